#!/bin/sh
# Starts Redis with two users from the environment (.env, never committed):
# `default` for administrators and health checks, and `cachewright` with
# exactly the least-privilege rule `cachewright acl` prints for the
# default prefixes (app:, cachewright:). tests/ops.rs checks that the
# rule below is that output. Passwords must not contain spaces.
set -eu
: "${REDIS_ADMIN_PASSWORD:?set REDIS_ADMIN_PASSWORD in .env}"
: "${REDIS_CACHEWRIGHT_PASSWORD:?set REDIS_CACHEWRIGHT_PASSWORD in .env}"
umask 077
cat >/tmp/users.acl <<ACL
user default on >${REDIS_ADMIN_PASSWORD} ~* &* +@all
user cachewright reset on >${REDIS_CACHEWRIGHT_PASSWORD} ~app:* ~cachewright:* &cachewright:progress:* -@all +ping +echo +info +role +scan +type +ttl +exists +get +smembers +lrange +zrange +llen +scard +zcard +hgetall +memory|usage +subscribe +psubscribe +unsubscribe +punsubscribe +select +cluster|slots +cluster|nodes +asking +set +del +unlink +expire +sadd +srem +smove +rpush +zadd +rename +hset +hincrby +incr +multi +exec +discard +watch +unwatch +eval +evalsha +script|load +publish
ACL
exec redis-server --save "" --appendonly no --aclfile /tmp/users.acl
