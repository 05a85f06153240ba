#!/usr/bin/env bash
# Order dependence and load sensitivity, before they reach CI (issue 29).  Not part of .ci/run
# (it takes as long as the suite and more); run it before a release or on a schedule:
#
#   1. the whole suite (scripts/test.sh) in a random order, with a printed seed
#   2. the engine modules that failed only in full runs (the event hub, the cluster, the lease
#      tests), each test repeated CHASQUI_REPEAT times (default 3) while two busy loops load the
#      machine's cores
#
# CHASQUI_TEST_SEED replays an order.  The dependency matrix's newest venv (scripts/matrix.sh,
# part of .ci/run) runs its suites shuffled too, in one pinned order (seed 197530602) that was
# proven green, so CI fails only when a change breaks it; this script draws fresh orders.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
SEED="${CHASQUI_TEST_SEED:-$(( (RANDOM << 15) | RANDOM ))}"
REPEAT="${CHASQUI_REPEAT:-3}"
echo "==> order check 1/2: the whole suite in a random order, seed $SEED (replay: CHASQUI_TEST_SEED=$SEED $0)"
scripts/test.sh --random-order-bucket=global --random-order-seed="$SEED"

echo "==> order check 2/2: engine and cluster modules, each test $REPEAT times, cores loaded"
hogs=()
for _ in 1 2; do
  ( end=$((SECONDS + 3600)); while [ $SECONDS -lt $end ]; do :; done ) &
  hogs+=($!)
done
trap 'kill "${hogs[@]}" 2>/dev/null || true' EXIT
scripts/test.sh --count="$REPEAT" tests/engine/test_event_hub.py tests/engine/test_engine_cluster.py \
  tests/engine/test_engine_lease.py
