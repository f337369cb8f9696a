#!/usr/bin/env bash
# Results must not change across a refactor (issue 29): run the default sweep, a compare, a run
# with a replay log, its replay and every study at the quick size from the checkout at REPO, and
# write the SHA-256 of every CSV and Parquet file they produce to OUT/SHA256SUMS (paths relative to
# OUT). Compare two checkouts with `diff A/SHA256SUMS B/SHA256SUMS`.
#   bash scripts/check_identical.sh REPO OUT
# e.g. a baseline from a commit:  git worktree add /tmp/base <commit> && bash scripts/check_identical.sh /tmp/base /tmp/out-base
set -euo pipefail
REPO=$(cd "$1" && pwd)
OUT=$(mkdir -p "$2" && cd "$2" && pwd)
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
W() { (cd "$REPO" && python -m wispsim.cli "$@"); }
echo "checking $REPO ($(git -C "$REPO" rev-parse --short HEAD)) -> $OUT"
W sweep --policy wisp --classes 2,4,6,8 --out "$OUT/sweep"
W compare --policies wisp,centralized,centralized-sd,sled --classes 4 --devices 20:80:20 --out "$OUT/compare"
W run --policy wisp --devices 40 --classes 8 --seed 3 --out "$OUT/run" --log "$OUT/run/log.parquet"
W replay "$OUT/run/log.parquet" --out "$OUT/replay"
rm -rf "$REPO/experiments/quick"
W experiment run --all --quick
cp -r "$REPO/experiments/quick" "$OUT/quick"
# points/ folders are a cache: a sweep's may also hold a point a spare worker simulated ahead and no
# search asked for, which depends on timing (wispsim.study.lookahead); the tables name every point
(cd "$OUT" && find . \( -name '*.csv' -o -name '*.parquet' \) -not -path '*/points/*' | sort \
  | xargs sha256sum > SHA256SUMS)
echo "$(wc -l < "$OUT/SHA256SUMS") files hashed: $OUT/SHA256SUMS"
