#!/usr/bin/env bash
# plan_html_render.sh — `ration plan --html` and `ration train --html` checked in a real browser
# (headless Chromium).
# Owns: the end-to-end check of the memory picture: the page is self-contained (no external script,
#       style sheet, image or URL), its script runs to its end without errors or console output, and
#       the screenshot is a non-trivial image; from train, the page also draws the measured training
#       step. Does not own the page (src/ration/plan/html.cpp).
# usage: plan_html_render.sh RATION_CLI SOURCE_DIR [COPY_PNG_TO] [train]
#   COPY_PNG_TO: also keep the screenshot there (docs/plan.png is made this way); "" for none.
#   train: make the page with `ration train ... --html` (3 steps) instead of `ration plan ... --html`.
# Exit 77 (skipped) when Chromium is not installed; scripts/install-deps.sh installs it.
set -euo pipefail
cli=$(realpath "$1")
src=$(realpath "$2")
keep_png=${3:+$(realpath -m "$3")}
view=${4:-plan}
browser=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$browser" ]; then
  echo "SKIP: chromium is not installed (scripts/install-deps.sh installs Debian's chromium)"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

if [ "$view" = train ]; then
  (cd "$src" && "$cli" train configs/cnn.toml --steps 3 --memory-budget 60MiB --html "$tmp/plan.html" \
     --set train.checkpoint_dir= --set train.eval_batches=2 --json > "$tmp/report.json")
  [ -s "$tmp/plan.html" ] || fail "ration train --html wrote no page"
  python3 - "$tmp/plan.html" "$tmp/report.json" <<'PY' || fail "the page does not draw the measured training step"
import json, re, sys
page, report = open(sys.argv[1]).read(), json.load(open(sys.argv[2]))
m = re.search(r'<path id="series-trained" class="trained" data-points="([0-9]+)" d="M', page)
assert m and int(m.group(1)) > 10, "no measured training-step curve"
assert 'id="trained-note"' in page, "no note on the training step"
traced = [s["step"] for s in report["trace"]["traced"]]
assert traced == [1, 2], traced  # the default range: the two steps after the first
print("training step curve:", m.group(1), "points; traced steps", traced)
PY
else
  (cd "$src" && "$cli" plan configs/cnn.toml --memory-budget 60MiB --html "$tmp/plan.html" > "$tmp/plan.txt")
  [ -s "$tmp/plan.html" ] || fail "ration plan --html wrote no page"
fi
if grep -Eiqn '<(link|img|iframe|object|embed|base)[ >]|<script[^>]*src=|(src|href)=|https?:|url\(|@import' "$tmp/plan.html"; then
  grep -Ein '<(link|img|iframe|object|embed|base)[ >]|<script[^>]*src=|(src|href)=|https?:|url\(|@import' "$tmp/plan.html" | head -5 >&2
  fail "the page is not self-contained (it names an external resource)"
fi
grep -q '<svg' "$tmp/plan.html" || fail "no inline SVG chart"
grep -q 'id="budget-line"' "$tmp/plan.html" || fail "no budget line"

flags=(--headless --disable-gpu --hide-scrollbars --no-first-run --no-default-browser-check
       --user-data-dir="$tmp/profile" --enable-logging=stderr --v=0 --virtual-time-budget=5000)
if [ "$(id -u)" = 0 ]; then flags+=(--no-sandbox); fi
timeout 120 "$browser" "${flags[@]}" --screenshot="$tmp/plan.png" --window-size=1280,1400 \
  "file://$tmp/plan.html" > "$tmp/shot.out" 2> "$tmp/shot.log" || { tail -20 "$tmp/shot.log" >&2; fail "chromium --screenshot failed"; }
timeout 120 "$browser" "${flags[@]}" --dump-dom "file://$tmp/plan.html" > "$tmp/dom.html" 2> "$tmp/dom.log" ||
  { tail -20 "$tmp/dom.log" >&2; fail "chromium --dump-dom failed"; }

grep -q 'data-ready="1"' "$tmp/dom.html" || fail "the page's script did not run to its end"
if grep -q 'data-errors=' "$tmp/dom.html"; then
  grep -o 'data-errors="[^"]*"' "$tmp/dom.html" >&2
  fail "the page raised script errors"
fi
if grep -Eh 'CONSOLE|Uncaught' "$tmp/shot.log" "$tmp/dom.log"; then fail "console output while rendering"; fi
rows=$(grep -c '<tr data-group=' "$tmp/dom.html" || true)
[ "$rows" -gt 0 ] || fail "the rendered page has no group rows"
# Sorting runs in the browser: #sort=bytes:desc puts the largest group first.
timeout 120 "$browser" "${flags[@]}" --dump-dom "file://$tmp/plan.html#sort=bytes:desc" > "$tmp/sorted.html" 2> "$tmp/sort.log" ||
  { tail -20 "$tmp/sort.log" >&2; fail "chromium --dump-dom (sorted) failed"; }
if grep -Eh 'CONSOLE|Uncaught' "$tmp/sort.log"; then fail "console output while sorting"; fi
python3 - "$tmp/sorted.html" <<'PY' || fail "the table did not sort by bytes, largest first"
import re, sys
page = open(sys.argv[1]).read()
assert 'aria-sort="descending"' in page, "no column marked as sorted"
body = page[page.index("<tbody>"):]
sizes = [int(v) for v in re.findall(r'<tr data-group="[0-9]+"><td[^>]*>[^<]*</td><td[^>]*>[^<]*</td><td[^>]*>[^<]*</td><td class="num" data-v="([0-9]+)"', body)]
assert len(sizes) > 1 and sizes == sorted(sizes, reverse=True), sizes
print("sorted rows by bytes:", sizes[:5], "...")
PY
[ -s "$tmp/plan.png" ] || fail "no screenshot written"
python3 "$src/tests/cli/png_stats.py" "$tmp/plan.png" --min-width 1280 --min-height 1400 --min-colors 16 --min-ink 0.04
if [ -n "$keep_png" ]; then cp "$tmp/plan.png" "$keep_png"; fi
echo "plan_html_render ($view): OK ($rows group rows rendered)"
