#!/usr/bin/env bash
# Create (or bring up to date) one of the project's virtual environments from
# its lock file:   scripts/setup-venv.sh workflow|bench|bench-gpu|bench-torch VENV_DIR
#
# workflow:  snakemake, pandas, the report; the login node's side.
# bench:     TensorFlow (CPU), Horovod, mpi4py; what every rank runs. The container
#            build installs the same lock, so both sides hold identical versions.
# bench-gpu: the same for GPU nodes (benchmark_env: gpu): TensorFlow with its CUDA 11.8
#            wheels, Horovod with NCCL operations, compiled by CUDA 11.8's nvcc
#            (CUDA_HOME, default Debian's nvidia-cuda-toolkit: scripts/install-system-deps.sh --gpu-build).
# bench-torch: the PyTorch side (benchmark.frameworks with pytorch): torch, mpi4py; no Horovod.
set -euo pipefail
usage="usage: setup-venv.sh workflow|bench|bench-gpu|bench-torch VENV_DIR"
side=${1:?$usage}
venv=${2:?$usage}
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
case "$side" in
  bench) pins=envs/bench.txt lock=envs/bench.lock.txt wheelhouse="$root/build/wheelhouse" ;;
  bench-gpu) pins=envs/bench-gpu.txt lock=envs/bench-gpu.lock.txt wheelhouse="$root/build/wheelhouse-gpu" ;;
  bench-torch) pins=envs/bench-torch.txt lock=envs/bench-torch.lock.txt wheelhouse="$root/build/wheelhouse-torch" ;;
esac
lock_path="$root/${lock:-}"
# BENCH_LOCK: another lock, e.g. what a vendor's image carries (containerbench freeze-image); its
# Horovod, compiled against its TensorFlow, gets a wheelhouse of its own.
if [ -n "${BENCH_LOCK:-}" ]; then
  if [ ! -f "$BENCH_LOCK" ]; then  # before the venv is made: nothing half-built is left
    echo "setup-venv: BENCH_LOCK=$BENCH_LOCK is not a file; allowed: a lock that containerbench freeze-image wrote" >&2
    exit 2
  fi
  lock_path=$(realpath "$BENCH_LOCK")
  wheelhouse="$root/build/wheelhouse-$(basename "$lock_path" .txt)"
fi

pip_install() { "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@"; }

"$python" -m venv "$venv"
pip_install -r "$root/envs/build-tools.txt"
case "$side" in
  workflow)
    pip_install -r "$root/envs/workflow.lock.txt"
    ;;
  bench-torch)
    pip_install -r "$lock_path"
    ;;
  bench|bench-gpu)
    horovod_version=$(sed -n 's/^# horovod==//p' "$lock_path" | head -1)
    horovod_version=${horovod_version:-$(sed -n 's/^horovod==//p' "$root/$pins")}
    pip_install -r "$lock_path"
    # Horovod compiles against the TensorFlow just installed, hence no build
    # isolation; MPI support needs an MPI compiler wrapper (scripts/install-system-deps.sh).
    # The wheel goes to the wheelhouse the container build installs from, so the
    # image gets the very same Horovod build without compiling it again.
    gpu_build=()
    if [ "$side" = bench-gpu ]; then
      # NCCL operations: CUDA kernels compiled by nvcc 11.8 (TensorFlow 2.14's CUDA), which
      # accepts host compilers up to gcc 11; NCCL's header and library from the venv's
      # nvidia-nccl-cu11 wheel, found at run time through an rpath relative to Horovod's .so.
      cuda_home=${CUDA_HOME:-/usr/lib/nvidia-cuda-toolkit}
      if [ ! -x "$cuda_home/bin/nvcc" ]; then
        echo "setup-venv: bench-gpu needs CUDA 11.8's nvcc at \$CUDA_HOME/bin/nvcc (not found under $cuda_home); allowed: scripts/install-system-deps.sh --gpu-build, or CUDA_HOME=<a CUDA 11.8 toolkit>" >&2
        exit 2
      fi
      nccl=$("$venv/bin/python" -c "import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))")
      mkdir -p "$root/build/nccl-link"
      ln -sf "$nccl/lib/libnccl.so.2" "$root/build/nccl-link/libnccl.so"  # the wheel ships only the soname
      gpu_build=(PATH="$cuda_home/bin:/usr/bin:$PATH" HOROVOD_CUDA_HOME="$cuda_home"
                 CC=${CC:-gcc-11} CXX=${CXX:-g++-11} HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_LINK=SHARED
                 HOROVOD_NCCL_INCLUDE="$nccl/include" HOROVOD_NCCL_LIB="$root/build/nccl-link"
                 LDFLAGS='-Wl,-rpath,$ORIGIN/../../nvidia/nccl/lib')
    fi
    # ccache under the compile when installed (images.compiler_cache_env sets the same for the MPICH
    # flavour's wheel, which then compiles again only what includes mpi.h).
    compiler_cache=()
    if command -v ccache >/dev/null; then
      compiler_cache=(CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
                      CCACHE_DIR="$root/build/ccache" CCACHE_BASEDIR="${TMPDIR:-/tmp}" CCACHE_NOHASHDIR=1)
    fi
    if ! "$venv/bin/python" -c "import horovod.tensorflow" 2>/dev/null; then
      if ! ls "$wheelhouse"/horovod-"$horovod_version"-*.whl >/dev/null 2>&1; then
        echo "setup-venv: building horovod $horovod_version against TensorFlow (2-5 minutes; with NCCL more)" >&2
        mkdir -p "$wheelhouse"
        # Without debug information (the toolchain file says why; images.horovod_build_env sets the same).
        env "${gpu_build[@]}" "${compiler_cache[@]}" CMAKE_TOOLCHAIN_FILE="$root/scripts/horovod-without-debug-info.cmake" \
        HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
        HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=${HOROVOD_WITH_MPI:-1} MAKEFLAGS="-j$(nproc)" \
          "$venv/bin/python" -m pip wheel --quiet --no-cache-dir --no-deps --no-build-isolation \
            "horovod==$horovod_version" -w "$wheelhouse"
      fi
      pip_install --no-deps "$wheelhouse"/horovod-"$horovod_version"-*.whl
    fi
    ;;
  *) echo "setup-venv: unknown side '$side' (allowed: workflow, bench, bench-gpu, bench-torch)" >&2; exit 2 ;;
esac
# The package itself, editable, without dependencies: the locks above are the truth.
pip_install --no-deps --editable "$root"
touch "$venv/.containerbench-ready"
