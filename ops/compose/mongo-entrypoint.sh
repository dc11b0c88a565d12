#!/bin/bash
# MongoDB with authentication in a one-node replica set (change streams
# need one): members authenticate to each other with a key file, written
# here from MONGO_REPLICA_KEY (.env) and readable by mongod alone. Then the
# image's own entrypoint creates the root user and runs the init scripts.
set -euo pipefail
: "${MONGO_REPLICA_KEY:?set MONGO_REPLICA_KEY in .env}"
umask 077
printf '%s\n' "$MONGO_REPLICA_KEY" >/tmp/mongo-keyfile
chown mongodb:mongodb /tmp/mongo-keyfile
exec docker-entrypoint.sh "$@"
