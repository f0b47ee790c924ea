#!/bin/bash
# ps_servers.sh BUILD_DIR SOURCE_DIR — a group of dedicated parameter servers (dist.servers,
# distributed/ps_group_aggregator.cpp), through `ration launch --servers S`:
#  1. synchronous rounds, 2 workers: S = 2 servers end with the same weights and optimiser state as S = 1,
#     bitwise, and as rank 0 serving as the colocated synchronous server — SGD with Nesterov momentum (its
#     buffers travel with the weights), clipping at 0.05
#     (so the servers' exchanged gradient norms decide every step's scale);
#  2. backup workers (k = 1 of 3, worker 2 slowed by 60 ms a step) on 2 servers: every server drops worker 2's
#     late pushes and the run ends;
#  3. bounded asynchrony (s = 1, worker 1 slowed) on 2 servers: no push is applied more than 1 version late.
set -u
build=$1 src=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
common=(--set train.threads=1 --set train.eval_batches=2 --set train.log_every=5 --set dist.topology=ps)
train() {  # train NAME STEPS LAUNCH_ARGS... -- TRAIN_ARGS...
  local name=$1 steps=$2
  shift 2
  local launch=()
  while [ "$1" != "--" ]; do launch+=("$1"); shift; done
  shift
  timeout 300 "$build/ration" launch --master-port 0 "${launch[@]}" -- train "$src/configs/mlp.toml" --steps "$steps" \
    "${common[@]}" --set train.checkpoint_dir="$dir/$name" --report "$dir/$name.json" "$@" >"$dir/$name.log" 2>&1 ||
    { cat "$dir/$name.log"; fail "$name: the launch failed"; }
}
sync_args=(--set optim.clip_grad_norm=0.05)
train one 24 -n 2 --servers 1 -- "${sync_args[@]}"
train two 24 -n 2 --servers 2 -- "${sync_args[@]}"
train colocated 24 -n 2 -- "${sync_args[@]}"
for f in model.pt trainer.pt; do
  cmp -s "$dir/one/ckpt-24/$f" "$dir/two/ckpt-24/$f" || fail "S=2 and S=1 differ in ckpt-24/$f"
  cmp -s "$dir/one/ckpt-24/$f" "$dir/colocated/ckpt-24/$f" || fail "S=1 and the colocated server differ in ckpt-24/$f"
done
python3 - "$dir/two.json" <<'PY' || fail "S=2 report"
import json, sys
d = json.load(open(sys.argv[1]))["dist"]
assert d["servers"] == 2 and d["workers"] == 2, d
assert len(d["server_stats"]) == 2 and all(s["versions"] == 24 for s in d["server_stats"]), d["server_stats"]
assert sum(d["elements_per_server"]) == 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10, d["elements_per_server"]
print("S=2: servers", d["elements_per_server"], "elements, 24 versions each")
PY
echo "sync: S=2 == S=1 == colocated, bitwise (model.pt, trainer.pt)"

train backup 30 -n 3 --servers 2 -- --set dist.backup_workers=1 --set dist.debug_delay_ms=60 --set dist.debug_delay_rank=2
python3 - "$dir/backup.json" <<'PY' || { cat "$dir/backup.log"; fail "backup workers on 2 servers"; }
import json, sys
d = json.load(open(sys.argv[1]))["dist"]
for j, s in enumerate(d["server_stats"]):
    assert s["dropped_by_rank"][2] > 0 and s["dropped_by_rank"][0] == 0, (j, s)
    print("backup: server", j, "versions", s["versions"], "dropped by rank", s["dropped_by_rank"])
PY
train async 30 -n 2 --servers 2 -- --set dist.sync=async --set dist.max_staleness=1 --set dist.debug_delay_ms=30 \
  --set dist.debug_delay_rank=1
python3 - "$dir/async.json" <<'PY' || { cat "$dir/async.log"; fail "bounded asynchrony on 2 servers"; }
import json, sys
d = json.load(open(sys.argv[1]))["dist"]
for j, s in enumerate(d["server_stats"]):
    assert s["max_staleness"] <= 1 and sum(s["pushes_by_rank"]) == sum(s["included_by_rank"]), (j, s)
    print("async: server", j, "versions", s["versions"], "max staleness", s["max_staleness"])
PY
echo PASS
