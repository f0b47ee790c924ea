#!/bin/bash
# kill_rank.sh BUILD_DIR SOURCE_DIR N VICTIM [TRAIN ARGS...] — `ration launch -n N` trains gpt; once rank 0 has logged a
# few steps, rank VICTIM is killed with SIGKILL (mid-step: a step takes ~100 ms, the kill lands anywhere).
# Passes when the launcher exits non-zero naming the victim and its signal, and every surviving rank exits
# non-zero with an error naming the lost rank, within dist.timeout_s (20 s here) plus two diagnosis windows
# (3 s each) and 2 s: a survivor whose pending collective is with another survivor (busy diagnosing, not
# the killed rank) sees no closed socket and fails only at the world's timeout, then diagnoses for one
# window, while rank 0 lingers for its note (distributed/liveness.h). CI saw 23.4 s on that path once.
# With SERVERS=S in the environment the launch adds S dedicated parameter servers (ranks N..N+S-1,
# dist.servers); every process of the job but the victim, servers included, must name it.
set -u
build=$1 src=$2 n=$3 victim=$4
servers=${SERVERS:-0}
total=$((n + servers))
shift 4  # the rest: extra `ration train` arguments (e.g. --set dist.topology=ps --set dist.backup_workers=1)
timeout_s=20
log=$(mktemp)
trap 'rm -f "$log"; [ -n "${launcher:-}" ] && kill "$launcher" 2>/dev/null' EXIT  # ranks die with the launcher
fail() { echo "---- launcher output ----"; cat "$log"; echo "FAIL: $*"; exit 1; }

"$build/ration" launch -n "$n" --servers "$servers" --master-port 0 --grace 30 -- train "$src/configs/gpt.toml" --steps 100000 \
  --set model.n_layer=2 --set model.n_embd=64 \
  --set train.threads=1 --set train.checkpoint_dir= --set train.log_every=1 --set dist.timeout_s=$timeout_s "$@" \
  >"$log" 2>&1 &
launcher=$!
for _ in $(seq 1 1800); do grep -q "step 3/" "$log" && break; sleep 0.1; done  # 180 s: 5 processes start slowly on a loaded 2-vCPU machine
grep -q "step 3/" "$log" || fail "training did not start"
victim_pid=""
for c in $(pgrep -P "$launcher"); do
  if tr '\0' '\n' <"/proc/$c/environ" 2>/dev/null | grep -qx "RANK=$victim"; then victim_pid=$c; fi
done
[ -n "$victim_pid" ] || fail "no process with RANK=$victim under the launcher"
kill -9 "$victim_pid"
t0=$(date +%s.%N)
wait "$launcher"
rc=$?
elapsed=$(echo "$(date +%s.%N) - $t0" | bc)
cat "$log" | grep -v "^\[rank 0\] step"
echo "launcher exit $rc after ${elapsed}s"
[ "$rc" -ne 0 ] || fail "the launcher exited 0"
bound=$((timeout_s + 2 * 3 + 2))
[ "$(echo "$elapsed < $bound" | bc)" = 1 ] || fail "took ${elapsed}s, more than dist.timeout_s=$timeout_s + 2 diagnosis windows + 2 s"
grep -q "ration launch: rank $victim failed (killed by signal 9" "$log" || fail "the launcher did not name rank $victim"
for r in $(seq 0 $((total - 1))); do
  [ "$r" = "$victim" ] && continue
  grep -q "^\[rank $r\] error: rank $r of $total: lost rank $victim " "$log" || fail "rank $r did not name lost rank $victim"
  grep -q "ration launch: rank $r: exit status 2" "$log" || fail "rank $r did not exit with status 2"
done
echo "PASS"
