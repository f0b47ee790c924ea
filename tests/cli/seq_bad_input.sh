#!/usr/bin/env bash
# Bad input to the sequence commands is a clear error: `ration stream` with a checkpoint of another model
# names both; --chunk 0 names the flag and the expected form; train.tbptt = 0 names the key; --tokens above
# the bound names it. And `generate` shows its text as it samples: bytes reach stdout long before a large
# --tokens is done, and SIGINT stops it with exit 130 and a summary saying so.
# Usage: seq_bad_input.sh BUILD_DIR SOURCE_DIR
set -uo pipefail
ration="$1/ration"; src="$2"
dir=$(mktemp -d); trap 'rm -rf "$dir"' EXIT
expect_error() {  # expect_error NEEDLE COMMAND...: the command fails and its stderr contains NEEDLE
  local needle="$1"; shift
  if "$@" >"$dir/out" 2>"$dir/err"; then echo "FAIL: succeeded: $*"; exit 1; fi
  if ! grep -qF -- "$needle" "$dir/err"; then echo "FAIL: no '$needle' in:"; cat "$dir/err"; exit 1; fi
  echo "ok: $needle"
}
# A tcn_lm checkpoint (one step) ...
"$ration" train "$src/configs/tcn_lm.toml" --steps 1 --set data.seq_len=16 --set train.batch_size=2 \
  --set train.eval_batches=1 --set "train.checkpoint_dir=$dir/tcn" --json >/dev/null || { echo "FAIL: training tcn_lm"; exit 1; }
# ... is not an lstm_lm.
expect_error "does not hold a 'lstm_lm' model" \
  "$ration" stream "$src/configs/lstm_lm.toml" --checkpoint "$dir/tcn" --input "$src/configs/lstm_lm.toml"
expect_error "does not hold a 'lstm_lm' model" \
  "$ration" generate "$src/configs/lstm_lm.toml" --checkpoint "$dir/tcn" --prompt "The " --tokens 4
expect_error "is a directory; expected a text file to score" \
  "$ration" stream "$src/configs/tcn_lm.toml" --checkpoint "$dir/tcn" --input "$src/configs"
expect_error "--chunk must be >= 1; got 0" \
  "$ration" stream "$src/configs/tcn_lm.toml" --checkpoint "$dir/tcn" --input "$src/configs/tcn_lm.toml" --chunk 0
expect_error "train.tbptt must be a chunk length >= 1" \
  "$ration" train "$src/configs/lstm_lm.toml" --steps 1 --set train.tbptt=0 --set train.checkpoint_dir=
expect_error "model.attention_window" \
  "$ration" train "$src/configs/gpt.toml" --steps 1 --set train.tbptt=16 --set train.checkpoint_dir=
expect_error "--tokens: expected an integer from 0 to 10000000 (bytes to sample), got '1000000000'" \
  "$ration" generate "$src/configs/tcn_lm.toml" --checkpoint "$dir/tcn" --prompt "The " --tokens 1000000000
"$ration" generate "$src/configs/tcn_lm.toml" --checkpoint "$dir/tcn" --prompt "The " --tokens 10000000 >"$dir/gen" 2>&1 &
pid=$!
for _ in $(seq 1 600); do  # up to 60 s for the model to load and the first bytes past the prompt to show
  [ "$(wc -c <"$dir/gen")" -gt 64 ] && break
  sleep 0.1
done
[ "$(wc -c <"$dir/gen")" -gt 64 ] || { echo "FAIL: generate showed nothing while sampling"; kill -9 $pid; exit 1; }
kill -INT $pid
wait $pid; rc=$?
[ $rc = 130 ] || { echo "FAIL: generate stopped by SIGINT exited $rc, want 130"; tail -c 300 "$dir/gen"; exit 1; }
grep -q "stopped by SIGINT" "$dir/gen" || { echo "FAIL: no 'stopped by SIGINT' summary"; tail -c 300 "$dir/gen"; exit 1; }
echo "ok: generate streams its text and stops on SIGINT (exit 130)"
echo "all bad inputs rejected"
