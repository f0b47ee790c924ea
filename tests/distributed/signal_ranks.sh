#!/bin/bash
# signal_ranks.sh BUILD_DIR SOURCE_DIR TARGET [TRAIN ARGS...] — `ration launch -n 2` trains gpt with a checkpoint
# directory; once rank 0 has logged a few steps, SIGINT goes to one rank only (TARGET=rank1) or SIGTERM
# to the launcher (TARGET=launcher, which forwards it to every rank). Every rank carries its stop request
# in the step's loss all-reduce, so both ranks stop after the same step: passes when both exit with the
# signal's status (130 / 143) well within the collective timeout (no hang, no "lost rank"), rank 0 says
# "stopped by SIG... after step K" and rank 0's checkpoint of step K exists.
set -u
build=$1 src=$2 target=$3
shift 3  # the rest: extra `ration train` arguments
timeout_s=30
log=$(mktemp)
ckpt=$(mktemp -d)
trap 'rm -rf "$log" "$ckpt"' EXIT
fail() { echo "---- launcher output ----"; cat "$log"; echo "FAIL: $*"; exit 1; }

"$build/ration" launch -n 2 --master-port 0 --grace 30 -- train "$src/configs/gpt.toml" --steps 100000 \
  --set model.n_layer=2 --set model.n_embd=64 --set train.threads=1 --set train.checkpoint_dir="$ckpt" \
  --set train.checkpoint_every=100000 --set train.log_every=1 --set dist.timeout_s=$timeout_s "$@" >"$log" 2>&1 &
launcher=$!
for _ in $(seq 1 900); do grep -q "step 3/" "$log" && break; sleep 0.1; done
grep -q "step 3/" "$log" || fail "training did not start"
case "$target" in
  rank1)
    pid=""
    for c in $(pgrep -P "$launcher"); do
      if tr '\0' '\n' <"/proc/$c/environ" 2>/dev/null | grep -qx "RANK=1"; then pid=$c; fi
    done
    [ -n "$pid" ] || fail "no process with RANK=1 under the launcher"
    kill -INT "$pid"; signal=SIGINT; status=130 ;;
  launcher) kill -TERM "$launcher"; signal=SIGTERM; status=143 ;;
  *) echo "usage: signal_ranks.sh BUILD SRC rank1|launcher"; exit 2 ;;
esac
t0=$(date +%s.%N)
wait "$launcher"
rc=$?
elapsed=$(echo "$(date +%s.%N) - $t0" | bc)
grep -v "^\[rank 0\] step" "$log"
echo "launcher exit $rc after ${elapsed}s"
[ "$rc" -ne 0 ] || fail "the launcher exited 0 after a stop by $signal"
[ "$(echo "$elapsed < $timeout_s" | bc)" = 1 ] || fail "took ${elapsed}s: a rank waited for a collective"
grep -q "lost rank" "$log" && fail "a rank was reported lost: the ranks did not stop at the same step"
step=$(grep -o "stopped by $signal after step [0-9]*" "$log" | head -1 | grep -o "[0-9]*$")
[ -n "$step" ] || fail "rank 0 did not report a stop by $signal"
[ -d "$ckpt/ckpt-$step" ] || fail "no checkpoint of step $step in $ckpt ($(ls "$ckpt"))"
for r in 0 1; do
  grep -q "ration launch: rank $r: exit status $status\|rank $r failed (exit status $status)" "$log" ||
    fail "rank $r did not exit with status $status"
done
echo "PASS (both ranks stopped after step $step)"
