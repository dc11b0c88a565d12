#!/usr/bin/env bash
# Benchmark of the full rebuild against reading and writing alone.
#   scripts/bench.sh [VIDEOS] [SEED]      (default 58000 videos, seed 1)
# Starts its own Redis and SecantusDB on ports 16379 / 27117 so that no
# other data is touched, generates a fresh data set, then measures:
#   (a) reading the four collections with the driver, no processing;
#   (b) writing the rebuild's final keys with pipelining, no reading or
#       planning (the ops are planned first, untimed, then replayed);
#   (c) a full rebuild into an empty Redis: wall time, CPU time, peak RSS.
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
VIDEOS="${1:-58000}"
SEED="${2:-1}"
REDIS_PORT=16379
MONGO_PORT=27117
RUN_DIR="$ROOT/target/bench-servers"
ensure_redis
ensure_secantus
start_redis "$REDIS_PORT"
start_mongo "$MONGO_PORT"
cargo build --release --quiet --features dev --bin cachewright --bin cachewright-dev
BIN="$ROOT/target/release/cachewright"
# The benchmark's own servers and database: replacing them needs no asking.
DEV=("$ROOT/target/release/cachewright-dev")
OUT="$ROOT/target/bench-$VIDEOS"
mkdir -p "$OUT"
export MONGODB_URI="mongodb://127.0.0.1:$MONGO_PORT/?directConnection=true"
export MONGODB_DB="bench"
export REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
export CACHEWRIGHT_PREFIX="app:"
flush() { redis-cli -p "$REDIS_PORT" FLUSHALL >/dev/null; }

say "generating $VIDEOS videos (seed $SEED)"
"${DEV[@]}" fixtures generate --yes --videos "$VIDEOS" --seed "$SEED" 2>"$OUT/generate.log"
flush
say "(a) read only and (b) write only"
"${DEV[@]}" bench --yes --out "$OUT/parts.json" 2>"$OUT/bench.log"
flush
# Readers: one client doing GETs of a small key, idle and during a rebuild.
reader() { redis-benchmark -p "$REDIS_PORT" -c 1 -n "$1" -t get >"$2" 2>&1; }
cli() { redis-cli -p "$REDIS_PORT" "$@"; }
say "(c) full rebuild into an empty Redis"
cli CONFIG RESETSTAT >/dev/null
"$BIN" rebuild --summary-json "$OUT/rebuild.json" >"$OUT/rebuild.txt" 2>"$OUT/rebuild.log"
cli LATENCY HISTOGRAM exec >"$OUT/exec-empty.txt"
say "(c') full rebuild again, over its own keys (sweep path), with a reader"
cli SET bench:reader value >/dev/null
reader 20000 "$OUT/reader-idle.txt"
cli CONFIG RESETSTAT >/dev/null
reader 40000 "$OUT/reader-busy.txt" &
"$BIN" rebuild --summary-json "$OUT/rebuild-warm.json" >"$OUT/rebuild-warm.txt" 2>"$OUT/rebuild-warm.log"
wait
cli LATENCY HISTOGRAM exec >"$OUT/exec-warm.txt"

say "watcher: latency at 1,000 updates/s, then the sustained apply rate"
flush
"${DEV[@]}" bench --yes --watch --rate 1000 --seconds 10 --out "$OUT/watch.json" 2>"$OUT/watch.log"

python3 - "$OUT" "$VIDEOS" <<'PY'
import json, sys
out, videos = sys.argv[1], sys.argv[2]
p = json.load(open(f"{out}/parts.json"))
c = json.load(open(f"{out}/rebuild.json"))
w = json.load(open(f"{out}/rebuild-warm.json"))
a, b, cw = p["read_seconds"], p["write_seconds"], c["duration_seconds"]
mib = lambda x: f"{x / 1048576:.1f} MiB"
print(f"benchmark: {videos} videos, {p['documents']} documents, {p['ops']} keys")
print(f"(a) read only                  {a:8.2f} s")
print(f"(b) write only                 {b:8.2f} s")
print(f"    planning alone             {p['plan_wall_seconds']:8.2f} s wall, {p['plan_cpu_seconds']:.2f} s CPU")
print(f"(c) full rebuild, empty Redis  {cw:8.2f} s wall, {c['cpu_seconds']:.2f} s CPU, peak RSS {mib(c['peak_rss_bytes'])}")
print(f"(c') full rebuild, warm        {w['duration_seconds']:8.2f} s wall, {w['cpu_seconds']:.2f} s CPU, peak RSS {mib(w['peak_rss_bytes'])}")
print(f"c / max(a, b)                  {cw / max(a, b):8.2f}")
print(f"c / (a + b)                    {cw / (a + b):8.2f}")
print(f"redis used_memory after        {mib(c['used_memory_after'])}")
def exec_p99(path):
    # redis-cli prints: exec, calls, N, histogram_usec, then bucket/cumulative pairs.
    words = open(path).read().split()
    calls = int(words[words.index("calls") + 1])
    pairs = words[words.index("histogram_usec") + 1:]
    for bucket, count in zip(pairs[::2], pairs[1::2]):
        if int(count) >= 0.99 * calls:
            return f"<= {int(bucket) / 1000:.2f} ms over {calls} transactions"
def reader(path, q):
    for line in open(path):
        if "% <=" in line and float(line.split("%")[0]) >= q:
            return float(line.split()[2])
print(f"EXEC p99 (LATENCY HISTOGRAM)   empty: {exec_p99(f'{out}/exec-empty.txt')}; warm: {exec_p99(f'{out}/exec-warm.txt')}")
for name in ["idle", "busy"]:
    f = f"{out}/reader-{name}.txt"
    label = "idle" if name == "idle" else "during warm rebuild"
    print(f"reader GET {label:20} p99 {reader(f, 99)} ms, p99.9 {reader(f, 99.9)} ms")
wb = json.load(open(f"{out}/watch.json"))
print(f"watcher, {wb['rate_per_s']} updates/s for {wb['updates_sent']} updates, window {wb['window_ms']} ms:")
print(f"  event-to-Redis latency       p50 {wb['latency_p50_ms']:.0f} ms, p99 {wb['latency_p99_ms']:.0f} ms")
print(f"  beyond the window            p50 {wb['beyond_window_p50_ms']:.0f} ms, p99 {wb['beyond_window_p99_ms']:.0f} ms")
print(f"  sustained apply rate         {wb['sustained_per_s']:.0f} updates/s ({wb['sustained_updates']} in {wb['sustained_seconds']:.2f} s)")
print("keys per family:")
for fam, n in sorted(p["keys_per_family"].items()):
    print(f"  {fam:26} {n:9}")
PY
