//! The watcher benchmark (`cachewright bench --watch`): event-to-Redis
//! latency at a steady update rate (and how much of it is MongoDB's own
//! delivery of the events), the sustained rate of video updates
//! applied per second while MongoDB takes a flood, and the rate at which
//! the watcher drains a backlog already in its change streams. Runs the
//! watcher in-process on the configured database, so generate a data set
//! first (scripts/bench.sh).

use super::change_mix::{Changes, Mix};
use crate::config::Config;
use crate::source::Source;
use crate::watch::{WatchMetrics, WatchOptions};
use futures::StreamExt;
use mongodb::bson::{Document, doc};
use serde::Serialize;
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(Debug, Serialize)]
pub struct WatchBench {
    pub mix: Mix,
    /// What picked the mix's changes (`--seed`, or the clock's).
    pub seed: u64,
    pub window_ms: u64,
    pub rate_per_s: u64,
    pub updates_sent: u64,
    pub latency_p50_ms: f64,
    pub latency_p99_ms: f64,
    pub beyond_window_p50_ms: f64,
    pub beyond_window_p99_ms: f64,
    /// MongoDB's share of the latency: from sending a change to its event
    /// reaching a bare change stream opened beside the watcher.
    pub delivery_p50_ms: f64,
    pub delivery_p99_ms: f64,
    pub sustained_updates: u64,
    pub sustained_seconds: f64,
    pub sustained_per_s: f64,
    /// How long MongoDB took to take the backlog: when it is about
    /// `sustained_seconds`, the watcher kept up and the rate is MongoDB's.
    pub sent_seconds: f64,
    /// Scope members the watcher's planning read per applied change.
    pub visited_per_change: f64,
    /// CPU µs the watcher's in-memory work (applying to its state,
    /// planning) took per applied change.
    pub state_cpu_us_per_change: f64,
    /// Peak resident memory while the watcher applied the backlog (reset
    /// after the first phase: the full rebuild a first start runs and
    /// the load come before; the script measures a restart's load apart).
    pub peak_rss_mib: f64,
    /// Resident memory once the watcher applied the backlog.
    pub settled_rss_mib: f64,
    /// This process's peak over the whole run, the rebuild included.
    pub process_peak_rss_mib: f64,
    /// How fast a watcher drains a backlog already in its change streams
    /// (not limited by how fast MongoDB takes writes); `None` when the
    /// MongoDB URI names what one forwarder cannot stand in for.
    pub drain: Option<Drain>,
}

/// Phase 3's figures (see [`drain`]).
#[derive(Debug, Serialize)]
pub struct Drain {
    /// Changes applied from the backlog.
    pub changes: u64,
    /// From the release to the last batch applied.
    pub seconds: f64,
    pub per_s: f64,
    /// How long MongoDB took to take the backlog while the watcher waited.
    pub sent_seconds: f64,
    /// Where the drain's CPU went, in µs per change applied.
    pub cpu_us_per_change: DrainCpu,
    /// Redis's costliest commands over the drain (`INFO commandstats`,
    /// every master), by the time Redis spent in them. `EXEC` and `EVAL`
    /// include the commands they ran, which are listed by name too.
    pub redis_commands: Vec<CommandCost>,
}

/// One Redis command's share of a drain, per change applied.
#[derive(Debug, Serialize)]
pub struct CommandCost {
    pub command: String,
    pub calls_per_change: f64,
    pub us_per_change: f64,
}

/// Calls and µs by command name from `INFO commandstats` replies,
/// summed over the masters (`cmdstat_set:calls=3,usec=25,...`).
fn command_stats(infos: &[(String, String)]) -> HashMap<String, (u64, u64)> {
    let mut stats: HashMap<String, (u64, u64)> = HashMap::new();
    for (_, info) in infos {
        for line in info.lines() {
            let Some((name, fields)) = line.strip_prefix("cmdstat_").and_then(|l| l.split_once(':')) else { continue };
            let field =
                |f: &str| fields.split(',').find_map(|kv| kv.strip_prefix(f)?.strip_prefix('=')?.parse::<u64>().ok());
            let entry = stats.entry(name.to_string()).or_default();
            entry.0 += field("calls").unwrap_or(0);
            entry.1 += field("usec").unwrap_or(0);
        }
    }
    stats
}

/// The commands Redis spent most time in between two readings of
/// [`command_stats`], costliest first, at most `top`.
fn costliest(
    before: &HashMap<String, (u64, u64)>,
    after: &HashMap<String, (u64, u64)>,
    changes: u64,
    top: usize,
) -> Vec<CommandCost> {
    let per = changes.max(1) as f64;
    let mut costs: Vec<CommandCost> = after
        .iter()
        .map(|(name, &(calls, usec))| {
            let (c0, u0) = before.get(name).copied().unwrap_or_default();
            CommandCost {
                command: name.clone(),
                calls_per_change: calls.saturating_sub(c0) as f64 / per,
                us_per_change: usec.saturating_sub(u0) as f64 / per,
            }
        })
        .filter(|c| c.calls_per_change > 0.0)
        .collect();
    costs.sort_by(|a, b| b.us_per_change.total_cmp(&a.us_per_change));
    costs.truncate(top);
    costs
}

/// CPU per change while a backlog drained, by process: this one (the
/// watcher, the driver's reads and the writer; `state` is the watcher's
/// in-memory part of it), every `redis-server` on the machine (masters
/// and replicas) and every `secantusd-rs`. What bounds the drain on a
/// shared 2-core machine is their sum as much as any one of them.
#[derive(Debug, Serialize)]
pub struct DrainCpu {
    pub cachewright: f64,
    pub state: f64,
    pub redis: f64,
    pub mongodb: f64,
}

/// CPU readings at one instant, for [`DrainCpu`].
struct CpuMark {
    own: Duration,
    state_us: u64,
    redis: Duration,
    mongodb: Duration,
}

impl CpuMark {
    fn now(metrics: &WatchMetrics) -> CpuMark {
        use crate::usage::{cpu_time, cpu_time_of};
        CpuMark {
            own: cpu_time(),
            state_us: metrics.state_cpu_us.load(Ordering::Relaxed),
            redis: cpu_time_of("redis-server"),
            mongodb: cpu_time_of("secantusd-rs"),
        }
    }

    fn per_change(&self, later: &CpuMark, changes: u64) -> DrainCpu {
        let us = |d: Duration| d.as_secs_f64() * 1e6 / changes.max(1) as f64;
        DrainCpu {
            cachewright: us(later.own.saturating_sub(self.own)),
            state: later.state_us.saturating_sub(self.state_us) as f64 / changes.max(1) as f64,
            redis: us(later.redis.saturating_sub(self.redis)),
            mongodb: us(later.mongodb.saturating_sub(self.mongodb)),
        }
    }
}

/// A line of this process's `/proc/self/status` in MiB: `VmHWM` (the
/// peak resident memory) or `VmRSS` (the current one).
fn status_mib(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok());
    kib.unwrap_or(0.0) / 1024.0
}

/// Resets `VmHWM` to the current resident memory (Linux: writing 5 to
/// `clear_refs`), so a later reading is the peak of what followed.
fn reset_peak_rss() {
    if let Err(err) = std::fs::write("/proc/self/clear_refs", "5") {
        tracing::warn!(error = %err, "could not reset the peak RSS; it includes the earlier phases");
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

type Spawned = (
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<Result<(), crate::watch::WatchError>>,
    Arc<WatchMetrics>,
);

/// Starts a watcher in this process and waits until it streams.
async fn spawn_streaming(cfg: &Config, opts: WatchOptions) -> super::DevResult<Spawned> {
    let metrics = Arc::new(WatchMetrics::default());
    let stop = tokio_util::sync::CancellationToken::new();
    let watcher = {
        let (cfg, metrics, stop) = (cfg.clone(), metrics.clone(), stop.clone());
        tokio::spawn(async move { crate::watch::run(&cfg, &opts, metrics, stop.cancelled()).await })
    };
    while !metrics.streaming.load(Ordering::Relaxed) {
        if watcher.is_finished() {
            return Err("the watcher stopped before streaming".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok((stop, watcher, metrics))
}

pub async fn run(cfg: &Config, mix: Mix, seed: Option<u64>, rate: u64, seconds: u64) -> super::DevResult<WatchBench> {
    let source = Source::connect(&cfg.mongo()).await?;
    let videos = source.database().collection::<Document>(&cfg.collections.video);
    let ids: Vec<mongodb::bson::Bson> = videos
        .find(doc! { "listStatus": 1 })
        .projection(doc! { "_id": 1 })
        .limit(20_000)
        .await?
        .filter_map(|d| async move { d.ok().and_then(|d| d.get("_id").cloned()) })
        .collect()
        .await;
    if ids.is_empty() {
        return Err("no active videos; generate a data set first".into());
    }
    // Every change carries this run's nonce: an update that sets a value
    // the document already holds is a no-op MongoDB never reports, and a
    // repeated run would wait for events that never come.
    let mut changes = Changes::new(source.database(), &cfg.collections, mix, seed, ids).await?;

    // Sent time of the latest update per video, and measured latencies.
    let sent: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
    let latencies: Arc<Mutex<Vec<f64>>> = Arc::default();
    let window = Duration::from_millis(200);
    let hook = {
        let (sent, latencies) = (sent.clone(), latencies.clone());
        Arc::new(move |touched: &[String]| {
            let now = Instant::now();
            let mut sent = sent.lock().unwrap_or_else(|e| e.into_inner());
            let mut lat = latencies.lock().unwrap_or_else(|e| e.into_inner());
            for id in touched {
                if let Some(at) = sent.remove(id) {
                    lat.push(now.duration_since(at).as_secs_f64() * 1000.0);
                }
            }
        })
    };
    let opts = WatchOptions { window, on_applied: Some(hook), ..WatchOptions::default() };
    // The watcher reads MongoDB through a forwarder that phase 3 holds
    // (a hop on loopback, well under a millisecond against the window).
    let hold = forwarder(cfg).await?;
    let watcher_cfg = match &hold {
        Some((_, uri)) => Config { mongodb_uri: uri.clone(), ..cfg.clone() },
        None => cfg.clone(),
    };
    let (stop_tx, watcher, metrics) = spawn_streaming(&watcher_cfg, opts).await?;
    let delivery = Delivery::observe(&videos).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Phase 1: a steady rate, one update at a time.
    let mut seq = 0u64;
    let total = rate * seconds;
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate as f64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut inflight = futures::stream::FuturesUnordered::new();
    while seq < total {
        tick.tick().await;
        let change = changes.next(seq);
        if let Some(video) = &change.video {
            let now = Instant::now();
            sent.lock().unwrap_or_else(|e| e.into_inner()).insert(video.clone(), now);
            delivery.sent(video, now);
        }
        inflight.push(change.send());
        while inflight.len() > 64 {
            inflight.next().await;
        }
        seq += 1;
    }
    while inflight.next().await.is_some() {}
    let drain_deadline = Instant::now() + Duration::from_secs(30);
    while !sent.lock().unwrap_or_else(|e| e.into_inner()).is_empty() && Instant::now() < drain_deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut lat = latencies.lock().unwrap_or_else(|e| e.into_inner()).clone();
    lat.sort_by(f64::total_cmp);
    let delivered = delivery.finish();
    let window_ms = window.as_millis() as f64;

    // Phase 2: the sustained apply rate. A backlog of the same mix is sent
    // as fast as MongoDB takes it while the watcher, caught up, streams:
    // the rate is what it applies from the first send to the last batch
    // (a restart's load and catch-up are measured apart, by the script).
    let backlog = (rate * seconds * 3).max(10_000);
    let process_peak = status_mib("VmHWM");
    reset_peak_rss();
    let base = metrics.total_applied();
    let started = Instant::now();
    let mut inflight = futures::stream::FuturesUnordered::new();
    for n in 0..backlog {
        inflight.push(changes.next(total + n).send());
        if inflight.len() >= 256 {
            inflight.next().await;
        }
    }
    while inflight.next().await.is_some() {}
    let sent_seconds = started.elapsed().as_secs_f64();
    let (applied, last_batch) = until_applied(&metrics, base, backlog, started).await;
    let sustained_seconds = last_batch.duration_since(started).as_secs_f64().max(0.001);
    let settled_rss_mib = status_mib("VmRSS");
    let (peak_rss_mib, process_peak_rss_mib) = (status_mib("VmHWM"), process_peak.max(status_mib("VmHWM")));
    let drain = match &hold {
        Some((hold, _)) => {
            let sink = crate::sink::Sink::connect_writer(&cfg.redis()).await?;
            Some(drain(hold, &sink, &metrics, &mut changes, total + backlog).await)
        }
        None => None,
    };
    stop_tx.cancel();
    watcher.await??;
    let visited = metrics.visited_videos.load(Ordering::Relaxed);
    let applied_total = metrics.total_applied().max(1) as f64;
    Ok(WatchBench {
        mix,
        seed: changes.seed,
        visited_per_change: visited as f64 / applied_total,
        state_cpu_us_per_change: metrics.state_cpu_us.load(Ordering::Relaxed) as f64 / applied_total,
        peak_rss_mib,
        settled_rss_mib,
        process_peak_rss_mib,
        drain,
        window_ms: window.as_millis() as u64,
        rate_per_s: rate,
        updates_sent: total,
        latency_p50_ms: percentile(&lat, 0.5),
        latency_p99_ms: percentile(&lat, 0.99),
        beyond_window_p50_ms: (percentile(&lat, 0.5) - window_ms).max(0.0),
        beyond_window_p99_ms: (percentile(&lat, 0.99) - window_ms).max(0.0),
        delivery_p50_ms: percentile(&delivered, 0.5),
        delivery_p99_ms: percentile(&delivered, 0.99),
        sustained_updates: applied,
        sustained_seconds,
        sustained_per_s: applied as f64 / sustained_seconds,
        sent_seconds,
    })
}

/// MongoDB's delivery of the first phase's changes, measured apart from
/// the watcher: a change stream of its own on the video collection
/// (straight to MongoDB, without the watcher's forwarder or its
/// `updateLookup`) notes when each sent video's first event arrives. What
/// the watcher adds on top is its window and its work.
struct Delivery {
    sent: Arc<Mutex<HashMap<String, Instant>>>,
    delivered: Arc<Mutex<Vec<f64>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Delivery {
    async fn observe(videos: &mongodb::Collection<Document>) -> super::DevResult<Delivery> {
        // The stream is open once `watch` returns: nothing sent after it
        // is missed.
        let mut stream = videos.watch().max_await_time(Duration::from_millis(500)).await?;
        let sent: Arc<Mutex<HashMap<String, Instant>>> = Arc::default();
        let delivered: Arc<Mutex<Vec<f64>>> = Arc::default();
        let task = {
            let (sent, delivered) = (sent.clone(), delivered.clone());
            tokio::spawn(async move {
                while let Some(Ok(event)) = stream.next().await {
                    let now = Instant::now();
                    let id = event.document_key.as_ref().and_then(|key| key.get("_id"));
                    let Some(id) = id.and_then(crate::model::id::written_id) else { continue };
                    if let Some(at) = sent.lock().unwrap_or_else(|e| e.into_inner()).remove(&id) {
                        let ms = now.duration_since(at).as_secs_f64() * 1000.0;
                        delivered.lock().unwrap_or_else(|e| e.into_inner()).push(ms);
                    }
                }
            })
        };
        Ok(Delivery { sent, delivered, task })
    }

    /// Notes that a change to `video` is being sent `at`.
    fn sent(&self, video: &str, at: Instant) {
        self.sent.lock().unwrap_or_else(|e| e.into_inner()).insert(video.to_string(), at);
    }

    /// Stops observing; the delivery times, sorted.
    fn finish(self) -> Vec<f64> {
        self.task.abort();
        let mut delivered = std::mem::take(&mut *self.delivered.lock().unwrap_or_else(|e| e.into_inner()));
        delivered.sort_by(f64::total_cmp);
        delivered
    }
}

/// Waits until `expected` changes past `base` are applied, and gives how
/// many were and when the last batch was. Done when every change arrived,
/// or when none has for 15 s (longer than any one batch takes): a change
/// that turned out a no-op (a delete of a video already gone) never
/// produces an event. Gives up 120 s after `started`.
async fn until_applied(metrics: &WatchMetrics, base: u64, expected: u64, started: Instant) -> (u64, Instant) {
    let deadline = started + Duration::from_secs(120);
    let (mut applied, mut last_batch) = (0, started);
    while applied < expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
        let now = metrics.total_applied() - base;
        if now != applied {
            (applied, last_batch) = (now, Instant::now());
        } else if applied > 0 && last_batch.elapsed() > Duration::from_secs(15) {
            break;
        }
    }
    (applied, last_batch)
}

/// How long phase 3 lets the backlog build: well inside the driver's
/// 10 s server monitoring timeout, which the held connections must not
/// reach (a monitor that times out clears the pool and the watcher's
/// streams reconnect, which is not what this phase measures).
const BACKLOG_FOR: Duration = Duration::from_secs(5);

/// A forwarder to the configured MongoDB and the URI that goes through
/// it; `None` (phase 3 skipped) for a URI one forwarder cannot stand in
/// for.
async fn forwarder(cfg: &Config) -> super::DevResult<Option<(super::hold::Hold, String)>> {
    use super::hold::{Hold, target, through};
    let Some((host, port)) = target(&cfg.mongodb_uri) else {
        tracing::warn!("the drain phase needs a single-host, non-TLS mongodb:// URI; skipped");
        return Ok(None);
    };
    let hold = Hold::start(host, port).await?;
    let uri = through(&cfg.mongodb_uri, hold.port()).ok_or("the MongoDB URI cannot be forwarded")?;
    Ok(Some((hold, uri)))
}

/// Phase 3: the drain rate. The watcher, caught up with the flood, reads
/// MongoDB through `hold`; it holds the watcher's connections while the
/// mix is sent for [`BACKLOG_FOR`], then releases them: the backlog is
/// in the change streams at once, and the rate is the watcher's own
/// (with the streams' reads), not MongoDB's pace of taking writes, which
/// bounds phase 2 on a slow server.
async fn drain(
    hold: &super::hold::Hold,
    sink: &crate::sink::Sink,
    metrics: &WatchMetrics,
    changes: &mut Changes,
    first: u64,
) -> Drain {
    let commands = || async { sink.topology().infos(sink, &["commandstats"]).await.map(|i| command_stats(&i)) };
    hold.hold();
    let base = metrics.total_applied();
    let started = Instant::now();
    let mut inflight = futures::stream::FuturesUnordered::new();
    let mut sent = 0;
    while started.elapsed() < BACKLOG_FOR {
        inflight.push(changes.next(first + sent).send());
        sent += 1;
        if inflight.len() >= 256 {
            inflight.next().await;
        }
    }
    while inflight.next().await.is_some() {}
    let sent_seconds = started.elapsed().as_secs_f64();
    // MongoDB is idle again (it took the backlog); what follows is the
    // drain's CPU. The second reading comes as the last change is seen
    // applied; were some change never to arrive, it would come 15 s later
    // and hold that idle time's CPU too (every change of the mixes
    // changes something, so each has an event).
    let stats_before = commands().await.unwrap_or_default();
    let before = CpuMark::now(metrics);
    let released = Instant::now();
    hold.release();
    let (applied, last_batch) = until_applied(metrics, base, sent, released).await;
    let cpu_us_per_change = before.per_change(&CpuMark::now(metrics), applied);
    let redis_commands = match commands().await {
        Ok(after) => costliest(&stats_before, &after, applied, 8),
        Err(err) => {
            tracing::warn!(error = %err, "could not read Redis's command stats after the drain");
            Vec::new()
        }
    };
    let seconds = last_batch.duration_since(released).as_secs_f64().max(0.001);
    Drain {
        changes: applied,
        seconds,
        per_s: applied as f64 / seconds,
        sent_seconds,
        cpu_us_per_change,
        redis_commands,
    }
}

#[cfg(test)]
mod tests {
    use super::{command_stats, costliest};

    /// Two masters' `INFO commandstats` are summed by command, and the
    /// drain's share is what grew between the readings, costliest first.
    #[test]
    fn command_stats_are_summed_over_masters_and_diffed() {
        let info = |set: u64, eval: u64| {
            format!(
                "# Commandstats\r\ncmdstat_set:calls={set},usec={},usec_per_call=2.00,rejected_calls=0,failed_calls=0\r\n\
                 cmdstat_eval:calls={eval},usec={},usec_per_call=10.00\r\n",
                set * 2,
                eval * 10
            )
        };
        let before = command_stats(&[("a".into(), info(10, 1)), ("b".into(), info(5, 0))]);
        assert_eq!(before["set"], (15, 30));
        assert_eq!(before["eval"], (1, 10));
        let after = command_stats(&[("a".into(), info(30, 5)), ("b".into(), info(5, 2))]);
        let costs = costliest(&before, &after, 10, 8);
        let names: Vec<&str> = costs.iter().map(|c| c.command.as_str()).collect();
        assert_eq!(names, ["eval", "set"], "60 µs of EVAL before 40 of SET");
        assert_eq!((costs[0].calls_per_change, costs[0].us_per_change), (0.6, 6.0));
        assert_eq!((costs[1].calls_per_change, costs[1].us_per_change), (2.0, 4.0));
    }
}
