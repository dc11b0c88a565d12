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
//! - The fill starts with `UNLINK` of the stage, so sending it again after
//!   a lost reply is safe; it ends by reading the stage's size back. A
//!   stage that lost elements on the way (a restart or fail-over) is
//!   never renamed: the write starts over on a new stage.
//! - The rename fails (`no such key`) when the stage is gone: lost, or
//!   already renamed by an attempt whose reply was lost. Either way the
//!   key is whole, old or new; the write starts over.
//! - A writer that dies mid-way leaves a stage no reader looks at; it
//!   expires within [`STAGE_TTL`].

use super::{RedisConn, Sink, SinkError, cluster, pipeline};
use crate::plan::{Change, Op, Value};
use std::collections::HashSet;
use std::ops::Range;

/// Seconds a stage key lives after it was filled.
pub const STAGE_TTL: u64 = 300;

/// The pipeline that fills `stage` with `value`'s elements, one command
/// per step, and replies with the stage's size (its only reply).
pub fn fill(stage: &str, value: &Value, steps: &[Range<usize>]) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.cmd("UNLINK").arg(stage).ignore();
    for step in steps {
        pipeline::add_members(&mut pipe, stage, value, step.clone());
    }
    pipe.cmd("EXPIRE").arg(stage).arg(STAGE_TTL).ignore();
    pipe.cmd(size_command(value)).arg(stage);
    pipe
}

/// Appends the last step: the stage becomes `key`, with `seconds` to live.
pub fn add_swap(pipe: &mut redis::Pipeline, stage: &str, key: &str, seconds: u64) {
    pipe.cmd("RENAME").arg(stage).arg(key).ignore();
    pipe.cmd("EXPIRE").arg(key).arg(seconds).ignore();
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

fn size_command(value: &Value) -> &'static str {
    match value {
        Value::List(_) => "LLEN",
        Value::Set(_) => "SCARD",
        Value::String(_) | Value::Zset(_) => "ZCARD",
    }
}

/// A rename refused because its stage is gone.
fn stage_gone(err: &SinkError) -> bool {
    matches!(err, SinkError::Write { source, .. } if source.to_string().contains("no such key"))
}

impl Sink {
    /// Whether `op` is written in steps by this sink (see the module).
    fn is_staged(&self, op: &Op) -> bool {
        op.is_staged(self.unit_cost)
    }

    /// Writes the ops of `ops` too big for one unit, each in steps, one
    /// after another; returns the others, for one atomic unit.
    pub(super) async fn write_staged_ops<'a>(&self, ops: &'a [Op]) -> Result<Vec<&'a Op>, SinkError> {
        let (staged, whole): (Vec<&Op>, Vec<&Op>) = ops.iter().partition(|op| self.is_staged(op));
        for op in staged {
            self.write_staged(op).await?;
        }
        Ok(whole)
    }

    /// The same for the watcher's changes: puts too big for one unit are
    /// written in steps; the other changes come back in their order.
    pub(super) async fn write_staged_changes<'a>(&self, changes: &'a [Change]) -> Result<Vec<&'a Change>, SinkError> {
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
        let mut attempt = 1;
        loop {
            let stage = cluster::stage_key(&self.status_prefix, slot, rand::random());
            if self.try_staged(op, &stage, &steps).await? {
                return Ok(());
            }
            // Best effort: a stage left behind expires anyway.
            let _ = self.unlink(std::slice::from_ref(&stage)).await;
            if attempt >= self.retry.attempts {
                return Err(SinkError::StageLost { key: op.key.text.clone(), attempts: attempt });
            }
            let delay = self.retry.delay(attempt);
            tracing::warn!(key = %op.key.text, attempt, delay_ms = delay.as_millis() as u64,
                "a staged write lost its stage (Redis restarting or failing over?); writing the key again");
            tokio::time::sleep(delay).await;
            attempt += 1;
        }
    }

    /// Sends a fill and returns the stage's size. On a cluster it goes in
    /// one round trip to the master of the stage's slot (the routed path
    /// sends one slot's commands one at a time); where that fails (the
    /// slot moved or is moving), through the routed path, which follows
    /// the cluster. A fill starts with `UNLINK`, so sending it again after
    /// part of it landed is safe.
    async fn send_fill(&self, fill: &redis::Pipeline, slot: u16) -> Result<usize, SinkError> {
        if let RedisConn::Cluster(router) = &self.conn
            && let Some(addr) = router.owner(Some(slot))
            && let Ok(replies) = router.pipeline_on_node(&addr, fill).await
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
        match self.send_with(|pipe| add_swap(pipe, stage, &op.key.text, seconds)).await {
            Ok(()) => Ok(true),
            Err(err) if stage_gone(&err) => Ok(false),
            Err(err) => Err(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::Keys;
    use crate::registry::FamilyId;

    fn packed(pipe: &redis::Pipeline) -> String {
        String::from_utf8_lossy(&pipe.get_packed_pipeline()).replace("\r\n", " ")
    }

    /// The fill starts the stage afresh (so sending it again is safe),
    /// adds one bounded command per step and reads the size back.
    #[test]
    fn the_fill_is_one_bounded_command_per_step() {
        let list = Value::List((0..5).map(|i| format!("v{i}")).collect());
        let pipe = fill("s", &list, &[0..2, 2..5]);
        assert_eq!(
            packed(&pipe),
            "*2 $6 UNLINK $1 s *4 $5 RPUSH $1 s $2 v0 $2 v1 *5 $5 RPUSH $1 s $2 v2 $2 v3 $2 v4 \
             *3 $6 EXPIRE $1 s $3 300 *2 $4 LLEN $1 s "
        );
        let zset = Value::Zset(vec![(7, "a".into()), (9, "b".into())]);
        let pipe = fill("s", &zset, &[0..1, 1..2]);
        assert!(packed(&pipe).contains("*4 $4 ZADD $1 s $1 7 $1 a *4 $4 ZADD $1 s $1 9 $1 b "));
        assert!(packed(&pipe).ends_with("*2 $5 ZCARD $1 s "));
    }

    #[test]
    fn the_swap_renames_and_sets_the_ttl() {
        let mut pipe = redis::pipe();
        add_swap(&mut pipe, "s", "k", 7200);
        assert_eq!(packed(&pipe), "*3 $6 RENAME $1 s $1 k *3 $6 EXPIRE $1 k $4 7200 ");
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
