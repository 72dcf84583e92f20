#!/usr/bin/env bash
# Create (or bring up to date) one of the project's virtual environments from
# its lock file:   scripts/setup-venv.sh workflow|bench VENV_DIR
#
# workflow: snakemake, pandas, the report; the login node's side.
# bench:    TensorFlow, Horovod, mpi4py; what every rank runs. The container
#           build installs the same lock, so both sides hold identical versions.
set -euo pipefail
side=${1:?usage: setup-venv.sh workflow|bench VENV_DIR}
venv=${2:?usage: setup-venv.sh workflow|bench VENV_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}
horovod_version=$(sed -n 's/^horovod==//p' "$root/envs/bench.txt")

pip_install() { "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "$@"; }

"$python" -m venv "$venv"
pip_install -r "$root/envs/build-tools.txt"
case "$side" in
  workflow)
    pip_install -r "$root/envs/workflow.lock.txt"
    ;;
  bench)
    pip_install -r "$root/envs/bench.lock.txt"
    # Horovod compiles against the TensorFlow just installed, hence no build
    # isolation; MPI support needs an MPI compiler wrapper (scripts/install-system-deps.sh).
    # The wheel goes to the wheelhouse the container build installs from, so the
    # image gets the very same Horovod build without compiling it again.
    wheelhouse="$root/build/wheelhouse"
    if ! "$venv/bin/python" -c "import horovod.tensorflow" 2>/dev/null; then
      if ! ls "$wheelhouse"/horovod-"$horovod_version"-*.whl >/dev/null 2>&1; then
        echo "setup-venv: building horovod $horovod_version against TensorFlow (2-5 minutes)" >&2
        mkdir -p "$wheelhouse"
        HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 \
        HOROVOD_WITH_GLOO=1 HOROVOD_WITH_MPI=${HOROVOD_WITH_MPI:-1} MAKEFLAGS=${MAKEFLAGS:--j$(nproc)} \
          "$venv/bin/python" -m pip wheel --quiet --no-cache-dir --no-deps --no-build-isolation \
            "horovod==$horovod_version" -w "$wheelhouse"
      fi
      pip_install --no-deps "$wheelhouse"/horovod-"$horovod_version"-*.whl
    fi
    ;;
  *) echo "setup-venv: unknown side '$side' (allowed: workflow, bench)" >&2; exit 2 ;;
esac
# The package itself, editable, without dependencies: the locks above are the truth.
pip_install --no-deps --editable "$root"
touch "$venv/.containerbench-ready"
