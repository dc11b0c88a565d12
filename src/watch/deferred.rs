//! Writing on around a degraded Redis Cluster: slots no live master
//! covers (their master failed with no replica to take over, under
//! `cluster-require-full-coverage no`, or slots never assigned).
//!
//! A batch's changes to keys in such slots are taken out of its writes
//! and their key names recorded, in `cdc:deferred` first and then in the
//! state; the rest of the batch, tokens included, goes on as usual, so
//! the covered slots stay current. Each such key counts as held with
//! unknown contents, so no later batch patches it. On every tick while
//! keys are deferred the engine reads the slot map again, and writes the
//! keys whose slot is covered again with what they should hold now (as
//! the drift check judges a key; a detail payload from its document),
//! then forgets them.
//!
//! A master that comes back restarted, or a replica that took over,
//! shows as a new `run_id` and the watcher rebuilds as after any
//! restart; a master that comes back with its data (a stalled process,
//! a healed partition) gets its deferred keys rewritten.

use super::WatchError;
use super::drift::{DetailProbe, Expected, judge_key};
use super::engine::Engine;
use super::model::id_key;
use super::plan::BatchPlan;
use super::state::State;
use crate::plan::{Change, Value};
use crate::registry::FamilyId;
use std::collections::BTreeSet;

/// Deferred keys rewritten in one round, at most.
const PER_ROUND: usize = 10_000;

/// Takes the changes to keys `covers` refuses out of `plan`, and gives
/// their key names.
pub fn split_uncovered(plan: &mut BatchPlan, covers: impl Fn(&[u8]) -> bool) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for changes in [&mut plan.changes, &mut plan.last].into_iter().chain(plan.later.iter_mut()) {
        changes.retain(|change| {
            let key = &change.key().text;
            let keep = covers(key.as_bytes());
            if !keep {
                out.insert(key.clone());
            }
            keep
        });
    }
    out
}

/// What each of `keys` should hold now: known values (or absence), and
/// detail payloads that need their document.
fn expected_now(state: &State, ctx: &crate::plan::PlanCtx, keys: &[String]) -> (Vec<Expected>, Vec<DetailProbe>) {
    let (mut expected, mut probes) = (Vec::new(), Vec::new());
    let mut catalog = None;
    for key in keys {
        let detail = ctx.keys.parse(key).filter(|(family, _)| *family == FamilyId::VideoDetail);
        if let Some((family, args)) = detail
            && let Some((raw_id, view)) = args.first().and_then(|w| state.detail_probe(w))
        {
            probes.push(DetailProbe { key: crate::keys::Key { family, text: key.clone() }, raw_id, view });
            continue;
        }
        // A key that is not the contract's (a changed prefix) is left.
        expected.extend(judge_key(state, ctx, key, &mut catalog));
    }
    (expected, probes)
}

impl Engine<'_> {
    /// Takes the changes to uncovered slots out of `plan` and records
    /// their keys (in Redis first), before the batch's writes.
    pub(super) async fn defer_uncovered(
        &self,
        state: &mut State,
        plan: &mut BatchPlan,
    ) -> Result<BTreeSet<String>, crate::sink::SinkError> {
        let uncovered = self.sink.uncovered_slots();
        self.metrics.coverage(&uncovered, state.deferred.len());
        if uncovered.is_empty() {
            return Ok(BTreeSet::new());
        }
        let deferred = split_uncovered(plan, |key| self.sink.covers(key));
        if !deferred.is_empty() {
            let names: Vec<String> = deferred.iter().cloned().collect();
            self.sink.add_deferred(self.status, &names).await?;
            state.deferred.extend(names);
            self.metrics.coverage(&uncovered, state.deferred.len());
            tracing::warn!(
                keys = deferred.len(),
                waiting = state.deferred.len(),
                slots = %super::metrics::slot_ranges_text(&uncovered),
                "no live master covers some slots: their keys wait, the others are written"
            );
        }
        Ok(deferred)
    }

    /// One round of writing deferred keys whose slot is covered again,
    /// with what they should hold now. A failure leaves them deferred.
    pub(super) async fn retry_deferred(&self, state: &mut State) -> Result<(), WatchError> {
        self.sink.refresh_topology().await;
        let uncovered = self.sink.uncovered_slots();
        self.metrics.coverage(&uncovered, state.deferred.len());
        // While the state is ahead of the cache (catching up), its
        // values are not yet what a rebuild would write.
        if state.catching_up {
            return Ok(());
        }
        let ready: Vec<String> =
            state.deferred.iter().filter(|k| self.sink.covers(k.as_bytes())).take(PER_ROUND).cloned().collect();
        if ready.is_empty() {
            return Ok(());
        }
        let (mut expected, probes) = crate::tasks::off_runtime(|| expected_now(state, self.ctx, &ready));
        let ids = probes.iter().map(|p| p.raw_id.clone()).collect();
        let docs = self.read_documents(ids).await?;
        // A document the state has not caught up with waits for its event
        // (whose batch writes the detail) or the next round.
        let mut waiting = BTreeSet::new();
        for probe in probes {
            match docs.get(&id_key(&probe.raw_id)).and_then(|doc| super::drift::detail_of(state, &probe, doc)) {
                Some(detail) => expected.push(Expected { key: probe.key, want: Some(Value::String(detail)) }),
                None => drop(waiting.insert(probe.key.text)),
            }
        }
        let changes: Vec<Change> = expected.iter().map(Expected::change).collect();
        let budget = self.sink.tx_budget();
        match self.apply_runs(budget.cut(&changes)).await {
            Ok(()) => {}
            // A slot lost again, or Redis busy: the next round tries again.
            Err(err) if err.is_retriable() => {
                tracing::warn!(error = %err, keys = changes.len(), "deferred keys could not be written yet; trying again");
                return Ok(());
            }
            // A lost lease or a fence ends the watcher's leadership.
            Err(err) => return Err(err.into()),
        }
        for e in &expected {
            super::drift::record_repair(state, self.ctx, e);
        }
        let done: Vec<String> = ready.into_iter().filter(|k| !waiting.contains(k)).collect();
        self.sink.remove_deferred(self.status, &done).await?;
        for key in &done {
            state.deferred.remove(key);
        }
        self.metrics.coverage(&uncovered, state.deferred.len());
        tracing::info!(written = done.len(), waiting = state.deferred.len(), "deferred keys written");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::Keys;
    use crate::plan::Op;

    #[test]
    fn uncovered_changes_leave_the_plan_and_name_their_keys() {
        let keys = Keys::new("app:");
        let put = |family, id: &str| Change::Put(Op { key: keys.key(family, &[id]), value: Value::String("x".into()) });
        let mut plan = BatchPlan {
            changes: vec![put(FamilyId::CategoryVideoCount, "c1"), put(FamilyId::CategoryVideoCount, "c2")],
            last: vec![put(FamilyId::VideoDetail, "v1"), Change::Delete(keys.key(FamilyId::VideoDetail, &["v2"]))],
            later: vec![vec![put(FamilyId::CategoryVideoCount, "c2")]],
            ..BatchPlan::default()
        };
        let covers = |key: &[u8]| !(key.ends_with(b"c2") || key.ends_with(b"v2"));
        let deferred = split_uncovered(&mut plan, covers);
        assert_eq!(deferred.len(), 2, "{deferred:?}");
        assert!(deferred.iter().all(|k| k.ends_with("c2") || k.ends_with("v2")));
        assert_eq!(plan.changes.len(), 1);
        assert_eq!(plan.last.len(), 1);
        assert!(plan.later[0].is_empty(), "a patch's later step waits with its first");
        assert!(plan.changes.iter().chain(&plan.last).all(|c| covers(c.key().text.as_bytes())));
    }
}
