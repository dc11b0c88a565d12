//! `cachewright serve`: runs the scheduled jobs of `schedules/`, the
//! change-stream watcher, and an HTTP endpoint for health, metrics and
//! status, until SIGTERM or SIGINT.
//!
//! Jobs run one at a time; a fire that comes while a job still runs is
//! skipped and logged. Every job takes the rebuild lease, so among several
//! replicas exactly one runs each fire. The watcher is paused around a job
//! (its tokens saved) and resumes after it, replaying what changed in
//! between, so a scheduled rebuild never overwrites newer incremental
//! writes with its older snapshot.

pub mod http;
pub mod metrics;
pub mod schedule;

use crate::config::Config;
use crate::keys::status::StatusKeys;
use crate::progress::Progress;
use crate::rebuild::{RebuildOptions, RunError, rebuild};
use crate::sink::{Sink, SinkError};
use crate::source::Source;
use crate::status::Trigger;
use crate::watch::{WatchMetrics, WatchOptions};
use chrono::Utc;
use http::{Handler, Response};
use metrics::ServeMetrics;
use schedule::Schedule;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;

pub struct ServeOptions {
    pub schedules: Vec<Schedule>,
    pub watch: bool,
    pub window: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Schedule(#[from] schedule::ScheduleError),
    #[error(transparent)]
    Source(#[from] crate::source::SourceError),
    #[error(transparent)]
    Sink(#[from] SinkError),
    #[error("the watcher failed: {0}")]
    Watch(#[from] crate::watch::WatchError),
}

/// How long shutdown waits for the current batch and the watcher.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

struct Watcher {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), crate::watch::WatchError>>,
}

fn start_watcher(cfg: &Config, window: Duration, metrics: Arc<WatchMetrics>) -> Watcher {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let cfg = cfg.clone();
    let opts = WatchOptions { window, heartbeat: false, ..WatchOptions::default() };
    let task = tokio::spawn(async move {
        crate::watch::run(&cfg, &opts, metrics, async {
            let _ = stopped.await;
        })
        .await
    });
    Watcher { stop, task }
}

async fn stop_watcher(watcher: Watcher) -> Result<(), ServeError> {
    let _ = watcher.stop.send(());
    match tokio::time::timeout(SHUTDOWN_GRACE, watcher.task).await {
        Ok(Ok(result)) => Ok(result?),
        Ok(Err(join)) => {
            tracing::error!(error = %join, "watcher task failed");
            Ok(())
        }
        Err(_) => {
            tracing::error!("watcher did not stop in time");
            Ok(())
        }
    }
}

fn edge_of(err: &RunError) -> &'static str {
    match err {
        RunError::Source(_) => "mongodb",
        RunError::Sink(_) | RunError::RedisRestarted => "redis",
        RunError::Lease(_) => "lease",
        RunError::Internal(_) => "other",
    }
}

struct Shared {
    cfg: Config,
    source: Source,
    sink: Sink,
    metrics: ServeMetrics,
    watch_metrics: Arc<WatchMetrics>,
    current: Mutex<Option<String>>,
    started_at: u64,
}

impl Shared {
    fn heartbeat(&self) -> serde_json::Value {
        serde_json::json!({
            "service": "cachewright serve",
            "pid": std::process::id(),
            "timestamp": crate::status::unix_now(),
            "started_at": self.started_at,
            "current_job": *self.current.lock().unwrap_or_else(|e| e.into_inner()),
            "watcher": self.watch_metrics.heartbeat(),
        })
    }

    async fn health(&self) -> Response {
        let mongo = tokio::time::timeout(Duration::from_secs(2), self.source.cluster_time()).await;
        let mongo = match mongo {
            Ok(Ok(_)) => "ok".to_string(),
            Ok(Err(err)) => err.to_string(),
            Err(_) => "no answer within 2s".to_string(),
        };
        let mut conn = self.sink.connection();
        let redis =
            tokio::time::timeout(Duration::from_secs(2), redis::cmd("PING").query_async::<String>(&mut conn)).await;
        let redis = match redis {
            Ok(Ok(_)) => "ok".to_string(),
            Ok(Err(err)) => err.to_string(),
            Err(_) => "no answer within 2s".to_string(),
        };
        let ok = mongo == "ok" && redis == "ok";
        let body =
            serde_json::json!({ "status": if ok { "ok" } else { "unavailable" }, "mongodb": mongo, "redis": redis });
        Response::json(if ok { 200 } else { 503 }, &body)
    }

    async fn status(&self) -> Response {
        let keys = StatusKeys::new(self.cfg.status_prefix.clone());
        let mut conn = self.sink.connection();
        let runs = crate::status::show::recent_runs(&mut conn, &keys, 20).await.unwrap_or_default();
        Response::json(200, &serde_json::json!({ "current": self.heartbeat(), "runs": runs }))
    }
}

fn handler(shared: Arc<Shared>) -> Handler {
    Arc::new(move |path: String| {
        let shared = shared.clone();
        Box::pin(async move {
            match path.as_str() {
                "/health" => shared.health().await,
                "/metrics" => Response::text(200, shared.metrics.render(Some(&shared.watch_metrics))),
                "/status" => shared.status().await,
                _ => Response::text(404, "try /health, /metrics or /status\n".into()),
            }
        })
    })
}

/// Runs until `shutdown` resolves, then stops within a bounded time: no
/// new fires, the current batch finishes or the run stops cleanly (marked
/// failed with reason `shutdown`, lease released), the watcher saves its
/// tokens.
pub async fn run(
    cfg: &Config,
    opts: ServeOptions,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    schedule::check_coverage(&opts.schedules, &cfg.ttl, Utc::now())?;
    let shared = Arc::new(Shared {
        cfg: cfg.clone(),
        source: Source::connect(cfg).await?,
        sink: Sink::connect(cfg).await?,
        metrics: ServeMetrics::default(),
        watch_metrics: Arc::new(WatchMetrics::default()),
        current: Mutex::new(None),
        started_at: crate::status::unix_now(),
    });
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let http = tokio::spawn(http::serve(listener, handler(shared.clone()), stopped(stop_rx.clone())));
    let heartbeat = {
        let (shared, rx) = (shared.clone(), stop_rx.clone());
        tokio::spawn(async move {
            let keys = StatusKeys::new(shared.cfg.status_prefix.clone());
            loop {
                let mut conn = shared.sink.connection();
                let _: redis::RedisResult<()> = redis::cmd("SET")
                    .arg(keys.health())
                    .arg(shared.heartbeat().to_string())
                    .arg("EX")
                    .arg(60)
                    .query_async(&mut conn)
                    .await;
                let mut rx = rx.clone();
                if tokio::time::timeout(Duration::from_secs(10), rx.wait_for(|s| *s)).await.is_ok() {
                    return;
                }
            }
        })
    };
    let mut watcher = opts.watch.then(|| start_watcher(cfg, opts.window, shared.watch_metrics.clone()));
    tracing::info!(schedules = opts.schedules.len(), watch = opts.watch, "serve started");

    tokio::pin!(shutdown);
    let mut next_due: Vec<_> = opts.schedules.iter().map(|s| s.next_fire(Utc::now())).collect();
    loop {
        let Some(due) = next_due.iter().flatten().min().copied() else {
            // No schedule ever fires again; serve the watcher and HTTP.
            (&mut shutdown).await;
            break;
        };
        let wait = (due - Utc::now()).to_std().unwrap_or(Duration::ZERO);
        tracing::debug!(due = %due, wait_ms = wait.as_millis() as u64, "next fire");
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tokio::time::sleep(wait) => {}
        }
        let firing: Vec<usize> = (0..opts.schedules.len()).filter(|&i| next_due[i] == Some(due)).collect();
        let mut interrupted = false;
        for i in firing {
            let schedule = &opts.schedules[i];
            if let Some(w) = watcher.take() {
                stop_watcher(w).await?;
            }
            *shared.current.lock().unwrap_or_else(|e| e.into_inner()) = Some(schedule.name.clone());
            let cancel = Arc::new(AtomicBool::new(false));
            let run_opts = RebuildOptions { cancel: Some(cancel.clone()), ..RebuildOptions::only(schedule.families()) }
                .trigger(Trigger::Cron);
            tracing::info!(schedule = %schedule.name, "scheduled job started");
            let progress = Progress::hidden();
            let job = rebuild(cfg, &run_opts, &progress);
            tokio::pin!(job);
            let result = tokio::select! {
                result = &mut job => result,
                _ = &mut shutdown => {
                    interrupted = true;
                    tracing::info!(schedule = %schedule.name, "shutdown during a job; stopping before its next batch");
                    cancel.store(true, Ordering::SeqCst);
                    match tokio::time::timeout(SHUTDOWN_GRACE, &mut job).await {
                        Ok(result) => result,
                        Err(_) => Err(RunError::Internal("the job did not stop in time".into())),
                    }
                }
            };
            *shared.current.lock().unwrap_or_else(|e| e.into_inner()) = None;
            match result {
                Ok(summary) => {
                    tracing::info!(schedule = %schedule.name, keys_written = summary.written_total(), keys_deleted = summary.deleted_total(), "scheduled job completed");
                    shared.metrics.completed("cron", &summary);
                }
                Err(RunError::Lease(err)) => {
                    tracing::info!(schedule = %schedule.name, reason = %err, "fire skipped: another instance is rebuilding");
                    shared.metrics.skipped(&schedule.name);
                }
                Err(err) => {
                    tracing::error!(schedule = %schedule.name, error = %err, "scheduled job failed");
                    shared.metrics.failed("cron", edge_of(&err));
                }
            }
            if interrupted {
                break;
            }
        }
        if interrupted {
            break;
        }
        if opts.watch && watcher.is_none() {
            watcher = Some(start_watcher(cfg, opts.window, shared.watch_metrics.clone()));
        }
        // Fires that passed while the job ran are skipped, never queued.
        let now = Utc::now();
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
    }
    tracing::info!("serve stopping");
    if let Some(w) = watcher.take() {
        stop_watcher(w).await?;
    }
    let _ = stop_tx.send(true);
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, http).await;
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, heartbeat).await;
    tracing::info!("serve stopped");
    Ok(())
}
