//! Incremental refresh from MongoDB change streams (`cachewright watch`).
//!
//! The watcher keeps a compact state of the sources ([`state`]). Events
//! are coalesced over a short window, applied to the state, and turned
//! into exactly the writes a full rebuild from the new state would make
//! for the touched keys ([`plan`]). Resume tokens are saved only after
//! those writes succeed, so delivery is at-least-once and every write is
//! idempotent.
//!
//! Start-up: with saved tokens for every collection the streams resume
//! from them; otherwise (first start, lost history, an unusable token, a
//! drop, rename or invalidate) the watcher records MongoDB's cluster time,
//! runs a full rebuild, and streams from that time, so no change falls in
//! the gap and none is overwritten by older data.
//!
//! By role: this file holds the leader loop and the opening of streams;
//! `restart` decides what follows a stop; `load` restores the state, the tracked keys
//! and the tokens; `batch` sorts stream items into a batch; `engine`
//! applies batches; `state`, `members` and `compact` are the state;
//! `plan` is the pure batch planner (`delta` its patches) and `protocol`
//! the order in which a batch's writes reach Redis; `drift` draws the
//! keys the continuous drift check compares between batches; `deferred`
//! writes on around slots a degraded cluster does not cover.

mod arena;
mod batch;
pub mod catalog;
pub mod deferred;
pub mod delta;
pub mod drift;
mod engine;
mod handles;
mod homes;
mod index_fields;
mod load;
pub mod members;
mod memo;
pub mod metrics;
pub mod model;
pub mod plan;
pub mod protocol;
pub mod restart;
pub mod state;
pub mod stream;
pub mod videos;

pub use metrics::WatchMetrics;

use crate::config::{Collections, Config};
use crate::keys::status::StatusKeys;
use crate::plan::FamilySet;
use crate::progress::Progress;
use crate::rebuild::{RebuildOptions, RunError, plan_ctx, rebuild_with_retries};
use crate::sink::{Fence, Lease, LeaseError, Sink, SinkError};
use crate::source::{Source, SourceError};
use crate::status::Trigger;
use batch::CatchUp;
use engine::Engine;
use load::{clear_tokens, load_beside_cache, load_tokens, resume_kept};
use model::Coll;
use restart::{Next, Restart};
use state::State;
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
    /// Keys a minute the drift check compares with what a rebuild would
    /// write (0: off; see [`drift`]).
    pub drift_per_minute: u64,
    /// Connections the caller holds (serve's leader), the sink fenced by
    /// the fence [`run_fenced`] is given: used instead of connecting.
    pub edges: Option<crate::rebuild::Edges>,
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
            drift_per_minute: 0,
            edges: None,
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
    let sink = Sink::connect_for(&cfg.redis(), crate::sink::Access::Write).await?;
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

/// The full rebuild a watcher without usable tokens runs once its streams
/// are open, fenced by its lease, before it loads its state.
async fn rebuild_first(
    cfg: &Config,
    opts: &WatchOptions,
    fence: &Fence,
    metrics: &WatchMetrics,
    reason: &str,
) -> Result<(), WatchError> {
    tracing::info!(reason = %reason, "streams open; running a full rebuild before applying changes");
    let opts = RebuildOptions { fence: Some(fence.clone()), edges: opts.edges.clone(), ..RebuildOptions::full() }
        .trigger(Trigger::ChangeStream);
    metrics.rebuild();
    rebuild_with_retries(cfg, &opts, &Progress::hidden(), 3).await?;
    Ok(())
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
    let (sink, source) = match &opts.edges {
        Some(edges) => (edges.sink.clone(), edges.source.clone()),
        None => (
            Sink::connect_writer(&cfg.redis()).await?.fenced(fence.clone()).await?,
            Source::connect(&cfg.mongo()).await?,
        ),
    };
    let status = StatusKeys::new(cfg.status_prefix.clone());
    let mongo = cfg.mongo();
    let ctx = plan_ctx(cfg, FamilySet::all());
    let mut rebuild_reason: Option<String> = None;
    'establish: loop {
        let saved = match &rebuild_reason {
            Some(_) => None,
            None => load_tokens(&sink, &status, &cfg.collections).await?,
        };
        // Without tokens the streams open first, then the rebuild reads:
        // every change after the snapshot is in the streams, none is lost
        // in the gap, and none is overwritten by the rebuild's older read.
        let fresh = saved.is_none();
        let mut starts = match saved {
            Some(tokens) => tokens.into_iter().map(StartAt::Token).collect::<Vec<_>>(),
            None => {
                clear_tokens(&sink, &status, &cfg.collections).await?;
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
        let mut reopens = crate::retry::RetryPolicy::REOPEN_STREAMS.start();
        let mut drift = drift::Drift::new(opts.drift_per_minute);
        loop {
            let opened_at = Instant::now();
            let (tx, mut rx) = mpsc::channel::<Item>(20_000);
            let mut opened = Vec::new();
            // Owned: they end with the engine, even when its future is
            // dropped.
            let tasks: Vec<crate::tasks::Owned<()>> = Coll::ALL
                .iter()
                .zip(starts.iter().cloned())
                .map(|(coll, start)| {
                    let name = coll.name(&cfg.collections).to_string();
                    let (open_tx, open_rx) = tokio::sync::oneshot::channel();
                    opened.push(open_rx);
                    crate::tasks::spawn(stream::follow(source.clone(), *coll, name, start, tx.clone(), open_tx))
                })
                .collect();
            drop(tx);
            let all_open = futures::future::join_all(opened).await.iter().all(Result::is_ok);
            // Loading the state (and the rebuild before it) meets the same
            // servers as streaming does: what fails there is judged like a
            // failed batch, so a MongoDB or Redis that is restarting leads
            // to a reopen (or a rebuild, without tokens) after the backoff,
            // not to the end of the watcher. `Ok(false)`: shut down.
            let prepared: Result<bool, WatchError> = async {
                if !all_open {
                    return Ok(true);
                }
                match state.as_mut() {
                    Some((kept, _)) if !metrics.is_streaming() => {
                        catch_up = resume_kept(kept, &sink, &status, &source).await?;
                    }
                    Some(_) => return Ok(true),
                    None => {
                        if fresh {
                            let reason = rebuild_reason.take().unwrap_or_else(|| "no saved resume tokens".into());
                            tokio::select! {
                                _ = &mut shutdown => return Ok(false),
                                result = rebuild_first(cfg, opts, &fence, &metrics, &reason) => result?,
                            }
                        }
                        let (loaded, run_id, loaded_at) =
                            load_beside_cache(&sink, &source, &status, &mongo, &ctx).await?;
                        tracing::debug!(loaded_at = ?loaded_at, "catching up with the load");
                        catch_up = CatchUp::until(loaded_at);
                        state = Some((loaded, run_id));
                    }
                }
                metrics.streaming.store(true, std::sync::atomic::Ordering::Relaxed);
                Ok(true)
            }
            .await;
            let outcome = match (prepared, state.as_mut()) {
                (Ok(false), _) => return Ok(()),
                (Err(err), _) => Err(err),
                (Ok(true), Some((state, run_id))) => {
                    let engine = Engine {
                        names: &cfg.collections,
                        write_concurrency: cfg.write_concurrency,
                        opts,
                        sink: &sink,
                        source: &source,
                        status: &status,
                        ctx: &ctx,
                        metrics: &metrics,
                    };
                    engine
                        .stream_batches(state, run_id, &mut catch_up, &mut rx, &mut starts, &mut drift, &mut shutdown)
                        .await
                }
                // A stream failed to open before anything was loaded; its
                // error is in the channel.
                (Ok(true), None) => first_failure(&cfg.collections, &mut rx).await,
            };
            drop(tasks);
            match restart::decide(outcome, &starts)? {
                Next::Stop => {
                    if let (Some(carry), Some((state, redis_run_id))) = (opts.carry.as_ref(), state.take()) {
                        *lock(carry) = Some(Carry { state, starts, redis_run_id, catch_up });
                    }
                    return Ok(());
                }
                Next::Reopen { failed } => {
                    if let Some(why) = failed {
                        metrics.failed_batches.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        tracing::warn!("{why}; the batch was taken back and is replayed");
                    }
                    reopens.start_over_after(opened_at.elapsed());
                    let delay = reopens.pause();
                    tracing::warn!(
                        delay_ms = delay.as_millis() as u64,
                        "change streams failed; reopening from the saved tokens"
                    );
                    tokio::select! {
                        _ = &mut shutdown => return Ok(()),
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
                Next::Rebuild(reason) => {
                    tracing::warn!(reason = %reason, db = %cfg.mongodb_db, "change streams cannot resume; rebuilding");
                    // Not streaming until the rebuild and the reload are
                    // done: the cache is incomplete meanwhile, and
                    // `/health` says so.
                    metrics.streaming.store(false, std::sync::atomic::Ordering::Relaxed);
                    rebuild_reason = Some(reason);
                    continue 'establish;
                }
            }
        }
    }
}

/// Reads the failure a stream reported while opening.
async fn first_failure(names: &Collections, rx: &mut mpsc::Receiver<Item>) -> Result<Option<Restart>, WatchError> {
    while let Some(item) = rx.recv().await {
        if let Item::Unresumable(_, reason) = item {
            return Ok(Some(Restart::Rebuild(reason)));
        }
        if let Item::Failed(coll, err) = item {
            let name = coll.name(names);
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

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
