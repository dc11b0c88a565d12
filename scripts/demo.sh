#!/usr/bin/env bash
# The main job end to end on local defaults: install what is missing,
# start Redis and SecantusDB, load a small generated sample data set, run a
# full rebuild and print its summary.
#   VIDEOS=5000 SEED=1 scripts/demo.sh
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
ensure_redis
ensure_secantus
start_redis 6379
start_mongo 27017
say "building cachewright and its development tools"
cargo build --release --quiet --features dev --bin cachewright --bin cachewright-dev
BIN="$ROOT/target/release/cachewright"
# The sample goes into a scratch database of its own, replaced on each run;
# a database named by the caller is never replaced without asking.
YES=()
if [ -z "${MONGODB_DB:-}" ]; then export MONGODB_DB=cachewright_demo; YES=(--yes); fi
say "generating the sample data set (${VIDEOS:-5000} videos, seed ${SEED:-1}) into database $MONGODB_DB"
"$ROOT/target/release/cachewright-dev" fixtures generate "${YES[@]}" --videos "${VIDEOS:-5000}" --seed "${SEED:-1}"
say "running a full rebuild"
"$BIN" rebuild "$@"
