#!/usr/bin/env bash
# ration bounds OpenMP's spin-wait when a run has more than one intra-op thread (base/openmp.h): with nothing
# set by the user, `ration train` at train.threads=2 reports GOMP_SPINCOUNT=10000 chosen by ration (it
# restarted itself once, keeping its process id); at one thread it leaves libgomp's default; a
# GOMP_SPINCOUNT or OMP_WAIT_POLICY the user set is kept. The loss is the same either way.
# Usage: openmp_spin.sh BUILD_DIR SOURCE_DIR
set -u
bin="$1/ration" src=$2
fail=0
run() {  # prints "spin chosen_by loss" of a 2-step mlp run with THREADS under the given environment
  local threads=$1; shift
  env -u GOMP_SPINCOUNT -u OMP_WAIT_POLICY -u RATION_OMP_SELECTED "$@" "$bin" train "$src/configs/mlp.toml" --steps 2 \
    --set train.checkpoint_dir= --set train.eval_batches=1 --set train.threads="$threads" --json 2>/dev/null |
    /usr/bin/python3 -c 'import json,sys; r=json.load(sys.stdin); o=r["openmp"]; print(o["spin"] or "-", o["chosen_by"], repr(r["loss"][-1]))'
}
check() {  # check WHAT GOT REGEX
  if printf '%s' "$2" | grep -qE -- "$3"; then echo "ok: $1: $2"; else echo "FAIL: $1: got '$2', want /$3/"; fail=1; fi
}
two=$(run 2)
check "two threads, nothing set" "$two" "^10000 ration "
check "one thread" "$(run 1)" "^- runtime "
check "user's GOMP_SPINCOUNT kept" "$(run 2 GOMP_SPINCOUNT=123)" "^123 user "
user_policy=$(run 2 OMP_WAIT_POLICY=active)
check "user's OMP_WAIT_POLICY kept" "$user_policy" "^active user "
check "same loss with ration's spin and the user's" "${two##* }" "^${user_policy##* }$"
exit $fail
