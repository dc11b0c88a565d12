#!/usr/bin/env bash
# Shared helpers for the project's scripts: install what is missing, start
# and stop local servers. Sourced, not run.

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PATH="$HOME/.cargo/bin:$PATH"
SECANTUS_VERSION="0.5.3-beta.196"
RUN_DIR="${CACHEWRIGHT_RUN_DIR:-$ROOT/target/local-servers}"

say() { printf '==> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

apt_install() {
  command -v apt-get >/dev/null || die "apt-get not found; install $* by hand"
  say "installing $* from Debian packages"
  if [ "$(id -u)" -ne 0 ]; then SUDO=sudo; else SUDO=; fi
  $SUDO apt-get update -qq >/dev/null || true
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null \
    || die "apt-get install $* failed"
}

ensure_redis() {
  command -v redis-server >/dev/null || apt_install redis-server
  command -v redis-cli >/dev/null || apt_install redis-tools
}

# promtool checks the alert rules and parses /metrics; docker-compose
# validates the compose file without an engine; openssl makes the TLS
# test's certificates.
ensure_ops_tools() {
  command -v promtool >/dev/null || apt_install prometheus
  command -v docker-compose >/dev/null || apt_install docker-compose
  command -v openssl >/dev/null || apt_install openssl
}

# The contract's independent checker (scripts/contract_check.py, run by
# tests/contract_check.rs) reads MongoDB and Redis with these clients.
PY_CLIENTS="pymongo==4.20.1 redis==8.2.0"
ensure_python_clients() {
  python3 -c 'import pymongo, redis, bson.datetime_ms' 2>/dev/null && return
  command -v python3 >/dev/null || apt_install python3
  python3 -m pip --version >/dev/null 2>&1 || apt_install python3-pip
  say "installing $PY_CLIENTS with pip"
  # shellcheck disable=SC2086
  python3 -m pip install -q $PY_CLIENTS 2>/dev/null \
    || python3 -m pip install -q --break-system-packages $PY_CLIENTS \
    || die "pip install $PY_CLIENTS failed"
}

# SecantusDB is a separate GPL program: installed as a binary and run as a
# process, never linked into cachewright.
ensure_secantus() {
  if command -v secantusd-rs >/dev/null; then return; fi
  command -v cmake >/dev/null || apt_install cmake
  say "installing secantusd-rs $SECANTUS_VERSION with cargo (about 7 minutes, once per machine)"
  cargo install secantus-mdb --version "$SECANTUS_VERSION" --ignore-rust-version --locked \
    || die "cargo install secantus-mdb failed; see the output above"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Waits until $1 listens, up to $3 tenths of a second (default 100).
wait_port() {
  local port=$1 what=$2 tries=${3:-100} i
  for i in $(seq 1 "$tries"); do
    if port_open "$port"; then return 0; fi
    sleep 0.1
  done
  die "$what did not start listening on 127.0.0.1:$port; see $RUN_DIR/*.log"
}

# Starts Redis on $1 unless something already listens there.
start_redis() {
  local port=$1
  if port_open "$port"; then say "redis already listening on $port"; return; fi
  mkdir -p "$RUN_DIR"
  say "starting redis-server on 127.0.0.1:$port"
  redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
    --daemonize yes --pidfile "$RUN_DIR/redis-$port.pid" --logfile "$RUN_DIR/redis-$port.log" \
    || die "redis-server failed to start; see $RUN_DIR/redis-$port.log"
  wait_port "$port" redis-server
}

# Starts SecantusDB on $1 unless something already listens there.
start_mongo() {
  local port=$1
  if port_open "$port"; then say "a MongoDB-wire server already listens on $port"; return; fi
  mkdir -p "$RUN_DIR"
  say "starting secantusd-rs on 127.0.0.1:$port (data in $RUN_DIR/mongo-$port)"
  nohup secantusd-rs --port "$port" --storage-path "$RUN_DIR/mongo-$port" \
    --cache-size 1G --log-file-max 16MB --log-level WARNING --oplog-max-entries 20000000 \
    >"$RUN_DIR/mongo-$port.log" 2>&1 &
  echo $! >"$RUN_DIR/mongo-$port.pid"
  # Opening a data directory that holds millions of videos takes it
  # longer than 10 s (the benchmarks' 5M data set did).
  wait_port "$port" secantusd-rs 1200
}

# Starts a Redis Cluster of masters on the given ports (no replicas)
# unless the first already runs one.
start_cluster() {
  local port
  if port_open "$1" && redis-cli -p "$1" CLUSTER INFO 2>/dev/null | grep -q "cluster_state:ok"; then
    say "a Redis Cluster already runs on $*"; return
  fi
  for port in "$@"; do
    port_open "$port" && die "port $port is taken by something that is not this benchmark's cluster"
    mkdir -p "$RUN_DIR/cluster-$port"
    # The cluster keeps no data: a node table left by a stopped one would
    # make the node refuse to join a new cluster.
    rm -f "$RUN_DIR/cluster-$port/nodes.conf"
    redis-server --port "$port" --bind 127.0.0.1 --save "" --appendonly no \
      --cluster-enabled yes --cluster-config-file nodes.conf --cluster-port $((port + 100)) \
      --dir "$RUN_DIR/cluster-$port" \
      --daemonize yes --pidfile "$RUN_DIR/redis-$port.pid" --logfile "$RUN_DIR/redis-$port.log" \
      || die "redis-server failed to start; see $RUN_DIR/redis-$port.log"
    wait_port "$port" redis-server
  done
  say "creating a Redis Cluster of $# masters"
  redis-cli --cluster create $(printf '127.0.0.1:%s ' "$@") --cluster-replicas 0 --cluster-yes >"$RUN_DIR/cluster-create.log" \
    || die "redis-cli --cluster create failed; see $RUN_DIR/cluster-create.log"
  for _ in $(seq 100); do
    redis-cli -p "$1" CLUSTER INFO | grep -q "cluster_state:ok" && return
    sleep 0.1
  done
  die "the Redis Cluster on $* did not become ok"
}

# The port (of those given) whose node owns key $1.
reader_port() {
  local key=$1 port; shift
  for port in "$@"; do
    local reply; reply=$(redis-cli -p "$port" GET "$key" 2>&1)
    case "$reply" in MOVED*|ASK*) ;; *) echo "$port"; return ;; esac
  done
  echo "$1"
}

# Stops the servers started under $RUN_DIR and waits until they exited
# (a SecantusDB still closing holds its storage lock against a restart).
stop_servers() {
  local f pid pids=()
  for f in "$RUN_DIR"/*.pid; do
    [ -e "$f" ] || continue
    pid=$(cat "$f")
    kill "$pid" 2>/dev/null && pids+=("$pid")
    rm -f "$f"
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  done
}

# The benchmarks' own servers, so that no other data is touched: one Redis
# on 16379 (`single`) or a 3-master cluster on 17001-17003 (`cluster`),
# and SecantusDB on 27117. Sets PORTS (the Redis ports), MONGO_PORT and
# RUN_DIR.
# After start_bench_servers: builds the release binaries, makes the
# output directory $OUT (target/$1) and points cachewright at the
# benchmark's servers, database $2 and prefix app:.
bench_setup() {
  cargo build --release --quiet --features dev --bin cachewright --bin cachewright-dev
  OUT="$ROOT/target/$1"
  mkdir -p "$OUT"
  export MONGODB_URI="mongodb://127.0.0.1:$MONGO_PORT/?directConnection=true"
  export MONGODB_DB="$2"
  export REDIS_URL="redis://127.0.0.1:${PORTS[0]}"
  export CACHEWRIGHT_PREFIX="app:"
}

# Runs `$1 watch` in a process of its own, as deployed (the image's
# allocator setting: Dockerfile, MIMALLOC_ARENA_EAGER_COMMIT), logging to
# $2. It resumes from the saved tokens (no rebuild), loads its state and
# catches up; once the streams caught up, prints its load time (ms, from
# its log), peak and settled RSS (MiB) and CPU (s) from /proc, and stops
# it.
watch_alone() {
  local binary=$1 log=$2 pid caught="" load hwm rss cpu
  MIMALLOC_ARENA_EAGER_COMMIT=0 "$binary" watch >"$log" 2>&1 &
  pid=$!
  for _ in $(seq 1 1200); do
    if grep -q "caught up with the loaded documents" "$log"; then caught=1; break; fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if [ -z "$caught" ]; then
    kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true
    die "$binary watch did not catch up within 120 s; see $log"
  fi
  hwm=$(awk '/VmHWM/ {print int($2/1024)}' "/proc/$pid/status" 2>/dev/null)
  rss=$(awk '/VmRSS/ {print int($2/1024)}' "/proc/$pid/status" 2>/dev/null)
  cpu=$(awk -v hz="$(getconf CLK_TCK)" '{printf "%.2f", ($14 + $15) / hz}' "/proc/$pid/stat" 2>/dev/null)
  kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null || true
  load=$(sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -o 'load_ms=[0-9]*' | tail -1 | cut -d= -f2)
  echo "${load:-?} ${hwm:-?} ${rss:-?} ${cpu:-?}"
}

start_bench_servers() {
  local setup=$1
  MONGO_PORT=27117
  RUN_DIR="$ROOT/target/bench-servers"
  ensure_redis
  ensure_secantus
  case "$setup" in
    single) PORTS=(16379) ;;
    cluster) PORTS=(17001 17002 17003) ;;
    *) die "setup must be single or cluster, not $setup" ;;
  esac
  if [ "$setup" = single ]; then start_redis "${PORTS[0]}"; else start_cluster "${PORTS[@]}"; fi
  start_mongo "$MONGO_PORT"
}
