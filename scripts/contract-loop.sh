#!/usr/bin/env bash
# The independent reading of the contract (scripts/contract_check.py) over
# many seeds, against the release binary run as its own process:
#   scripts/contract-loop.sh [FIRST_SEED] [COUNT] [VIDEOS] [single|cluster] [watch|serve]
#                        (default seed 100, 10 seeds, 1500 videos, single, watch)
# Per seed: fresh hostile data (database `hostile` on the benchmarks'
# SecantusDB, 27117), an emptied Redis (16400, or the benchmarks' cluster
# on 17001-17003), `cachewright rebuild`, a check; then a `cachewright
# watch` process: a round of changes and a check once it has applied
# them; a round and a `kill -9` as soon as it is made; a round while it is
# down; a restart and a check. Home sections of 5, so that their cut falls
# inside ties. With `serve`, the process is `cachewright serve` instead,
# its scheduled jobs every few seconds (a full rebuild every 20 s, the
# index families' refresh every 10 s, the counts' every 7 s), so changes
# land before, during and after jobs, and the kill may fall inside one.
# Stops at the first difference and prints it; running the
# script again from that seed replays it. The test suite runs a shorter
# form of this sequence (150 and 40 changes, `watch` only) on three seeds,
# two on one node and one on a cluster (tests/contract_check.rs); this
# runs it on as many as you have time for.
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
FIRST="${1:-100}"
COUNT="${2:-10}"
VIDEOS="${3:-1500}"
SETUP="${4:-single}"
MODE="${5:-watch}"
RUN_DIR="$ROOT/target/bench-servers"
OUT="$ROOT/target/contract-loop"
mkdir -p "$OUT"
ensure_redis
ensure_secantus
ensure_python_clients
case "$SETUP" in
  single) PORTS=(16400); start_redis 16400 ;;
  cluster) PORTS=(17001 17002 17003); start_cluster "${PORTS[@]}" ;;
  *) die "setup must be single or cluster, not $SETUP" ;;
esac
start_mongo 27117
cargo build --release --quiet --bin cachewright
BIN="$ROOT/target/release/cachewright"
export MONGODB_URI="mongodb://127.0.0.1:27117/?directConnection=true" MONGODB_DB=hostile
export REDIS_URL="redis://127.0.0.1:${PORTS[0]}" CACHEWRIGHT_PREFIX="hostile:"
export CACHEWRIGHT_STATUS_PREFIX="hostile-status:" CACHEWRIGHT_HOME_LIMIT=5
# A short lease, so that a process started after a `kill -9` takes over
# within seconds.
export CACHEWRIGHT_LEASE_SECONDS=2
checker() { python3 scripts/contract_check.py "$@"; }
case "$MODE" in
  watch) RUN=(watch --window-ms 50) ;;
  serve)
    mkdir -p "$OUT/schedules"
    cat >"$OUT/schedules/fast.toml" <<'TOML'
[[schedule]]
name = "full-rebuild"
cron = "*/20 * * * * *"
job = "rebuild"

[[schedule]]
name = "index-refresh"
cron = "5,15,25,35,45,55 * * * * *"
job = "refresh"
families = ["video:category:index", "video:category:list", "video:tag:list", "video:list:home", "tag:search"]

[[schedule]]
name = "count-refresh"
cron = "*/7 * * * * *"
job = "refresh"
families = ["category:video:count"]
TOML
    RUN=(serve --schedules "$OUT/schedules" --http 127.0.0.1:3099 --window-ms 50) ;;
  *) die "mode must be watch or serve, not $MODE" ;;
esac

# Waits until Redis agrees with the checker, up to 90 s; otherwise prints
# the differences and stops.
agrees() {
  local what=$1 deadline=$((SECONDS + 90))
  until checker check >"$OUT/diff.txt" 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      cat "$OUT/diff.txt"
      die "$what: the cache still differs from the independent reading of the contract (log: $OUT/watch.log)"
    fi
    sleep 0.3
  done
}

# Waits until the process $1 streams, as its own heartbeat says (under
# `serve`, its watcher's part of it).
streaming() {
  local pid=$1 beat deadline=$((SECONDS + 30))
  while [ "$SECONDS" -lt "$deadline" ]; do
    kill -0 "$pid" 2>/dev/null || die "the watcher $pid ended; see $OUT/watch.log"
    beat=$(redis-cli -p "${PORTS[0]}" -c GET "${CACHEWRIGHT_STATUS_PREFIX}health:current")
    python3 -c 'import json,sys; b=json.loads(sys.argv[1] or "{}"); w=b.get("watcher", b); sys.exit(0 if b.get("pid")==int(sys.argv[2]) and w.get("streaming") else 1)' \
      "$beat" "$pid" && return 0
    sleep 0.1
  done
  die "the watcher $pid did not stream within 30 s; see $OUT/watch.log"
}

watch_pid=
trap '[ -n "$watch_pid" ] && kill -9 "$watch_pid" 2>/dev/null' EXIT
start_watch() {
  "$BIN" "${RUN[@]}" >>"$OUT/watch.log" 2>&1 &
  watch_pid=$!
  streaming "$watch_pid"
}

for seed in $(seq "$FIRST" $((FIRST + COUNT - 1))); do
  for p in "${PORTS[@]}"; do redis-cli -p "$p" FLUSHALL >/dev/null; done
  : >"$OUT/watch.log"
  checker generate --seed "$seed" --videos "$VIDEOS" >/dev/null
  "$BIN" rebuild >"$OUT/rebuild.txt" 2>"$OUT/rebuild.log" || die "seed $seed: the rebuild failed; see $OUT/rebuild.log"
  checker check >"$OUT/diff.txt" 2>&1 || { cat "$OUT/diff.txt"; die "seed $seed: the rebuild differs"; }
  start_watch
  checker mutate --seed $((seed * 10 + 1)) --changes 300 --videos "$VIDEOS" >/dev/null
  agrees "seed $seed, a round of changes"
  checker mutate --seed $((seed * 10 + 2)) --changes 300 --videos "$VIDEOS" >/dev/null
  kill -9 "$watch_pid"; wait "$watch_pid" 2>/dev/null || true
  checker mutate --seed $((seed * 10 + 3)) --changes 100 --videos "$VIDEOS" >/dev/null
  start_watch
  agrees "seed $seed, after a kill -9 and a restart"
  kill -TERM "$watch_pid"; wait "$watch_pid" 2>/dev/null || die "seed $seed: the watcher did not stop cleanly"
  watch_pid=
  say "seed $seed: the rebuild and the $MODE process agree with the independent reading"
done
say "$COUNT seeds from $FIRST agree ($VIDEOS videos, $SETUP, $MODE)"
