//! Keys too big for one atomic unit: filled into a stage key by bounded
//! commands, then renamed onto the key in one atomic step.
//!
//! Readers wait behind every `MULTI`/`EXEC` (or script) a writer runs, so
//! each is bounded by what it costs Redis (see `TxBudget`). A collection
//! whose replace alone costs more (at 500K videos a category's index
//! holds about 600 members, ten units' worth) would break that bound if
//! it went whole. Its elements instead fill a fresh stage key,
//! `<status>stage:<nonce>:{tag}`, tagged into the key's slot (a cluster
//! renames only within one slot): one plain pipeline of adds, each
//! command bounded like a unit (a step), so other clients' commands run
//! between them. No reader looks at a stage, so filling it needs neither
//! a transaction nor the fence. Then one fenced atomic step renames the
//! stage onto the key and sets the key's TTL. Readers see the old value
//! until that rename, then the new one whole: never a missing, partial
//! or mixed key. Two round trips, whatever the key's size.
//!
//! - The fill's first command replaces the stage with its first element
//!   and gives it its TTL, in one script: sending the fill again after a
//!   lost reply is safe, and no stage ever lives without a TTL, however
//!   the fill is cut. The fill ends by reading the stage's size back; a
//!   stage that lost elements on the way is never renamed.
//! - The size is checked again inside the rename's own atomic step (a
//!   size guard of the write script, see `cluster::WRITE_SCRIPT`): a stage
//!   trimmed between the read-back and the rename (a fail-over to a
//!   replica the whole fill had not reached, an AOF not yet synced, an
//!   eviction) fails the step with `DRIFTED` before anything is
//!   renamed. So does a stage that is gone: lost, or already renamed by
//!   an attempt whose reply was lost. Either way the key is whole, old or
//!   new, and the write starts over on a new stage.
//! - A writer that dies mid-way leaves a stage no reader looks at; it
//!   expires within [`STAGE_TTL`] of its first command.

use crate::plan::{Change, Op, Value};
use crate::sink::write::unit::{Step, Unit};
use crate::sink::{Sink, SinkError, cluster, pipeline};
use std::collections::HashSet;
use std::ops::Range;

/// Seconds a stage key lives after its first command.
pub const STAGE_TTL: u64 = 300;

/// Replaces `KEYS[1]` with a key holding only the elements in `ARGV[3..]`,
/// added by the command `ARGV[1]`, and gives it `ARGV[2]` seconds to live.
const START_SCRIPT: &str = "\
redis.call('UNLINK', KEYS[1])
redis.call(ARGV[1], KEYS[1], unpack(ARGV, 3))
redis.call('EXPIRE', KEYS[1], ARGV[2])
return 1";

/// The pipeline that fills `stage` with `value`'s elements, one command
/// per step, and replies with the stage's size (its only reply). The
/// first element goes in by [`START_SCRIPT`], with the stage's TTL.
pub fn fill(stage: &str, value: &Value, steps: &[Range<usize>]) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    let mut start = redis::cmd("EVAL");
    start.arg(START_SCRIPT).arg(1).arg(stage).arg(add_command(value)).arg(STAGE_TTL);
    match value {
        Value::String(_) => {}
        Value::List(items) => drop(start.arg(items.first())),
        Value::Set(members) => drop(start.arg(members.first())),
        Value::Zset(members) => {
            if let Some((score, member)) = members.first() {
                start.arg(*score).arg(member);
            }
        }
    }
    pipe.add_command(start).ignore();
    let mut adds = Unit::new();
    for step in steps {
        let rest = step.start.max(1)..step.end;
        if !rest.is_empty() {
            pipeline::add_members(&mut adds, stage, value, rest);
        }
    }
    adds.append_to(&mut pipe);
    pipe.cmd(size_command(value)).arg(stage);
    pipe
}

/// Appends the last step: the stage becomes `key`, with `seconds` to
/// live, only if it still holds `value`'s elements, all checked and done
/// in one atomic step (`DRIFTED` otherwise): a guarded step, which a
/// cluster runs in its slot's write script and one node as one unfenced
/// write script inside the fenced transaction.
pub fn add_swap(unit: &mut Unit, stage: &str, key: &str, value: &Value, seconds: u64) {
    let mut swap = Step::default();
    swap.cmd(cluster::SIZE_GUARD, stage).arg(size_command(value)).arg(size(value));
    swap.cmd("RENAME", stage).arg(key);
    swap.cmd("EXPIRE", key).arg(seconds);
    unit.guarded(swap);
}

/// The size Redis reports for `value` once written: a list's length, a
/// set's or sorted set's distinct members.
pub fn size(value: &Value) -> usize {
    match value {
        Value::String(_) => 0,
        Value::List(items) => items.len(),
        Value::Set(members) => members.iter().collect::<HashSet<_>>().len(),
        Value::Zset(members) => members.iter().map(|(_, m)| m).collect::<HashSet<_>>().len(),
    }
}

fn add_command(value: &Value) -> &'static str {
    match value {
        Value::List(_) => "RPUSH",
        Value::Set(_) => "SADD",
        Value::String(_) | Value::Zset(_) => "ZADD",
    }
}

fn size_command(value: &Value) -> &'static str {
    match value {
        Value::List(_) => "LLEN",
        Value::Set(_) => "SCARD",
        Value::String(_) | Value::Zset(_) => "ZCARD",
    }
}

impl Sink {
    /// Whether `op` is written in steps by this sink (see the module).
    fn is_staged(&self, op: &Op) -> bool {
        op.is_staged(self.unit_cost)
    }

    /// Writes the ops of `ops` too big for one unit, each in steps, one
    /// after another; returns the others, for one atomic unit.
    pub(in crate::sink) async fn write_staged_ops<'a>(&self, ops: &'a [Op]) -> Result<Vec<&'a Op>, SinkError> {
        let (staged, whole): (Vec<&Op>, Vec<&Op>) = ops.iter().partition(|op| self.is_staged(op));
        for op in staged {
            self.write_staged(op).await?;
        }
        Ok(whole)
    }

    /// The same for the watcher's changes: puts too big for one unit are
    /// written in steps; the other changes come back in their order.
    pub(in crate::sink) async fn write_staged_changes<'a>(
        &self,
        changes: &'a [Change],
    ) -> Result<Vec<&'a Change>, SinkError> {
        let mut rest = Vec::with_capacity(changes.len());
        for change in changes {
            match change {
                Change::Put(op) if self.is_staged(op) => self.write_staged(op).await?,
                _ => rest.push(change),
            }
        }
        Ok(rest)
    }

    /// Replaces `op`'s key whole through a stage (see the module),
    /// starting over on a new stage when one is lost.
    async fn write_staged(&self, op: &Op) -> Result<(), SinkError> {
        let steps = op.steps(self.unit_cost);
        let slot = cluster::slot(op.key.text.as_bytes());
        let mut attempts = self.retry.start();
        loop {
            // A writer that knows it lost the lease stops here: its fill
            // could never be renamed, and would only load Redis.
            if self.fence.as_ref().is_some_and(|fence| !fence.is_valid()) {
                return Err(SinkError::LeaseLost);
            }
            let stage = crate::keys::status::stage_key(&self.status_prefix, slot, rand::random());
            if self.try_staged(op, &stage, &steps).await? {
                return Ok(());
            }
            // Best effort: a stage left behind expires anyway.
            let _ = self.unlink(std::slice::from_ref(&stage)).await;
            let Some(delay) = attempts.next_pause() else {
                return Err(SinkError::StageLost { key: op.key.text.clone(), attempts: attempts.made() });
            };
            tracing::warn!(key = %op.key.text, attempt = attempts.made() - 1, delay_ms = delay.as_millis() as u64,
                "a staged write lost its stage (Redis restarting or failing over?); writing the key again");
            tokio::time::sleep(delay).await;
        }
    }

    /// Sends a fill and returns the stage's size. It goes in one round
    /// trip to the master of the stage's slot (on a cluster, the routed
    /// path sends one slot's commands one at a time); where that fails
    /// (the slot moved or is moving, a connection broke), through the
    /// routed path with retries, which follows the deployment. A fill
    /// starts with `UNLINK`, so sending it again after part of it landed
    /// is safe.
    async fn send_fill(&self, fill: &redis::Pipeline, slot: u16) -> Result<usize, SinkError> {
        if let Some(addr) = self.topology().owner(slot)
            && let Ok(replies) = self.topology().pipeline_on_node(&addr, fill).await
            && let [reply] = replies.as_slice()
            && let Ok(found) = redis::from_redis_value::<usize>(reply.clone())
        {
            return Ok(found);
        }
        let conn = self.connection();
        let (found,): (usize,) = self
            .retry
            .run(|| {
                let mut conn = conn.clone();
                async move { fill.query_async(&mut conn).await }
            })
            .await
            .map_err(|(attempts, source)| SinkError::Write { attempts, source })?;
        Ok(found)
    }

    /// One attempt: `Ok(false)` when the stage was lost before the rename.
    async fn try_staged(&self, op: &Op, stage: &str, steps: &[Range<usize>]) -> Result<bool, SinkError> {
        let found = self.send_fill(&fill(stage, &op.value, steps), cluster::slot(stage.as_bytes())).await?;
        if found != size(&op.value) {
            return Ok(false);
        }
        let seconds = pipeline::ttl_with_jitter(self.ttl.get(op.tier()), self.jitter, rand::random());
        match self.send_with(|unit| add_swap(unit, stage, &op.key.text, &op.value, seconds)).await {
            Ok(()) => Ok(true),
            // Its stage is gone or short (see `SinkError::is_drift`).
            Err(err) if err.is_drift() => Ok(false),
            Err(err) => Err(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::Keys;
    use crate::registry::FamilyId;

    /// Each command of `pipe` as its arguments joined by spaces, the
    /// scripts named.
    fn commands(pipe: &redis::Pipeline) -> Vec<String> {
        pipe.cmd_iter()
            .map(|cmd| {
                let args: Vec<String> = cluster::cmd_args(cmd)
                    .into_iter()
                    .map(|arg| match std::str::from_utf8(arg).unwrap() {
                        START_SCRIPT => "<start>".to_string(),
                        cluster::WRITE_SCRIPT => "<write>".to_string(),
                        text => text.to_string(),
                    })
                    .collect();
                args.join(" ")
            })
            .collect()
    }

    /// The fill creates the stage with its first element and its TTL in
    /// one step (so sending it again is safe and no stage lives without a
    /// TTL), adds one bounded command per step and reads the size back.
    #[test]
    fn the_fill_starts_with_a_ttl_and_is_one_bounded_command_per_step() {
        let list = Value::List((0..5).map(|i| format!("v{i}")).collect());
        assert_eq!(
            commands(&fill("s", &list, &[0..2, 2..5])),
            ["EVAL <start> 1 s RPUSH 300 v0", "RPUSH s v1", "RPUSH s v2 v3 v4", "LLEN s"]
        );
        let zset = Value::Zset(vec![(7, "a".into()), (9, "b".into())]);
        assert_eq!(
            commands(&fill("s", &zset, &[0..1, 1..2])),
            ["EVAL <start> 1 s ZADD 300 7 a", "ZADD s 9 b", "ZCARD s"]
        );
        let set = Value::Set(vec!["a".into(), "b".into()]);
        assert_eq!(commands(&fill("s", &set, &[0..1, 1..2])), ["EVAL <start> 1 s SADD 300 a", "SADD s b", "SCARD s"]);
    }

    /// The rename carries its size check: on a cluster as commands the
    /// slot's write script runs, guards first; on one node as that script
    /// itself, unfenced (the transaction around it is).
    #[test]
    fn the_swap_checks_the_size_renames_and_sets_the_ttl_in_one_step() {
        let list = Value::List(vec!["a".into(), "b".into()]);
        let mut unit = Unit::new();
        add_swap(&mut unit, "s{k}", "k", &list, 7200);
        let parts = cluster::split(&unit).parts;
        let joined = parts[0].lines();
        assert_eq!(parts.len(), 1, "the stage is tagged into the key's slot");
        assert_eq!(joined, ["SIZEIS s{k} LLEN 2", "RENAME s{k} k", "EXPIRE k 7200"]);
        assert_eq!(
            commands(&unit.into_pipeline()),
            ["EVAL <write> 0  4 SIZEIS s{k} LLEN 2 3 RENAME s{k} k 3 EXPIRE k 7200"]
        );
    }

    #[test]
    fn sizes_count_distinct_members_as_redis_does() {
        assert_eq!(size(&Value::List(vec!["a".into(), "a".into()])), 2);
        assert_eq!(size(&Value::Set(vec!["a".into(), "a".into(), "b".into()])), 2);
        assert_eq!(size(&Value::Zset(vec![(1, "a".into()), (2, "a".into())])), 1);
        let keys = Keys::new("app:");
        let op = Op { key: keys.key(FamilyId::VideoCategoryList, &["c"]), value: Value::List(vec!["a".into()]) };
        assert_eq!(size_command(&op.value), "LLEN");
    }
}
