#!/usr/bin/env bash
# `ration train --json` prints nothing but one JSON report (no progress lines), and the report has the
# promised fields. Usage: json_quiet.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
out=$("$1/ration" train "$2/configs/mlp.toml" --steps 3 --json --set train.checkpoint_dir= --set train.eval_batches=1)
printf '%s' "$out" | /usr/bin/python3 -c '
import json, sys
r = json.load(sys.stdin)
for k in ("loss", "eval", "memory", "time"):
    assert k in r, k
assert len(r["loss"]) == 3 and r["memory"]["peak_bytes"] > 0 and r["time"]["step_ms_median"] > 0
print("json report ok:", len(r["loss"]), "losses, peak", r["memory"]["peak_bytes"])
'
