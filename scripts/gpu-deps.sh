#!/usr/bin/env bash
# gpu-deps.sh — run on a Debian 12 machine with network: downloads into .gpudeps/ the Debian packages a
# GPU machine without them needs to build ration (header-only libraries, GoogleTest, Google Benchmark,
# gRPC/protobuf/absl, RocksDB and their libraries). scripts/gpu-env.sh unpacks them there.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .gpudeps/fallback
grep -qx '/.gpudeps/' .git/info/exclude 2>/dev/null || echo '/.gpudeps/' >> .git/info/exclude
(cd .gpudeps && apt-get download \
  nlohmann-json3-dev libtomlplusplus-dev libtomlplusplus3 libcli11-dev googletest libgtest-dev \
  libbenchmark-dev libbenchmark1debian libabsl-dev libabsl20220623 \
  libgrpc++-dev libgrpc++1.51 libgrpc-dev libgrpc29 protobuf-compiler-grpc libc-ares-dev libc-ares2 \
  libre2-dev libre2-9 libprotobuf-dev libprotobuf32 libprotobuf-lite32 libprotoc32 protobuf-compiler \
  librocksdb-dev librocksdb7.8 libsnappy-dev libsnappy1v5 libgflags-dev libgflags2.2 liblz4-dev \
  libzstd-dev libbz2-dev zlib1g-dev libssl-dev libgloo-dev)
# Runtime libraries the GPU machine normally has; unpacked there only if it lacks one.
(cd .gpudeps/fallback && apt-get download zlib1g libssl3 libzstd1 liblz4-1 libbz2-1.0)
du -sh .gpudeps
