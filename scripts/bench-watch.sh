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
python3 - "$OUT/watch.json" "$VIDEOS" "$SETUP" <<'PY'
import json, sys
w = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]} videos, {sys.argv[3]}, mix {w['mix']} (seed {w['seed']}), window {w['window_ms']} ms")
print(f"  latency at {w['rate_per_s']}/s      p50 {w['latency_p50_ms']:.0f} ms, p99 {w['latency_p99_ms']:.0f} ms "
      f"(beyond the window p99 {w['beyond_window_p99_ms']:.0f} ms)")
print(f"  MongoDB's delivery       p50 {w['delivery_p50_ms']:.0f} ms, p99 {w['delivery_p99_ms']:.0f} ms "
      f"(sent to an event at a bare change stream)")
print(f"  sustained                {w['sustained_per_s']:.0f} changes/s ({w['sustained_updates']} in {w['sustained_seconds']:.1f} s; "
      f"MongoDB took them in {w['sent_seconds']:.1f} s)")
d = w.get('drain')
if d:
    print(f"  drained                  {d['per_s']:.0f} changes/s ({d['changes']} in {d['seconds']:.2f} s, a backlog held "
          f"back from the watcher while MongoDB took it in {d['sent_seconds']:.1f} s)")
    c = d['cpu_us_per_change']
    print(f"  drain CPU per change     cachewright {c['cachewright']:.0f} µs (state {c['state']:.0f}), "
          f"Redis {c['redis']:.0f} µs, MongoDB {c['mongodb']:.0f} µs")
    for r in d.get('redis_commands', []):
        print(f"    Redis {r['command']:<22} {r['us_per_change']:6.1f} µs, {r['calls_per_change']:.2f} calls per change")
else:
    print("  drained                  n/a (the drain phase needs a single-host mongodb:// URI)")
print(f"  members read per change  {w['visited_per_change']:.1f}")
print(f"  state CPU per change     {w['state_cpu_us_per_change']:.0f} µs (applying to the state and planning)")
print(f"  watcher RSS              peak {w['peak_rss_mib']:.0f} MiB (while applying the flood), "
      f"settled {w['settled_rss_mib']:.0f} MiB; process peak with its rebuild {w['process_peak_rss_mib']:.0f} MiB")
PY
# The restarted watcher's load (it resumes from tokens, so no rebuild).
LOAD_MS=$(sed 's/\x1b\[[0-9;]*m//g' "$OUT/watch.log" | grep -o 'load_ms=[0-9]*' | tail -1 | cut -d= -f2)
echo "  state load on restart    ${LOAD_MS:-?} ms"
# The watcher's own footprint, as deployed (see watch_alone).
ALONE=$(watch_alone "$ROOT/target/release/cachewright" "$OUT/watch-alone.log")
read -r _ HWM RSS _ <<<"$ALONE"
PER_VIDEO=$(python3 -c "print(round(${RSS:-0} * 1048576 / $VIDEOS))")
echo "  cachewright watch alone  peak ${HWM:-?} MiB, settled ${RSS:-?} MiB (about $PER_VIDEO bytes per video)"
