#!/usr/bin/env bash
# Measures the redis crate's own cluster client (`cluster-async`) beside
# cachewright's router through a paused master, its forced fail-over, its
# return, and a master restart, on a 6-node cluster the test starts:
#   scripts/cluster-client-check.sh
# Prints one table row per phase (the suite runs the same test, giving
# the crate 15 s a phase instead of 60). Run it after upgrading the redis crate;
# ARCHITECTURE.md ("Redis Cluster") records the last result.
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
ensure_redis
ensure_secantus
CLUSTER_CLIENT_CRATE_PATIENCE_SECS=60 cargo test --locked --test cluster_client -- --nocapture 2>&1 | grep -E '^\||^redis crate|panicked|test result'
