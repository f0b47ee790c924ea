#!/usr/bin/env bash
# Converts the MovieLens ratings shipped by Debian's r-cran-dslabs (~100k ratings) to the CSV that
# data.kind = "movielens" reads: userId,movieId,rating,timestamp,year,genres (genres pipe-separated).
# Installs r-base-core and r-cran-dslabs with apt when Rscript or dslabs is missing (root or sudo).
# Usage: scripts/movielens.sh [OUT.csv]   (default: data/movielens.csv under the repository root)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$here/data/movielens.csv}
if ! command -v Rscript >/dev/null || ! Rscript -e 'library(dslabs)' >/dev/null 2>&1; then
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  echo "movielens: installing r-base-core r-cran-dslabs"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get install -y -qq --no-install-recommends r-base-core r-cran-dslabs >/dev/null ||
    { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends r-base-core r-cran-dslabs >/dev/null; }
fi
mkdir -p "$(dirname "$out")"
tmp="$out.tmp.$$"
Rscript "$here/scripts/movielens.R" "$tmp"
mv "$tmp" "$out"
echo "movielens: wrote $(($(wc -l <"$out") - 1)) ratings to $out"
