#!/usr/bin/env bash
# Benchmark of the full rebuild against reading and writing alone.
#   scripts/bench.sh [VIDEOS] [SEED] [single|cluster]
#                                         (default 58000 videos, seed 1, single)
# Starts its own Redis (one node on 16379, or a 3-master Redis Cluster on
# 17001-17003) and SecantusDB on 27117 so that no other data is touched,
# generates a fresh data set, then measures:
#   (p) the physical write limit: the rebuild's final state as plain
#       commands, `redis-cli --pipe` per master, all masters in parallel;
#   (a) reading the four collections with the driver, no processing;
#   (b) writing the rebuild's final keys through cachewright's sink, no
#       reading or planning (the ops are planned first, untimed);
#   (c) a full rebuild into an empty Redis: wall time, CPU time, peak RSS.
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
VIDEOS="${1:-58000}"
SEED="${2:-1}"
SETUP="${3:-single}"
start_bench_servers "$SETUP"
REDIS_PORT=${PORTS[0]}
cargo build --release --quiet --features dev --bin cachewright --bin cachewright-dev
BIN="$ROOT/target/release/cachewright"
# The benchmark's own servers and database: replacing them needs no asking.
DEV=("$ROOT/target/release/cachewright-dev")
OUT="$ROOT/target/bench-$VIDEOS-$SETUP"
mkdir -p "$OUT"
export MONGODB_URI="mongodb://127.0.0.1:$MONGO_PORT/?directConnection=true"
export MONGODB_DB="bench"
export REDIS_URL="redis://127.0.0.1:$REDIS_PORT"
export CACHEWRIGHT_PREFIX="app:"
flush() { for p in "${PORTS[@]}"; do redis-cli -p "$p" FLUSHALL >/dev/null; done; }

say "generating $VIDEOS videos (seed $SEED)"
"${DEV[@]}" fixtures generate --yes --videos "$VIDEOS" --seed "$SEED" 2>"$OUT/generate.log"
flush
say "(a) read only and (b) write only"
rm -rf "$OUT/resp"
"${DEV[@]}" bench --yes --resp-dir "$OUT/resp" --out "$OUT/parts.json" 2>"$OUT/bench.log"
flush
say "(p) physical limit: redis-cli --pipe of the final state, per master, in parallel"
# Waits on these pipes only: servers this script started also run in the
# background.
pipes=()
start=$(date +%s.%N)
for f in "$OUT"/resp/*.resp; do
  port=$(basename "$f" .resp); port=${port##*_}
  redis-cli -p "$port" --pipe <"$f" >"$OUT/pipe-$port.txt" 2>&1 &
  pipes+=($!)
done
wait "${pipes[@]}"
end=$(date +%s.%N)
python3 -c "import json,sys; json.dump({'pipe_seconds': $end - $start}, open('$OUT/pipe.json','w'))"
grep -h "errors" "$OUT"/pipe-*.txt | grep -v "errors: 0," && die "redis-cli --pipe reported errors"
flush
# Readers: one client doing GETs of a small key (on the master that owns
# it), idle for two seconds and through the whole warm rebuild
# (`cachewright-dev reader` stops when told; `redis-benchmark -n` stopped
# after a count, about the rebuild's first second).
READER_PORT=$(reader_port bench:reader "${PORTS[@]}")
reader() { "${DEV[@]}" reader --addr "127.0.0.1:$READER_PORT" --key bench:reader --out "$@"; }
cli() { redis-cli -p "$REDIS_PORT" "$@"; }
# What a writer's atomic unit is: MULTI/EXEC on one node, a script per
# master and batch (EVAL) on a cluster. Its latency histogram over every
# master.
UNIT=exec; [ "$SETUP" = cluster ] && UNIT=eval
resetstat() { for p in "${PORTS[@]}"; do redis-cli -p "$p" CONFIG RESETSTAT >/dev/null; done; }
histogram() { for p in "${PORTS[@]}"; do redis-cli -p "$p" LATENCY HISTOGRAM "$UNIT"; done >"$1"; }
# Redis's own percentiles of the unit (INFO latencystats, exact where the
# histogram only gives power-of-two buckets), one line per master; and of
# the adds and the rename, which a key too big for one unit is written
# with outside any unit (a stage filled command by command, then renamed).
percentiles() {
  for p in "${PORTS[@]}"; do
    redis-cli -p "$p" INFO latencystats | grep -E "_($UNIT|rpush|zadd|sadd|rename):"
  done >"$1"
}
say "(c) full rebuild into an empty Redis"
resetstat
"$BIN" rebuild --summary-json "$OUT/rebuild.json" >"$OUT/rebuild.txt" 2>"$OUT/rebuild.log"
histogram "$OUT/exec-empty.txt"
percentiles "$OUT/percentiles-empty.txt"
say "(c') full rebuild again, over its own keys (sweep path), with a reader"
redis-cli -p "$READER_PORT" SET bench:reader value >/dev/null
reader "$OUT/reader-idle.json" --seconds 2
resetstat
rm -f "$OUT/rebuild-warm.done"
reader "$OUT/reader-busy.json" --until-file "$OUT/rebuild-warm.done" &
busy_reader=$!
# Whatever ends the script (a failed rebuild under `set -e`), the reader
# stops with it: a client left reading would slow every later run.
trap 'touch "$OUT/rebuild-warm.done"' EXIT
"$BIN" rebuild --summary-json "$OUT/rebuild-warm.json" >"$OUT/rebuild-warm.txt" 2>"$OUT/rebuild-warm.log"
touch "$OUT/rebuild-warm.done"
wait "$busy_reader" || die "the reader beside the warm rebuild failed"
histogram "$OUT/exec-warm.txt"
percentiles "$OUT/percentiles-warm.txt"

say "watcher: latency at 1,000 changes/s of the platform mix, then the sustained apply rate"
flush
"${DEV[@]}" bench --yes --watch --mix platform --rate 1000 --seconds 10 --out "$OUT/watch.json" 2>"$OUT/watch.log"

python3 - "$OUT" "$VIDEOS" "$SETUP" "$UNIT" <<'PY'
import json, sys
out, videos, setup, unit = sys.argv[1:5]
p = json.load(open(f"{out}/parts.json"))
pipe = json.load(open(f"{out}/pipe.json"))["pipe_seconds"]
c = json.load(open(f"{out}/rebuild.json"))
w = json.load(open(f"{out}/rebuild-warm.json"))
a, b, cw = p["read_seconds"], p["write_seconds"], c["duration_seconds"]
mib = lambda x: f"{x / 1048576:.1f} MiB"
print(f"benchmark: {videos} videos, {p['documents']} documents, {p['ops']} keys, setup {setup}")
print(f"(p) physical write limit       {pipe:8.2f} s (redis-cli --pipe per master, in parallel)")
print(f"(a) read only                  {a:8.2f} s")
print(f"(b) write only                 {b:8.2f} s")
print(f"    planning alone             {p['plan_wall_seconds']:8.2f} s wall, {p['plan_cpu_seconds']:.2f} s CPU")
print(f"(c) full rebuild, empty Redis  {cw:8.2f} s wall, {c['cpu_seconds']:.2f} s CPU, peak RSS {mib(c['peak_rss_bytes'])}")
print(f"(c') full rebuild, warm        {w['duration_seconds']:8.2f} s wall, {w['cpu_seconds']:.2f} s CPU, peak RSS {mib(w['peak_rss_bytes'])}")
print(f"c / max(a, b)                  {cw / max(a, b):8.2f}")
print(f"c / (a + b)                    {cw / (a + b):8.2f}")
print(f"c / max(a, p)                  {cw / max(a, pipe):8.2f}")
print(f"redis used_memory after        {mib(c['used_memory_after'])}")
def exec_p99(path):
    # redis-cli prints, per master: the command, calls, N, histogram_usec,
    # then bucket/cumulative pairs. Buckets are merged over the masters.
    words = open(path).read().split()
    calls, buckets = 0, {}
    for i, w in enumerate(words):
        if w != "calls":
            continue
        calls += int(words[i + 1])
        j = words.index("histogram_usec", i) + 1
        prev = 0
        while j + 1 < len(words) and words[j].isdigit() and words[j + 1].isdigit():
            bucket, cum = int(words[j]), int(words[j + 1])
            buckets[bucket] = buckets.get(bucket, 0) + cum - prev
            prev = cum
            j += 2
    seen = 0
    for bucket in sorted(buckets):
        seen += buckets[bucket]
        if seen >= 0.99 * calls:
            return f"<= {bucket / 1000:.2f} ms over {calls} {'transactions' if unit == 'exec' else 'scripts'}"
print(f"{unit.upper()} p99 (LATENCY HISTOGRAM) empty: {exec_p99(f'{out}/exec-empty.txt')}; warm: {exec_p99(f'{out}/exec-warm.txt')}")
def percentiles(path, command=unit):
    # The worst master's p50, p99 and p99.9 (percentiles of several
    # masters do not merge).
    worst = {}
    for line in open(path):
        if not line.startswith(f"latency_percentiles_usec_{command}:"):
            continue
        for part in line.strip().split(":", 1)[1].split(","):
            name, value = part.split("=")
            worst[name] = max(worst.get(name, 0.0), float(value) / 1000)
    return ", ".join(f"{name} {worst[name]:.2f} ms" for name in ("p50", "p99", "p99.9") if name in worst)
for state in ["empty", "warm"]:
    print(f"{unit.upper()} {state:5} (INFO latencystats, worst master): {percentiles(f'{out}/percentiles-{state}.txt')}")
for state in ["empty", "warm"]:
    # Each add is bounded like a unit, inside one or filling a stage.
    worst = {c: percentiles(f"{out}/percentiles-{state}.txt", c) for c in ("rpush", "zadd", "sadd", "rename")}
    print(f"  one command, {state:5} p99:  " + ", ".join(
        f"{c.upper()} {w.split('p99 ')[1].split(',')[0]}" for c, w in worst.items() if "p99 " in w))
for name in ["idle", "busy"]:
    r = json.load(open(f"{out}/reader-{name}.json"))
    label = "idle" if name == "idle" else "during warm rebuild"
    print(f"reader GET {label:20} p99 {r['p99_ms']:.2f} ms, p99.9 {r['p99_9_ms']:.2f} ms, max {r['max_ms']:.2f} ms"
          f" ({r['requests']} requests in {r['seconds']:.1f} s)")
print("keys per family:")
for fam, n in sorted(p["keys_per_family"].items()):
    print(f"  {fam:26} {n:9}")
PY
python3 "$ROOT/scripts/print_watch.py" "$OUT/watch.json" "$VIDEOS" "$SETUP"
