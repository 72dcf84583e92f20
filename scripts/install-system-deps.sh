#!/usr/bin/env bash
# System packages the embedded default needs: an MPI (Open MPI from the
# distribution) to build Horovod with MPI and to launch ranks with mpirun.
# Installs them when running as root on Debian/Ubuntu; otherwise says what is missing.
set -euo pipefail
missing=()
command -v mpirun >/dev/null || missing+=(openmpi-bin)
command -v mpicxx >/dev/null || missing+=(libopenmpi-dev)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  echo "install-system-deps: apt-get install ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "install-system-deps: missing ${missing[*]} (an MPI with its compiler wrappers); install them, or 'module load' your site's MPI, and re-run" >&2
  exit 1
fi
