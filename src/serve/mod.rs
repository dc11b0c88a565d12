//! `cachewright serve`: leadership among replicas, the scheduled jobs of
//! `schedules/`, a supervised change-stream watcher, and an HTTP endpoint
//! for health, metrics and status, until SIGTERM or SIGINT.
//!
//! Among replicas exactly one is leader: the one holding the writer lease
//! (see [`crate::sink::lease`]). The leader runs the watcher and the
//! schedules under the lease's fencing epoch; the others wait and take
//! over within one lease TTL of the leader's death or stall. A leader that
//! loses the lease stops its watcher and jobs (Redis refuses their writes
//! anyway) and becomes a follower.
//!
//! Jobs run one at a time; a fire that comes while a job still runs is
//! skipped and logged. The watcher is paused around a job (its tokens
//! saved) and resumes after it, replaying what changed in between, so a
//! scheduled rebuild never overwrites newer incremental writes with its
//! older snapshot. A watcher that fails is restarted with backoff; its
//! last error shows in `/health` (503 while it is not streaming) and
//! `/status`, and `serve` keeps running.

pub mod clock;
pub mod http;
pub mod metrics;
pub mod schedule;
mod supervise;

use crate::config::Config;
use crate::keys::status::StatusKeys;
use crate::progress::Progress;
use crate::rebuild::{RebuildOptions, RunError, rebuild};
use crate::sink::{Fence, Lease, Sink, SinkError};
use crate::source::Source;
use crate::status::Trigger;
use crate::watch::WatchMetrics;
use chrono::Utc;
use http::{Handler, Response};
use metrics::ServeMetrics;
use schedule::Schedule;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use supervise::{Supervised, WatcherHealth};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub struct ServeOptions {
    pub schedules: Vec<Schedule>,
    pub watch: bool,
    pub window: Duration,
    pub http: http::Limits,
    /// How long a job waits for the watcher to stop (saving its tokens)
    /// before it aborts it; also how long a stop waits for a job.
    pub grace: Duration,
    /// Where the schedules read the time ([`clock::system`] but in tests).
    pub clock: std::sync::Arc<dyn clock::Clock>,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Schedule(#[from] schedule::ScheduleError),
    #[error(transparent)]
    Source(#[from] crate::source::SourceError),
    #[error(transparent)]
    Sink(#[from] SinkError),
}

/// How long shutdown waits for the current batch and the watcher.
/// The default [`ServeOptions::grace`].
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// `/health/live` fails when the liveness task has not ticked for this
/// long (it ticks every second).
const LIVENESS_STALE_SECONDS: u64 = 30;

fn edge_of(err: &RunError) -> &'static str {
    match err {
        RunError::Source(_) => "mongodb",
        RunError::Sink(_) | RunError::RedisRestarted => "redis",
        RunError::Lease(_) => "lease",
        RunError::Guard(_) => "guard",
        RunError::Internal(_) => "other",
    }
}

/// This instance's place among replicas.
#[derive(Debug, Clone, Default)]
struct Role {
    leader: bool,
    epoch: u64,
    holder: String,
}

/// The outcome of the last scheduled job, for `/health` and `/status`.
#[derive(Debug, Clone, serde::Serialize)]
struct JobRecord {
    schedule: String,
    finished_at: u64,
    ok: bool,
    /// The sweep guard refused it: the cache is intact but not refreshed.
    refused: bool,
    error: Option<String>,
}

pub(crate) struct Shared {
    cfg: Config,
    source: Source,
    sink: Sink,
    metrics: ServeMetrics,
    watch_metrics: Arc<WatchMetrics>,
    watch_enabled: bool,
    watcher: Arc<Mutex<WatcherHealth>>,
    /// The paused watcher's state, kept across scheduled jobs.
    carry: Arc<Mutex<Option<crate::watch::Carry>>>,
    current: Mutex<Option<String>>,
    role: Mutex<Role>,
    last_job: Mutex<Option<JobRecord>>,
    /// The leader's fenced sink, for the heartbeat; `None` on a follower.
    leader_sink: Mutex<Option<Sink>>,
    started_at: u64,
    /// Unix seconds of the last tick of the liveness task: a runtime that
    /// no longer schedules tasks stops updating it.
    alive_at: std::sync::atomic::AtomicU64,
    /// Per schedule: the interval between its fires and the unix time of
    /// its last success (the start until its first), for readiness.
    schedule_state: Mutex<std::collections::BTreeMap<String, (u64, u64)>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Shared {
    fn heartbeat(&self) -> serde_json::Value {
        let role = lock(&self.role).clone();
        serde_json::json!({
            "service": "cachewright serve",
            "pid": std::process::id(),
            "timestamp": crate::status::unix_now(),
            "started_at": self.started_at,
            "role": if role.leader { "leader" } else { "follower" },
            "epoch": role.epoch,
            "holder": role.holder,
            "current_job": *lock(&self.current),
            "last_job": *lock(&self.last_job),
            "watcher": self.watcher_json(),
        })
    }

    fn watcher_json(&self) -> serde_json::Value {
        let health = lock(&self.watcher).clone();
        let mut value = self.watch_metrics.heartbeat();
        value["state"] = serde_json::json!(health.state(&self.watch_metrics));
        value["last_error"] = serde_json::json!(health.last_error);
        value["restarts"] = serde_json::json!(health.restarts);
        value
    }

    /// Why this instance is not ready, if it is not.
    fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let leader = lock(&self.role).leader;
        if leader && self.watch_enabled {
            let health = lock(&self.watcher).clone();
            match health.state(&self.watch_metrics) {
                "streaming" | "paused" => {}
                state => problems.push(match &health.last_error {
                    Some(err) => format!("watcher is {state}; last error: {err}"),
                    None => format!("watcher is {state}"),
                }),
            }
            problems.extend(self.watch_metrics.coverage_problem());
            let lag = self.watch_metrics.lag_ms.load(Ordering::Relaxed) / 1000;
            if lag > self.cfg.watch_max_lag_seconds {
                problems.push(format!(
                    "watcher lag {lag}s exceeds CACHEWRIGHT_WATCH_MAX_LAG_SECONDS={}",
                    self.cfg.watch_max_lag_seconds
                ));
            }
        }
        if let Some(job) = lock(&self.last_job).as_ref().filter(|j| j.refused) {
            problems.push(format!(
                "scheduled job {} was refused by the sweep guard: {}",
                job.schedule,
                job.error.as_deref().unwrap_or_default()
            ));
        }
        if leader {
            problems.extend(self.overdue_jobs(crate::status::unix_now()));
        }
        problems
    }

    /// The schedules whose last job failed and whose last success is
    /// older than their interval: a failed job is tolerated until the
    /// next fire should have refreshed what it missed.
    fn overdue_jobs(&self, now: u64) -> Vec<String> {
        let last = lock(&self.last_job).clone();
        let state = lock(&self.schedule_state);
        state
            .iter()
            .filter(|(name, (interval, ok_at))| {
                let failed = last.as_ref().is_some_and(|j| &j.schedule == *name && !j.ok);
                failed && now.saturating_sub(*ok_at) > *interval
            })
            .map(|(name, (interval, ok_at))| {
                format!(
                    "schedule {name} has not succeeded for {}s (interval {interval}s); its last job failed",
                    now.saturating_sub(*ok_at)
                )
            })
            .collect()
    }

    /// `/health/live`: the runtime still runs the liveness task.
    fn live(&self) -> Response {
        let age = crate::status::unix_now().saturating_sub(self.alive_at.load(Ordering::Relaxed));
        let ok = age <= LIVENESS_STALE_SECONDS;
        let body = serde_json::json!({
            "status": if ok { "ok" } else { "stalled" },
            "seconds_since_tick": age,
        });
        Response::json(if ok { 200 } else { 503 }, &body)
    }

    /// `/metrics`: Redis's figures are read first, within a second.
    async fn metrics(&self) -> Response {
        let info = tokio::time::timeout(Duration::from_secs(1), self.sink.info()).await;
        let stats = match info {
            Ok(Ok(info)) => Some(metrics::RedisStats::from_info(&info)),
            _ => None,
        };
        self.metrics.redis_stats(stats);
        Response { status: 200, content_type: metrics::CONTENT_TYPE, body: self.metrics.render() }
    }

    async fn health(&self) -> Response {
        let mongo = tokio::time::timeout(Duration::from_secs(2), self.source.cluster_time()).await;
        let mongo = match mongo {
            Ok(Ok(_)) => "ok".to_string(),
            Ok(Err(err)) => err.to_string(),
            Err(_) => "no answer within 2s".to_string(),
        };
        let redis = tokio::time::timeout(Duration::from_secs(2), self.sink.ping()).await;
        let redis = match redis {
            Ok(Ok(_)) => "ok".to_string(),
            Ok(Err(err)) => err.to_string(),
            Err(_) => "no answer within 2s".to_string(),
        };
        self.metrics.dependency("mongodb", mongo == "ok");
        self.metrics.dependency("redis", redis == "ok");
        let problems = self.problems();
        let ok = mongo == "ok" && redis == "ok" && problems.is_empty();
        let role = lock(&self.role).clone();
        let body = serde_json::json!({
            "status": if ok { "ok" } else { "unavailable" },
            "mongodb": mongo,
            "redis": redis,
            "role": if role.leader { "leader" } else { "follower" },
            "problems": problems,
        });
        Response::json(if ok { 200 } else { 503 }, &body)
    }

    async fn status(&self) -> Response {
        let keys = StatusKeys::new(self.cfg.status_prefix.clone());
        let runs = self.sink.recent_runs(&keys, 20).await.unwrap_or_default();
        Response::json(200, &serde_json::json!({ "current": self.heartbeat(), "runs": runs }))
    }
}

fn handler(shared: Arc<Shared>) -> Handler {
    Arc::new(move |path: String| {
        let shared = shared.clone();
        Box::pin(async move {
            match path.as_str() {
                "/health/live" => shared.live(),
                "/health/ready" | "/health" => shared.health().await,
                "/metrics" => shared.metrics().await,
                "/status" => shared.status().await,
                _ => Response::text(404, "try /health/live, /health/ready, /metrics or /status\n".into()),
            }
        })
    })
}

/// Why a leader stopped leading.
enum LeaderExit {
    Shutdown,
    Lost,
}

/// Runs until `shutdown` resolves, then stops within a bounded time: no
/// new fires, the current batch finishes or the run stops cleanly (marked
/// failed with reason `shutdown`), the watcher saves its tokens, and the
/// lease is released.
pub async fn run(
    cfg: &Config,
    opts: ServeOptions,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    schedule::check_coverage(&opts.schedules, &cfg.ttl, Utc::now())?;
    let watch_metrics = Arc::new(WatchMetrics::default());
    let started_at = crate::status::unix_now();
    let metrics = ServeMetrics::new(watch_metrics.clone());
    let mut schedule_state = std::collections::BTreeMap::new();
    for s in &opts.schedules {
        metrics.schedule(&s.name, s.shortest_ttl(&cfg.ttl));
        schedule_state.insert(s.name.clone(), (s.interval_seconds(Utc::now()), started_at));
    }
    let shared = Arc::new(Shared {
        cfg: cfg.clone(),
        source: Source::connect(&cfg.mongo()).await?,
        sink: Sink::connect_for(&cfg.redis(), crate::sink::Access::Write).await?,
        metrics,
        watch_metrics,
        watch_enabled: opts.watch,
        watcher: Default::default(),
        carry: Default::default(),
        current: Mutex::new(None),
        role: Mutex::new(Role::default()),
        last_job: Mutex::new(None),
        leader_sink: Mutex::new(None),
        started_at,
        alive_at: started_at.into(),
        schedule_state: Mutex::new(schedule_state),
    });
    // The side tasks (HTTP, liveness, heartbeat) stop when `stop` is
    // cancelled; `tasks` waits for them.
    let stop = CancellationToken::new();
    let tasks = TaskTracker::new();
    tasks.spawn(http::serve(listener, handler(shared.clone()), opts.http, stop.clone().cancelled_owned()));
    {
        let (shared, stop) = (shared.clone(), stop.clone());
        tasks.spawn(async move {
            while tokio::time::timeout(Duration::from_secs(1), stop.cancelled()).await.is_err() {
                shared.alive_at.store(crate::status::unix_now(), Ordering::Relaxed);
            }
        });
    }
    {
        let (shared, stop) = (shared.clone(), stop.clone());
        tasks.spawn(async move {
            let keys = StatusKeys::new(shared.cfg.status_prefix.clone());
            // Every 10 s, and at once when this instance becomes leader.
            let mut written: Option<(u64, std::time::Instant)> = None;
            loop {
                // Only the leader reports, under its epoch.
                let sink = lock(&shared.leader_sink).clone();
                let epoch = lock(&shared.role).epoch;
                let due = written.is_none_or(|(e, at)| e != epoch || at.elapsed() >= Duration::from_secs(10));
                if let Some(sink) = sink.filter(|_| due) {
                    let beat = shared.heartbeat();
                    tokio::select! {
                        biased;
                        _ = stop.cancelled() => return,
                        result = sink.heartbeat(&keys, &beat) => {
                            if let Err(err) = result {
                                tracing::warn!(error = %err, "could not write the heartbeat");
                            }
                        }
                    }
                    written = Some((epoch, std::time::Instant::now()));
                }
                if tokio::time::timeout(Duration::from_millis(500), stop.cancelled()).await.is_ok() {
                    return;
                }
            }
        });
    }
    tasks.close();
    tracing::info!(schedules = opts.schedules.len(), watch = opts.watch, "serve started");

    tokio::pin!(shutdown);
    let status = StatusKeys::new(cfg.status_prefix.clone());
    let ttl = Duration::from_secs(cfg.lease_seconds);
    loop {
        *lock(&shared.role) = Role::default();
        let lease = tokio::select! {
            _ = &mut shutdown => break,
            lease = Lease::acquire_waiting(shared.sink.connection(), &status, ttl) => lease,
        };
        let lease = match lease {
            Ok(lease) => lease,
            Err(err) => {
                tracing::error!(error = %err, "cannot take part in leadership; retrying");
                shared.metrics.error("redis");
                tokio::select! {
                    _ = &mut shutdown => break,
                    _ = tokio::time::sleep(ttl) => continue,
                }
            }
        };
        let fence = lease.fence();
        *lock(&shared.role) = Role { leader: true, epoch: fence.epoch(), holder: lease.holder().to_string() };
        shared.metrics.leadership(true, fence.epoch());
        tracing::info!(epoch = fence.epoch(), holder = %lease.holder(), "leading: running the watcher and schedules");
        let exit = lead(cfg, &opts, &shared, &fence, &mut shutdown).await;
        *lock(&shared.leader_sink) = None;
        shared.metrics.leadership(false, fence.epoch());
        match exit {
            LeaderExit::Shutdown => {
                lease.release().await;
                break;
            }
            LeaderExit::Lost => {
                tracing::warn!(epoch = fence.epoch(), "leadership lost; following");
                drop(lease);
            }
        }
    }
    tracing::info!("serve stopping");
    stop.cancel();
    if tokio::time::timeout(SHUTDOWN_GRACE, tasks.wait()).await.is_err() {
        tracing::warn!("the HTTP server or the heartbeat did not stop in time");
    }
    tracing::info!("serve stopped");
    Ok(())
}

/// Leads until shutdown or until the lease is lost: the supervised
/// watcher, and the schedules' jobs under the same fence.
async fn lead(
    cfg: &Config,
    opts: &ServeOptions,
    shared: &Arc<Shared>,
    fence: &Fence,
    shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
) -> LeaderExit {
    let leader_sink = match shared.sink.clone().fenced(fence.clone()).await {
        Ok(sink) => sink,
        Err(err) => {
            // Without its epoch in every slot the leader cannot write
            // safely: step down, and try again as a follower would.
            tracing::warn!(error = %err, "could not arm the writer fence; stepping down");
            return LeaderExit::Lost;
        }
    };
    *lock(&shared.leader_sink) = Some(leader_sink.clone());
    // The watcher and every job of this leadership write through this
    // sink and read through serve's source: no reconnecting, no second
    // permission check, and on a cluster no epoch copies raised again
    // but for the hand-over's own raise.
    let edges = crate::rebuild::Edges { sink: leader_sink.clone(), source: shared.source.clone() };
    // Report at once; the heartbeat task keeps it fresh.
    let keys = StatusKeys::new(cfg.status_prefix.clone());
    if let Err(err) = leader_sink.heartbeat(&keys, &shared.heartbeat()).await {
        tracing::warn!(error = %err, "could not write the heartbeat");
    }
    // A state kept under an earlier lease may predate another leader's
    // writes: start afresh.
    *lock(&shared.carry) = None;
    let start_watcher = || {
        opts.watch.then(|| {
            supervise::start(
                cfg,
                opts.window,
                shared.watch_metrics.clone(),
                fence.clone(),
                shared.watcher.clone(),
                shared.carry.clone(),
                edges.clone(),
            )
        })
    };
    let mut watcher: Option<Supervised> = start_watcher();
    let clock = &opts.clock;
    let mut next_due: Vec<_> = opts.schedules.iter().map(|s| s.next_fire(clock.now())).collect();
    let exit = 'lead: loop {
        let due = next_due.iter().flatten().min().copied();
        let wake = due.unwrap_or_else(|| clock.now() + chrono::Duration::hours(1));
        tokio::select! {
            // Shutdown first, then a lost lease: never a job after either.
            biased;
            _ = shutdown.as_mut() => break LeaderExit::Shutdown,
            _ = fence.lost() => break LeaderExit::Lost,
            _ = clock.sleep_until(wake) => {}
        }
        let Some(due) = due.filter(|d| *d <= clock.now()) else { continue };
        let firing: Vec<usize> = (0..opts.schedules.len()).filter(|&i| next_due[i] == Some(due)).collect();
        let mut interrupted = None;
        for i in firing {
            let schedule = &opts.schedules[i];
            if let Some(w) = watcher.take() {
                w.stop(opts.grace).await;
                // Stopped by itself (its in-flight batch dropped) or
                // aborted, the watcher may have a write on its way under
                // this epoch that would land over the job's newer values:
                // raise the epoch, so Redis refuses it.
                if let Err(err) = leader_sink.raise_epoch().await {
                    tracing::warn!(error = %err, "could not fence off the stopped watcher; stepping down");
                    break 'lead LeaderExit::Lost;
                }
                lock(&shared.role).epoch = fence.epoch();
                shared.metrics.leadership(true, fence.epoch());
            }
            interrupted = run_job(cfg, shared, schedule, (fence, &edges), opts.grace, shutdown).await;
            if interrupted.is_some() {
                break;
            }
        }
        if let Some(exit) = interrupted {
            break exit;
        }
        if watcher.is_none() {
            watcher = start_watcher();
        }
        // Fires that passed while the job ran are skipped, never queued.
        let now = clock.now();
        for (i, s) in opts.schedules.iter().enumerate() {
            let mut next = s.next_fire(due);
            while let Some(t) = next.filter(|t| *t < now) {
                tracing::warn!(schedule = %s.name, fire = %t, "fire skipped: the previous job was still running");
                shared.metrics.skipped(&s.name);
                next = s.next_fire(t);
            }
            if next_due[i] == Some(due) || next_due[i].is_some_and(|t| t < now) {
                next_due[i] = next;
            }
        }
    };
    if let Some(w) = watcher.take() {
        w.stop(opts.grace).await;
    }
    exit
}

/// Runs one scheduled job under the leader's fence. Returns why the
/// leader must stop, if a shutdown or a lost lease cut the job short.
async fn run_job(
    cfg: &Config,
    shared: &Shared,
    schedule: &Schedule,
    (fence, edges): (&Fence, &crate::rebuild::Edges),
    grace: Duration,
    shutdown: &mut std::pin::Pin<&mut impl Future<Output = ()>>,
) -> Option<LeaderExit> {
    *lock(&shared.current) = Some(schedule.name.clone());
    let cancel = Arc::new(AtomicBool::new(false));
    let run_opts = RebuildOptions {
        cancel: Some(cancel.clone()),
        fence: Some(fence.clone()),
        edges: Some(edges.clone()),
        // The paused watcher learns from them what the job left.
        keep_names: crate::watch::state::tracked_families(),
        ..RebuildOptions::only(schedule.families())
    }
    .trigger(Trigger::Cron);
    tracing::info!(schedule = %schedule.name, "scheduled job started");
    let started = std::time::Instant::now();
    let progress = Progress::hidden();
    let job = rebuild(cfg, &run_opts, &progress);
    tokio::pin!(job);
    let mut interrupted = None;
    let result = tokio::select! {
        biased;
        _ = shutdown.as_mut() => {
            interrupted = Some(LeaderExit::Shutdown);
            tracing::info!(schedule = %schedule.name, "shutdown during a job; stopping before its next batch");
            cancel.store(true, Ordering::SeqCst);
            match tokio::time::timeout(grace, &mut job).await {
                Ok(result) => result,
                Err(_) => Err(RunError::Internal("the job did not stop in time".into())),
            }
        }
        result = &mut job => result,
    };
    *lock(&shared.current) = None;
    let record = |ok: bool, refused: bool, error: Option<String>| JobRecord {
        schedule: schedule.name.clone(),
        finished_at: crate::status::unix_now(),
        ok,
        refused,
        error,
    };
    match result {
        Ok(summary) => {
            tracing::info!(schedule = %schedule.name, keys_written = summary.written_total(), keys_deleted = summary.deleted_total(), "scheduled job completed");
            if let Some(carry) = lock(&shared.carry).as_mut() {
                let keys = crate::keys::Keys::new(cfg.prefix.clone());
                carry.after_job(&keys, schedule.families(), &summary.kept_names);
            }
            shared.metrics.completed("cron", &schedule.name, &summary);
            if let Some(state) = lock(&shared.schedule_state).get_mut(&schedule.name) {
                state.1 = crate::status::unix_now();
            }
            *lock(&shared.last_job) = Some(record(true, false, None));
        }
        Err(err) => {
            tracing::error!(schedule = %schedule.name, error = %err, "scheduled job failed");
            shared.metrics.failed("cron", edge_of(&err), started.elapsed());
            // What a failed job wrote is unknown: the watcher starts over.
            *lock(&shared.carry) = None;
            let refused = matches!(err, RunError::Guard(_));
            *lock(&shared.last_job) = Some(record(false, refused, Some(err.to_string())));
            if matches!(err, RunError::Sink(SinkError::LeaseLost | SinkError::Fenced { .. })) {
                interrupted.get_or_insert(LeaderExit::Lost);
            }
        }
    }
    interrupted
}
