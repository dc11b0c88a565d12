#!/usr/bin/env bash
# Alternating rebuild rounds of two binaries on the data `scripts/bench.sh`
# left in its SecantusDB, for a before/after comparison on a machine whose
# speed drifts:
#   scripts/rounds.sh OTHER_BINARY [single|cluster] [ROUNDS]
# Each round, for the other binary and then this checkout's release
# binary: FLUSHALL, CONFIG RESETSTAT, `cachewright rebuild`, then the wall
# time and the worst master's p99 of the writer's unit (`exec` on one node,
# `eval` on a cluster) from INFO latencystats.
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
OTHER="${1:?usage: scripts/rounds.sh OTHER_BINARY [single|cluster] [ROUNDS]}"
SETUP="${2:-single}"
ROUNDS="${3:-3}"
RUN_DIR="$ROOT/target/bench-servers"
THIS="$ROOT/target/release/cachewright"
[ -x "$OTHER" ] || die "$OTHER is not an executable"
[ -d "$RUN_DIR/mongo-27117" ] || die "no bench data: run scripts/bench.sh first"
case "$SETUP" in
  single) PORTS=(16379); UNIT=exec; start_redis 16379 ;;
  cluster) PORTS=(17001 17002 17003); UNIT=eval; start_cluster "${PORTS[@]}" ;;
  *) die "setup must be single or cluster, not $SETUP" ;;
esac
start_mongo 27117
cargo build --release --quiet --bin cachewright
export MONGODB_URI="mongodb://127.0.0.1:27117/?directConnection=true" MONGODB_DB=bench
export REDIS_URL="redis://127.0.0.1:${PORTS[0]}" CACHEWRIGHT_PREFIX="app:"
one() {
  local label=$1 bin=$2 p start end p99
  for p in "${PORTS[@]}"; do
    redis-cli -p "$p" FLUSHALL >/dev/null
    redis-cli -p "$p" CONFIG RESETSTAT >/dev/null
  done
  start=$(date +%s.%N)
  "$bin" rebuild >/dev/null 2>"$RUN_DIR/rounds-$label.log" || die "$label rebuild failed; see $RUN_DIR/rounds-$label.log"
  end=$(date +%s.%N)
  p99=$(for p in "${PORTS[@]}"; do redis-cli -p "$p" INFO latencystats | grep "_$UNIT:"; done \
    | sed 's/.*p99=\([0-9.]*\).*/\1/' | sort -n | tail -1)
  printf '%-6s rebuild %6.2f s, %s p99 (worst master) %.2f ms\n' "$label" "$(echo "$end - $start" | bc)" "$UNIT" \
    "$(echo "$p99 / 1000" | bc -l)"
}
for _ in $(seq "$ROUNDS"); do
  one other "$OTHER"
  one this "$THIS"
done
