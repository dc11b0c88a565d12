//! Redis Cluster, the pure part: key slots, how one atomic unit
//! becomes scripts (one per master, or one per slot), the fencing epoch's
//! copy and a probe in every slot, and reading the masters' layout.
//!
//! A cluster runs a transaction only when all its keys share a slot, and
//! the contract's keys carry no hash tags. So a batch is cut by slot, and
//! all of one master's slots of it run as one script on that master
//! (atomic there, as `MULTI`/`EXEC` is); the masters run in parallel. A
//! master that refuses gets the slots again one by one, a script each.
//! Each key's replace lives in one slot, so it stays whole.
//!
//! Fencing: the epoch key and the data keys live in different slots, so
//! a `WATCH` on the epoch cannot cover a data write. Every slot therefore
//! holds a copy of the epoch (`lock:epoch:slot:{tag}`, the tag chosen to
//! hash to that slot), raised by a new leader in all 16384 slots before
//! its first write, and only ever raised. Each script first compares a
//! copy on its master with the writer's epoch, inside the same atomic
//! step as the writes. See ARCHITECTURE.md, "Fencing on a cluster".

use crate::sink::script::{Named, Script};
use crate::sink::topology::script_args::push_commands;
use crate::sink::write::unit::{Entry, Unit};
use indexmap::IndexMap;

pub use crate::keys::slot::{SLOTS, slot};
use crate::keys::status::{epoch_copy_key, probe_key};

/// The end both write scripts share: the commands from `ARGV[first]` on,
/// each as its argument count and its arguments. Every size guard
/// (`SIZEIS key size-command n`, see [`SIZE_GUARD`]) is checked before
/// any command runs; a key whose size is not `n` fails the whole step
/// with `DRIFTED`. Then the other commands run in order. An edit of a
/// guarded key (a patch's) that finds its element missing (`ZREM`,
/// `SREM`, `LREM`, a `LINSERT` pivot) or already there (`SADD`) stops the
/// step with `DRIFTED` too: the key no longer holds what the writer knew,
/// and the writer then replaces it whole (a patch's edits before it may
/// have run; the key is rewritten either way). Other keys' commands are
/// not judged: a job's `SMOVE`, cut into `SREM` and `SADD` on a cluster,
/// may find its id already moved. A block of set flips (`FLIPS op member`
/// then `key size seconds` per key, see `script_args.rs`) means, for
/// each key, the guard `SIZEIS key SCARD size`, `op key member` judged
/// the same way, and `EXPIRE key seconds`.
macro_rules! run_commands {
    ($first:literal) => {
        concat!(
            "local first = ",
            $first,
            "
local i = first
local guarded = {}
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  if ARGV[i + 1] == 'SIZEIS' then
    local found = redis.call(ARGV[i + 3], ARGV[i + 2])
    if found ~= tonumber(ARGV[i + 4]) then return redis.error_reply('DRIFTED ' .. ARGV[i + 2] .. ' holds ' .. found) end
    guarded[ARGV[i + 2]] = true
  elseif ARGV[i + 1] == 'FLIPS' then
    for j = i + 4, i + n, 3 do
      local found = redis.call('SCARD', ARGV[j])
      if found ~= tonumber(ARGV[j + 1]) then return redis.error_reply('DRIFTED ' .. ARGV[j] .. ' holds ' .. found) end
    end
  end
  i = i + n + 1
end
i = first
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  local name = ARGV[i + 1]
  if name == 'FLIPS' then
    local op, member = ARGV[i + 2], ARGV[i + 3]
    for j = i + 4, i + n, 3 do
      if redis.call(op, ARGV[j], member) == 0 then
        return redis.error_reply('DRIFTED ' .. ARGV[j] .. ' does not hold what its ' .. op .. ' expects')
      end
      redis.call('EXPIRE', ARGV[j], ARGV[j + 2])
    end
  elseif name ~= 'SIZEIS' then
    local r = redis.call(unpack(ARGV, i + 1, i + n))
    if guarded[ARGV[i + 2]] and ((name == 'LINSERT' and r <= 0) or (name == 'LREM' and r == 0)
      or ((name == 'ZREM' or name == 'SREM' or name == 'SADD') and r < n - 2)) then
      return redis.error_reply('DRIFTED ' .. ARGV[i + 2] .. ' does not hold what its ' .. name .. ' expects')
    end
  end
  i = i + n + 1
end
return 1"
        )
    };
}

/// Runs one slot's part of a batch atomically: with a non-empty epoch in
/// `ARGV[1]`, only while `KEYS[1]` (the slot's epoch copy) holds exactly
/// that epoch. The slot's probe is among the keys (see [`probe_key`]).
/// Then come the commands, each as its argument count and its
/// arguments. `FENCED n` means a newer writer raised the copy to `n`;
/// `EPOCHLOW` that the copy is missing or older (never raised, or lost
/// with a restarted master), which the writer repairs and retries.
///
/// A command named [`SIZE_GUARD`] (`SIZEIS key size-command n`) writes
/// nothing: every guard is checked before any command runs, and a key
/// whose size is not `n` fails the whole step with `DRIFTED`. That is
/// how a stage's rename carries its size check into the same atomic step
/// (see `stage.rs`). On one node the same script runs inside the fenced
/// `MULTI`/`EXEC`, unfenced (`ARGV[1]` empty).
pub const WRITE_SCRIPT: &str = concat!(
    "\
if ARGV[1] ~= '' then
  local e = redis.call('GET', KEYS[1])
  if e ~= ARGV[1] then
    if e and tonumber(e) > tonumber(ARGV[1]) then return redis.error_reply('FENCED ' .. e) end
    return redis.error_reply('EPOCHLOW ' .. (e or 'none'))
  end
end
",
    run_commands!("2")
);

/// The name of the size guard the write scripts know (see
/// [`WRITE_SCRIPT`]); Redis itself has no such command.
pub const SIZE_GUARD: &str = "SIZEIS";

/// Runs all of one master's slot parts of a batch as one atomic step,
/// declaring no keys (so the call goes to the master we choose). `ARGV`:
/// the epoch (`''` unfenced), the epoch copy of the first slot (the
/// anchor), the number of slots, each slot's probe, then the commands as
/// in [`WRITE_SCRIPT`].
///
/// Every slot is checked before anything is written: its probe must be
/// readable here, so the slot is stable on this master and no command
/// below can be redirected halfway. So the script writes everything or
/// nothing; `UNSTABLE`, `FENCED` or `EPOCHLOW` send the parts on to the
/// one-slot path, which follows the cluster. Size guards are checked
/// first, as in [`WRITE_SCRIPT`].
///
/// One copy fences the whole step: a new leader raises every copy before
/// its first write, and this step runs on one master at one instant, so
/// once the anchor (a copy on this master) is raised, any later step here
/// is refused; an earlier one lands before the new leader's writes, as
/// with per-slot checks. Undeclared keys of several slots of one node are
/// allowed to a script without flags (Redis 6 and 7, Valkey).
pub const GROUP_SCRIPT: &str = concat!(
    "\
local epoch, n = ARGV[1], tonumber(ARGV[3])
for i = 4, 3 + n do
  local probe = redis.pcall('EXISTS', ARGV[i])
  if type(probe) == 'table' and probe.err then return redis.error_reply('UNSTABLE ' .. probe.err) end
end
if epoch ~= '' then
  local e = redis.call('GET', ARGV[2])
  if e ~= epoch then
    if e and tonumber(e) > tonumber(epoch) then return redis.error_reply('FENCED ' .. e) end
    return redis.error_reply('EPOCHLOW ' .. (e or 'none'))
  end
end
",
    run_commands!("4 + n")
);

/// Raises an epoch copy to `ARGV[1]` unless it already holds more.
pub const RAISE_SCRIPT: &str = "\
local c = tonumber(redis.call('GET', KEYS[1]) or '0')
if c < tonumber(ARGV[1]) then redis.call('SET', KEYS[1], ARGV[1]) end
return 1";

/// Raises many copies on one master at once (no declared keys): `ARGV[1]`
/// the epoch, then the copies. A copy is only raised, never lowered. The
/// reply lists the positions (from 1) of the copies this master cannot
/// serve now (a slot moved or moving), for the one-slot path.
pub const RAISE_GROUP_SCRIPT: &str = "\
local epoch, left = tonumber(ARGV[1]), {}
for i = 2, #ARGV do
  local c = redis.pcall('GET', ARGV[i])
  if type(c) == 'table' and c.err then
    left[#left + 1] = i - 1
  elseif tonumber(c or '0') < epoch then
    redis.call('SET', ARGV[i], ARGV[1])
  end
end
return left";

/// What share of `write_batch_cost` one script may carry: a quarter.
///
/// - Half, because a script takes about twice the Redis time of the same
///   commands in a `MULTI`/`EXEC`: every argument becomes a Lua string,
///   then a command argument again, and each command goes through
///   `redis.call`. Measured at 58K on 3 masters never descheduled (`chrt
///   -f`): a script of the whole budget had `EVAL` p50 0.40 ms where a
///   transaction of it has 0.15 ms; half of it, p50 0.21 ms.
/// - Half again, because a script's tail is mostly its master waiting for
///   a core, and masters often share cores (three on the two of the
///   benchmark machine): at 500K, half the budget left `EVAL` p99 at
///   1.37 ms, a quarter gives 0.61 ms, for a rebuild 11% longer.
pub const SCRIPT_BUDGET_DIVISOR: usize = 4;

/// What one group script may carry, in bytes plus [`ARG_COST`] per
/// argument: about one master's share of a rebuild batch (whose cost is
/// bounded already), so a rebuild batch stays one script per master,
/// while a watcher batch of thousands of updates is cut instead of
/// becoming one giant script (a script handles every argument as a Lua
/// string, then again as a command argument; the giant ones made the
/// watcher about 10% slower and held their master for its whole length).
pub const GROUP_COST: usize = 160 * 1024;
const ARG_COST: usize = 32;

fn part_cost(part: &SlotPart<'_>) -> usize {
    part.commands.iter().flatten().map(|arg| arg.len() + ARG_COST).sum()
}

/// One master's parts cut, in order, into groups of at most
/// [`GROUP_COST`]; a part above it goes alone (a key's replace is never
/// cut).
pub fn bounded_groups(parts: Vec<SlotPart<'_>>) -> Vec<Vec<SlotPart<'_>>> {
    let mut groups: Vec<Vec<SlotPart>> = Vec::new();
    let mut cost = 0;
    for part in parts {
        let this = part_cost(&part);
        match groups.last_mut() {
            Some(group) if cost + this <= GROUP_COST => group.push(part),
            _ => {
                groups.push(vec![part]);
                cost = 0;
            }
        }
        cost += this;
    }
    groups
}

/// The scripts the cluster's writes call, each by hash once a master
/// holds it: one master's slot parts ([`GROUP_SCRIPT`]), one slot's
/// part ([`WRITE_SCRIPT`]), epoch copies raised many at once or one.
pub static GROUP: Script = Script::new(GROUP_SCRIPT);
pub static WRITE: Script = Script::new(WRITE_SCRIPT);
pub static RAISE_GROUP: Script = Script::new(RAISE_GROUP_SCRIPT);
pub static RAISE: Script = Script::new(RAISE_SCRIPT);

/// The call of [`GROUP_SCRIPT`] for one master's `parts` (at least one),
/// fenced by `epoch` when given.
pub fn group_command(status_prefix: &str, epoch: Option<u64>, parts: &[SlotPart], named: Named) -> redis::Cmd {
    let mut cmd = GROUP.call(named);
    cmd.arg(0);
    match (epoch, parts.first()) {
        (Some(epoch), Some(anchor)) => cmd.arg(epoch).arg(epoch_copy_key(status_prefix, anchor.slot)),
        _ => cmd.arg("").arg(""),
    };
    cmd.arg(parts.len());
    for part in parts {
        cmd.arg(probe_key(status_prefix, part.slot));
    }
    let commands = parts.iter().flat_map(|part| part.commands.iter().map(Vec::as_slice));
    push_commands(commands, |arg| {
        cmd.arg(arg);
    });
    cmd
}

/// An unfenced `EVAL` of [`WRITE_SCRIPT`] running `commands` in one
/// atomic step, its size guards first. On one node it runs inside the
/// fenced transaction, which the epoch's `WATCH` guards.
pub fn guarded_command(commands: &[Vec<&[u8]>]) -> redis::Cmd {
    let mut cmd = redis::cmd("EVAL");
    cmd.arg(WRITE_SCRIPT).arg(0).arg("");
    push_commands(commands.iter().map(Vec::as_slice), |arg| {
        cmd.arg(arg);
    });
    cmd
}

/// One slot's part of a batch: its commands in their original order,
/// their arguments borrowed from the unit they were cut from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotPart<'a> {
    pub slot: u16,
    pub commands: Vec<Vec<&'a [u8]>>,
}

impl SlotPart<'_> {
    /// Each command as its arguments joined by spaces, for tests.
    #[cfg(test)]
    pub fn lines(&self) -> Vec<String> {
        self.commands.iter().map(|c| String::from_utf8_lossy(&c.join(&b' ')).into_owned()).collect()
    }

    /// The keys its commands name, each once (for a script's `KEYS`).
    pub fn keys(&self) -> Vec<&[u8]> {
        let mut keys: Vec<&[u8]> = Vec::new();
        for command in &self.commands {
            if !keys.contains(&command[1]) {
                keys.push(command[1]);
            }
        }
        keys
    }
}

/// A unit cut by slot, plus the commands that name no key
/// (`PUBLISH`), which run after every part landed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Split<'a> {
    pub parts: Vec<SlotPart<'a>>,
    pub keyless: Vec<Vec<&'a [u8]>>,
}

/// A command's arguments, its name first (redis-rs keeps them as bytes).
pub fn cmd_args(cmd: &redis::Cmd) -> Vec<&[u8]> {
    cmd.args_iter()
        .filter_map(|a| match a {
            redis::Arg::Simple(bytes) => Some(bytes),
            _ => None,
        })
        .collect()
}

/// Cuts `unit` by slot, from the keys its builder filed each command
/// under (a keyed command's key is its first argument), not from command
/// names: an `UNLINK` of many keys goes one key per slot, a move between
/// two sets as `SREM` plus `SADD` (each job id sits in exactly one of the
/// job sets a moment later, as with `SMOVE`), a guarded step's commands
/// each into its key's slot, whose script checks the guards first.
pub fn split(unit: &Unit) -> Split<'_> {
    fn add<'a>(parts: &mut IndexMap<u16, SlotPart<'a>>, command: Vec<&'a [u8]>) {
        let s = slot(command[1]);
        parts.entry(s).or_insert_with(|| SlotPart { slot: s, commands: Vec::new() }).commands.push(command);
    }
    let mut parts: IndexMap<u16, SlotPart> = IndexMap::new();
    let mut keyless = Vec::new();
    for entry in unit.entries() {
        match entry {
            Entry::Keyed(cmd) => add(&mut parts, cmd_args(cmd)),
            Entry::Guarded(commands) => commands.iter().for_each(|cmd| add(&mut parts, cmd_args(cmd))),
            Entry::Unlink(keys) => keys.iter().for_each(|key| add(&mut parts, vec![b"UNLINK", key.as_bytes()])),
            Entry::Move { from, to, member } => {
                add(&mut parts, vec![b"SREM", from.as_bytes(), member.as_bytes()]);
                add(&mut parts, vec![b"SADD", to.as_bytes(), member.as_bytes()]);
            }
            Entry::Keyless(cmd) => keyless.push(cmd_args(cmd)),
        }
    }
    Split { parts: parts.into_values().collect(), keyless }
}

/// The masters and the slots they own, as `CLUSTER SLOTS` reports them,
/// and whether any slot is being moved.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Layout {
    /// `host:port` of every master, sorted.
    pub masters: Vec<String>,
    /// `start-end@host:port` of every range, sorted: equal maps compare equal.
    pub ranges: Vec<String>,
}

/// `host:port`, with an IPv6 host in brackets (`[::1]:7000`), as a
/// `redis://` URL and a socket address need it. A host given in brackets
/// already keeps them.
pub fn node_addr(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') { format!("[{host}]:{port}") } else { format!("{host}:{port}") }
}

/// A node address as Redis writes it in a redirection (`MOVED 3999
/// ::1:7001`: an IPv6 host without brackets), as [`node_addr`] writes it.
pub fn redirect_addr(addr: &str) -> String {
    match addr.rsplit_once(':') {
        Some((host, port)) if host.contains(':') => match port.parse() {
            Ok(port) => node_addr(host, port),
            Err(_) => addr.to_string(),
        },
        _ => addr.to_string(),
    }
}

/// The host of a `host:port` address, without an IPv6 host's brackets.
pub fn addr_host(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or("", |(host, _)| host);
    host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host)
}

/// The ranges of a `CLUSTER SLOTS` reply: `(start, end, "host:port")` of
/// each range's master; a master without a reported host is reached at
/// `default_host`, the node that answered.
pub fn slot_ranges(reply: &redis::Value, default_host: &str) -> Option<Vec<(u16, u16, String)>> {
    let redis::Value::Array(ranges) = reply else { return None };
    let mut out = Vec::new();
    for range in ranges {
        let redis::Value::Array(fields) = range else { return None };
        let start: u16 = redis::from_redis_value(fields.first()?.clone()).ok()?;
        let end: u16 = redis::from_redis_value(fields.get(1)?.clone()).ok()?;
        let redis::Value::Array(master) = fields.get(2)? else { return None };
        let host: String = redis::from_redis_value(master.first()?.clone()).ok()?;
        let port: u16 = redis::from_redis_value(master.get(1)?.clone()).ok()?;
        let host = if host.is_empty() || host == "?" { default_host } else { &host };
        out.push((start, end, node_addr(host, port)));
    }
    Some(out)
}

/// The node id of each range's master in a `CLUSTER SLOTS` reply, in
/// the order of [`slot_ranges`] (`None` where the reply has none).
pub fn slot_range_ids(reply: &redis::Value) -> Vec<Option<String>> {
    let redis::Value::Array(ranges) = reply else { return Vec::new() };
    ranges
        .iter()
        .map(|range| match range {
            redis::Value::Array(fields) => match fields.get(2) {
                Some(redis::Value::Array(master)) => {
                    master.get(2).and_then(|id| redis::from_redis_value::<String>(id.clone()).ok())
                }
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// Parses a `CLUSTER SLOTS` reply into a [`Layout`].
pub fn parse_slots(reply: &redis::Value) -> Option<Layout> {
    let mut layout = Layout::default();
    for (start, end, node) in slot_ranges(reply, "127.0.0.1")? {
        layout.ranges.push(format!("{start}-{end}@{node}"));
        if !layout.masters.contains(&node) {
            layout.masters.push(node);
        }
    }
    layout.masters.sort();
    layout.ranges.sort();
    Some(layout)
}

/// The ids of the nodes `CLUSTER NODES` flags as failed by the cluster's
/// agreement (`fail`; a `fail?` is one node's suspicion only). A failed
/// master's slots stay assigned to it until a replica takes over or an
/// operator moves them, so `CLUSTER SLOTS` still names it: with no replica
/// (or `cluster-require-full-coverage no`), those slots have nobody to
/// write to.
pub fn failed_nodes(cluster_nodes: &str) -> Vec<String> {
    cluster_nodes
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let id = fields.next()?;
            let flags = fields.nth(1)?;
            flags.split(',').any(|f| f == "fail").then(|| id.to_string())
        })
        .collect()
}

/// Whether a node's `CLUSTER NODES` line for itself shows a slot being
/// migrated out (`[slot->-id]`) or imported (`[slot-<-id]`).
pub fn moving_slots(cluster_nodes: &str) -> bool {
    cluster_nodes
        .lines()
        .filter(|l| l.split_whitespace().nth(2).is_some_and(|flags| flags.contains("myself")))
        .any(|l| l.contains("->-") || l.contains("-<-"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// IPv6 nodes get brackets wherever an address is made, so that
    /// `redis://{addr}` parses; IPv4 and names are left alone.
    #[test]
    fn ipv6_addresses_are_bracketed() {
        use redis::IntoConnectionInfo;
        assert_eq!(node_addr("::1", 7000), "[::1]:7000");
        assert_eq!(node_addr("[::1]", 7000), "[::1]:7000");
        assert_eq!(node_addr("10.0.0.1", 7000), "10.0.0.1:7000");
        assert_eq!(node_addr("redis-a.internal", 7000), "redis-a.internal:7000");
        assert_eq!(redirect_addr("::1:7001"), "[::1]:7001");
        assert_eq!(redirect_addr("fe80::2:7001"), "[fe80::2]:7001");
        assert_eq!(redirect_addr("[::1]:7001"), "[::1]:7001");
        assert_eq!(redirect_addr("127.0.0.1:7001"), "127.0.0.1:7001");
        assert_eq!(addr_host("[::1]:7001"), "::1");
        assert_eq!(addr_host("127.0.0.1:7001"), "127.0.0.1");
        let info = format!("redis://{}", node_addr("::1", 7000)).into_connection_info().unwrap();
        assert!(matches!(info.addr(), redis::ConnectionAddr::Tcp(host, 7000) if host == "::1"), "{:?}", info.addr());
        // A CLUSTER SLOTS reply naming an IPv6 master.
        let node = |host: &str, port: i64| {
            redis::Value::Array(vec![redis::Value::BulkString(host.as_bytes().to_vec()), redis::Value::Int(port)])
        };
        let reply = redis::Value::Array(vec![redis::Value::Array(vec![
            redis::Value::Int(0),
            redis::Value::Int(16383),
            node("::1", 7000),
        ])]);
        assert_eq!(slot_ranges(&reply, "::1").unwrap(), [(0, 16383, "[::1]:7000".to_string())]);
        let reply = redis::Value::Array(vec![redis::Value::Array(vec![
            redis::Value::Int(0),
            redis::Value::Int(16383),
            node("", 7000),
        ])]);
        assert_eq!(slot_ranges(&reply, "::1").unwrap(), [(0, 16383, "[::1]:7000".to_string())]);
    }

    #[test]
    fn a_batch_is_cut_by_slot_keeping_each_key_whole() {
        let mut unit = Unit::new();
        unit.cmd("DEL", "app:a");
        unit.cmd("SADD", "app:a").arg("x");
        unit.cmd("SET", "app:b").arg("v").arg("EX").arg(5);
        unit.cmd("EXPIRE", "app:a").arg(9);
        unit.unlink(&["app:a".to_string(), "app:b".to_string()]);
        unit.smove("s:active".into(), "s:done".into(), "r1");
        let mut step = crate::sink::write::unit::Step::default();
        step.cmd(SIZE_GUARD, "app:b").arg("SCARD").arg(1);
        unit.guarded(step);
        unit.publish("chan", "m");
        let split = split(&unit);
        let owned = |parts: &[&'static str]| parts.iter().map(|p| p.as_bytes()).collect::<Vec<_>>();
        let a = split.parts.iter().find(|p| p.keys() == [b"app:a"]).unwrap();
        assert_eq!(a.slot, slot(b"app:a"));
        assert_eq!(
            a.commands,
            vec![
                owned(&["DEL", "app:a"]),
                owned(&["SADD", "app:a", "x"]),
                owned(&["EXPIRE", "app:a", "9"]),
                owned(&["UNLINK", "app:a"])
            ]
        );
        let b = split.parts.iter().find(|p| p.keys() == [b"app:b"]).unwrap();
        assert_eq!(
            b.commands,
            vec![
                owned(&["SET", "app:b", "v", "EX", "5"]),
                owned(&["UNLINK", "app:b"]),
                owned(&["SIZEIS", "app:b", "SCARD", "1"])
            ]
        );
        let active = split.parts.iter().find(|p| p.keys() == [b"s:active"]).unwrap();
        assert_eq!(active.commands, vec![owned(&["SREM", "s:active", "r1"])]);
        let done = split.parts.iter().find(|p| p.keys() == [b"s:done"]).unwrap();
        assert_eq!(done.commands, vec![owned(&["SADD", "s:done", "r1"])]);
        assert_eq!(split.keyless, vec![owned(&["PUBLISH", "chan", "m"])]);
        assert_eq!(split.parts.len(), 4);
    }

    #[test]
    fn a_group_checks_one_copy_and_probes_every_slot() {
        let mut unit = Unit::new();
        unit.cmd("SET", "app:b").arg("v");
        unit.cmd("DEL", "app:a");
        unit.cmd("SADD", "app:a").arg("x").arg("y");
        let parts = split(&unit).parts;
        let args = |cmd: redis::Cmd| -> Vec<String> {
            cmd_args(&cmd).iter().map(|b| String::from_utf8_lossy(b).into_owned()).collect()
        };
        let (a, b) = (slot(b"app:a"), slot(b"app:b"));
        let fenced = args(group_command("cw:", Some(7), &parts, Named::ByText));
        let mut expected = vec!["EVAL".to_string(), GROUP_SCRIPT.to_string(), "0".into(), "7".into()];
        expected.push(epoch_copy_key("cw:", b));
        expected.extend(["2".to_string(), probe_key("cw:", b), probe_key("cw:", a)]);
        expected
            .extend(["3", "SET", "app:b", "v", "2", "DEL", "app:a", "4", "SADD", "app:a", "x", "y"].map(String::from));
        assert_eq!(fenced, expected);
        let unfenced = args(group_command("cw:", None, &parts, Named::ByText));
        assert_eq!(&unfenced[3..6], ["", "", "2"]);
        // By hash, the same call with the script's SHA1 in place of its text.
        let by_hash = args(group_command("cw:", Some(7), &parts, Named::ByHash));
        let sha = redis::Script::new(GROUP_SCRIPT).get_hash().to_string();
        assert_eq!(by_hash[..2], ["EVALSHA".to_string(), sha]);
        assert_eq!(by_hash[2..], fenced[2..]);
    }

    #[test]
    fn a_master_s_parts_go_in_bounded_groups_in_order() {
        let value = vec![b'x'; 1000];
        let mut unit = Unit::new();
        for i in 0..200 {
            unit.cmd("SET", format!("app:{i}")).arg(&value);
        }
        let big: Vec<Vec<u8>> = (0..400).map(|i| format!("member-{i:0>600}").into_bytes()).collect();
        unit.cmd("SADD", "app:big").arg(&big);
        let parts = split(&unit).parts;
        let order: Vec<u16> = parts.iter().map(|p| p.slot).collect();
        let groups = bounded_groups(parts);
        assert!(groups.len() > 1);
        for group in &groups {
            assert!(group.len() == 1 || group.iter().map(part_cost).sum::<usize>() <= GROUP_COST);
        }
        let big_slot = slot(b"app:big");
        assert!(groups.iter().any(|g| g.len() == 1 && g[0].slot == big_slot), "a part above the bound goes alone");
        let regrouped: Vec<u16> = groups.iter().flatten().map(|p| p.slot).collect();
        assert_eq!(regrouped, order);
    }

    #[test]
    fn keys_of_one_slot_share_a_part() {
        let mut unit = Unit::new();
        unit.cmd("SET", "{t}1").arg("a");
        unit.cmd("SET", "{t}2").arg("b");
        let split = split(&unit);
        assert_eq!(split.parts.len(), 1);
        assert_eq!(split.parts[0].keys(), vec![&b"{t}1"[..], &b"{t}2"[..]]);
    }

    #[test]
    fn the_layout_is_read_from_cluster_slots() {
        use redis::Value::{Array, BulkString, Int};
        let node = |port: i64| Array(vec![BulkString(b"127.0.0.1".to_vec()), Int(port), BulkString(b"id".to_vec())]);
        let reply = Array(vec![
            Array(vec![Int(5461), Int(10922), node(7001)]),
            Array(vec![Int(0), Int(5460), node(7000)]),
            Array(vec![Int(10923), Int(16383), node(7002), node(7005)]),
        ]);
        let layout = parse_slots(&reply).unwrap();
        assert_eq!(layout.masters.len(), 3);
        assert_eq!(layout.masters[0], "127.0.0.1:7000");
        assert_eq!(layout.ranges[0], "0-5460@127.0.0.1:7000");
    }

    #[test]
    fn failed_masters_are_those_the_cluster_agreed_on() {
        let nodes = "abc 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460\n\
                     def 127.0.0.1:7001@17001 master,fail - 0 0 2 disconnected 5461-10922\n\
                     ghi 127.0.0.1:7002@17002 master,fail? - 0 0 3 connected 10923-16383\n";
        assert_eq!(failed_nodes(nodes), vec!["def".to_string()]);
        assert!(failed_nodes("").is_empty());
    }

    #[test]
    fn moving_slots_are_seen_on_the_node_itself() {
        let quiet = "abc 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460\n\
                     def 127.0.0.1:7001@17001 master - 0 0 2 connected 5461-10922\n";
        assert!(!moving_slots(quiet));
        let moving = "abc 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460 [5460->-def]\n";
        assert!(moving_slots(moving));
        let importing = "abc 127.0.0.1:7000@17000 myself,master - 0 0 1 connected 0-5460 [5461-<-def]\n";
        assert!(moving_slots(importing));
    }
}
