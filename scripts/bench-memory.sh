#!/usr/bin/env bash
# The full rebuild's memory at scale:
#   scripts/bench-memory.sh [VIDEOS] [single|cluster]   (default 500000, single)
# Starts the benchmark's own servers (as scripts/bench.sh), generates a
# fresh data set of VIDEOS videos, then runs `cachewright rebuild` twice:
# into an empty Redis, then over its own keys (the scheduled case, with
# the sweep's full pass). Prints each run's wall time, CPU time and peak
# RSS, and the peak against the target of 128 MiB plus 100 bytes a video.
# Redis needs about 1.7 KB a video (8 GiB at 5,000,000).
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
VIDEOS="${1:-500000}"
SETUP="${2:-single}"
start_bench_servers "$SETUP"
bench_setup "bench-memory-$VIDEOS-$SETUP" bench
say "generating $VIDEOS videos (seed 1)"
target/release/cachewright-dev fixtures generate --yes --videos "$VIDEOS" --seed 1 2>"$OUT/generate.log"
for p in "${PORTS[@]}"; do redis-cli -p "$p" FLUSHALL >/dev/null; done
for run in empty warm; do
  say "full rebuild ($run Redis)"
  target/release/cachewright rebuild --summary-json "$OUT/$run.json" >"$OUT/$run.txt" 2>"$OUT/$run.log"
done
python3 - "$OUT" "$VIDEOS" <<'PY'
import json, sys
out, videos = sys.argv[1], int(sys.argv[2])
target = 128 + 100 * videos / 1048576
for run in ("empty", "warm"):
    c = json.load(open(f"{out}/{run}.json"))
    peak = c["peak_rss_bytes"] / 1048576
    print(f"{videos} videos, {run:5} Redis: {c['duration_seconds']:7.2f} s wall, {c['cpu_seconds']:7.2f} s CPU, "
          f"peak RSS {peak:6.1f} MiB (target {target:.0f} MiB: {'met' if peak <= target else 'MISSED'})")
PY
