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
say "building cachewright"
cargo build --release --quiet
BIN="$ROOT/target/release/cachewright"
say "generating the sample data set (${VIDEOS:-5000} videos, seed ${SEED:-1})"
"$BIN" fixtures generate --videos "${VIDEOS:-5000}" --seed "${SEED:-1}"
say "running a full rebuild"
"$BIN" rebuild "$@"
