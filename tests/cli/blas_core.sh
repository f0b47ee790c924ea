#!/usr/bin/env bash
# ration runs OpenBLAS's vector kernels on a CPU that has them (base/blas.h): with nothing set by the user
# the reported core uses AVX2 or wider whenever /proc/cpuinfo lists avx2; when the library's pick would
# leave the vector units unused (simulated with RATION_BLAS_PRETEND_GENERIC=1) ration restarts itself with
# the best core and says so; a core the user chose with OPENBLAS_CORETYPE is kept.
# Usage: blas_core.sh BUILD_DIR SOURCE_DIR
set -u
bin="$1/ration" src=$2
fail=0
blas_of() {  # prints "core chosen_by" of a 1-step run under the given environment
  env "$@" "$bin" train "$src/configs/mlp.toml" --steps 1 --set train.checkpoint_dir= --set train.eval_batches=1 \
    --set train.threads=1 --json 2>/dev/null |
    /usr/bin/python3 -c 'import json,sys; b=json.load(sys.stdin)["blas"]; print(b["core"], b["chosen_by"])'
}
check() {  # check WHAT GOT REGEX
  if printf '%s' "$2" | grep -qE -- "$3"; then echo "ok: $1: $2"; else echo "FAIL: $1: got '$2', want /$3/"; fail=1; fi
}
vector='^(Haswell|SkylakeX|Cooperlake|SapphireRapids|Zen|Excavator) '
got=$(blas_of -u OPENBLAS_CORETYPE -u RATION_BLAS_SELECTED)
if [ -z "$got" ]; then echo "FAIL: no report"; exit 1; fi
case "$got" in " "*) echo "skip: the BLAS is not OpenBLAS ($got)"; exit 0 ;; esac
if grep -qw avx2 /proc/cpuinfo; then
  check "default, AVX2 CPU" "$got" "$vector(library|ration)$"
  if grep -qw avx512bw /proc/cpuinfo && grep -qw avx512vl /proc/cpuinfo && grep -qw avx512dq /proc/cpuinfo; then
    best=SkylakeX
  else
    best=Haswell
  fi
  check "library pick treated as generic" "$(blas_of -u OPENBLAS_CORETYPE RATION_BLAS_PRETEND_GENERIC=1)" "^$best ration$"
else
  echo "note: no avx2 on this CPU; only the user's choice is checked"
fi
check "user's OPENBLAS_CORETYPE kept" "$(blas_of OPENBLAS_CORETYPE=Prescott)" "^Prescott user$"
exit $fail
