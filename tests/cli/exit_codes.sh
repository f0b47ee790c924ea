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
[ $fail = 0 ] && echo "all exit codes as documented"
exit $fail
