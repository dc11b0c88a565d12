//! The full rebuild: read the four collections concurrently, plan on the
//! blocking pool with rayon, write through concurrent pipelines, then sweep.
//! Reading, planning and writing overlap; only the small per-video index
//! tuples are held until the end.

pub mod guard;
mod summary;
pub(crate) mod videos;

pub use summary::{RunSummary, Sweep};

use crate::config::Config;
use crate::keys::Keys;
use crate::keys::status::StatusKeys;
use crate::model::catalog::Catalog;
use crate::model::report::{CollectionReport, RefReport};
use crate::plan::{self, FamilySet, Op, PlanCtx, TxBudget};
use crate::progress::Progress;
use crate::registry::FamilyId;
use crate::sink::{self, Fence, Lease, LeaseError, Sink, SinkError};
use crate::source::{Source, SourceError};
use crate::status::{JobReporter, Trigger};
use guard::{GuardError, GuardPolicy, families_fed_by};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

#[derive(Debug, Clone)]
pub struct RebuildOptions {
    pub families: FamilySet,
    pub dry_run: bool,
    pub trigger: Trigger,
    /// Set to true to stop the run before its next batch (shutdown).
    pub cancel: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// The writer lease the run writes under, when its caller (a `serve`
    /// or `watch` leader) holds one; otherwise the run takes its own.
    pub fence: Option<Fence>,
    /// `--allow-mass-delete`: skip the sweep guard.
    pub allow_mass_delete: bool,
    /// Families whose written key names the summary lists (the watcher
    /// under `serve` learns from them what the job left in the cache).
    pub keep_names: FamilySet,
    /// How many stale key names one sweep pass keeps (see `sink::sweep`).
    pub sweep_cap: usize,
    /// Connections the caller already holds (serve's leader): the run
    /// uses them instead of connecting, checking permissions and raising
    /// a cluster's epoch copies again.
    pub edges: Option<Edges>,
}

/// A connected source and a sink fenced by the run's [`RebuildOptions::fence`].
#[derive(Clone)]
pub struct Edges {
    pub sink: Sink,
    pub source: Source,
}

impl std::fmt::Debug for Edges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Edges { .. }")
    }
}

/// The default [`RebuildOptions::sweep_cap`]: about 10 MB of names.
pub const SWEEP_CAP: usize = 100_000;

impl RebuildOptions {
    /// A manual run of every family.
    pub fn full() -> RebuildOptions {
        RebuildOptions {
            families: FamilySet::all(),
            dry_run: false,
            trigger: Trigger::Manual,
            cancel: None,
            fence: None,
            allow_mass_delete: false,
            keep_names: FamilySet::of([]),
            sweep_cap: SWEEP_CAP,
            edges: None,
        }
    }

    pub fn only(families: FamilySet) -> RebuildOptions {
        RebuildOptions { families, ..RebuildOptions::full() }
    }

    pub fn dry_run(mut self) -> RebuildOptions {
        self.dry_run = true;
        self
    }

    pub fn trigger(mut self, trigger: Trigger) -> RebuildOptions {
        self.trigger = trigger;
        self
    }
}

/// Why a run failed. Every key is then either old or new: batches are
/// atomic and nothing is swept.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Source(#[from] SourceError),
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error(transparent)]
    Guard(#[from] GuardError),
    #[error("Redis restarted during the run (its run_id changed), so keys written before the restart may be gone")]
    RedisRestarted,
    #[error("internal error: {0}")]
    Internal(String),
}

impl RunError {
    /// Whether the run stopped because its writer lease went away.
    pub fn is_lease_loss(&self) -> bool {
        matches!(self, RunError::Sink(SinkError::LeaseLost | SinkError::Fenced { .. }))
    }

    /// Whether running the whole rebuild again may succeed: a server that
    /// went away and came back, a network fault.
    pub fn is_retriable(&self) -> bool {
        match self {
            RunError::Source(e) => e.is_retriable(),
            RunError::Sink(e) => e.is_retriable(),
            RunError::RedisRestarted => true,
            RunError::Lease(_) | RunError::Guard(_) => false,
            RunError::Internal(_) => false,
        }
    }
}

/// Runs [`rebuild`] up to `attempts` times while it fails for reasons that
/// may pass (a server restart mid-run). A full rebuild is idempotent, so a
/// second attempt rewrites whatever the first one lost.
pub async fn rebuild_with_retries(
    cfg: &Config,
    opts: &RebuildOptions,
    progress: &Progress,
    attempts: u32,
) -> Result<RunSummary, RunError> {
    let mut tries = crate::retry::RetryPolicy::REBUILD.with_attempts(attempts).start();
    loop {
        let err = match rebuild(cfg, opts, progress).await {
            Err(err) if err.is_retriable() => err,
            other => return other,
        };
        let Some(delay) = tries.next_pause() else { return Err(err) };
        tracing::warn!(attempt = tries.made() - 1, error = %err, delay_ms = delay.as_millis() as u64,
            "rebuild failed, running it again");
        tokio::time::sleep(delay).await;
    }
}

impl From<tokio::task::JoinError> for RunError {
    fn from(err: tokio::task::JoinError) -> Self {
        RunError::Internal(format!("planning task failed: {err}"))
    }
}

/// Builds the planner's context from the configuration.
pub fn plan_ctx(cfg: &Config, families: FamilySet) -> PlanCtx {
    PlanCtx {
        keys: Keys::new(cfg.prefix.clone()),
        search_lengths: cfg.tag_search_lengths.clone(),
        home_sections: cfg.home_sections(),
        families,
    }
}

/// Splits ops into write batches by key count and by what they cost
/// Redis (see [`crate::plan::Op::cost`]): Redis runs each MULTI/EXEC as
/// one block that the site's readers wait behind, so the cost budget
/// (`write_batch_cost`) is what keeps them short. A key above the budget
/// goes alone, and the sink writes it through a stage in bounded steps
/// (see `sink::stage`).
pub struct Batcher {
    tx: mpsc::Sender<Vec<Op>>,
    budget: TxBudget,
    current: Vec<Op>,
    cost: usize,
}

impl Batcher {
    pub fn new(tx: mpsc::Sender<Vec<Op>>, budget: TxBudget) -> Batcher {
        Batcher { tx, budget, current: Vec::new(), cost: 0 }
    }

    /// Queues ops; returns false once the writer has stopped (it failed,
    /// and its error is what the run reports).
    pub async fn send(&mut self, ops: Vec<Op>) -> bool {
        for op in ops {
            let cost = op.cost();
            // A key that would take the batch past its budget starts the next.
            if !self.budget.admits(self.current.len(), self.cost, cost) && !self.flush().await {
                return false;
            }
            self.cost += cost;
            self.current.push(op);
            // A full batch goes now rather than with the next key.
            if self.budget.is_full(self.current.len(), self.cost) && !self.flush().await {
                return false;
            }
        }
        true
    }

    pub async fn flush(&mut self) -> bool {
        if self.current.is_empty() {
            return true;
        }
        self.cost = 0;
        self.tx.send(std::mem::take(&mut self.current)).await.is_ok()
    }
}

/// Reads and decodes the catalogue collections concurrently.
pub async fn read_catalog(
    source: &Source,
    cfg: &Config,
) -> Result<(Catalog, [(String, CollectionReport); 3], RefReport), RunError> {
    let names = cfg.collections.clone();
    let batch = cfg.read_batch_size;
    let (channels, categories, tags) = tokio::try_join!(
        source.read_all(&names.channel, batch),
        source.read_all(&names.category, batch),
        source.read_all(&names.tag, batch),
    )?;
    let decoded =
        tokio::task::spawn_blocking(move || crate::plan::decode_catalog(&names, &channels, &categories, &tags)).await?;
    Ok(decoded)
}

/// Runs one full rebuild (or dry run) and returns its summary.
///
/// A real run writes under the writer lease: the caller's (`opts.fence`)
/// or its own, taken for the run and released when it ends or is dropped.
/// Every batch, sweep deletion and status write is fenced by the lease's
/// epoch. A dry run takes no lease and writes nothing.
pub async fn rebuild(cfg: &Config, opts: &RebuildOptions, progress: &Progress) -> Result<RunSummary, RunError> {
    // A dry run reads Redis (the sweep's scan) but writes nothing, so a
    // read-only user may run it.
    let access = if opts.dry_run { crate::sink::Access::Read } else { crate::sink::Access::Write };
    let status = StatusKeys::new(cfg.status_prefix.clone());
    if let (Some(edges), Some(_), false) = (&opts.edges, &opts.fence, opts.dry_run) {
        return run_reported(cfg, opts, progress, edges.sink.clone(), status, None).await;
    }
    let sink = Sink::connect_for(&cfg.redis(), access).await?;
    if opts.dry_run {
        return run_pipeline(cfg, opts, progress, &sink).await;
    }
    let (fence, own_lease) = match &opts.fence {
        Some(fence) => (fence.clone(), None),
        None => {
            let ttl = std::time::Duration::from_secs(cfg.lease_seconds);
            let lease = Lease::acquire(sink.connection(), &status, ttl).await?;
            (lease.fence(), Some(lease))
        }
    };
    let sink = sink.fenced(fence).await?;
    run_reported(cfg, opts, progress, sink, status, own_lease).await
}

/// Runs the pipeline with a fenced sink, reporting the run in the status
/// keys, and releases the run's own lease (if it took one) at the end.
async fn run_reported(
    cfg: &Config,
    opts: &RebuildOptions,
    progress: &Progress,
    sink: Sink,
    status: StatusKeys,
    own_lease: Option<Lease>,
) -> Result<RunSummary, RunError> {
    let redis_run_id = sink.run_id().await?;
    let mut reporter = JobReporter::start(sink.clone(), status, opts.trigger).await;
    tracing::info!(run_id = %reporter.run_id, trigger = %opts.trigger, "run registered");
    let (events_tx, mut events_rx) = tokio::sync::mpsc::unbounded_channel();
    let reporting = crate::tasks::spawn(async move {
        while let Some(event) = events_rx.recv().await {
            reporter.progress(&event).await;
        }
        reporter
    });
    let mut result = run_pipeline(cfg, opts, &progress.with_events(events_tx), &sink).await;
    // A Redis that restarted without its data also lost the lease and the
    // epoch: that is a restart to redo the run for, not a take-over.
    if result.as_ref().is_err_and(RunError::is_lease_loss) && sink.run_id().await.is_ok_and(|now| now != redis_run_id) {
        result = Err(RunError::RedisRestarted);
    }
    let reporter = reporting.await?;
    match &result {
        Ok(summary) => {
            reporter.complete(summary.written_total(), summary.deleted_total(), summary.rejected_total()).await
        }
        Err(RunError::Sink(SinkError::Stopped)) => reporter.fail("shutdown").await,
        Err(err) => reporter.fail(&err.to_string()).await,
    }
    if let Some(lease) = own_lease {
        lease.release().await;
    }
    result
}

/// The existing keys of `families`, when a collection gave no usable
/// document (the empty-source guard needs them; a normal run never does).
async fn guard_source(
    sink: &Sink,
    ctx: &PlanCtx,
    cfg: &Config,
    policy: GuardPolicy,
    group: &str,
    collection: &str,
    report: &CollectionReport,
) -> Result<(), RunError> {
    let rejected = report.rejected_total();
    if policy.force || report.read > rejected {
        return Ok(());
    }
    let families = families_fed_by(group, ctx.families);
    if families.iter().next().is_none() {
        return Ok(());
    }
    let existing = sink.count_existing(&ctx.keys, families).await?;
    policy.check_source(collection, &cfg.mongodb_db, report.read, rejected, existing)?;
    Ok(())
}

/// The sweep's first pass, made while the index keys are written: keys
/// of per-video families are judged against the finished video table, the
/// others are kept for after the writes.
fn early_sweep_scan(
    sink: &Sink,
    ctx: &PlanCtx,
    opts: &RebuildOptions,
    table: Arc<plan::index::VideoTable>,
) -> crate::tasks::Owned<Result<sink::Stale, SinkError>> {
    let (sink, keys, families, cap) = (sink.clone(), ctx.keys.clone(), opts.families, opts.sweep_cap);
    crate::tasks::spawn(async move {
        let judge = |family: FamilyId, args: &[&str], _: &str| args.first().and_then(|id| table.planned(family, id));
        sink.find_stale(&keys, families, &judge, cap).await
    })
}

async fn run_pipeline(
    cfg: &Config,
    opts: &RebuildOptions,
    progress: &Progress,
    sink: &Sink,
) -> Result<RunSummary, RunError> {
    // A dry run only reports; the guard stops real runs.
    let policy = GuardPolicy { max_share: cfg.sweep_max_share, force: opts.allow_mass_delete || opts.dry_run };
    let started = Instant::now();
    let source = match &opts.edges {
        Some(edges) => edges.source.clone(),
        None => Source::connect(&cfg.mongo()).await?,
    };
    let memory_before = sink.used_memory().await.ok();
    let redis_run_id = sink.run_id().await?;
    let ctx = Arc::new(plan_ctx(cfg, opts.families));
    // Told before this run writes anything: a keyspace that holds no key
    // of the run's families leaves its sweep nothing to delete, since
    // every such key at the end is this run's (it holds the writer lease;
    // `serve` pauses its watcher around a job). Then no pass scans the
    // keys just written, which cost Redis about 3 s at 500K videos: a
    // first run, or the rebuild after Redis lost its data.
    let nothing_before = match sink.holds_no_family_key(&ctx.keys, opts.families).await {
        Ok(none) => none,
        Err(err) => {
            tracing::warn!(error = %err, "could not tell whether Redis holds keys of this run; the sweep scans as usual");
            false
        }
    };

    let (tx, rx) = mpsc::channel::<Vec<Op>>(16);
    let budget = sink.tx_budget();
    let write_stage = Arc::new(progress.stage("writing ops", 0));
    let writer = {
        let stage = write_stage.clone();
        let sink = (!opts.dry_run).then(|| sink.clone());
        let cancel = opts.cancel.clone();
        let keep = opts.keep_names;
        // Owned: a run dropped mid-way (a job cut short, an aborted
        // watcher) stops writing with it.
        crate::tasks::spawn(sink::run_writer(sink, rx, cfg.write_concurrency, cancel, keep, move |n| stage.inc(n)))
    };

    let mut early_scan = None;
    let produce = async {
        // The catalogue first (thousands of documents against the videos'
        // millions): videos are resolved against it as they stream in.
        let (catalog, reports, mut refs) = read_catalog(&source, cfg).await?;
        // Nothing of a collection that gave no usable document is written
        // while its families hold keys.
        for (group, (name, report)) in ["channel", "category", "tag"].into_iter().zip(&reports) {
            guard_source(sink, &ctx, cfg, policy, group, name, report).await?;
        }
        let catalog = Arc::new(catalog);
        let catalog_side = async {
            let (ops, plan_refs) = {
                let (catalog, ctx) = (catalog.clone(), ctx.clone());
                tokio::task::spawn_blocking(move || plan::plan_catalog(&catalog, &ctx)).await?
            };
            let mut batcher = Batcher::new(tx.clone(), budget);
            let _ = batcher.send(ops).await && batcher.flush().await;
            Ok::<_, RunError>(plan_refs)
        };
        let video_side = async {
            if !opts.families.needs_videos() {
                return Ok(None);
            }
            let batcher = Batcher::new(tx.clone(), budget);
            videos::read_videos(&source, &cfg.mongo(), ctx.clone(), catalog.clone(), batcher, progress).await.map(Some)
        };
        let (plan_refs, video_part) = tokio::try_join!(catalog_side, video_side)?;
        refs.merge(&plan_refs);
        let mut collections: Vec<(String, CollectionReport)> = reports.into_iter().collect();
        let mut table = None;
        if let Some((videos, intake)) = video_part {
            guard_source(sink, &ctx, cfg, policy, "video", &cfg.collections.video, &intake.report).await?;
            collections.push((cfg.collections.video.clone(), intake.report));
            refs.merge(&intake.refs);
            let videos = Arc::new(videos);
            // The sweep's scan starts now, beside the index keys' writes:
            // every per-video key can be judged (the table is whole), the
            // few others once the writes are done.
            if !nothing_before {
                early_scan = Some(early_sweep_scan(sink, &ctx, opts, videos.clone()));
            }
            let batcher = Batcher::new(tx.clone(), budget);
            videos::plan_index_keys(videos.clone(), catalog.clone(), ctx.clone(), batcher).await?;
            table = Some(videos);
        }
        Ok::<_, RunError>((collections, refs, table))
    };
    let produced = produce.await;
    drop(tx);
    let written = writer.await?;
    write_stage.finish();
    let written = written?;
    let (collections, refs, table) = produced?;
    let videos_indexed = table.as_ref().map_or(0, |t| t.indexed());

    let sweep_started = Instant::now();
    // Redis without persistence forgets everything on a restart; if that
    // happened mid-run, earlier batches are gone and the run must be redone.
    if sink.run_id().await? != redis_run_id {
        return Err(RunError::RedisRestarted);
    }
    let digested = |key: &str| written.produced.contains(&sink::digest(key));
    let produced = |family: FamilyId, args: &[&str], key: &str| {
        let per_video = table.as_deref().zip(args.first()).and_then(|(table, id)| table.planned(family, id));
        Some(per_video.unwrap_or_else(|| digested(key)))
    };
    let early = match early_scan {
        Some(scan) => Some(scan.await??).filter(|stale| !stale.later_dropped),
        None => None,
    };
    let mut stale = match early {
        _ if nothing_before => sink::Stale::default(),
        Some(mut stale) => {
            stale.settle(digested, opts.sweep_cap);
            stale
        }
        // More undecided keys than the cap (or no early scan): a pass now
        // judges every key as it comes.
        None => sink.find_stale(&ctx.keys, opts.families, &produced, opts.sweep_cap).await?,
    };
    let (not_utf8, scanned) = (stale.not_utf8, stale.scanned);
    let sweep = match nothing_before {
        true => summary::Sweep::Skipped,
        false => summary::Sweep::Scanned(scanned),
    };
    if let Err(refused) = policy.check_sweep_after_writes(stale.total(), written.ops) {
        return Err(refused.into());
    }
    let mut deleted = BTreeMap::new();
    if opts.dry_run {
        let real = GuardPolicy { max_share: cfg.sweep_max_share, force: opts.allow_mass_delete };
        if let Err(refused) = real.check_sweep_after_writes(stale.total(), written.ops) {
            tracing::warn!(reason = %refused, "a real run would refuse to sweep");
        }
        deleted = stale.by_family;
    } else {
        // Above the cap a pass names only some stale keys; once they are
        // gone, the next pass names more. Each pass deletes at least one.
        loop {
            sink.unlink_stale(&stale).await?;
            for (family, _) in &stale.keys {
                *deleted.entry(*family).or_default() += 1;
            }
            if stale.is_complete() {
                break;
            }
            tracing::info!(
                deleted = stale.keys.len(),
                left = stale.total() - stale.keys.len() as u64,
                "sweep pass done, scanning again"
            );
            stale = sink.find_stale(&ctx.keys, opts.families, &produced, opts.sweep_cap).await?;
        }
    }
    match sweep {
        summary::Sweep::Skipped => {
            tracing::info!("sweep skipped: Redis held no key of this run's families when it began")
        }
        summary::Sweep::Scanned(scanned) => tracing::info!(
            deleted = deleted.values().sum::<u64>(),
            scanned,
            elapsed_ms = sweep_started.elapsed().as_millis() as u64,
            "sweep done"
        ),
    }
    let memory_after = sink.used_memory().await.ok();

    Ok(RunSummary {
        families: opts.families,
        written: written.written,
        deleted,
        collections,
        refs,
        videos_indexed,
        duration: started.elapsed(),
        memory_before,
        memory_after,
        dry_run: opts.dry_run,
        not_utf8,
        sweep,
        kept_names: written.names,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::Keys;
    use crate::plan::Value;
    use crate::registry::FamilyId;

    fn detail(keys: &Keys, i: usize, bytes: usize) -> Op {
        Op { key: keys.key(FamilyId::VideoDetail, &[&format!("v{i}")]), value: Value::String("x".repeat(bytes)) }
    }

    /// Transactions are bounded by what they cost Redis, not only by key
    /// count: many small keys fill one up to the budget, a key above the
    /// budget goes alone, and a zset of short members costs by element.
    #[tokio::test]
    async fn batches_are_bounded_by_redis_cost() {
        let keys = Keys::new("app:");
        let (tx, mut rx) = mpsc::channel(64);
        const BATCH_COST: usize = 400_000;
        let mut batcher = Batcher::new(tx, TxBudget { max_keys: 1000, max_cost: BATCH_COST });
        let small: Vec<Op> = (0..400).map(|i| detail(&keys, i, 800)).collect();
        assert!(batcher.send(small).await);
        assert!(batcher.send(vec![detail(&keys, 9999, BATCH_COST * 2)]).await);
        let members = (0..2000).map(|i| (i as i64, format!("m{i}"))).collect();
        let zset = Op { key: keys.key(FamilyId::VideoListHome, &["s", "latest"]), value: Value::Zset(members) };
        assert!(batcher.send(vec![zset]).await);
        assert!(batcher.flush().await);
        drop(batcher);
        let mut sizes = Vec::new();
        while let Some(batch) = rx.recv().await {
            let cost: usize = batch.iter().map(Op::cost).sum();
            assert!(batch.len() == 1 || cost <= BATCH_COST, "a batch of {} keys costs {cost}", batch.len());
            sizes.push(batch.len());
        }
        // 400 details fill batches up to the budget; the big string and
        // the zset (2000 members at 1,200+ each) go alone.
        let one = detail(&keys, 1, 800);
        let per = BATCH_COST / one.cost();
        assert_eq!(sizes, vec![per, per, 400 - 2 * per, 1, 1], "{sizes:?}");
    }
}
