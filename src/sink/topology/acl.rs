//! The least-privilege Redis ACL of a cachewright user, and the check
//! that a connection has it before anything is written.
//!
//! The rule is generated from one list, [`WRITE`], so `cachewright acl`,
//! `docs/DEPLOYMENT.md` and the preflight check cannot drift apart. The
//! preflight queues one probe per permission inside `MULTI` and then
//! `DISCARD`s: Redis checks ACLs when it queues a command, so a missing
//! permission shows as a `NOPERM` reply and nothing is executed. A
//! command that lacks a permission therefore stops before its first
//! write, never halfway through.

use crate::config::RedisSettings;
use crate::keys::status::StatusKeys;
use crate::sink::write::pipeline::Replace;
use crate::sink::{Sink, SinkError};

/// What a command needs of Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// `verify`, `memory`, `status`: reads only.
    Read,
    /// `rebuild`, `watch`, `serve`, `purge`, `migrate`.
    Write,
}

/// The commands every cachewright connection may send: reads, `SCAN`
/// for the sweep, `INFO` for memory and restarts, `ROLE` to check the
/// master Sentinel names, `MEMORY USAGE` for
/// `memory`; on a Redis Cluster, the slot map (`CLUSTER SLOTS`), moving
/// slots (`CLUSTER NODES`) and `ASKING` to follow a slot being moved.
const READ: &[&str] = &[
    "ping",
    "echo",
    "info",
    "role",
    "scan",
    "type",
    "ttl",
    "exists",
    "get",
    "smembers",
    "lrange",
    "zrange",
    "llen",
    "scard",
    "zcard",
    "hgetall",
    "memory|usage",
    "subscribe",
    "psubscribe",
    "unsubscribe",
    "punsubscribe",
    "select",
    "cluster|slots",
    "cluster|nodes",
    "asking",
];

/// What writers add: the replaces of the contract's key types inside
/// `MULTI`/`EXEC` (a big collection through a stage key and `RENAME`),
/// `WATCH` for fencing, the lease's Lua scripts, job
/// status hashes and counters, and progress messages.
const WRITE: &[&str] = &[
    "set",
    "del",
    "unlink",
    "expire",
    "sadd",
    "srem",
    "smove",
    "rpush",
    "zadd",
    "rename",
    "hset",
    "hincrby",
    "incr",
    "multi",
    "exec",
    "discard",
    "watch",
    "unwatch",
    "eval",
    "evalsha",
    "script|load",
    "publish",
];

/// The ACL permissions `access` needs, as `+command` items.
pub fn commands(access: Access) -> Vec<&'static str> {
    let mut all: Vec<&str> = READ.to_vec();
    if access == Access::Write {
        all.extend(WRITE);
    }
    all
}

/// The `ACL SETUSER` line for a cachewright user: nothing but its key
/// prefixes, its progress channels and its commands.
pub fn rule(user: &str, password: &str, prefix: &str, status_prefix: &str) -> String {
    let status = StatusKeys::new(status_prefix.to_string());
    let mut line = format!(
        "ACL SETUSER {user} reset on >{password} ~{prefix}* ~{status_prefix}* &{} -@all",
        status.progress_pattern()
    );
    for c in commands(Access::Write) {
        line.push_str(" +");
        line.push_str(c);
    }
    line
}

/// One probe: a command with representative keys, and what to grant if
/// Redis refuses it.
struct Probe {
    args: Vec<String>,
}

fn probes(settings: &RedisSettings, access: Access) -> Vec<Probe> {
    let data = format!("{}cachewright-acl-probe", settings.prefix);
    let other = format!("{}cachewright-acl-probe:2", settings.prefix);
    let status = StatusKeys::new(settings.status_prefix.clone());
    let job = status.job("acl-probe");
    let stage = format!("{}stage:acl-probe", settings.status_prefix);
    let p = |args: &[&str]| Probe { args: args.iter().map(|a| a.to_string()).collect() };
    let mut all = vec![
        p(&["PING"]),
        p(&["INFO", "server"]),
        p(&["ROLE"]),
        p(&["SCAN", "0", "MATCH", &format!("{}*", settings.prefix), "COUNT", "1"]),
        p(&["TYPE", &data]),
        p(&["TTL", &data]),
        p(&["GET", &data]),
        p(&["SMEMBERS", &data]),
        p(&["LRANGE", &data, "0", "0"]),
        p(&["ZRANGE", &data, "0", "0"]),
        p(&["LLEN", &data]),
        p(&["SCARD", &data]),
        p(&["ZCARD", &data]),
        p(&["MEMORY", "USAGE", &data]),
        p(&["HGETALL", &job]),
        p(&["GET", &status.rebuild_lock()]),
    ];
    if access == Access::Write {
        all.extend([
            p(&["SET", &data, "x", "EX", "1"]),
            p(&["SADD", &data, "x"]),
            p(&["SREM", &data, "x"]),
            p(&["RPUSH", &data, "x"]),
            p(&["RENAME", &stage, &data]),
            p(&["ZADD", &data, "1", "x"]),
            p(&["EXPIRE", &data, "1"]),
            p(&["DEL", &data]),
            p(&["UNLINK", &data, &other]),
            p(&["HSET", &job, "probe", "1"]),
            p(&["HINCRBY", &job, "probe", "1"]),
            p(&["INCR", &status.total_jobs()]),
            p(&["SMOVE", &status.jobs("running"), &status.jobs("completed"), "acl-probe"]),
            p(&["SET", &status.epoch(), "1"]),
            p(&["EXPIRE", &status.health(), "1"]),
            p(&["DEL", &status.cdc_pending()]),
            p(&["PUBLISH", &status.progress("acl-probe"), "probe"]),
            p(&["EVAL", "return 1", "2", &status.rebuild_lock(), &status.epoch()]),
            p(&["EVALSHA", "e0e1f9fabfc9d4800c877a703b823ac0578ff8db", "2", &status.rebuild_lock(), &status.epoch()]),
        ]);
    }
    all
}

/// The parts of an ACL refusal worth showing: `NOPERM` and its reason.
fn refusal(err: &redis::RedisError) -> Option<String> {
    let text = err.to_string();
    (err.code() == Some("NOPERM") || text.contains("NOPERM")).then_some(text)
}

impl Sink {
    /// Checks that this connection's user may do what `access` needs,
    /// without executing anything. On a refusal, names each denied
    /// command and how to grant it. A writer's optional `RESTORE` probe
    /// (see [`Sink::may_restore`]) rides in the same transaction: the
    /// answer is whether this user may run it (false when
    /// `CACHEWRIGHT_RESTORE=false`, which sends no probe). Its refusal
    /// is no error.
    pub async fn check_access(&self, settings: &RedisSettings, access: Access) -> Result<bool, SinkError> {
        let probes = probes(settings, access);
        let restore = if access == Access::Write { restore_probe(settings) } else { None };
        let with_restore = restore.is_some();
        let commands = probes.iter().map(|probe| redis::cmd(&probe.args[0]).arg(&probe.args[1..]).clone());
        let replies = match self.queued(commands.chain(restore)).await {
            Ok(replies) => replies,
            Err(source) => {
                if let Some(reason) = refusal(&source) {
                    return Err(SinkError::Permission { denied: vec![reason], grant: grant_hint(settings) });
                }
                return Err(SinkError::Scan { attempts: 1, source });
            }
        };
        let mut denied = Vec::new();
        for (probe, reply) in probes.iter().zip(replies.iter()) {
            if let redis::Value::ServerError(err) = reply {
                let err: redis::RedisError = err.clone().into();
                if let Some(reason) = refusal(&err) {
                    denied.push(format!("{} ({reason})", probe.args[..2.min(probe.args.len())].join(" ")));
                }
            }
        }
        if !denied.is_empty() {
            return Err(SinkError::Permission { denied, grant: grant_hint(settings) });
        }
        Ok(with_restore && replies.get(probes.len()).is_some_and(granted))
    }
}

/// Refuses to write where Redis may evict any key under memory pressure
/// (`maxmemory-policy allkeys-*`, on any master of `infos`: each
/// master's `INFO` reply holding its `memory` section): the lease, the
/// fencing epoch, the watcher's tokens and pending record carry no TTL,
/// and losing one silently (a second writer, a skipped replay) leaves
/// the cache wrong. `noeviction` and the `volatile-*` policies only ever
/// evict keys with a TTL: cache keys, which readers miss and the next
/// write restores. With `allow`, warns instead.
pub(in crate::sink) fn check_eviction(infos: &[(String, String)], allow: bool) -> Result<(), SinkError> {
    for (node, info) in infos {
        let Some(policy) = crate::sink::info_value(info, "maxmemory_policy") else { continue };
        if !policy.starts_with("allkeys-") {
            continue;
        }
        if allow {
            tracing::warn!(%node, policy, "Redis may evict cachewright's control records (CACHEWRIGHT_ALLOW_EVICTION=true)");
            continue;
        }
        return Err(SinkError::Eviction { node: node.clone(), policy: policy.to_string() });
    }
    Ok(())
}

impl Sink {
    /// Queues `commands` in a `MULTI` on one node and discards them, so
    /// nothing runs: each reply (`QUEUED`, or the error Redis gives a
    /// command this user may not run) in order.
    async fn queued(&self, commands: impl IntoIterator<Item = redis::Cmd>) -> redis::RedisResult<Vec<redis::Value>> {
        let mut pipe = redis::pipe();
        pipe.ignore_errors();
        pipe.cmd("MULTI");
        for cmd in commands {
            pipe.add_command(cmd);
        }
        pipe.cmd("DISCARD");
        let mut replies = self.query_one_node(&pipe).await?;
        // MULTI's OK first, DISCARD's OK last.
        replies.pop();
        replies.remove(0);
        Ok(replies)
    }

    /// Sends `pipe` on one connection to one node, a connection no other
    /// request shares (its `MULTI` must hold the probes alone) where the
    /// topology offers a client of its master; on a cluster, the first
    /// master that answers, so a start does not depend on the one seed
    /// `REDIS_URL` names (Redis checks permissions before it redirects a
    /// key of another master: that reply is `MOVED`, not a refusal).
    async fn query_one_node(&self, pipe: &redis::Pipeline) -> redis::RedisResult<Vec<redis::Value>> {
        if let Some(client) = self.topology().node_client() {
            let mut conn = client.get_multiplexed_async_connection().await?;
            return pipe.query_async(&mut conn).await;
        }
        let mut last = None;
        for master in self.topology().masters() {
            match self.topology().pipeline_on_node(&master, pipe).await {
                Ok(replies) => return Ok(replies),
                Err(err) => last = Some(err),
            }
        }
        Err(last.unwrap_or_else(|| (redis::ErrorKind::Io, "no Redis master answered").into()))
    }
}

fn grant_hint(settings: &RedisSettings) -> String {
    format!(
        "grant the user the rule `cachewright acl` prints for these prefixes ({}, {}); see docs/DEPLOYMENT.md",
        settings.prefix, settings.status_prefix
    )
}

impl Sink {
    /// Whether this user may replace collections with one `RESTORE`
    /// each (`write::dump`) instead of `UNLINK`, adds and `EXPIRE`: the
    /// ACL allows it (a probe queued in `MULTI` and discarded, as
    /// [`Sink::check_access`] does) and every master runs Redis 5.0 or
    /// later, whose format the values use (`servers`: each master's
    /// `INFO server`, read by the caller with whatever else its start
    /// needs; Valkey reports its Redis version there too). `RESTORE` is
    /// optional: it sits in ACL category `@dangerous`, which deployments
    /// often deny, and `cachewright acl` does not grant it. Any doubt
    /// keeps the commands, and so does `CACHEWRIGHT_RESTORE=false`,
    /// without a probe.
    pub async fn may_restore(&self, settings: &RedisSettings, servers: &[(String, String)]) -> Replace {
        let Some(probe) = restore_probe(settings) else { return Replace::Commands };
        let allowed = match self.queued([probe]).await {
            Ok(replies) => replies.first().is_some_and(granted),
            Err(_) => false,
        };
        restore_choice(allowed, servers)
    }
}

/// The `RESTORE` probe (a one-member set under the prefix, never run):
/// none when `CACHEWRIGHT_RESTORE=false`.
fn restore_probe(settings: &RedisSettings) -> Option<redis::Cmd> {
    if !settings.restore {
        return None;
    }
    let key = format!("{}cachewright-acl-probe", settings.prefix);
    let value = crate::sink::write::dump::payload(&crate::plan::Value::Set(vec!["x".into()]))?;
    let mut probe = redis::cmd("RESTORE");
    probe.arg(&key).arg(1000).arg(value.as_slice()).arg("REPLACE");
    Some(probe)
}

/// Whether a queued probe's reply lets it run (`QUEUED`, not an error).
fn granted(reply: &redis::Value) -> bool {
    !matches!(reply, redis::Value::ServerError(_))
}

/// How collections are replaced, given whether the user may `RESTORE`
/// and each master's `INFO server` (see [`Sink::may_restore`]).
pub(in crate::sink) fn restore_choice(allowed: bool, servers: &[(String, String)]) -> Replace {
    let recent = all_load_the_values(servers);
    tracing::debug!(allowed, recent, "replacing collections with RESTORE: {}", allowed && recent);
    if allowed && recent { Replace::Restore } else { Replace::Commands }
}

/// Whether every master of `servers` (each one's `INFO server`) loads the
/// values `RESTORE` is given; none known is a doubt.
fn all_load_the_values(servers: &[(String, String)]) -> bool {
    let version = |info: &str| crate::sink::info_value(info, "redis_version").is_some_and(loads_the_values);
    !servers.is_empty() && servers.iter().all(|(_, info)| version(info))
}

/// Whether a Redis of `version` (`INFO server`'s `redis_version`) loads
/// the values `RESTORE` is given: 5.0 or later.
fn loads_the_values(version: &str) -> bool {
    version.split('.').next().and_then(|major| major.parse::<u32>().ok()).is_some_and(|major| major >= 5)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_names_prefixes_channels_and_commands() {
        let rule = rule("cachewright", "pw", "app:", "cachewright:");
        assert!(rule.starts_with(
            "ACL SETUSER cachewright reset on >pw ~app:* ~cachewright:* &cachewright:progress:* -@all +ping"
        ));
        for c in ["+set", "+unlink", "+evalsha", "+memory|usage", "+scan", "+publish", "+watch"] {
            assert!(rule.split(' ').any(|w| w == c), "{c} missing from {rule}");
        }
        assert!(!rule.contains("+flushall") && !rule.contains("+keys"));
    }

    #[test]
    fn probes_cover_every_write_command() {
        let cfg = crate::config::Config::from_raw(crate::config::RawConfig::default()).unwrap();
        let probed: Vec<String> =
            probes(&cfg.redis(), Access::Write).iter().map(|p| p.args[0].to_lowercase()).collect();
        for c in WRITE.iter().chain(READ) {
            let base = c.split('|').next().unwrap();
            let unprobeable =
                ["multi", "exec", "discard", "watch", "unwatch", "script", "echo", "exists", "cluster", "asking"]
                    .contains(&base)
                    || ["subscribe", "psubscribe", "unsubscribe", "punsubscribe", "select"].contains(&base);
            assert!(unprobeable || probed.iter().any(|p| p == base), "{c} has no probe");
        }
    }

    #[test]
    fn redis_5_and_later_load_the_values() {
        assert!(super::loads_the_values("7.0.15"));
        assert!(super::loads_the_values("5.0.0"));
        assert!(!super::loads_the_values("4.0.14"));
        assert!(!super::loads_the_values("unknown"));
    }

    fn infos(field: &str, values: &[&str]) -> Vec<(String, String)> {
        let info = |(i, v): (usize, &&str)| (format!("m{i}"), format!("# Section\r\n{field}:{v}\r\nother:1\r\n"));
        values.iter().enumerate().map(info).collect()
    }

    /// Every master must load the values; an unknown version, or no
    /// master read at all, keeps the commands.
    #[test]
    fn restore_needs_every_master_recent() {
        assert!(all_load_the_values(&infos("redis_version", &["7.0.15", "6.2.1"])));
        assert!(!all_load_the_values(&infos("redis_version", &["7.0.15", "4.0.14"])));
        assert!(!all_load_the_values(&infos("redis_build_id", &["7.0.15"])));
        assert!(!all_load_the_values(&[]));
    }

    /// Only `allkeys-*` may evict a key without a TTL, on any master;
    /// allowed, it is a warning.
    #[test]
    fn an_allkeys_policy_on_any_master_refuses_writing() {
        for safe in ["noeviction", "volatile-lru", "volatile-ttl"] {
            assert!(check_eviction(&infos("maxmemory_policy", &[safe, "noeviction"]), false).is_ok());
        }
        let evicting = infos("maxmemory_policy", &["noeviction", "allkeys-lru"]);
        match check_eviction(&evicting, false) {
            Err(SinkError::Eviction { node, policy }) => {
                assert_eq!((node.as_str(), policy.as_str()), ("m1", "allkeys-lru"))
            }
            other => panic!("{other:?}"),
        }
        assert!(check_eviction(&evicting, true).is_ok());
        assert!(check_eviction(&infos("used_memory", &["1"]), false).is_ok());
    }
}
