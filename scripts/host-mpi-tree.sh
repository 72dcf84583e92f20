#!/usr/bin/env bash
# This machine's MPICH laid out as a site's host MPI is: in a directory of its own, with every library it
# loads but the C runtime (containerbench.hostmpi.C_RUNTIME), and UCX's transport modules in lib/ucx, where
# UCX looks beside its own libucs. Debian installs MPICH into /usr/lib, which no runtime can bind over an
# image's; a site's MPI (/opt/cray/pe/mpich/..., an MVAPICH or Intel MPI prefix) already is such a directory.
# config/native.yaml binds this one (native_mpi.library_dirs), so the native runs here load every library of
# the host's MPI from the host, and the ranks' /proc/self/maps show it.
#   scripts/host-mpi-tree.sh /usr/lib/x86_64-linux-gnu/libmpich.so.12 build/host-mpi
set -euo pipefail
library=${1:?usage: host-mpi-tree.sh LIBRARY DIR}
into=${2:?usage: host-mpi-tree.sh LIBRARY DIR}
[ -e "$library" ] || { echo "host-mpi-tree: no $library here (Debian's libmpich12: scripts/install-system-deps.sh)" >&2; exit 1; }
partial="$into.partial"
rm -rf "$partial" && mkdir -p "$partial/lib"
cp -L "$library" "$partial/lib/$(basename "$library")"
# The MPICH ABI's name, which an image's MPICH links (MPICH's own install names its library libmpi.so.12; Debian's,
# libmpich.so.12): a runtime that binds the directory and puts it on LD_LIBRARY_PATH without binding over the image's
# file (podman-hpc's mpich module, Shifter's) finds the host's library by it.
if [ "$(basename "$library")" = libmpich.so.12 ]; then ln -s libmpich.so.12 "$partial/lib/libmpi.so.12"; fi
# ldd's "NAME => PATH (ADDRESS)" lines: every library of the closure, resolved as the loader does here.
ldd "$library" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name path; do
  case "$name" in
    ld-linux*|libc.so*|libm.so*|libmvec.so*|libpthread.so*|libdl.so*|librt.so*|libresolv.so*|libutil.so*|libgcc_s.so*|libstdc++.so*) ;;
    *) cp -L "$path" "$partial/lib/$name" ;;
  esac
done
ucx_modules="$(dirname "$(readlink -f "$library")")/ucx"
if [ -d "$ucx_modules" ]; then cp -rL "$ucx_modules" "$partial/lib/ucx"; fi
rm -rf "$into" && mv "$partial" "$into"
echo "host-mpi-tree: $(ls "$into/lib" | wc -l) entries in $into/lib"
