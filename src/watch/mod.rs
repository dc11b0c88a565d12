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

pub mod metrics;
pub mod model;
pub mod stream;

pub use metrics::WatchMetrics;

use crate::config::Config;
use crate::keys::status::StatusKeys;
use crate::plan::{Change, FamilySet};
use crate::progress::Progress;
use crate::rebuild::{RebuildOptions, RunError, plan_ctx, rebuild_with_retries};
use crate::sink::{Fence, Lease, LeaseError, Sink, SinkError};
use crate::source::{Source, SourceError};
use crate::status::Trigger;
use model::{Coll, Event, Model, Touched, id_key};
use mongodb::change_stream::event::{OperationType, ResumeToken};
use std::collections::{BTreeSet, HashMap};
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
}

impl Default for WatchOptions {
    fn default() -> Self {
        WatchOptions { window: Duration::from_millis(200), max_batch: 20_000, on_applied: None, heartbeat: true }
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

/// Changes per MULTI/EXEC.
const CHANGES_PER_TX: usize = 500;

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
    let sink = Sink::connect(cfg).await?;
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
    let sink = Sink::connect(cfg).await?.fenced(fence.clone());
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
        let mut model: Option<Model> = None;
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
            if all_open && model.is_none() {
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
                let mut loaded = load_model(&source, cfg).await?;
                // The catalogue keys as they are in Redis, contents unknown:
                // the model may already be newer than what was written
                // (changes after the rebuild read, or while this process
                // was down); the first catalogue change rewrites them all.
                let catalog_families =
                    FamilySet::of(crate::registry::FamilyId::ALL.iter().copied().filter(|f| !f.needs_videos()));
                let existing = sink.scan_existing(&ctx.keys, catalog_families).await?;
                loaded.catalog_keys_exist(existing.keys.into_iter().map(|(_, k)| k));
                loaded.redis_run_id = sink.run_id().await?;
                tracing::info!(videos = loaded.video_count(), db = %cfg.mongodb_db, "watcher model loaded; streaming");
                metrics.streaming.store(true, std::sync::atomic::Ordering::Relaxed);
                model = Some(loaded);
            }
            let outcome = match model.as_mut() {
                Some(model) => {
                    stream_batches(
                        cfg,
                        opts,
                        &sink,
                        &source,
                        &status,
                        model,
                        &ctx,
                        &metrics,
                        &mut rx,
                        &mut starts,
                        &mut shutdown,
                    )
                    .await
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
                None => return Ok(()),
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

/// Applies batches until shutdown (`None`) or a stream failure.
#[allow(clippy::too_many_arguments)]
async fn stream_batches(
    cfg: &Config,
    opts: &WatchOptions,
    sink: &Sink,
    source: &Source,
    status: &StatusKeys,
    model: &mut Model,
    ctx: &crate::plan::PlanCtx,
    metrics: &WatchMetrics,
    rx: &mut mpsc::Receiver<Item>,
    starts: &mut [StartAt],
    shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
) -> Result<Option<Restart>, WatchError> {
    loop {
        let first = tokio::select! {
            _ = shutdown.as_mut() => return Ok(None),
            item = rx.recv() => item,
        };
        let Some(first) = first else { return Ok(Some(Restart::Reopen)) };
        // The window runs from the first event's arrival: one that queued
        // while the previous batch was being written has waited already.
        let arrived = match &first {
            Item::Event(_, _, at) => tokio::time::Instant::from_std(*at),
            _ => tokio::time::Instant::now(),
        };
        let mut items = vec![first];
        let deadline = arrived + opts.window;
        while items.len() < opts.max_batch {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(item)) => items.push(item),
                _ => break,
            }
        }
        // A Redis that restarted without persistence lost every key this
        // process wrote: only a rebuild brings them back.
        if sink.run_id().await? != model.redis_run_id {
            return Ok(Some(Restart::Rebuild("Redis restarted and lost its keys".into())));
        }
        let started = Instant::now();
        let mut events = Vec::new();
        let mut tokens: HashMap<Coll, ResumeToken> = HashMap::new();
        let mut newest_cluster_time = 0u32;
        let mut per_collection = [0u64; 4];
        for item in items {
            match item {
                Item::Unresumable(_, reason) => return Ok(Some(Restart::Rebuild(reason))),
                Item::Failed(coll, err) if stream::is_history_lost(&err) => {
                    return Ok(Some(Restart::Rebuild(format!("{} stream: {err}", coll.name(&cfg.collections)))));
                }
                Item::Failed(coll, err) => {
                    tracing::warn!(collection = coll.name(&cfg.collections), error = %err, "change stream failed");
                    metrics.stream_error();
                    return Ok(Some(Restart::Reopen));
                }
                Item::Idle(coll, token) => {
                    tokens.insert(coll, token);
                }
                Item::Event(coll, event, _) => {
                    if let Some(t) = event.cluster_time {
                        newest_cluster_time = newest_cluster_time.max(t.time);
                    }
                    let key = event.document_key.as_ref().and_then(|k| k.get("_id")).cloned();
                    match (&event.operation_type, key) {
                        (OperationType::Insert | OperationType::Update | OperationType::Replace, Some(id)) => {
                            events.push(match event.full_document {
                                Some(doc) => Event::Upsert { coll, key: id_key(&id), raw_id: id, doc },
                                // Looked up after it was deleted: gone now.
                                None => Event::Remove { coll, key: id_key(&id), raw_id: id },
                            });
                        }
                        (OperationType::Delete, Some(id)) => {
                            events.push(Event::Remove { coll, key: id_key(&id), raw_id: id })
                        }
                        (op, _) => {
                            return Ok(Some(Restart::Rebuild(format!("{:?} on {}", op, coll.name(&cfg.collections)))));
                        }
                    }
                    per_collection[coll as usize] += 1;
                    tokens.insert(coll, event.id);
                }
            }
        }
        if !events.is_empty() {
            let videos = apply_batch(sink, source, model, ctx, events).await?;
            if let Some(hook) = &opts.on_applied {
                hook(&videos);
            }
        }
        save_tokens(sink, status, cfg, &tokens).await?;
        metrics.rejected.store(model.rejected, std::sync::atomic::Ordering::Relaxed);
        for (coll, token) in tokens {
            starts[coll as usize] = StartAt::Token(token);
        }
        metrics.applied(per_collection, newest_cluster_time, started.elapsed());
        if opts.heartbeat {
            heartbeat(sink, status, metrics).await;
        }
    }
}

/// Applies events to the model and writes the resulting changes.
async fn apply_batch(
    sink: &Sink,
    source: &Source,
    model: &mut Model,
    ctx: &crate::plan::PlanCtx,
    events: Vec<Event>,
) -> Result<Vec<String>, WatchError> {
    let mut touched = Touched::default();
    for event in events {
        model.apply(event, &mut touched);
    }
    // A duplicate id whose first owner went away: the next owner's detail
    // was never loaded, so read it again.
    for w in touched.videos.clone() {
        if let Some(raw_id) = model.needs_detail(&w) {
            let coll = source.database().collection::<mongodb::bson::RawDocumentBuf>(model.video_collection());
            if let Ok(Some(doc)) = coll.find_one(mongodb::bson::doc! { "_id": raw_id.clone() }).await {
                model.apply(Event::Upsert { coll: Coll::Video, key: id_key(&raw_id), raw_id, doc }, &mut touched);
            }
        }
    }
    // The categories Redis lists for the touched videos: their membership
    // as last written, even across a restart of this process.
    // and the details they were written with (which show the index view).
    let mut redis_categories: std::collections::BTreeMap<String, BTreeSet<String>> = Default::default();
    let mut redis_details: HashMap<String, String> = HashMap::new();
    if !touched.videos.is_empty() {
        let mut conn = sink.connection();
        let mut pipe = redis::pipe();
        for w in &touched.videos {
            pipe.cmd("SMEMBERS").arg(ctx.keys.key(crate::registry::FamilyId::VideoCategories, &[w]).text);
            pipe.cmd("GET").arg(ctx.keys.key(crate::registry::FamilyId::VideoDetail, &[w]).text);
        }
        let replies: Vec<redis::Value> = pipe
            .query_async(&mut conn)
            .await
            .map_err(|source| WatchError::Sink(SinkError::Scan { attempts: 1, source }))?;
        let mut sets: Vec<Vec<String>> = Vec::new();
        for (w, pair) in touched.videos.iter().zip(replies.chunks(2)) {
            sets.push(redis::from_redis_value(pair[0].clone()).unwrap_or_default());
            if let Ok(Some(detail)) = redis::from_redis_value::<Option<String>>(pair[1].clone()) {
                redis_details.insert(w.clone(), detail);
            }
        }
        for (w, cats) in touched.videos.iter().zip(sets) {
            let cats: BTreeSet<String> = cats.into_iter().filter(|c| crate::model::id::is_usable_id(c)).collect();
            if !cats.is_empty() {
                redis_categories.insert(w.clone(), cats);
            }
        }
    }
    let tag_lists = if touched.categories.is_empty() && touched.tags.is_empty() {
        Vec::new()
    } else {
        let existing = sink.scan_existing(&ctx.keys, FamilySet::of([crate::registry::FamilyId::VideoTagList])).await?;
        let prefix = ctx.keys.key(crate::registry::FamilyId::VideoTagList, &["x", "y"]).text;
        let head = &prefix[..prefix.len() - 3];
        existing
            .keys
            .into_iter()
            .filter_map(|(_, k)| {
                let (c, t) = k.strip_prefix(head)?.split_once(':')?;
                (touched.categories.contains(c) || touched.tags.contains(t)).then(|| (c.to_string(), t.to_string()))
            })
            .collect()
    };
    let changes: Vec<Change> = model.plan(&touched, &redis_categories, &redis_details, &tag_lists, ctx);
    for chunk in changes.chunks(CHANGES_PER_TX) {
        sink.apply_changes(chunk).await?;
    }
    Ok(touched.videos.into_iter().collect())
}

async fn load_model(source: &Source, cfg: &Config) -> Result<Model, WatchError> {
    let [channels, categories, tags, videos] = source.read_four(cfg).await?;
    let names = cfg.collections.clone();
    tokio::task::spawn_blocking(move || Model::load(&names, channels, categories, tags, videos))
        .await
        .map_err(|e| WatchError::Internal(e.to_string()))
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

/// Saves tokens; called only after the writes they cover succeeded.
async fn save_tokens(
    sink: &Sink,
    status: &StatusKeys,
    cfg: &Config,
    tokens: &HashMap<Coll, ResumeToken>,
) -> Result<(), WatchError> {
    let mut texts = Vec::with_capacity(tokens.len());
    for (coll, token) in tokens {
        let text = serde_json::to_string(token).map_err(|e| WatchError::Internal(e.to_string()))?;
        texts.push((coll.name(&cfg.collections), text));
    }
    Ok(sink.save_tokens(status, &texts).await?)
}

async fn clear_tokens(sink: &Sink, status: &StatusKeys, cfg: &Config) -> Result<(), WatchError> {
    Ok(sink.clear_tokens(status, &collection_names(cfg)).await?)
}

#[cfg(test)]
mod tests {
    use mongodb::change_stream::event::ResumeToken;

    #[test]
    fn resume_tokens_round_trip_through_json() {
        let token: ResumeToken = serde_json::from_str(r#"{"_data":"3C0000001273004A5401"}"#).expect("parses");
        let text = serde_json::to_string(&token).unwrap();
        let back: ResumeToken = serde_json::from_str(&text).expect("round trip");
        assert_eq!(serde_json::to_string(&back).unwrap(), text, "{text}");
    }
}
