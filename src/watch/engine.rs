//! The engine: applies batches of stream items to the state, writes
//! what they change and saves the tokens after.

use super::batch::{Batch, CatchUp};
use super::drift::{DetailProbe, Drift, Expected, Suspect};
use super::protocol::Step;
use super::state::State;
use super::stream::{Item, StartAt};
use super::{Restart, WatchError, WatchMetrics, WatchOptions, model, plan};
use crate::config::Collections;
use crate::keys::status::StatusKeys;
use crate::plan::{Change, PlanCtx, Value};
use crate::sink::{Sink, SinkError};
use crate::source::{Source, SourceError};
use crate::tasks::off_runtime;
use model::{Coll, Event, id_key};
use mongodb::bson::Bson;
use std::collections::HashMap;
use std::time::Instant;
use tokio::sync::mpsc;

/// The engine's connections and settings, for one streaming session.
pub(super) struct Engine<'a> {
    /// The collections' names (for logs, tokens and lookups).
    pub(super) names: &'a Collections,
    /// Write transactions in flight at once.
    pub(super) write_concurrency: usize,
    pub(super) opts: &'a WatchOptions,
    pub(super) sink: &'a Sink,
    pub(super) source: &'a Source,
    pub(super) status: &'a StatusKeys,
    pub(super) ctx: &'a PlanCtx,
    pub(super) metrics: &'a WatchMetrics,
}

impl Engine<'_> {
    /// Applies batches until shutdown (`None`) or a stream failure. Each
    /// argument is a piece of the session the caller keeps across
    /// reopenings of the streams.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn stream_batches(
        &self,
        state: &mut State,
        redis_run_id: &str,
        catch_up: &mut CatchUp,
        rx: &mut mpsc::Receiver<Item>,
        starts: &mut [StartAt],
        drift: &mut Option<Drift>,
        shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> Result<Option<Restart>, WatchError> {
        // The state may have been reloaded since the last session.
        if let Some(drift) = drift.as_mut() {
            drift.forget_catalog();
        }
        let mut tick = tokio::time::interval(super::drift::TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // Shutdown first, then events; the drift check only when
            // neither is ready.
            let first = tokio::select! {
                biased;
                _ = shutdown.as_mut() => return Ok(None),
                item = rx.recv() => item,
                _ = tick.tick(), if drift.is_some() || !state.deferred.is_empty() => {
                    if !state.deferred.is_empty() {
                        self.retry_deferred(state).await?;
                    }
                    if let Some(drift) = drift.as_mut() {
                        self.check_drift(state, drift).await?;
                    }
                    continue;
                }
            };
            let Some(first) = first else { return Ok(Some(Restart::Reopen)) };
            // The window runs from the first event's arrival: one that
            // queued while the previous batch was being written has waited.
            let arrived = match &first {
                Item::Event(_, _, at, _) => tokio::time::Instant::from_std(*at),
                _ => tokio::time::Instant::now(),
            };
            let mut items = vec![first];
            let deadline = arrived + self.opts.window;
            while items.len() < self.opts.max_batch {
                match tokio::time::timeout_at(deadline, rx.recv()).await {
                    Ok(Some(item)) => items.push(item),
                    _ => break,
                }
            }
            // A Redis that restarted without persistence lost every key
            // this process wrote: only a rebuild brings them back.
            if !crate::sink::same_servers(redis_run_id, &self.sink.run_id().await?) {
                return Ok(Some(Restart::Rebuild("Redis restarted and lost its keys".into())));
            }
            let started = Instant::now();
            let mut batch = Batch::default();
            for item in items {
                catch_up.see(&item);
                if let Some(restart) = batch.add(self.names, item, self.metrics) {
                    return Ok(Some(restart));
                }
            }
            // Once every stream is past the load, the documents are no
            // longer ahead: this batch recomputes the scopes written
            // meanwhile, and they are clean again.
            state.replayed = state.catching_up;
            let caught_up = state.catching_up && catch_up.is_done();
            if caught_up {
                tracing::info!("change streams caught up with the loaded documents");
                state.catching_up = false;
            }
            for (coll, id) in std::mem::take(&mut batch.lookups) {
                batch.events.push(self.look_up(coll, id).await?);
            }
            let tokens: Vec<(&str, String)> = batch
                .tokens
                .iter()
                .map(|(coll, token)| {
                    serde_json::to_string(token)
                        .map(|text| (coll.name(self.names), text))
                        .map_err(|e| WatchError::Internal(e.to_string()))
                })
                .collect::<Result<_, _>>()?;
            let videos = self.apply(state, std::mem::take(&mut batch.events), &tokens).await?;
            if let Some(drift) = drift.as_mut()
                && batch.per_collection[..3].iter().any(|n| *n > 0)
            {
                drift.forget_catalog();
            }
            if let Some(hook) = &self.opts.on_applied
                && !videos.is_empty()
            {
                hook(&videos);
            }
            for (coll, token) in batch.tokens {
                starts[coll as usize] = StartAt::Token(token);
            }
            if caught_up {
                self.trust_sizes(state).await;
            }
            self.metrics.applied(batch.per_collection, batch.newest_cluster_time, started.elapsed());
            if self.opts.heartbeat {
                heartbeat(self.sink, self.status, self.metrics).await;
            }
        }
    }

    /// Once the streams caught up with a load (or a job), the keys of the
    /// patchable families that no batch wrote since hold what the last
    /// exact writer left, which is what the state derives: every change
    /// since the load was replayed and its scopes written whole, and a
    /// scope a failed batch may have left half-written was recomputed by
    /// the batch that ended the catch-up. Those whose size in Redis is
    /// the state's (so they did not expire or get evicted) count as
    /// known, so their next change is a patch rather than a rewrite of
    /// the whole key. A key of another size stays unknown and is written
    /// whole; a failure here only leaves keys unknown.
    async fn trust_sizes(&self, state: &mut State) {
        let mut wanted = off_runtime(|| state.unknown_patchable(&self.ctx.keys));
        // A deferred key may hold stale members of the right count; a key
        // in a slot without a master cannot be read now (both stay unknown).
        wanted.retain(|(key, _, _)| !state.deferred.contains(key) && self.sink.covers(key.as_bytes()));
        let pairs: Vec<(String, &'static str)> = wanted.iter().map(|(k, c, _)| (k.clone(), *c)).collect();
        match self.sink.sizes(&pairs).await {
            Ok(found) => {
                let checked = wanted.len();
                let trusted = state.trust_sizes(wanted, &found);
                tracing::info!(checked, trusted, "index keys whose size matches the state count as known");
            }
            Err(err) => tracing::warn!(error = %err, "could not read the index keys' sizes; they are written whole"),
        }
    }

    /// Reads a document whose change event could not be used whole: the
    /// event names it, the collection says what it is now.
    async fn look_up(&self, coll: Coll, id: mongodb::bson::Bson) -> Result<Event, WatchError> {
        let name = coll.name(self.names);
        let collection = self.source.database().collection::<mongodb::bson::RawDocumentBuf>(name);
        let found = self.source.bounded(name, collection.find_one(mongodb::bson::doc! { "_id": id.clone() })).await?;
        Ok(match found {
            Some(doc) => Event::Upsert { coll, key: id_key(&id), raw_id: id, doc, decoded: None },
            None => Event::Remove { coll, key: id_key(&id), raw_id: id },
        })
    }

    /// Runs a batch's in-memory work off the runtime, counting its CPU:
    /// the calling thread's and the rayon pool's, where planning spreads
    /// its scopes. Under `serve`, a scheduled job decoding on the pool at
    /// the same moment is counted with it.
    fn in_memory<T>(&self, work: impl FnOnce() -> T) -> T {
        off_runtime(|| {
            let cpu = || crate::usage::thread_cpu_time() + crate::usage::pool_cpu_time();
            let before = cpu();
            let out = work();
            self.metrics.state_cpu(cpu().saturating_sub(before));
            out
        })
    }

    /// Applies events to the state, writes what they change and saves the
    /// tokens; the state keeps the batch only once all of that is in
    /// Redis, and is left exactly as before when any of it fails.
    async fn apply(
        &self,
        state: &mut State,
        events: Vec<Event>,
        tokens: &[(&str, String)],
    ) -> Result<Vec<String>, WatchError> {
        let started = Instant::now();
        // What Redis holds of the touched videos is read while the batch
        // is applied: the read needs only their ids, and no write happens
        // in between (the batch's own come after planning).
        let reading = {
            let (sink, keys, ids) = (self.sink.clone(), self.ctx.keys.clone(), super::state::written_ids(&events));
            crate::tasks::spawn(async move { sink.video_memberships(&keys, ids.iter()).await })
        };
        let mut applied = self.in_memory(|| state.apply(events));
        let applied_at = started.elapsed();
        // A repeated id whose first owner went away: the next owner was
        // loaded without its detail, so read it again.
        let missing: Vec<_> = applied.videos.keys().filter_map(|w| state.needs_detail(w)).collect();
        for raw_id in missing {
            match self.look_up(Coll::Video, raw_id).await {
                Ok(event) => {
                    let again = state.apply(vec![event]);
                    applied.absorb(again);
                }
                Err(err) => {
                    state.undo(applied);
                    return Err(err);
                }
            }
        }
        self.metrics.rejected(&applied.rejected);
        let read = match reading.await {
            Ok(read) => read.map_err(WatchError::from),
            Err(joined) => Err(WatchError::Internal(format!("reading the touched videos' keys stopped: {joined}"))),
        };
        let (categories, details) = match read {
            Ok(view) => view,
            Err(err) => {
                state.undo(applied);
                return Err(err);
            }
        };
        let view = plan::RedisView { categories, details };
        let read = started.elapsed();
        // A patch goes in steps as big as the sink's atomic unit. A flip's
        // members are restored whole only in transactions: inside a
        // cluster's slot scripts that cost Redis more than the flip block
        // (docs/BENCHMARKS.md, "flipped members restored whole").
        let shape = plan::Shape { patch_step: self.sink.unit_cost(), restore: self.sink.restores_in_transactions() };
        let mut plan = self.in_memory(|| plan::plan_batch(state, &applied, &view, self.ctx, shape));
        let planned = started.elapsed();
        self.metrics.visited(plan.visited);
        let budget = self.sink.tx_budget();
        let deferred = match self.defer_uncovered(state, &mut plan).await {
            Ok(deferred) => deferred,
            Err(err) => {
                state.abort(applied, &self.ctx.keys, &plan.record);
                return Err(err.into());
            }
        };
        let written = async {
            for step in super::protocol::steps(&plan, budget, state.clears_pending(&applied)) {
                match step {
                    Step::Pending(members) => self.sink.add_pending(self.status, &members).await?,
                    Step::Runs(runs) => self.apply_runs(runs).await?,
                    Step::Tokens { changes, clear } => {
                        self.sink.apply_changes_and_save_tokens(changes, self.status, tokens, clear).await?
                    }
                }
            }
            Ok::<(), SinkError>(())
        }
        .await;
        tracing::debug!(
            apply_ms = applied_at.as_millis() as u64,
            read_ms = (read - applied_at).as_millis() as u64,
            plan_ms = (planned - read).as_millis() as u64,
            write_ms = (started.elapsed() - planned).as_millis() as u64,
            visited = plan.visited,
            changes = plan.changes.len() + plan.last.len(),
            "batch phases"
        );
        match written {
            Ok(()) => {
                let patched = plan.changes.iter().chain(&plan.last).filter(|c| matches!(c, Change::Patch(_))).count();
                self.metrics.patched_keys.fetch_add(patched as u64, std::sync::atomic::Ordering::Relaxed);
                let steps: usize = plan.later.iter().map(Vec::len).sum();
                self.metrics.patch_steps.fetch_add(steps as u64, std::sync::atomic::Ordering::Relaxed);
                let videos: Vec<String> = applied.videos.keys().cloned().collect();
                state.commit(applied, &self.ctx.keys, &plan.record);
                // Not written: held with unknown contents until rewritten.
                for key in &deferred {
                    state.existing.insert(&self.ctx.keys, key, None);
                }
                Ok(videos)
            }
            Err(err) => {
                state.abort(applied, &self.ctx.keys, &plan.record);
                Err(err.into())
            }
        }
    }

    /// One round of the drift check (see [`super::drift`]): draws keys,
    /// compares them with Redis, and rewrites those that differ through
    /// the fenced writer. Runs only between batches, and not while the
    /// state is ahead of the cache (catching up), a failed batch's
    /// scopes are pending or its documents not saved again, or keys are
    /// deferred.
    async fn check_drift(&self, state: &mut State, drift: &mut Drift) -> Result<(), WatchError> {
        let unsettled = state.catching_up || !state.dirty.is_empty() || state.awaits_replay();
        if unsettled || !state.deferred.is_empty() || !self.metrics.is_streaming() {
            return Ok(());
        }
        let n = drift.due();
        let (mut expected, mut probes) = off_runtime(|| drift.draw(state, self.ctx, n));
        // A tenth more drawn from what Redis holds, for keys no known
        // scope names.
        if n > 0 {
            for key in self.sink.random_keys(n.div_ceil(10)).await? {
                expected.extend(drift.judge_existing(state, self.ctx, &key));
            }
        }
        // Each key once a round (a small catalogue's walk comes round
        // again within one), and a detail not while it is a suspect.
        let mut once: std::collections::HashSet<String> =
            drift.suspects.iter().map(|s| s.probe.key.text.clone()).collect();
        expected.retain(|e| once.insert(e.key.text.clone()));
        probes.retain(|p| once.insert(p.key.text.clone()));
        let again = drift.due_suspects(Instant::now());
        // Details are read again from MongoDB: a first look for the new
        // probes, a second for the suspects.
        let wanted: Vec<Bson> = probes.iter().chain(again.iter().map(|s| &s.probe)).map(|p| p.raw_id.clone()).collect();
        let docs = match self.read_documents(wanted).await {
            Ok(docs) => docs,
            Err(err) => {
                tracing::warn!(error = %err, "the drift check could not read video documents; details wait for the next round");
                HashMap::new()
            }
        };
        let rendered = |probe: &DetailProbe| {
            docs.get(&id_key(&probe.raw_id)).and_then(|doc| super::drift::detail_of(state, probe, doc))
        };
        let first_looks = expected.len();
        let mut looks: Vec<(DetailProbe, u128)> = Vec::new();
        for probe in probes {
            if let Some(detail) = rendered(&probe) {
                looks.push((probe.clone(), super::drift::detail_digest(&detail)));
                expected.push(Expected { key: probe.key, want: Some(Value::String(detail)) });
            }
        }
        let seconds = expected.len();
        for suspect in again {
            // The same rendering as at the first look, or it is not judged.
            if let Some(detail) = rendered(&suspect.probe)
                && super::drift::detail_digest(&detail) == suspect.want
            {
                expected.push(Expected { key: suspect.probe.key, want: Some(Value::String(detail)) });
            }
        }
        if expected.is_empty() {
            return Ok(());
        }
        let names: Vec<String> = expected.iter().map(|e| e.key.text.clone()).collect();
        let seen = self.sink.inspect(&names).await?;
        let mut repairs = Vec::new();
        for (i, (want, seen)) in expected.into_iter().zip(seen).enumerate() {
            let family = want.key.family;
            if i < seconds {
                self.metrics.drift_checked(family);
            }
            let Some(found) = crate::sink::difference(want.want.as_ref(), &seen) else { continue };
            if (first_looks..seconds).contains(&i) {
                // A detail that differs from its document now: judged on
                // the second look (its change may not have reached the
                // watcher yet).
                let (probe, digest) = looks[i - first_looks].clone();
                drift.suspects.push(Suspect { probe, want: digest, since: Instant::now() });
                continue;
            }
            self.metrics.drift_found(family);
            tracing::warn!(key = %want.key.text, family = %family, found = %found.describe(&want.key.text), "drift: the key differs from what a rebuild would write; rewriting it");
            repairs.push(want);
        }
        if repairs.is_empty() {
            return Ok(());
        }
        let changes: Vec<Change> = repairs.iter().map(Expected::change).collect();
        self.sink.apply_changes(&changes).await?;
        for e in &repairs {
            super::drift::record_repair(state, self.ctx, e);
        }
        Ok(())
    }

    /// Reads video documents by `_id`, keyed by it.
    pub(super) async fn read_documents(
        &self,
        ids: Vec<Bson>,
    ) -> Result<HashMap<model::IdKey, mongodb::bson::RawDocumentBuf>, SourceError> {
        use futures::TryStreamExt;
        let mut out = HashMap::new();
        if ids.is_empty() {
            return Ok(out);
        }
        let name = Coll::Video.name(self.names);
        let coll = self.source.database().collection::<mongodb::bson::RawDocumentBuf>(name);
        let mut cursor = self.source.bounded(name, coll.find(mongodb::bson::doc! { "_id": { "$in": ids } })).await?;
        while let Some(doc) = self.source.bounded(name, cursor.try_next()).await? {
            if let Some(key) = model::raw_id_key(&doc) {
                out.insert(key, doc);
            }
        }
        Ok(out)
    }

    /// Writes runs of changes that may land in any order, as many at once
    /// as the rebuild writes batches.
    pub(super) async fn apply_runs(&self, runs: Vec<&[Change]>) -> Result<(), SinkError> {
        use futures::{StreamExt, TryStreamExt};
        // Collected first: a lazy map over borrowed runs trips the
        // compiler's `Send` check where the watcher is spawned.
        let sends: Vec<_> = runs.into_iter().map(|run| self.sink.apply_changes(run)).collect();
        futures::stream::iter(sends).buffer_unordered(self.write_concurrency.max(1)).try_collect::<Vec<()>>().await?;
        Ok(())
    }
}

/// Writes `health:current` (60 s TTL) at most every few seconds.
pub(super) async fn heartbeat(sink: &Sink, status: &StatusKeys, metrics: &WatchMetrics) {
    let now = crate::status::unix_now();
    let last = metrics.last_heartbeat.swap(now, std::sync::atomic::Ordering::Relaxed);
    if now.saturating_sub(last) < 5 {
        return;
    }
    if let Err(err) = sink.heartbeat(status, &metrics.heartbeat()).await {
        tracing::warn!(error = %err, "could not write the health heartbeat");
    }
}
