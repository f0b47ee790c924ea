#!/usr/bin/env bash
# Installs the built tree into a temporary prefix, builds a downstream project with find_package(ration)
# and runs it. Usage: run.sh SOURCE_DIR BINARY_DIR
set -euo pipefail
src=$1; bin=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cmake --install "$bin" --prefix "$work/prefix" >/dev/null
cmake -S "$src/tests/install" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DEXAMPLE_SOURCE="$src/examples/custom_model.cpp" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$work/build" >/dev/null
"$work/build/downstream"
