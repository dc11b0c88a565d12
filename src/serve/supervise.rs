//! The watcher under `serve`: restarted with backoff when it fails, its
//! state and last error kept for `/health`, `/status` and metrics. Stopped
//! cleanly around a scheduled job, it leaves its in-memory state in a
//! [`Carry`] and the next start continues from its tokens without reading
//! the collections again.

use crate::config::Config;
use crate::retry::RetryPolicy;
use crate::sink::Fence;
use crate::watch::{Carry, WatchMetrics, WatchOptions};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// What `serve` knows of its watcher.
#[derive(Debug, Clone, Default)]
pub struct WatcherHealth {
    /// Running (starting or streaming), failed (waiting to restart),
    /// paused (a scheduled job runs), or stopped.
    running: bool,
    failed: bool,
    paused: bool,
    pub last_error: Option<String>,
    pub restarts: u64,
}

impl WatcherHealth {
    /// `starting`, `streaming`, `failed`, `paused` or `stopped`.
    pub fn state(&self, metrics: &WatchMetrics) -> &'static str {
        if self.failed {
            "failed"
        } else if self.running && metrics.streaming.load(Ordering::Relaxed) {
            "streaming"
        } else if self.running {
            "starting"
        } else if self.paused {
            "paused"
        } else {
            "stopped"
        }
    }
}

/// A running supervisor.
pub struct Supervised {
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
    health: Arc<Mutex<WatcherHealth>>,
}

fn set(health: &Mutex<WatcherHealth>, f: impl FnOnce(&mut WatcherHealth)) {
    f(&mut health.lock().unwrap_or_else(|e| e.into_inner()));
}

/// Starts the watcher under `fence`, restarting it with backoff whenever
/// it fails, until stopped or the lease is lost.
pub fn start(
    cfg: &Config,
    window: Duration,
    metrics: Arc<WatchMetrics>,
    fence: Fence,
    health: Arc<Mutex<WatcherHealth>>,
    carry: Arc<Mutex<Option<Carry>>>,
    edges: crate::rebuild::Edges,
) -> Supervised {
    let stop = CancellationToken::new();
    let cfg = cfg.clone();
    let opts = WatchOptions {
        window,
        heartbeat: false,
        carry: Some(carry),
        drift_per_minute: cfg.drift_sample_per_minute,
        edges: Some(edges),
        ..WatchOptions::default()
    };
    let task = {
        let (health, stopped) = (health.clone(), stop.clone());
        tokio::spawn(async move {
            let mut restarts = RetryPolicy::RESTART_WATCHER.start();
            loop {
                let started = std::time::Instant::now();
                set(&health, |h| {
                    h.running = true;
                    h.failed = false;
                    h.paused = false;
                });
                let result =
                    crate::watch::run_fenced(&cfg, &opts, metrics.clone(), fence.clone(), stopped.cancelled()).await;
                metrics.streaming.store(false, Ordering::Relaxed);
                let err = match result {
                    Ok(()) => {
                        set(&health, |h| h.running = false);
                        return;
                    }
                    Err(err) => err.to_string(),
                };
                set(&health, |h| {
                    h.running = false;
                    h.failed = true;
                    h.last_error = Some(err.clone());
                    h.restarts += 1;
                });
                if !fence.is_valid() {
                    tracing::warn!(error = %err, "watcher stopped: the writer lease is lost");
                    return;
                }
                restarts.start_over_after(started.elapsed());
                let delay = restarts.pause();
                tracing::error!(error = %err, delay_ms = delay.as_millis() as u64, "watcher failed; restarting");
                tokio::select! {
                    biased;
                    _ = stopped.cancelled() => return,
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        })
    };
    Supervised { stop, task, health }
}

impl Supervised {
    /// Stops the watcher (it saves its tokens) and marks it paused. A
    /// watcher that does not stop within `grace` (stalled on a server) is
    /// aborted, and this returns only once its task is gone, with every
    /// task it owns (streams, a rebuild's writer and scan: all abort with
    /// their owner). Returns whether it stopped by itself. Either way a
    /// write it had sent may still be on its way (a stop drops the batch
    /// in flight), which the caller fences off.
    pub async fn stop(self, grace: Duration) -> bool {
        self.stop.cancel();
        let mut task = self.task;
        let clean = match tokio::time::timeout(grace, &mut task).await {
            Ok(Ok(())) => true,
            Ok(Err(join)) => {
                tracing::error!(error = %join, "watcher task failed");
                true
            }
            Err(_) => {
                tracing::error!(grace_ms = grace.as_millis() as u64, "watcher did not stop in time; aborting it");
                task.abort();
                // Resolves once the task was dropped: it runs no more.
                let _ = task.await;
                false
            }
        };
        set(&self.health, |h| {
            h.running = false;
            h.failed = false;
            h.paused = true;
        });
        clean
    }
}
