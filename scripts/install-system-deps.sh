#!/usr/bin/env bash
# System packages the embedded default needs: an MPI (Open MPI from the
# distribution) to build Horovod with MPI and to launch ranks with mpirun.
# Installs them when running as root on Debian/Ubuntu; otherwise says what is missing.
#
#   --gpu-build  also what compiling Horovod's NCCL operations needs (setup-venv.sh bench-gpu):
#                CUDA 11.8's nvcc (Debian's nvidia-cuda-toolkit, in the non-free component,
#                which this enables) and gcc 11, the newest host compiler nvcc 11.8 accepts.
set -euo pipefail
missing=()
command -v mpirun >/dev/null || missing+=(openmpi-bin)
command -v mpicxx >/dev/null || missing+=(libopenmpi-dev)
non_free=false
if [ "${1:-}" = --gpu-build ]; then
  [ -x /usr/lib/nvidia-cuda-toolkit/bin/nvcc ] || { missing+=(nvidia-cuda-toolkit); non_free=true; }
  command -v g++-11 >/dev/null || missing+=(g++-11)
fi
# Installed where we can, not required: the host MPICH that the native MPI model swaps into the
# image's MPICH flavour (config native_mpi: library, and mpiexec for launcher mpirun). Open MPI stays
# the default mpirun and mpicc: Debian's alternatives rank it above MPICH.
optional=()
[ -e /usr/lib/x86_64-linux-gnu/libmpich.so.12 ] || optional+=(libmpich12)
command -v mpiexec.mpich >/dev/null || optional+=(mpich)
# ccache: Horovod's second compile (the MPICH flavour's wheel) reuses what the first compiled.
command -v ccache >/dev/null || optional+=(ccache)
# mksquashfs: Enroot's image, made where the workflow builds it when Enroot is on the compute nodes only
# (images.enroot.available: compute-nodes, as config/site.example.yaml has it; imagebuild.enroot_squashfs).
command -v mksquashfs >/dev/null || optional+=(squashfs-tools)
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  missing+=("${optional[@]}")
fi
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  echo "install-system-deps: apt-get install ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  sources=/etc/apt/sources.list.d/debian.sources
  if $non_free && [ -f "$sources" ] && ! grep -q "non-free" "$sources"; then
    sed -i 's/^Components: main$/Components: main contrib non-free/' "$sources"
  fi
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "install-system-deps: missing ${missing[*]} (an MPI with its compiler wrappers); install them, or 'module load' your site's MPI, and re-run" >&2
  exit 1
fi
