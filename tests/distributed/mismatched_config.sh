#!/bin/bash
# mismatched_config.sh BUILD_DIR SOURCE_DIR [EXPECTED RANK0_ARGS RANK1_ARGS] — two ranks started by hand
# (the torchrun-style variables any launcher sets) with different arguments (by default optim.lr): both
# must stop at start-up with an error containing EXPECTED (by default, naming rank 1's configuration).
set -u
build=$1 src=$2
expected=${3:-"the configuration of rank 1 differs from rank 0's"}
args0=${4:-"--steps 2 --set optim.lr=0.05"} args1=${5:-"--steps 2 --set optim.lr=0.01"}
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
common=(train "$src/configs/mlp.toml" --set train.threads=1 --set train.checkpoint_dir= --set dist.timeout_s=20)
out0=$(mktemp) out1=$(mktemp)
trap 'rm -f "$out0" "$out1"' EXIT
env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$build/ration" "${common[@]}" $args0 >"$out0" 2>&1 &
p0=$!
env RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port "$build/ration" "${common[@]}" $args1 >"$out1" 2>&1 &
p1=$!
wait $p0; rc0=$?
wait $p1; rc1=$?
cat "$out0" "$out1"
ok=1
for f in "$out0" "$out1"; do grep -qF "$expected" "$f" || ok=0; done
[ $rc0 -ne 0 ] && [ $rc1 -ne 0 ] && [ $ok = 1 ] && echo PASS && exit 0
echo "FAIL: rc0=$rc0 rc1=$rc1"; exit 1
