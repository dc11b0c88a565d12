//! Incremental refresh from MongoDB change streams (`cachewright watch`).
//!
//! The engine keeps an in-memory [`model::Model`] of the sources. Events
//! are coalesced over a short window, applied to the model, and turned into
//! exactly the writes a full rebuild from the new state would make for the
//! touched keys (zset deltas for big indexes). Resume tokens are saved only
//! after those writes succeed, so delivery is at-least-once and every write
//! is idempotent.
//!
//! Start-up: with saved tokens for every collection the streams resume
//! from them; otherwise (first start, lost history, an unusable token, a
//! drop, rename or invalidate) the engine records MongoDB's cluster time,
//! runs a full rebuild, and streams from that time, so no change falls in
//! the gap and none is overwritten by older data.

pub mod compact;
pub mod members;
pub mod metrics;
pub mod model;
pub mod plan;
pub mod state;
pub mod stream;

pub use metrics::WatchMetrics;

use crate::config::Config;
use crate::keys::status::StatusKeys;
use crate::plan::PlanCtx;
use crate::plan::{Change, FamilySet};
use crate::progress::Progress;
use crate::rebuild::{RebuildOptions, RunError, plan_ctx, rebuild_with_retries};
use crate::sink::{Fence, Lease, LeaseError, Sink, SinkError};
use crate::source::{Source, SourceError};
use crate::status::Trigger;
use model::{Coll, Event, id_key};
use mongodb::change_stream::event::{OperationType, ResumeToken};
use state::State;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use stream::{Item, StartAt};
use tokio::sync::mpsc;

/// Called after a batch's writes succeeded, with the written ids of the
/// videos it touched (the benchmark measures latency with it).
pub type AppliedHook = Arc<dyn Fn(&[String]) + Send + Sync>;

#[derive(Clone)]
pub struct WatchOptions {
    /// How long to gather events before applying them.
    pub window: Duration,
    /// The most events applied in one batch.
    pub max_batch: usize,
    pub on_applied: Option<AppliedHook>,
    /// Whether to write `health:current` (off under `serve`, which writes
    /// its own heartbeat with the watcher's figures in it).
    pub heartbeat: bool,
    /// Where a stopped watcher leaves its state for the next start (serve
    /// pauses the watcher around its jobs and resumes it from its tokens).
    pub carry: Option<Arc<std::sync::Mutex<Option<Carry>>>>,
}

impl Carry {
    /// Records what a job that rebuilt `families` left in the cache: the
    /// keys it wrote (`names`); it swept the others.
    pub fn after_job(&mut self, keys: &crate::keys::Keys, families: FamilySet, names: &[String]) {
        let tracked = FamilySet::of(families.iter().filter(|f| state::tracked_families().contains(*f)));
        self.state.existing.replace(keys, tracked, names);
    }
}

/// A stopped watcher's state and where its streams stood.
pub struct Carry {
    state: State,
    starts: Vec<StartAt>,
    redis_run_id: String,
    catch_up: CatchUp,
}

impl Default for WatchOptions {
    fn default() -> Self {
        WatchOptions {
            window: Duration::from_millis(200),
            max_batch: 20_000,
            on_applied: None,
            heartbeat: true,
            carry: None,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error("full rebuild for the watcher failed: {0}")]
    Rebuild(#[from] RunError),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error("internal error: {0}")]
    Internal(String),
}

/// Stream tasks end with the engine, even when its future is dropped.
struct AbortOnDrop(Vec<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        for task in &self.0 {
            task.abort();
        }
    }
}

enum Restart {
    /// Streams failed; reopen them from the saved tokens.
    Reopen,
    /// The streams cannot resume: rebuild and start from a cluster time.
    Rebuild(String),
}

/// Runs as a leader until `shutdown` resolves: waits for the writer lease
/// (following whoever holds it), watches under it, and goes back to
/// waiting if it is lost. Tokens are saved after every applied batch, so
/// stopping at any point loses nothing.
pub async fn run(
    cfg: &Config,
    opts: &WatchOptions,
    metrics: Arc<WatchMetrics>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), WatchError> {
    tokio::pin!(shutdown);
    let sink = Sink::connect_for(cfg, crate::sink::Access::Write).await?;
    let status = StatusKeys::new(cfg.status_prefix.clone());
    let ttl = Duration::from_secs(cfg.lease_seconds);
    loop {
        let lease = tokio::select! {
            _ = &mut shutdown => return Ok(()),
            lease = Lease::acquire_waiting(sink.connection(), &status, ttl) => lease?,
        };
        let fence = lease.fence();
        let outcome = tokio::select! {
            result = run_fenced(cfg, opts, metrics.clone(), fence.clone(), &mut shutdown) => Some(result),
            _ = fence.lost() => None,
        };
        metrics.streaming.store(false, std::sync::atomic::Ordering::Relaxed);
        match outcome {
            Some(Ok(())) => {
                lease.release().await;
                return Ok(());
            }
            Some(Err(WatchError::Sink(SinkError::LeaseLost | SinkError::Fenced { .. }))) | None => {
                tracing::warn!("the writer lease was lost; following the new leader");
            }
            Some(Err(err)) => return Err(err),
        }
    }
}

/// Watches under a writer lease the caller holds, until `shutdown`
/// resolves or an error the watcher cannot handle itself. Every write,
/// token and heartbeat is fenced by the lease's epoch.
pub async fn run_fenced(
    cfg: &Config,
    opts: &WatchOptions,
    metrics: Arc<WatchMetrics>,
    fence: Fence,
    shutdown: impl Future<Output = ()>,
) -> Result<(), WatchError> {
    tokio::pin!(shutdown);
    // The callers (`run`, serve's supervisor) checked the user's
    // permissions before taking the lease; a restart need not again.
    let sink = Sink::connect(cfg).await?.fenced(fence.clone()).await?;
    let source = Source::connect(cfg).await?;
    let status = StatusKeys::new(cfg.status_prefix.clone());
    let ctx = plan_ctx(cfg, FamilySet::all());
    let mut rebuild_reason: Option<String> = None;
    'establish: loop {
        let saved = match &rebuild_reason {
            Some(_) => None,
            None => load_tokens(&sink, &status, cfg).await?,
        };
        // Without tokens the streams open first, then the rebuild reads:
        // every change after the snapshot is in the streams, none is lost
        // in the gap, and none is overwritten by the rebuild's older read.
        let fresh = saved.is_none();
        let mut starts = match saved {
            Some(tokens) => tokens.into_iter().map(StartAt::Token).collect::<Vec<_>>(),
            None => {
                clear_tokens(&sink, &status, cfg).await?;
                vec![StartAt::Now; 4]
            }
        };
        let mut state: Option<(State, String)> = None;
        let mut catch_up = CatchUp::done();
        // A state kept across a pause (serve's scheduled jobs) resumes
        // from its own tokens instead of reloading the collections.
        if !fresh && let Some(carry) = opts.carry.as_ref().and_then(|c| lock(c).take()) {
            starts = carry.starts;
            state = Some((carry.state, carry.redis_run_id));
            catch_up = carry.catch_up;
        }
        let mut backoff = Duration::from_millis(200);
        loop {
            let (tx, mut rx) = mpsc::channel::<Item>(20_000);
            let mut opened = Vec::new();
            let tasks = AbortOnDrop(
                Coll::ALL
                    .iter()
                    .zip(starts.iter().cloned())
                    .map(|(coll, start)| {
                        let name = coll.name(&cfg.collections).to_string();
                        let (open_tx, open_rx) = tokio::sync::oneshot::channel();
                        opened.push(open_rx);
                        tokio::spawn(stream::follow(source.database().clone(), *coll, name, start, tx.clone(), open_tx))
                    })
                    .collect(),
            );
            drop(tx);
            let all_open = futures::future::join_all(opened).await.iter().all(Result::is_ok);
            if all_open && let Some((kept, _)) = state.as_mut().filter(|_| !metrics.is_streaming()) {
                // Resumed with a kept state: no collection is read again.
                // A job may have written newer values meanwhile (serve
                // recorded which keys it left), so until the streams pass
                // now, what the watcher writes stays pending, as after a
                // load.
                kept.dirty.extend(&state::Scopes::from_members(sink.members(&status.cdc_pending()).await?));
                kept.catching_up = true;
                catch_up = CatchUp::until(source.cluster_time().await?);
                tracing::info!(videos = kept.video_count(), "watcher state kept; streaming from its tokens");
                metrics.streaming.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            if all_open && state.is_none() {
                if fresh {
                    let reason = rebuild_reason.take().unwrap_or_else(|| "no saved resume tokens".into());
                    tracing::info!(reason = %reason, "streams open; running a full rebuild before applying changes");
                    let opts = RebuildOptions { fence: Some(fence.clone()), ..RebuildOptions::full() }
                        .trigger(Trigger::ChangeStream);
                    let progress = Progress::hidden();
                    metrics.rebuild();
                    tokio::select! {
                        _ = &mut shutdown => return Ok(()),
                        result = rebuild_with_retries(cfg, &opts, &progress, 3) => { result?; }
                    }
                }
                let loading = Instant::now();
                // What the cache holds of the scoped and catalogue keys
                // (catalogue contents unknown), scanned while the state
                // loads: the state may already be newer than what was
                // written (changes after the rebuild read, or while this
                // process was down), and a delete replayed from the
                // tokens must find the keys to remove.
                let (loaded, existing) = tokio::join!(load_state(&source, cfg), existing_keys(&sink, &ctx));
                let mut loaded = loaded?;
                // Everything up to now may be in the loaded documents.
                let loaded_at = source.cluster_time().await?;
                loaded.existing = existing?;
                loaded.dirty = state::Scopes::from_members(sink.members(&status.cdc_pending()).await?);
                let run_id = sink.run_id().await?;
                tracing::info!(
                    videos = loaded.video_count(),
                    tracked_keys = loaded.existing.len(),
                    scope_members = loaded.members.len(),
                    load_ms = loading.elapsed().as_millis() as u64,
                    db = %cfg.mongodb_db,
                    "watcher state loaded; streaming"
                );
                metrics.streaming.store(true, std::sync::atomic::Ordering::Relaxed);
                tracing::debug!(loaded_at = ?loaded_at, "catching up with the load");
                catch_up = CatchUp::until(loaded_at);
                state = Some((loaded, run_id));
            }
            let outcome = match state.as_mut() {
                Some((state, run_id)) => {
                    let engine = Engine {
                        cfg,
                        opts,
                        sink: &sink,
                        source: &source,
                        status: &status,
                        ctx: &ctx,
                        metrics: &metrics,
                    };
                    engine.stream_batches(state, run_id, &mut catch_up, &mut rx, &mut starts, &mut shutdown).await
                }
                // A stream failed to open before anything was loaded; its
                // error is in the channel.
                None => first_failure(cfg, &mut rx).await,
            };
            drop(tasks);
            // Redis or MongoDB trouble mid-batch: nothing was saved for the
            // batch, so reopening from the saved tokens replays it.
            let outcome = match outcome {
                Err(WatchError::Sink(err)) if err.is_retriable() => {
                    metrics.failed_batches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::warn!(error = %err, "redis failed while applying changes");
                    Ok(Some(Restart::Reopen))
                }
                Err(WatchError::Source(err)) if err.is_retriable() => {
                    tracing::warn!(error = %err, "mongodb failed while applying changes");
                    Ok(Some(Restart::Reopen))
                }
                other => other,
            };
            match outcome? {
                None => {
                    if let (Some(carry), Some((state, redis_run_id))) = (opts.carry.as_ref(), state.take()) {
                        *lock(carry) = Some(Carry { state, starts, redis_run_id, catch_up });
                    }
                    return Ok(());
                }
                // A stream that never reached a token cannot be reopened
                // without a gap: start over.
                Some(Restart::Reopen) if starts.iter().any(|s| matches!(s, StartAt::Now)) => {
                    rebuild_reason = Some("a change stream failed before its first resume token".into());
                    continue 'establish;
                }
                Some(Restart::Reopen) => {
                    tracing::warn!(
                        delay_ms = backoff.as_millis() as u64,
                        "change streams failed; reopening from the saved tokens"
                    );
                    tokio::select! {
                        _ = &mut shutdown => return Ok(()),
                        _ = tokio::time::sleep(backoff) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                }
                Some(Restart::Rebuild(reason)) => {
                    tracing::warn!(reason = %reason, db = %cfg.mongodb_db, "change streams cannot resume; rebuilding");
                    rebuild_reason = Some(reason);
                    continue 'establish;
                }
            }
        }
    }
}

/// Reads the failure a stream reported while opening.
async fn first_failure(cfg: &Config, rx: &mut mpsc::Receiver<Item>) -> Result<Option<Restart>, WatchError> {
    while let Some(item) = rx.recv().await {
        if let Item::Unresumable(_, reason) = item {
            return Ok(Some(Restart::Rebuild(reason)));
        }
        if let Item::Failed(coll, err) = item {
            let name = coll.name(&cfg.collections);
            return Ok(Some(if stream::is_history_lost(&err) {
                Restart::Rebuild(format!("{name} stream: {err}"))
            } else {
                tracing::warn!(collection = name, error = %err, "change stream failed to open");
                Restart::Reopen
            }));
        }
    }
    Ok(Some(Restart::Reopen))
}

/// The engine's connections and settings, for one streaming session.
struct Engine<'a> {
    cfg: &'a Config,
    opts: &'a WatchOptions,
    sink: &'a Sink,
    source: &'a Source,
    status: &'a StatusKeys,
    ctx: &'a PlanCtx,
    metrics: &'a WatchMetrics,
}

impl Engine<'_> {
    /// Applies batches until shutdown (`None`) or a stream failure.
    async fn stream_batches(
        &self,
        state: &mut State,
        redis_run_id: &str,
        catch_up: &mut CatchUp,
        rx: &mut mpsc::Receiver<Item>,
        starts: &mut [StartAt],
        shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> Result<Option<Restart>, WatchError> {
        let cfg = self.cfg;
        loop {
            let first = tokio::select! {
                _ = shutdown.as_mut() => return Ok(None),
                item = rx.recv() => item,
            };
            let Some(first) = first else { return Ok(Some(Restart::Reopen)) };
            // The window runs from the first event's arrival: one that
            // queued while the previous batch was being written has waited.
            let arrived = match &first {
                Item::Event(_, _, at) => tokio::time::Instant::from_std(*at),
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
            if self.sink.run_id().await? != redis_run_id {
                return Ok(Some(Restart::Rebuild("Redis restarted and lost its keys".into())));
            }
            let started = Instant::now();
            let mut batch = Batch::default();
            for item in items {
                catch_up.see(&item);
                if let Some(restart) = batch.add(cfg, item, self.metrics) {
                    return Ok(Some(restart));
                }
            }
            // Once every stream is past the load, the documents are no
            // longer ahead: this batch recomputes the scopes written
            // meanwhile, and they are clean again.
            state.replayed = state.catching_up;
            if state.catching_up && catch_up.is_done() {
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
                        .map(|text| (coll.name(&cfg.collections), text))
                        .map_err(|e| WatchError::Internal(e.to_string()))
                })
                .collect::<Result<_, _>>()?;
            let videos = self.apply(state, std::mem::take(&mut batch.events), &tokens).await?;
            if let Some(hook) = &self.opts.on_applied
                && !videos.is_empty()
            {
                hook(&videos);
            }
            for (coll, token) in batch.tokens {
                starts[coll as usize] = StartAt::Token(token);
            }
            self.metrics.applied(batch.per_collection, batch.newest_cluster_time, started.elapsed());
            if self.opts.heartbeat {
                heartbeat(self.sink, self.status, self.metrics).await;
            }
        }
    }

    /// Reads a document whose change event could not be used whole: the
    /// event names it, the collection says what it is now.
    async fn look_up(&self, coll: Coll, id: mongodb::bson::Bson) -> Result<Event, WatchError> {
        let name = coll.name(&self.cfg.collections);
        let found = self
            .source
            .database()
            .collection::<mongodb::bson::RawDocumentBuf>(name)
            .find_one(mongodb::bson::doc! { "_id": id.clone() })
            .await
            .map_err(|source| SourceError::Read { collection: name.to_string(), source })?;
        Ok(match found {
            Some(doc) => Event::Upsert { coll, key: id_key(&id), raw_id: id, doc },
            None => Event::Remove { coll, key: id_key(&id), raw_id: id },
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
        let mut applied = off_runtime(|| state.apply(events));
        let decoded = started.elapsed();
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
        let (categories, details) = match self.sink.video_memberships(&self.ctx.keys, applied.videos.keys()).await {
            Ok(view) => view,
            Err(err) => {
                state.undo(applied);
                return Err(err.into());
            }
        };
        let view = plan::RedisView { categories, details };
        let read = started.elapsed();
        let plan = off_runtime(|| plan::plan_batch(state, &applied, &view, self.ctx));
        let planned = started.elapsed();
        self.metrics.visited(plan.visited);
        let budget = self.sink.tx_budget(self.cfg);
        let written = async {
            if !plan.changes.is_empty() {
                self.sink.add_pending(self.status, &plan.scopes.to_members()).await?;
            }
            self.apply_runs(budget.cut(&plan.changes)).await?;
            // The videos' own keys go after every key that indexes them;
            // their last run carries the tokens (see `BatchPlan::last`).
            let mut last = budget.cut(&plan.last);
            let with_tokens = last.pop().unwrap_or_default();
            self.apply_runs(last).await?;
            let clear = !state.catching_up;
            self.sink.apply_changes_and_save_tokens(with_tokens, self.status, tokens, clear).await
        }
        .await;
        tracing::debug!(
            decode_ms = decoded.as_millis() as u64,
            read_ms = (read - decoded).as_millis() as u64,
            plan_ms = (planned - read).as_millis() as u64,
            write_ms = (started.elapsed() - planned).as_millis() as u64,
            visited = plan.visited,
            changes = plan.changes.len() + plan.last.len(),
            "batch phases"
        );
        match written {
            Ok(()) => {
                let videos: Vec<String> = applied.videos.keys().cloned().collect();
                state.commit(applied, &self.ctx.keys, &plan);
                Ok(videos)
            }
            Err(err) => {
                state.abort(applied, &self.ctx.keys, &plan);
                Err(err.into())
            }
        }
    }

    /// Writes runs of changes that may land in any order, as many at once
    /// as the rebuild writes batches.
    async fn apply_runs(&self, runs: Vec<&[Change]>) -> Result<(), SinkError> {
        use futures::{StreamExt, TryStreamExt};
        // Collected first: a lazy map over borrowed runs trips the
        // compiler's `Send` check where the watcher is spawned.
        let sends: Vec<_> = runs.into_iter().map(|run| self.sink.apply_changes(run)).collect();
        futures::stream::iter(sends)
            .buffer_unordered(self.cfg.write_concurrency.max(1))
            .try_collect::<Vec<()>>()
            .await?;
        Ok(())
    }
}

/// Whether each stream has passed the cluster time of a load.
#[derive(Debug, Clone)]
struct CatchUp {
    until: Option<mongodb::bson::Timestamp>,
    done: [bool; 4],
}

impl CatchUp {
    fn until(time: mongodb::bson::Timestamp) -> CatchUp {
        CatchUp { until: Some(time), done: [false; 4] }
    }

    fn done() -> CatchUp {
        CatchUp { until: None, done: [true; 4] }
    }

    /// A stream has passed the load when it delivers a later event, or
    /// has nothing left to deliver.
    fn see(&mut self, item: &Item) {
        let Some(until) = self.until else { return };
        match item {
            Item::Idle(coll, _) => self.done[*coll as usize] = true,
            Item::Event(coll, event, _)
                if event.cluster_time.is_some_and(|t| (t.time, t.increment) > (until.time, until.increment)) =>
            {
                self.done[*coll as usize] = true;
            }
            _ => {}
        }
    }

    fn is_done(&self) -> bool {
        self.done.iter().all(|d| *d)
    }
}

/// One batch of stream items, sorted out.
#[derive(Default)]
struct Batch {
    events: Vec<Event>,
    /// Documents to read by id: their events could not be used whole.
    lookups: Vec<(Coll, mongodb::bson::Bson)>,
    tokens: HashMap<Coll, ResumeToken>,
    newest_cluster_time: u32,
    per_collection: [u64; 4],
}

impl Batch {
    /// Takes one item; gives a restart when the streams must be reopened
    /// or the cache rebuilt.
    fn add(&mut self, cfg: &Config, item: Item, metrics: &WatchMetrics) -> Option<Restart> {
        match item {
            Item::Unresumable(_, reason) => return Some(Restart::Rebuild(reason)),
            Item::Failed(coll, err) if stream::is_history_lost(&err) => {
                return Some(Restart::Rebuild(format!("{} stream: {err}", coll.name(&cfg.collections))));
            }
            Item::Failed(coll, err) => {
                tracing::warn!(collection = coll.name(&cfg.collections), error = %err, "change stream failed");
                metrics.stream_error();
                return Some(Restart::Reopen);
            }
            Item::Idle(coll, token) => {
                self.tokens.insert(coll, token);
            }
            Item::Event(coll, event, _) => {
                if let Some(t) = event.cluster_time {
                    self.newest_cluster_time = self.newest_cluster_time.max(t.time);
                }
                let key = event.document_key.as_ref().and_then(|k| k.get("_id")).cloned();
                match (&event.operation_type, key) {
                    (OperationType::Insert | OperationType::Update | OperationType::Replace, Some(id)) => {
                        self.events.push(match event.full_document {
                            Some(doc) => Event::Upsert { coll, key: id_key(&id), raw_id: id, doc },
                            // Looked up after it was deleted: gone now.
                            None => Event::Remove { coll, key: id_key(&id), raw_id: id },
                        });
                    }
                    (OperationType::Delete, Some(id)) => {
                        self.events.push(Event::Remove { coll, key: id_key(&id), raw_id: id })
                    }
                    (op, _) => {
                        return Some(Restart::Rebuild(format!("{:?} on {}", op, coll.name(&cfg.collections))));
                    }
                }
                self.per_collection[coll as usize] += 1;
                self.tokens.insert(coll, event.id);
            }
            Item::Poison(coll, id, token, reason) => {
                // The event itself could not be used (too large, not
                // decodable): the document is read again by its id.
                tracing::warn!(collection = coll.name(&cfg.collections), reason = %reason, "change event unusable; reading the document again");
                metrics.poison(coll, &sample_id(&id), &reason);
                self.lookups.push((coll, id));
                self.per_collection[coll as usize] += 1;
                self.tokens.insert(coll, token);
            }
        }
        None
    }
}

/// A document's id as a sample in metrics and status: its written id,
/// or for an unusable one only its BSON type, never the value (which may
/// be any document).
fn sample_id(id: &mongodb::bson::Bson) -> String {
    crate::model::id::written_id(id).unwrap_or_else(|| format!("(unusable {:?} id)", id.element_type()))
}

/// Loads the state: the catalogue whole, then the videos streamed in
/// chunks. The cursor fills the next chunk while a blocking thread
/// decodes and files the previous one, so the raw documents in memory
/// are a few chunks, never the collection.
async fn load_state(source: &Source, cfg: &Config) -> Result<State, WatchError> {
    const CHUNK: usize = 8192;
    let (c, batch) = (&cfg.collections, cfg.read_batch_size);
    let (channels, categories, tags) = tokio::try_join!(
        source.read_all(&c.channel, batch),
        source.read_all(&c.category, batch),
        source.read_all(&c.tag, batch)
    )?;
    let names = c.clone();
    let internal = |e: tokio::task::JoinError| WatchError::Internal(e.to_string());
    let mut state =
        tokio::task::spawn_blocking(move || State::new(&names, channels, categories, tags)).await.map_err(internal)?;
    let (tx, mut rx) = mpsc::channel(2);
    let filing = async {
        while let Some(chunk) = rx.recv().await {
            state = tokio::task::spawn_blocking(move || {
                state.load_videos(chunk);
                state
            })
            .await
            .map_err(internal)?;
        }
        Ok::<State, WatchError>(state)
    };
    let (read, filed) = tokio::join!(source.read_chunks(&c.video, batch, CHUNK, tx), filing);
    read?;
    let mut state = filed?;
    tokio::task::spawn_blocking(move || {
        state.finish_load();
        state
    })
    .await
    .map_err(internal)
}

/// The scoped and catalogue keys the cache holds (not the per-video
/// ones): one SCAN, memory bounded by the catalogue.
async fn existing_keys(sink: &Sink, ctx: &PlanCtx) -> Result<state::Existing, WatchError> {
    let found = sink.scan_existing(&ctx.keys, state::tracked_families()).await?;
    let mut existing = state::Existing::default();
    for (_, key) in found.keys {
        existing.insert(&ctx.keys, &key, None);
    }
    Ok(existing)
}

/// Runs CPU-bound work (decoding a batch, planning it) without holding
/// up the runtime's other tasks (the HTTP probes, the lease renewal): on
/// a multi-threaded runtime the worker hands its queue to another thread
/// first. A current-thread runtime (some tests) runs it in place.
fn off_runtime<T>(work: impl FnOnce() -> T) -> T {
    use tokio::runtime::{Handle, RuntimeFlavor};
    match Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(RuntimeFlavor::MultiThread) => tokio::task::block_in_place(work),
        _ => work(),
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Writes `health:current` (60 s TTL) at most every few seconds.
async fn heartbeat(sink: &Sink, status: &StatusKeys, metrics: &WatchMetrics) {
    let now = crate::status::unix_now();
    let last = metrics.last_heartbeat.swap(now, std::sync::atomic::Ordering::Relaxed);
    if now.saturating_sub(last) < 5 {
        return;
    }
    if let Err(err) = sink.heartbeat(status, &metrics.heartbeat()).await {
        tracing::warn!(error = %err, "could not write the health heartbeat");
    }
}

fn collection_names(cfg: &Config) -> [&str; 4] {
    Coll::ALL.map(|c| c.name(&cfg.collections))
}

async fn load_tokens(sink: &Sink, status: &StatusKeys, cfg: &Config) -> Result<Option<Vec<ResumeToken>>, WatchError> {
    let Some(texts) = sink.load_tokens(status, &collection_names(cfg)).await? else { return Ok(None) };
    Ok(texts.iter().map(|text| serde_json::from_str(text).ok()).collect())
}

async fn clear_tokens(sink: &Sink, status: &StatusKeys, cfg: &Config) -> Result<(), WatchError> {
    Ok(sink.clear_tokens(status, &collection_names(cfg)).await?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::change_stream::event::ResumeToken;

    fn token(data: &str) -> ResumeToken {
        serde_json::from_value(serde_json::json!({ "_data": data })).expect("token")
    }

    #[test]
    fn an_unusable_event_becomes_a_lookup_by_id_and_moves_the_token() {
        let cfg = Config::from_raw(crate::config::RawConfig::default()).unwrap();
        let metrics = WatchMetrics::default();
        let mut batch = Batch::default();
        let item = Item::Poison(Coll::Video, mongodb::bson::Bson::String("v9".into()), token("0A"), "too large".into());
        assert!(batch.add(&cfg, item, &metrics).is_none(), "no restart for one unusable event");
        assert_eq!(batch.lookups, vec![(Coll::Video, mongodb::bson::Bson::String("v9".into()))]);
        assert!(batch.events.is_empty());
        assert_eq!(serde_json::to_string(&batch.tokens[&Coll::Video]).unwrap(), r#"{"_data":"0A"}"#);
        let problems = metrics.problems_json();
        assert_eq!(problems[0]["collection"], "VideoMedia");
        assert_eq!(problems[0]["samples"][0], "v9");
        assert_eq!(problems[0]["count"], 1);
    }

    #[test]
    fn resume_tokens_round_trip_through_json() {
        let token: ResumeToken = serde_json::from_str(r#"{"_data":"3C0000001273004A5401"}"#).expect("parses");
        let text = serde_json::to_string(&token).unwrap();
        let back: ResumeToken = serde_json::from_str(&text).expect("round trip");
        assert_eq!(serde_json::to_string(&back).unwrap(), text, "{text}");
    }
}
