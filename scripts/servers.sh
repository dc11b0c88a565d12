#!/usr/bin/env bash
# Usage: scripts/servers.sh start|stop
# Installs what is missing, then starts (or stops) a local Redis on
# $REDIS_PORT (default 6379) and SecantusDB on $MONGO_PORT (default 27017).
source "$(dirname "$0")/lib.sh"
case "${1:-start}" in
  start)
    ensure_redis
    ensure_secantus
    start_redis "${REDIS_PORT:-6379}"
    start_mongo "${MONGO_PORT:-27017}"
    ;;
  stop) stop_servers ;;
  *) die "usage: scripts/servers.sh start|stop" ;;
esac
