#!/usr/bin/env bash
# Re-resolve envs/*.lock.txt from the direct pins in envs/*.txt, each side in a
# scratch venv of its own (the two sides need different numpy majors: the Slurm
# executor plugin wants numpy 2, TensorFlow 2.15 numpy 1).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

"$python" -m venv "$scratch/workflow"
"$scratch/workflow/bin/pip" install --quiet -r "$root/envs/build-tools.txt"
"$scratch/workflow/bin/pip" install --quiet -r "$root/envs/workflow.txt"
{ echo "# Full closure of the workflow side, resolved from workflow.txt (make lock)."
  "$scratch/workflow/bin/pip" freeze --exclude-editable; } > "$root/envs/workflow.lock.txt"

"$python" -m venv "$scratch/bench"
"$scratch/bench/bin/pip" install --quiet -r "$root/envs/build-tools.txt"
# Horovod is left out here: it builds against TensorFlow (scripts/setup-venv.sh).
grep -v '^horovod==' "$root/envs/bench.txt" > "$scratch/bench.txt"
"$scratch/bench/bin/pip" install --quiet -r "$scratch/bench.txt" cloudpickle psutil pyyaml cffi
{ echo "# Full closure of the benchmark side, resolved from bench.txt (make lock). Horovod is"
  echo "# not listed: it is built from source after TensorFlow, by scripts/setup-venv.sh."
  "$scratch/bench/bin/pip" freeze --exclude-editable; } > "$root/envs/bench.lock.txt"
"$python" -m venv "$scratch/bench-torch"
"$scratch/bench-torch/bin/pip" install --quiet -r "$root/envs/build-tools.txt"
"$scratch/bench-torch/bin/pip" install --quiet -r "$root/envs/bench-torch.txt"
{ echo "# Full closure of the PyTorch benchmark side, resolved from bench-torch.txt (make lock)."
  "$scratch/bench-torch/bin/pip" freeze --exclude-editable; } > "$root/envs/bench-torch.lock.txt"
echo "lock-envs: wrote envs/workflow.lock.txt, envs/bench.lock.txt and envs/bench-torch.lock.txt" >&2
