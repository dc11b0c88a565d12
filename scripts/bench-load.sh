#!/usr/bin/env bash
# The watcher's start-up load, binaries alternated on the same data:
#   scripts/bench-load.sh ROUNDS BINARY...
# e.g. scripts/bench-load.sh 3 /tmp/cachewright-before target/release/cachewright
# Uses the data set scripts/bench-watch.sh left on its one-node servers
# (database benchwatch, prefix app:, resume tokens saved), so run that
# first at the size wanted. Each round runs every BINARY's `watch` alone
# once, in turn (see watch_alone in lib.sh), and prints its load time,
# CPU and peak RSS. The machine's pace drifts within the hour: compare
# binaries within a round, not rounds.
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
[ $# -ge 2 ] || die "usage: scripts/bench-load.sh ROUNDS BINARY..."
ROUNDS=$1
shift
for binary in "$@"; do [ -x "$binary" ] || die "$binary is not an executable"; done
start_bench_servers single
export MONGODB_URI="mongodb://127.0.0.1:$MONGO_PORT/?directConnection=true"
export MONGODB_DB=benchwatch REDIS_URL="redis://127.0.0.1:${PORTS[0]}" CACHEWRIGHT_PREFIX="app:"
export CACHEWRIGHT_STATUS_PREFIX="cachewright:"
[ "$(redis-cli -p "${PORTS[0]}" DBSIZE)" -gt 0 ] || die "the benchmark's Redis is empty: run scripts/bench-watch.sh first"
OUT="$ROOT/target/bench-load"
mkdir -p "$OUT"
printf '%-6s %-40s %10s %10s %10s\n' round binary load_ms cpu_s peak_mib
for round in $(seq 1 "$ROUNDS"); do
  n=0
  for binary in "$@"; do
    n=$((n + 1))
    result=$(watch_alone "$binary" "$OUT/watch-$round-$n.log")
    read -r load hwm _ cpu <<<"$result"
    printf '%-6s %-40s %10s %10s %10s\n' "$round" "$binary" "$load" "$cpu" "$hwm"
  done
done
