#!/bin/bash
# merge_shards.sh BUILD_DIR SOURCE_DIR [TRAIN ARGS...] — a split gpt (the [parallel] layout in the extra
# arguments, on N = 2 processes) trains 4 steps with checkpoints; `ration checkpoint merge` makes one
# model.pt of its shards, which Debian's PyTorch loads with torch.load: the same names and shapes as one
# process's checkpoint, every value finite, and the merged weights differ from the initial ones.
set -u
build=$1 src=$2
shift 2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
common=(--steps 4 --set train.threads=1 --set model.n_layer=2 --set model.n_embd=32 --set model.block_size=32
        --set model.n_head=2 --set train.eval_every=0 --set train.eval_batches=1 --set train.checkpoint_every=2)
"$build/ration" launch -n 2 --master-port 0 -- train "$src/configs/gpt.toml" "${common[@]}" \
  --set train.checkpoint_dir="$dir/split" "$@" >"$dir/log" 2>&1 || { cat "$dir/log"; echo "FAIL: training"; exit 1; }
"$build/ration" train "$src/configs/gpt.toml" "${common[@]}" --set train.checkpoint_dir="$dir/one" --json \
  >/dev/null 2>&1 || { echo "FAIL: the one-process run"; exit 1; }
"$build/ration" checkpoint merge "$dir/split" --out "$dir/merged.pt" || { echo "FAIL: merge"; exit 1; }
"$build/ration" checkpoint merge "$dir/split" --step 2 --out "$dir/merged2.pt" || { echo "FAIL: merge --step 2"; exit 1; }
/usr/bin/python3 - "$dir" <<'PY' || { echo "FAIL: torch.load"; exit 1; }
import sys, torch
d = sys.argv[1]
merged = torch.load(f"{d}/merged.pt")
at2 = torch.load(f"{d}/merged2.pt")
one = torch.load(f"{d}/one/ckpt-4/model.pt")
assert sorted(merged) == sorted(one), (sorted(set(merged) ^ set(one)))
for k, v in one.items():
    assert merged[k].shape == v.shape, (k, merged[k].shape, v.shape)
    assert torch.isfinite(merged[k]).all(), k
changed = sum(int(not torch.equal(merged[k], at2[k])) for k in one)
assert changed > len(one) // 2, f"only {changed} of {len(one)} weights changed between steps 2 and 4"
print(f"merged {len(merged)} weights; names and shapes equal one process's; {changed} changed from step 2 to 4")
PY
echo PASS
