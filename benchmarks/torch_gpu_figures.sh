#!/usr/bin/env bash
# The PyTorch side on one GPU node, outside the workflow: what a site (or a developer with a lent
# GPU) runs to see the harness at GPU speed before a sweep. Each step has its own time limit and
# its own log; a failing step is reported and the next one runs.
#
#   benchmarks/torch_gpu_figures.sh [OUTDIR]     (PYTHON: a python with torch and mpi4py)
#
# 1. torchbench.py, ResNet-50 224 px, batch 256, channels_last: fp32, fp16 (GradScaler), bf16,
#    and bf16 under torch.compile; DDP over NCCL (one rank per GPU the node has: mpiexec if there
#    is more than one GPU).
# 2. torch_harness_speed.py on the GPU: ours vs a plain DDP loop, bf16, batch 256 and batch 32
#    (a small batch is where a per-step host read would show).
# 3. netbench's torch.distributed backend with NCCL on this node's GPUs (needs 2 GPUs: NCCL puts
#    one rank on one GPU; with one GPU the refusal is the result).
set -uo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${1:-results/gpu-figures}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUTDIR"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-lo}
GPUS=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())')
MPIEXEC=$(command -v mpiexec || command -v mpirun || true)
# Open MPI refuses root unless told twice (a lent test machine runs as root).
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# One rank per GPU; one rank needs no launcher (MPI starts as a singleton).
LAUNCH=()
[ "$GPUS" -gt 1 ] && LAUNCH=("$MPIEXEC" -n "$GPUS")
step() {  # name, seconds, command...
    local name=$1 seconds=$2; shift 2
    echo "== $name (limit ${seconds}s): $*"
    local started=$SECONDS
    timeout "$seconds" "$@" >"$OUTDIR/$name.log" 2>&1
    local rc=$?
    echo "== $name: exit $rc after $((SECONDS - started))s"
    grep -E "^(containerbench: |containerbench-failure|torch-harness-speed |containerbench-netbench )|Error|NET/" \
        "$OUTDIR/$name.log" | cut -c1-400 | tail -12
    [ "$rc" -eq 0 ] || tail -5 "$OUTDIR/$name.log" | cut -c1-400
}
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
    "$PYTHON" -c 'import torch, mpi4py; from mpi4py import MPI; print("torch", torch.__version__, "cuda", torch.version.cuda,
"nccl", torch.cuda.nccl.version(), "mpi4py", mpi4py.__version__, MPI.Get_library_version().splitlines()[0])'
} | tee "$OUTDIR/node.txt"
TRAIN=(-m containerbench.rank.torchbench --model resnet50 --image-size 224 --batch-size 256 --warmup-steps 10 --steps 40)
# Most telling first: a step cut short by the caller's own limit loses only the last figures.
step torchbench-mixed_bfloat16 120 "${LAUNCH[@]}" "$PYTHON" "${TRAIN[@]}" --precision mixed_bfloat16
for batch in 256 32; do
    step "harness-speed-b$batch" 100 "${LAUNCH[@]}" "$PYTHON" benchmarks/torch_harness_speed.py --worker --device cuda \
        --precision mixed_bfloat16 --image-size 224 --batch-size "$batch" --steps 10 --rounds 6
done
for precision in fp32 mixed_float16; do
    step "torchbench-$precision" 120 "${LAUNCH[@]}" "$PYTHON" "${TRAIN[@]}" --precision "$precision"
done
step netbench-nccl 60 "$MPIEXEC" -n "$(( GPUS > 1 ? GPUS : 2 ))" "$PYTHON" -m containerbench.rank.netbench --backend torch-nccl \
    --max-bytes $((256 * 1024 * 1024)) --seconds-per-size 0.2
step torchbench-bf16-compile 200 "${LAUNCH[@]}" "$PYTHON" "${TRAIN[@]}" --precision mixed_bfloat16 --compile
