#!/usr/bin/env bash
# Installs every Debian 12 package ration needs to build, test and benchmark. Idempotent; run as root
# (or with sudo). Skips apt entirely when everything is already installed.
set -euo pipefail
PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git
  libtorch-dev libopenblas0-pthread libgloo-dev zlib1g-dev
  libcli11-dev libtomlplusplus-dev nlohmann-json3-dev libgtest-dev libbenchmark-dev
  coinor-libcbc-dev  # the exact plan yardstick (src/ration/plan/milp.h): CBC, a MILP solver
  libgrpc++-dev libprotobuf-dev protobuf-compiler-grpc protobuf-compiler libabsl-dev librocksdb-dev openssl
  python3-torch python3-torchvision dataset-fashion-mnist  # python3-torchvision: scripts/export_model.py --torchvision
  chromium fonts-dejavu-core  # tests/cli/plan_html_render.sh renders `ration plan --html` headless
)
missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi
SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"
