#!/usr/bin/env bash
# What a category's flip costs Redis inside the write script, per key:
#   scripts/bench-flip-script.sh [SETS] [KEYS_PER_CALL] [ROUNDS]
#                       (default 2000000 sets, 500 keys a call, 3 rounds)
# Starts a scratch redis-server on 127.0.0.1:16500, fills it with SETS
# two-member `video:categories`-like sets, then runs the project's own
# write script (WRITE_SCRIPT, read out of src/sink/topology/cluster.rs)
# over random keys: each key's `SADD` of a member, then its `SREM`, each
# behind its size guard and with its `EXPIRE`, once as plain commands
# (13 arguments a key) and once as `FLIPS` blocks (3 a key), alternated.
# Prints `EVALSHA`'s microseconds a key from `INFO commandstats`.
source "$(dirname "$0")/lib.sh"
cd "$ROOT"
SETS="${1:-2000000}"
PER_CALL="${2:-500}"
ROUNDS="${3:-3}"
PORT=16500
python3 -c "import redis" 2>/dev/null || python3 -m pip install --quiet redis || die "pip install redis failed"
DIR=$(mktemp -d)
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --dir "$DIR" --daemonize yes \
  --logfile "$DIR/redis.log" || die "redis-server did not start on $PORT"
trap 'redis-cli -p "$PORT" shutdown nosave >/dev/null 2>&1; rm -rf "$DIR"' EXIT
for _ in $(seq 1 50); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.1; done
python3 - "$PORT" "$SETS" "$PER_CALL" "$ROUNDS" <<'PY'
import random, re, sys
import redis
port, sets, per_call, rounds = (int(a) for a in sys.argv[1:])
src = open("src/sink/topology/cluster.rs").read()
body = re.search(r'macro_rules! run_commands.*?concat!\(\s*"local first = ",\s*\$first,\s*"(.*?)"\s*\)', src, re.S)
head = re.search(r'pub const WRITE_SCRIPT: &str = concat!\(\s*"\\\n(.*?)",\s*run_commands!\("2"\)', src, re.S)
if not body or not head:
    sys.exit("error: WRITE_SCRIPT not found in src/sink/topology/cluster.rs; update this script")
script = head.group(1) + "local first = 2" + body.group(1)
r = redis.Redis(port=port)
key = lambda i: "app:video:categories:%024x" % (i * 7919)
p = r.pipeline(transaction=False)
for i in range(sets):
    p.sadd(key(i), "c%d" % (i % 2000), "c%d" % ((i * 3) % 2000 + 1))
    p.expire(key(i), 86400)
    if i % 10000 == 9999:
        p.execute()
p.execute()
sha = r.script_load(script)

def plain(keys, sizes, op, member):
    args = [""]
    for k, n in zip(keys, sizes):
        args += [4, "SIZEIS", k, "SCARD", n, 3, op, k, member, 3, "EXPIRE", k, 86400]
    return args

def flips(keys, sizes, op, member):
    args = ["", 3 + 3 * len(keys), "FLIPS", op, member]
    for k, n in zip(keys, sizes):
        args += [k, n, 86400]
    return args

print(f"{sets} sets, {per_call} keys a call, EVALSHA µs a key (SADD then SREM of one member each)")
for rnd in range(1, rounds + 1):
    line = []
    for name, encode in (("plain", plain), ("FLIPS", flips)):
        r.config_resetstat()
        done = 0
        for _ in range(40):
            keys = list(dict.fromkeys(key(random.randrange(sets)) for _ in range(per_call)))
            sizes = [r.scard(k) for k in keys]
            r.evalsha(sha, 0, *encode(keys, sizes, "SADD", "bench"))
            r.evalsha(sha, 0, *encode(keys, [n + 1 for n in sizes], "SREM", "bench"))
            done += 2 * len(keys)
        usec = r.info("commandstats")["cmdstat_evalsha"]["usec"]
        line.append(f"{name} {usec / done:.2f}")
    print(f"  round {rnd}: " + ", ".join(line))
PY
