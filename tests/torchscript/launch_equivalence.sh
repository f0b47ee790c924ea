#!/bin/bash
# launch_equivalence.sh BUILD_DIR SOURCE_DIR [NAME EXPORT_ARGS...] — an imported PyTorch module (NAME of
# models.py, BertEncoder by default, exported with Debian's python3-torch and EXPORT_ARGS) trained data parallel by `ration launch -n 2` with batch 8 per rank equals
# one process with batch 16: after 10 SGD steps the checkpoints' weights agree within 1e-5 (relative to
# each weight's largest entry) and the losses of every step within 1e-5.
set -u
build=$1 src=$2
shift 2
name=${1:-BertEncoder}
[ $# -gt 0 ] && shift
export_args=("$@")
[ ${#export_args[@]} -eq 0 ] && export_args=(--input-shape 16 --input-dtype long --vocab 50)
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
/usr/bin/python3 -c "import torch" 2>/dev/null || { echo "SKIP: python3-torch is not installed"; exit 0; }
/usr/bin/python3 "$src/scripts/export_model.py" --file "$src/tests/torchscript/models.py" --name "$name" \
  "${export_args[@]}" --out "$dir/bert" --data 256,64 >"$dir/export.log" 2>&1 \
  || { cat "$dir/export.log"; echo "FAIL: export"; exit 1; }
common=(--steps 10 --set train.threads=1 --set optim.name=sgd --set optim.lr=0.05 --set optim.momentum=0.9
        --set train.eval_every=0 --set train.eval_batches=1 --set train.checkpoint_every=10)
"$build/ration" launch -n 2 --master-port 0 -- train "$dir/bert/config.toml" "${common[@]}" --set train.batch_size=8 \
  --set train.checkpoint_dir="$dir/dp" --report "$dir/dp.json" >"$dir/dp.log" 2>&1 \
  || { cat "$dir/dp.log"; echo "FAIL: ration launch"; exit 1; }
"$build/ration" train "$dir/bert/config.toml" "${common[@]}" --set train.batch_size=16 \
  --set train.checkpoint_dir="$dir/one" --report "$dir/one.json" >"$dir/one.log" 2>&1 \
  || { cat "$dir/one.log"; echo "FAIL: one process"; exit 1; }
/usr/bin/python3 - "$dir" <<'PY' || { echo "FAIL: not equal"; exit 1; }
import json, sys, torch
d = sys.argv[1]
a, b = torch.load(f"{d}/dp/ckpt-10/model.pt"), torch.load(f"{d}/one/ckpt-10/model.pt")
assert sorted(a) == sorted(b)
worst = max(((a[k].double() - b[k].double()).abs().max() / b[k].double().abs().max().clamp_min(1e-30)).item()
            for k in b if b[k].is_floating_point())
la, lb = json.load(open(f"{d}/dp.json"))["loss"], json.load(open(f"{d}/one.json"))["loss"]
loss = max(abs(x - y) / abs(y) for x, y in zip(la, lb))
print(f"2 ranks x batch 8 vs 1 x 16, 10 steps: worst weight difference {worst:.3g}, worst loss difference {loss:.3g}")
assert len(la) == len(lb) == 10 and worst <= 1e-5 and loss <= 1e-5
PY
echo PASS
