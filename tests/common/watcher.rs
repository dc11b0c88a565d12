//! An in-process `watch` for tests: start it, wait until it streams,
//! stop it cleanly or drop it like a crash.

use cachewright::config::Config;
use cachewright::watch::{WatchMetrics, WatchOptions};
use std::sync::Arc;
use std::time::Duration;

pub struct Watcher {
    pub stop: tokio::sync::oneshot::Sender<()>,
    pub task: tokio::task::JoinHandle<Result<(), cachewright::watch::WatchError>>,
    pub metrics: Arc<WatchMetrics>,
    /// How the watcher ended, once it has: a test waiting on its output
    /// says why instead of timing out.
    pub ended: Arc<std::sync::Mutex<Option<String>>>,
}

pub fn start(cfg: &Config) -> Watcher {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let metrics = Arc::new(WatchMetrics::default());
    let ended = Arc::new(std::sync::Mutex::new(None));
    let task = {
        let (cfg, metrics, ended) = (cfg.clone(), metrics.clone(), ended.clone());
        let opts = WatchOptions { window: Duration::from_millis(50), ..WatchOptions::default() };
        tokio::spawn(async move {
            let outcome = cachewright::watch::run(&cfg, &opts, metrics, async {
                let _ = stopped.await;
            })
            .await;
            *ended.lock().unwrap() = Some(format!("{outcome:?}"));
            outcome
        })
    };
    Watcher { stop, task, metrics, ended }
}

/// Starts a watcher and waits until its streams are open.
pub async fn start_streaming(cfg: &Config) -> Watcher {
    let watcher = start(cfg);
    super::wait_for("the watcher to start streaming", Duration::from_secs(30), || {
        // A watcher that failed at start says why now, not at the deadline.
        assert!(!watcher.task.is_finished(), "the watcher ended before it streamed");
        std::future::ready(watcher.metrics.streaming.load(std::sync::atomic::Ordering::Relaxed))
    })
    .await;
    watcher
}

impl Watcher {
    /// How the watcher ended, if it has.
    pub fn ended(&self) -> Option<String> {
        self.ended.lock().unwrap().clone()
    }

    /// Its counters, for a test that gives up waiting on it.
    pub fn report(&self) -> String {
        use std::sync::atomic::Ordering::Relaxed;
        let m = &self.metrics;
        format!(
            "streaming {}, rebuilds {}, batches {}, rounds {}, stream errors {}, failed batches {}, ended: {}",
            m.is_streaming(),
            m.rebuilds.load(Relaxed),
            m.batches.load(Relaxed),
            m.rounds.load(Relaxed),
            m.stream_errors.load(Relaxed),
            m.failed_batches.load(Relaxed),
            self.ended().unwrap_or_else(|| "no".into())
        )
    }

    pub async fn stop(self) -> Arc<WatchMetrics> {
        let _ = self.stop.send(());
        self.task.await.unwrap().expect("watcher ran cleanly");
        self.metrics
    }

    /// Waits until the batch in flight now, if any, has ended with its
    /// counters: the next round to end is that batch or one after it
    /// (idle streams end one about every second). Its keys may be visible
    /// before: on a cluster the tokens are saved, and the counters moved,
    /// after its last write.
    pub async fn end_of_round(&self) {
        use std::sync::atomic::Ordering::Relaxed;
        let now = self.metrics.rounds.load(Relaxed);
        super::wait_for("the watcher ending a round", Duration::from_secs(30), || {
            std::future::ready(self.metrics.rounds.load(Relaxed) > now)
        })
        .await;
    }

    /// A crash: the task is dropped wherever it is.
    pub async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// `cachewright watch` as its own process for `cfg`, with a short lease so
/// that a process started after a `kill -9` takes over within seconds.
pub fn spawn_process(cfg: &Config) -> std::process::Child {
    super::cachewright(cfg)
        .args(["watch", "--window-ms", "50"])
        .env("CACHEWRIGHT_LEASE_SECONDS", "2")
        .spawn()
        .expect("start cachewright watch")
}

/// Waits until the `cachewright watch` process `pid` streams: past its
/// start-up (a rebuild, or the replay from the saved tokens), as its own
/// heartbeat says, with a token saved for every collection.
pub async fn process_streaming(cfg: &Config, pid: u32) {
    let conn = super::redis_conn(&cfg.redis_url).await;
    let keys = super::env::status_keys(cfg);
    let names = &cfg.collections;
    let tokens: Vec<String> =
        [&names.channel, &names.category, &names.tag, &names.video].iter().map(|c| keys.cdc_resume(c)).collect();
    super::wait_for(&format!("watcher {pid} to stream"), Duration::from_secs(30), || {
        let (mut conn, health, tokens) = (conn.clone(), keys.health(), tokens.clone());
        async move {
            let beat: Option<String> = redis::cmd("GET").arg(health).query_async(&mut conn).await.unwrap();
            let beat: serde_json::Value = beat.and_then(|b| serde_json::from_str(&b).ok()).unwrap_or_default();
            // One key a call: on a cluster the tokens live in several slots.
            let mut saved = 0;
            for token in tokens {
                let exists: usize = redis::cmd("EXISTS").arg(token).query_async(&mut conn).await.unwrap();
                saved += exists;
            }
            beat["pid"] == pid && beat["streaming"] == true && saved == 4
        }
    })
    .await;
}
