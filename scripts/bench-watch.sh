#!/usr/bin/env bash
# The watcher benchmark alone, under a change mix:
#   scripts/bench-watch.sh [VIDEOS] [single|cluster] [platform|videos|title] [RATE] [SECONDS] [SEED]
#                       (default 58000 videos, single, platform, 1000/s, 10 s, seed 5)
# The seed picks the mix's changes. With a fixed one, two runs on fresh
# data make the same changes, so they flip the same categories: a
# category's flip reaches all its members, and which ones a run flips
# moves its cost more than most changes to the code do.
# Starts the benchmark's own servers (as scripts/bench.sh), generates a
# fresh data set, rebuilds it, then runs `cachewright-dev bench --watch`:
# event-to-Redis latency at RATE changes/s for SECONDS (beside MongoDB's own
# delivery of those changes to a bare change stream), then the sustained
# rate at which the streaming watcher applies a flood of the same mix
# (sent as fast as MongoDB takes it), the rate at which a watcher
# drains a backlog already in its change streams (held back from it by a
# forwarder while MongoDB took it), the members planning read per
# change and the RSS while it did; then a restarted `cachewright watch`
# alone: its load and its footprint.
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
VIDEOS="${1:-58000}"
SETUP="${2:-single}"
MIX="${3:-platform}"
RATE="${4:-1000}"
SECONDS_PER_PHASE="${5:-10}"
SEED="${6:-5}"
start_bench_servers "$SETUP"
bench_setup "bench-watch-$VIDEOS-$SETUP-$MIX" benchwatch
export CACHEWRIGHT_STATUS_PREFIX="cachewright:"
for p in "${PORTS[@]}"; do redis-cli -p "$p" FLUSHALL >/dev/null; done
say "generating $VIDEOS videos"
target/release/cachewright-dev fixtures generate --yes --videos "$VIDEOS" --seed 1 2>"$OUT/generate.log"
say "rebuilding"
target/release/cachewright rebuild >"$OUT/rebuild.txt" 2>"$OUT/rebuild.log"
say "watcher under the $MIX mix: $RATE changes/s for $SECONDS_PER_PHASE s, then a flood"
target/release/cachewright-dev bench --yes --watch --mix "$MIX" --rate "$RATE" --seconds "$SECONDS_PER_PHASE" \
  --seed "$SEED" --out "$OUT/watch.json" 2>"$OUT/watch.log"
python3 "$ROOT/scripts/print_watch.py" "$OUT/watch.json" "$VIDEOS" "$SETUP"
# The restarted watcher's load (it resumes from tokens, so no rebuild).
LOAD_MS=$(sed 's/\x1b\[[0-9;]*m//g' "$OUT/watch.log" | grep -o 'load_ms=[0-9]*' | tail -1 | cut -d= -f2)
echo "  state load on restart    ${LOAD_MS:-?} ms"
# The watcher's own footprint, as deployed (see watch_alone).
ALONE=$(watch_alone "$ROOT/target/release/cachewright" "$OUT/watch-alone.log")
read -r _ HWM RSS _ <<<"$ALONE"
PER_VIDEO=$(python3 -c "print(round(${RSS:-0} * 1048576 / $VIDEOS))")
echo "  cachewright watch alone  peak ${HWM:-?} MiB, settled ${RSS:-?} MiB (about $PER_VIDEO bytes per video)"
