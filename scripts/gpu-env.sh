#!/usr/bin/env bash
# gpu-env.sh — sourced on a GPU machine that has PyTorch 2.x (CUDA) but none of Debian's -dev packages:
# unpacks the Debian 12 packages that `scripts/gpu-deps.sh` downloaded into .gpudeps/ under /opt/deb,
# points their dangling library links at the system's copies, and exports
#   RATION_TORCH_PREFIX  python3's torch.utils.cmake_prefix_path
#   RATION_DEB_PREFIX    /opt/deb/usr (add to CMAKE_PREFIX_PATH)
#   LD_LIBRARY_PATH      + the unpacked libraries (gRPC, protobuf, absl, RocksDB, ...)
#   NCCL_INCLUDE_DIR     where nccl.h is (c10d's ProcessGroupNCCL.hpp includes it)
# Usage: source scripts/gpu-env.sh   (then see scripts/gpu-check.sh)
_ration_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_deb=/opt/deb
_lib=$_deb/usr/lib/x86_64-linux-gnu
if [ ! -d "$_lib" ]; then
  mkdir -p "$_deb" /opt/deb-fallback
  for f in "$_ration_root"/.gpudeps/*.deb; do dpkg-deb -x "$f" "$_deb"; done
  for f in "$_ration_root"/.gpudeps/fallback/*.deb; do dpkg-deb -x "$f" /opt/deb-fallback; done
  # Runtime libraries every system has (zlib, OpenSSL, zstd, lz4, bz2): use the system's; copy Debian's
  # only where the system lacks one.
  for so in libz.so.1 libssl.so.3 libcrypto.so.3 libzstd.so.1 liblz4.so.1 libbz2.so.1.0; do
    if ! ldconfig -p | grep -qE "^[[:space:]]$so[[:space:]]"; then
      cp -a /opt/deb-fallback/usr/lib/x86_64-linux-gnu/$so* /opt/deb-fallback/lib/x86_64-linux-gnu/$so* "$_lib"/ 2>/dev/null
      echo "gpu-env: $so from Debian (the system has none)"
    fi
  done
  for l in "$_lib"/*.so; do
    if [ -L "$l" ] && [ ! -e "$l" ]; then
      t="$(basename "$(readlink "$l")")"
      for d in /usr/lib/x86_64-linux-gnu /lib/x86_64-linux-gnu /usr/lib64; do
        if [ -e "$d/$t" ]; then ln -sf "$d/$t" "$l"; break; fi
      done
    fi
  done
fi
# Some packages' CMake files name /usr/... literally (Snappy, RocksDB, gflags, toml++'s prefix): point them
# here; their pkg-config files too (gRPC finds re2 through one). Idempotent.
find "$_deb" -name '*.cmake' -print0 | xargs -0 sed -i -E -e "s#(^|[\";[:space:](])/usr/(lib|include|bin|share)#\1$_deb/usr/\2#g" \
  -e "s#\"/usr\"#\"$_deb/usr\"#g"
find "$_deb" -name '*.pc' -print0 | xargs -0 sed -i -E "s#=/usr(/|\$)#=$_deb/usr\1#"
export RATION_DEB_PREFIX=$_deb/usr
export RATION_TORCH_PREFIX="$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')"
export LD_LIBRARY_PATH="$_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$_deb/usr/bin:$PATH"
# NCCL's header: the CUDA toolkit's, else the one in python3's nvidia-nccl wheel.
if [ -z "${NCCL_INCLUDE_DIR:-}" ]; then
  _nccl="$(find /usr/local/cuda/include /usr/include "$(python3 -c 'import site;print(site.getsitepackages()[0])')/nvidia" \
           -name nccl.h 2>/dev/null | head -1)"
  if [ -n "$_nccl" ]; then export NCCL_INCLUDE_DIR="$(dirname "$_nccl")"
  elif [ -f "$_ration_root/.gpudeps/nccl-fallback/nccl.h" ]; then
    # NVIDIA's public header (scripts/gpu-deps.sh), where neither the toolkit nor a wheel has one.
    export NCCL_INCLUDE_DIR="$_ration_root/.gpudeps/nccl-fallback"; echo "gpu-env: nccl.h from .gpudeps"
  fi
  unset _nccl
fi
unset _ration_root _deb _lib
