#!/usr/bin/env bash
# Every command follows README's exit codes (0 done, 1 a check failed, 2 bad input, 3 a failure while
# running, 130/143 signals): command-line errors exit 2 with a message naming what was wrong, not CLI11's
# own codes (105, 106, 109, ...); --version answers; an unknown command or option is named as such.
# Usage: exit_codes.sh BUILD_DIR SOURCE_DIR
set -u
bin="$1/ration" src=$2
fail=0
expect() {  # expect RC REGEX -- ARGS...
  local want=$1 regex=$2
  shift 3
  local out rc
  out=$("$bin" "$@" 2>&1)
  rc=$?
  if [ "$rc" != "$want" ] || ! printf '%s' "$out" | grep -qE -- "$regex"; then
    echo "FAIL: ration $* -> exit $rc (want $want), output: $(printf '%s' "$out" | tail -2)"
    fail=1
  else
    echo "ok: ration $* -> $rc"
  fi
}
expect 0 "^ration [0-9]+\.[0-9]+\.[0-9]+" -- --version
expect 2 "unknown command 'frobnicate'; expected a command: train, " -- frobnicate
expect 2 "unknown option '--frobnicate'; expected a command" -- --frobnicate
expect 2 "config is required|required" -- train
expect 2 "File does not exist|does not exist" -- train /nonexistent.toml
expect 2 "The following argument was not expected|not expected" -- plan "$src/configs/gpt.toml" --no-such-flag
expect 2 "expected an integer >= 1 \(number of optimiser steps\)" -- train "$src/configs/mlp.toml" --steps 0
expect 2 "below the feasible minimum" -- plan "$src/configs/gpt.toml" --memory-budget 1MiB
expect 2 "memory budget 976.56 KiB is below the feasible minimum" -- plan "$src/configs/gpt.toml" --memory-budget 1e6
expect 2 "--tol: expected a number > 0 and <= 1 \(relative error per parameter\), got '-1'" -- gradcheck "$src/configs/mlp.toml" --tol -1
expect 2 "--tol: expected a number > 0 and <= 1 \(relative error per parameter\), got 'nan'" -- gradcheck "$src/configs/mlp.toml" --tol nan
expect 2 "--seq-len: expected an integer >= 1 \(time steps\), got '0'" -- plan "$src/configs/tcn_lm.toml" --sequence --seq-len 0
for mb in 0 inf nan; do
  expect 2 "--trace-max-mb: expected a number > 0 and <= 1048576 \(MiB of trace\), got '$mb'" -- plan "$src/configs/gpt.toml" --memory-budget 60MiB --trace /tmp/ration-exit-codes-trace.json --trace-max-mb $mb
done
for lr in 1e39 1e-320; do
  expect 2 "optim.lr must be a number > 0 that float32 holds \(from 1.2e-38 to 3.4e\+38\)" -- train "$src/configs/mlp.toml" --steps 1 --set train.checkpoint_dir= --set optim.lr=$lr
done
expect 2 "train.keep_checkpoints must be >= 1 \(how many checkpoints to keep\), got 0" -- train "$src/configs/mlp.toml" --steps 1 --set train.checkpoint_dir= --set train.keep_checkpoints=0
# An unwritable --report is named before the first step (the run would otherwise train, then lose it).
expect 2 "--report /proc/ration-no-such/report.json: cannot be written .*checked before training" -- train "$src/configs/mlp.toml" --steps 50000 --set train.checkpoint_dir= --report /proc/ration-no-such/report.json
expect 2 "ration launch: -n 1000 is more ranks than this machine runs \(at most [0-9]+: 4 per core, one per 256 MiB of memory\); pass --oversubscribe" -- launch -n 1000 -- train "$src/configs/mlp.toml"
[ $fail = 0 ] && echo "all exit codes as documented"
exit $fail
