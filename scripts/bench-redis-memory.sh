#!/usr/bin/env bash
# What Redis's encoding settings do to this contract's keys:
#   scripts/bench-redis-memory.sh [VIDEOS]   (default 500000)
# Starts the benchmark's own servers (as scripts/bench.sh), generates a
# data set of VIDEOS videos, then for each variant below empties Redis,
# sets the variant with CONFIG SET (it applies to keys created after it),
# rebuilds into the empty Redis, reads `used_memory` and
# `cachewright memory`, and rebuilds again over the keys it wrote (the
# scheduled case: every big key is replaced by a rename, the old value
# freed). Prints one row per variant: memory, the category index family's
# bytes, both rebuilds' wall time, and Redis's p99 of EXEC and RENAME.
# Nothing here changes a user's Redis; DEPLOYMENT.md gives the figures.
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
VIDEOS="${1:-500000}"
start_bench_servers single
bench_setup "bench-redis-memory-$VIDEOS" bench
cli() { redis-cli -p "${PORTS[0]}" "$@"; }
say "generating $VIDEOS videos (seed 1)"
target/release/cachewright-dev fixtures generate --yes --videos "$VIDEOS" --seed 1 2>"$OUT/generate.log"
DEFAULT_ZSET=$(cli CONFIG GET zset-max-listpack-entries | tail -1)
VARIANTS=(
  "defaults|zset-max-listpack-entries $DEFAULT_ZSET|lazyfree-lazy-server-del no"
  "zset-max-listpack-entries 512|zset-max-listpack-entries 512|lazyfree-lazy-server-del no"
  "zset-max-listpack-entries 2048|zset-max-listpack-entries 2048|lazyfree-lazy-server-del no"
  "lazyfree-lazy-server-del yes|zset-max-listpack-entries $DEFAULT_ZSET|lazyfree-lazy-server-del yes"
)
for i in "${!VARIANTS[@]}"; do
  IFS='|' read -r name zset lazy <<<"${VARIANTS[$i]}"
  say "variant: $name"
  cli FLUSHALL >/dev/null
  # shellcheck disable=SC2086
  cli CONFIG SET $zset >/dev/null
  # shellcheck disable=SC2086
  cli CONFIG SET $lazy >/dev/null
  for run in empty warm; do
    cli CONFIG RESETSTAT >/dev/null
    target/release/cachewright rebuild --summary-json "$OUT/$i-$run.json" >"$OUT/$i-$run.txt" 2>"$OUT/$i-$run.log"
    cli INFO latencystats | grep -E "_(exec|rename):" >"$OUT/$i-$run-latency.txt" || true
    if [ "$run" = empty ]; then
      cli INFO memory | grep -E "^used_memory:" | cut -d: -f2 | tr -d '\r' >"$OUT/$i-used.txt"
      target/release/cachewright memory --format json >"$OUT/$i-memory.json" 2>"$OUT/$i-memory.log"
      # The encoding of the largest category's index.
      biggest=$(cli --scan --pattern 'app:video:category:index:*' 2>/dev/null \
        | while read -r k; do echo "$(cli ZCARD "$k") $k"; done | sort -n | tail -1 || true)
      echo "${biggest%% *} members: $(cli OBJECT ENCODING "${biggest#* }")" >"$OUT/$i-encoding.txt"
    fi
  done
  echo "$name" >"$OUT/$i-name.txt"
done
cli CONFIG SET zset-max-listpack-entries "$DEFAULT_ZSET" lazyfree-lazy-server-del no >/dev/null
python3 - "$OUT" "${#VARIANTS[@]}" "$VIDEOS" <<'PY'
import json, re, sys
out, n, videos = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def p99(path, cmd):
    for line in open(path):
        if line.startswith(f"latency_percentiles_usec_{cmd}:"):
            m = re.search(r"p99=([0-9.]+)", line)
            return f"{float(m.group(1)) / 1000:.2f} ms" if m else "?"
    return "–"
print(f"{videos} videos")
print("| variant | used_memory | video:category:index | the largest index key | rebuild empty / warm | warm EXEC p99 | warm RENAME p99 |")
print("|---|---|---|---|---|---|---|")
for i in range(n):
    name = open(f"{out}/{i}-name.txt").read().strip()
    used = int(open(f"{out}/{i}-used.txt").read().strip())
    mem = json.load(open(f"{out}/{i}-memory.json"))
    index = next(f["total_bytes"] for f in mem["families"] if f["family"] == "video:category:index")
    enc = open(f"{out}/{i}-encoding.txt").read().strip()
    empty = json.load(open(f"{out}/{i}-empty.json"))["duration_seconds"]
    warm = json.load(open(f"{out}/{i}-warm.json"))["duration_seconds"]
    lat = f"{out}/{i}-warm-latency.txt"
    print(f"| {name} | {used / 1048576:.1f} MiB | {index / 1048576:.1f} MiB | {enc} | {empty:.2f} / {warm:.2f} s "
          f"| {p99(lat, 'exec')} | {p99(lat, 'rename')} |")
PY
