#!/usr/bin/env bash
# bench/run_all.sh — rebuild the bench programs and regenerate bench/results/*.json with the commands
# BENCHMARKS.md records, one section of BENCHMARKS.md at a time, in the page's order.
#
#   bench/run_all.sh                    every CPU section (several hours on a 2-vCPU machine)
#   bench/run_all.sh planner ps         only the named sections, in the order given
#   bench/run_all.sh --list             the sections and the commands each runs (nothing is built or run)
#   bench/run_all.sh --dry-run [SECT]   print the build and bench commands without running them
#   bench/run_all.sh --no-build [SECT]  run with the binaries already in $BUILD
#   bench/run_all.sh gpu                the GPU section: bench_peer --device cuda and the planner on the GPU
#                                       machine's CPU, from a -DRATION_CUDA=ON build in $CUDA_BUILD
#                                       (scripts/gpu-check.sh build makes one); not part of the default run
#
# Environment: BUILD (default build), CUDA_BUILD (default build-cuda), PYTHON (the CPU peers' interpreter,
# default /usr/bin/python3, Debian's torch), GPU_PYTHON (the GPU peer's, default python3).
# A bench that exits non-zero (some exit 1 when one of their own targets is not met, after writing their
# JSON) is reported and the run goes on; the script then exits 1 and names them at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD=${BUILD:-build}
CUDA_BUILD=${CUDA_BUILD:-build-cuda}
PYTHON=${PYTHON:-/usr/bin/python3}
GPU_PYTHON=${GPU_PYTHON:-python3}
R=bench/results

CPU_SECTIONS=(speed memory offload planner distributed ps sequence trace settings)
ALL_SECTIONS=("${CPU_SECTIONS[@]}" gpu)

# The build targets each section needs (bench/CMakeLists.txt; ration_cli for the benches that run `ration`).
declare -A TARGETS=(
  [speed]="bench_train_peer bench_torchscript_peer bench_peer bench_engine_vs_libtorch"
  [memory]="bench_budget_curve bench_chain_yardstick bench_plan_yardstick"
  [offload]="bench_offload bench_joint_plan"
  [planner]="bench_plan_scaling"
  [distributed]="bench_dp_scaling bench_dp_convergence ration_cli"
  [ps]="bench_ps_store bench_ps_grpc bench_ps_ctr_synthetic bench_ps_evict bench_ps_modes bench_ps_online ration_cli"
  [sequence]="bench_seq_memory bench_seq_bptt_budget"
  [trace]="bench_trace_overhead"
  [settings]="bench_peer"
  [gpu]="bench_peer bench_plan_scaling"
)

DRY=0
BUILD_FIRST=1
LIST=0
FAILED=()

usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; }

# One argument as a shell word: as it is when it needs no quoting, else in single quotes.
quote() {
  if [[ $1 =~ ^[A-Za-z0-9_./=:,+@%-]+$ ]]; then
    printf '%s' "$1"
  else
    printf "'%s'" "${1//\'/\'\\\'\'}"
  fi
}

# Print a command and run it unless this is a dry run. A non-zero exit is recorded, not fatal.
run() {
  local line="+" a
  for a in "$@"; do line+=" $(quote "$a")"; done
  echo "$line"
  [ "$DRY" = 1 ] && return 0
  local rc=0
  "$@" || rc=$?
  if [ "$rc" != 0 ]; then
    echo "run_all: exit status $rc from: ${line#+ }" >&2
    FAILED+=("${line#+ }")
  fi
  return 0
}

ensure_movielens() {
  if [ ! -f data/movielens.csv ]; then
    run scripts/movielens.sh data/movielens.csv
  fi
}

section_speed() {
  local B=$BUILD/bench
  # `ration train` vs a PyTorch training loop, each config's threads, the peer with ration's process settings
  # and as installed (BENCHMARKS.md "Speed vs PyTorch"); gpt under a budget vs torch.utils.checkpoint per
  # block and attention only (its summary.gpt).
  run "$B"/bench_train_peer --reps 5 --steps 40 --families gpt --json $R/train_peer.json
  run "$B"/bench_train_peer --reps 5 --steps 40 --families mlp,cnn --no-budgets --json $R/train_peer_mlp_cnn.json
  run "$B"/bench_train_peer --reps 3 --steps 40 --families gpt,lstm_lm,tcn_lm --no-budgets --json $R/train_peer_seq.json
  # Imported TorchScript models (resnet18, mobilenet_v2, vgg11_bn, bert, unet, lstm) vs PyTorch eager on the same
  # nn.Module; resnet18 and bert under a budget vs torch.utils.checkpoint per block.
  run "$B"/bench_torchscript_peer --reps 3 --steps 5 --threads 2 --json $R/torchscript_peer.json
  # The engine's step alone (no loop around it) vs PyTorch's, each config's threads.
  run "$B"/bench_peer --reps 3 --families mlp,cnn,gpt,lstm_lm --json $R/bench_peer.json
  # Engine vs libtorch's C++ autograd, each config's train.threads and one thread.
  run "$B"/bench_engine_vs_libtorch --steps 10 configs/cnn.toml configs/gpt.toml configs/lstm_lm.toml configs/mlp.toml \
    --out $R/engine_vs_libtorch.json
  run "$B"/bench_engine_vs_libtorch --steps 10 configs/cnn.toml configs/gpt.toml configs/lstm_lm.toml configs/mlp.toml \
    --set train.threads=1 --out $R/engine_vs_libtorch_1thread.json
}

section_memory() {
  local B=$BUILD/bench
  run "$B"/bench_budget_curve --steps 7 --out $R/budget_curve.json
  run "$B"/bench_chain_yardstick --batch 4096 --width 256 --out $R/chain_yardstick.json
  run "$B"/bench_chain_yardstick --batch 1024 --width 256 --steps 1 --out $R/chain_yardstick_1024.json
  # The knapsack against the exact keep/recompute optimum (needs CBC: coinor-libcbc-dev).
  run "$B"/bench_plan_yardstick --time-limit 120 --out $R/plan_yardstick.json
}

section_offload() {
  local B=$BUILD/bench
  run "$B"/bench_offload --no-step --reps 3 --out $R/offload.json
  run env OPENBLAS_NUM_THREADS=1 "$B"/bench_joint_plan --steps 5 --set model.n_embd=256 --set model.n_head=8 \
    --out $R/joint_plan_d256.json
}

section_planner() {
  local B=$BUILD/bench
  run "$B"/bench_plan_scaling --set train.batch_size=4 --reps 7 --out $R/plan_scaling.json
}

section_distributed() {
  local B=$BUILD/bench
  run "$B"/bench_dp_scaling --steps 20 --reps 2 --skip-convergence --skip-topologies --out $R/dp_scaling.json
  run "$B"/bench_dp_scaling --skip-speed --skip-topologies --conv-model cnn \
    --conv-filter 'N=2 none|N=2 onebit + EF|N=2 onebit, no EF' --out $R/dp_convergence_cnn.json
  run "$B"/bench_dp_scaling --skip-speed --skip-topologies --conv-model cnn \
    --conv-filter 'N=2 onebit + EF, fp32 warm-up' --out $R/dp_convergence_cnn_warmup.json
  run "$B"/bench_dp_scaling --skip-speed --skip-topologies --conv-model gpt \
    --conv-filter 'N=2 none|N=2 onebit + EF|N=2 onebit + EF, mean-|v| scale|N=2 onebit, no EF' \
    --out $R/dp_convergence_gpt.json
  run "$B"/bench_dp_scaling --skip-speed --skip-topologies --conv-model gpt \
    --conv-filter 'N=2 onebit + EF, fp32 warm-up' --out $R/dp_convergence_gpt_warmup.json
  run "$B"/bench_dp_scaling --skip-speed --skip-convergence --reps 2 --out $R/dp_topologies.json
  run "$B"/bench_dp_scaling --skip-speed --skip-convergence --reps 1 --topo-n 3 --out $R/dp_topologies_n3.json
  # Samples and wall time to 85 % test accuracy, every topology x mode at N = 2, 3, 4, without / with a straggler.
  run "$B"/bench_dp_convergence --n 2,3,4 --max-steps 600 --target 85 --out $R/dp_convergence.json
  # Model and hybrid parallelism: layouts at N = 4, the bubble, pipeline + plan at equal memory.
  run python3 bench/model_parallel.py --build "$BUILD" --steps 10 --repeats 2 --out $R/model_parallel.json
}

section_ps() {
  local B=$BUILD/bench
  run "$B"/bench_ps_store --json $R/ps_store.json
  run "$B"/bench_ps_grpc --json $R/ps_grpc.json
  run "$B"/bench_ps_grpc --trainer-only --reps 5 --steps 60 --json $R/ps_grpc_trainer.json
  ensure_movielens
  run "$PYTHON" bench/ps_ctr_peer.py --ration "$BUILD"/ration --threads 1 --seeds 8 --json $R/ps_ctr_movielens.json
  run "$PYTHON" bench/ps_ctr_peer.py --ration "$BUILD"/ration --threads 1 --init ration --seeds 3 \
    --json $R/ps_ctr_movielens_matched.json
  run "$B"/bench_ps_ctr_synthetic --only "1 epoch" --json $R/ps_ctr_synthetic.json
  # AUC vs table cap (one process per dataset) and the scoring / round timings, merged into one JSON and plot.
  local tmp=/tmp/ration-ps-evict
  [ "$DRY" = 1 ] || tmp=$(mktemp -d /tmp/ration-ps-evict.XXXXXX)
  run "$B"/bench_ps_evict --parts auc --datasets synthetic --seeds 3 --json "$tmp"/syn.json --svg "$tmp"/syn.svg
  run "$B"/bench_ps_evict --parts auc --datasets movielens --seeds 3 --json "$tmp"/ml.json --svg "$tmp"/ml.svg
  run "$B"/bench_ps_evict --parts scoring,rounds --json "$tmp"/sr.json
  run "$B"/bench_ps_evict --merge "$tmp"/syn.json,"$tmp"/ml.json,"$tmp"/sr.json --json $R/ps_evict.json \
    --svg $R/ps_evict_auc.svg
  [ "$DRY" = 1 ] || rm -rf "$tmp"
  run "$B"/bench_ps_modes --model cnn --n 2 --steps 300 --batch 64 --delay-ms 60 --reps 1 --out $R/ps_modes.json
  run "$B"/bench_ps_online --json $R/ps_online.json
}

section_sequence() {
  local B=$BUILD/bench
  run "$B"/bench_seq_memory --max-t 1000000 --lstm-max-t 100000 --peer-max-t 100000 --attn-max-t 4096 \
    --out $R/seq_memory.json
  run "$B"/bench_seq_memory --type3 1 --max-t 100000 --out $R/seq_memory_type3.json
  run "$B"/bench_seq_bptt_budget --seq-len 1024 --steps 2 --out $R/seq_bptt_budget_1024.json
  run "$B"/bench_seq_bptt_budget --seq-len 4096 --steps 2 --out $R/seq_bptt_budget_4096.json
  # Below the feasible minimum: the JSON records the planner's refusal (the bench exits 1).
  run "$B"/bench_seq_bptt_budget --seq-len 1024 --steps 2 --fraction 0.05 --out $R/seq_bptt_budget_1024_5pct.json
}

section_trace() {
  local B=$BUILD/bench
  run "$B"/bench_trace_overhead --out $R/trace_overhead.json
  run "$B"/bench_trace_overhead --reps 11 --out $R/trace_overhead_gpt.json configs/gpt.toml
}

section_settings() {
  local B=$BUILD/bench
  run "$B"/bench_peer --variants 'train.threads=1|train.threads=2' --families mlp,cnn,lstm_lm,gpt --reps 3 \
    --json $R/thread_defaults.json
  run "$B"/bench_peer --variants 'train.malloc_keep_freed=0|train.malloc_keep_freed=1GiB' --families cnn,mlp,lstm_lm \
    --threads 1 --reps 3 --steps 10 --warmup 2 --json $R/malloc_keep_freed.json
  run "$B"/bench_peer --variants 'train.malloc_keep_freed=0|train.malloc_keep_freed=1GiB' --families gpt \
    --threads 1 --reps 3 --steps 5 --warmup 1 --json $R/malloc_keep_freed_gpt.json
}

section_gpu() {
  local B=$CUDA_BUILD/bench
  run env RATION_PEER_PYTHON="$GPU_PYTHON" "$B"/bench_peer --device cuda --families gpt,lstm_lm --reps 2 --steps 20 \
    --warmup 5 --json $R/gpu_peer.json
  run env RATION_PEER_PYTHON="$GPU_PYTHON" "$B"/bench_peer --device cuda --families gpt --reps 2 --steps 20 --warmup 5 \
    --set model.n_layer=12 --set model.n_embd=768 --set model.n_head=12 --set train.batch_size=32 \
    --json $R/gpu_peer_gpt768.json
  # The planner on the GPU machine's CPU (a quiet host; planning is single-threaded and device-independent).
  run "$B"/bench_plan_scaling --set train.batch_size=4 --reps 7 --out $R/plan_scaling_gpu_host.json
}

build() {
  local dir=$1
  shift
  if [ ! -f "$dir/CMakeCache.txt" ]; then
    if [ "$dir" = "$CUDA_BUILD" ]; then
      echo "run_all: no $dir/ (configure the CUDA build first: scripts/gpu-check.sh build)" >&2
      [ "$DRY" = 1 ] || exit 2
    else
      local gen=()
      command -v ninja >/dev/null && gen=(-G Ninja)
      printf '+ cmake -S . -B %q %s\n' "$dir" "${gen[*]}"
      [ "$DRY" = 1 ] || cmake -S . -B "$dir" "${gen[@]}"
    fi
  fi
  printf '+ cmake --build %q --target %s\n' "$dir" "$*"
  [ "$DRY" = 1 ] || cmake --build "$dir" --target "$@"
}

# ---- arguments ----
sections=()
for a in "$@"; do
  case "$a" in
    --list) LIST=1 ;;
    --dry-run | -n) DRY=1 ;;
    --no-build) BUILD_FIRST=0 ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "run_all: unknown option '$a' (see --help)" >&2; exit 2 ;;
    *)
      if [ -z "${TARGETS[$a]+set}" ]; then
        echo "run_all: unknown section '$a'; sections: ${ALL_SECTIONS[*]}" >&2
        exit 2
      fi
      sections+=("$a")
      ;;
  esac
done

if [ "$LIST" = 1 ]; then
  DRY=1
  [ ${#sections[@]} -gt 0 ] || sections=("${ALL_SECTIONS[@]}")
  for s in "${sections[@]}"; do
    echo "== $s (targets: ${TARGETS[$s]})"
    "section_$s"
  done
  echo "default run: ${CPU_SECTIONS[*]} (gpu only when named)"
  exit 0
fi

[ ${#sections[@]} -gt 0 ] || sections=("${CPU_SECTIONS[@]}")

# Build every target the chosen sections need, once per build folder.
if [ "$BUILD_FIRST" = 1 ]; then
  cpu_targets=() gpu_targets=()
  for s in "${sections[@]}"; do
    if [ "$s" = gpu ]; then
      read -r -a t <<<"${TARGETS[$s]}"
      gpu_targets+=("${t[@]}")
    else
      read -r -a t <<<"${TARGETS[$s]}"
      cpu_targets+=("${t[@]}")
    fi
  done
  if [ ${#cpu_targets[@]} -gt 0 ]; then
    read -r -a cpu_targets <<<"$(printf '%s\n' "${cpu_targets[@]}" | sort -u | tr '\n' ' ')"
    build "$BUILD" "${cpu_targets[@]}"
  fi
  if [ ${#gpu_targets[@]} -gt 0 ]; then
    read -r -a gpu_targets <<<"$(printf '%s\n' "${gpu_targets[@]}" | sort -u | tr '\n' ' ')"
    build "$CUDA_BUILD" "${gpu_targets[@]}"
  fi
fi

[ "$DRY" = 1 ] || mkdir -p "$R"
for s in "${sections[@]}"; do
  echo "== $s"
  start=$SECONDS
  "section_$s"
  [ "$DRY" = 1 ] || echo "== $s done in $((SECONDS - start)) s"
done

if [ ${#FAILED[@]} -gt 0 ]; then
  echo "run_all: ${#FAILED[@]} command(s) exited non-zero (their JSON may still have been written):" >&2
  printf '  %s\n' "${FAILED[@]}" >&2
  exit 1
fi
