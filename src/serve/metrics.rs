//! Prometheus metrics of a `serve` process, kept in a `prometheus-client`
//! registry and encoded in the Prometheus text format (0.0.4).
//!
//! The set is documented in the README ("Metrics"); `ops/` holds a Grafana
//! dashboard and alert rules over it, and a test checks that every metric
//! they use is exported. Job metrics are updated as jobs end; the
//! watcher's are read from its atomics at scrape time (a collector), and
//! Redis's own figures are fetched by the `/metrics` handler just before
//! encoding.

use crate::rebuild::RunSummary;
use crate::watch::WatchMetrics;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Label pairs; every family here has a few fixed label names.
type Labels = Vec<(&'static str, String)>;

/// The content type of [`ServeMetrics::render`].
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Job durations span a 1 s count refresh to a 10-minute 500K rebuild.
const JOB_BUCKETS: [f64; 12] = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0];

fn job_histogram() -> Histogram {
    Histogram::new(JOB_BUCKETS)
}

/// Redis's own figures, read at scrape time.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct RedisStats {
    pub used_memory: u64,
    /// 0 when Redis has no limit.
    pub maxmemory: u64,
    pub keyspace_hits: u64,
    pub keyspace_misses: u64,
}

impl RedisStats {
    /// Reads the figures out of an `INFO` reply that holds `memory` and
    /// `stats`.
    pub fn from_info(info: &str) -> RedisStats {
        let field = |name| crate::sink::info_value(info, name).and_then(|v| v.parse().ok()).unwrap_or(0);
        RedisStats {
            used_memory: field("used_memory"),
            maxmemory: field("maxmemory"),
            keyspace_hits: field("keyspace_hits"),
            keyspace_misses: field("keyspace_misses"),
        }
    }
}

pub struct ServeMetrics {
    registry: Registry,
    runs: Family<Labels, Counter>,
    duration: Family<Labels, Histogram, fn() -> Histogram>,
    written: Family<Labels, Counter>,
    deleted: Family<Labels, Counter>,
    rejected: Family<Labels, Counter>,
    errors: Family<Labels, Counter>,
    skipped: Family<Labels, Counter>,
    last_success: Family<Labels, Gauge<f64, AtomicU64>>,
    schedule_ttl: Family<Labels, Gauge>,
    leader: Gauge,
    epoch: Gauge,
    up: Family<Labels, Gauge>,
    redis: RedisCollector,
}

impl std::fmt::Debug for ServeMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServeMetrics").finish_non_exhaustive()
    }
}

impl ServeMetrics {
    /// A registry with every `serve` metric; `watch` is the watcher's
    /// atomics, read at each scrape.
    pub fn new(watch: Arc<WatchMetrics>) -> ServeMetrics {
        let mut registry = Registry::with_prefix("cachewright");
        let m = ServeMetrics {
            runs: Family::default(),
            duration: Family::new_with_constructor(job_histogram as fn() -> Histogram),
            written: Family::default(),
            deleted: Family::default(),
            rejected: Family::default(),
            errors: Family::default(),
            skipped: Family::default(),
            last_success: Family::default(),
            schedule_ttl: Family::default(),
            leader: Gauge::default(),
            epoch: Gauge::default(),
            up: Family::default(),
            redis: RedisCollector::default(),
            registry: Registry::default(),
        };
        registry.register("job_runs", "Jobs run, by trigger and outcome (completed, failed)", m.runs.clone());
        registry.register("job_duration_seconds", "Duration of jobs, by trigger and outcome", m.duration.clone());
        registry.register("keys_written", "Keys written by jobs, by family", m.written.clone());
        registry.register("keys_deleted", "Stale keys deleted by job sweeps, by family", m.deleted.clone());
        registry.register(
            "rejected_documents",
            "Documents jobs rejected (counted and skipped), by collection and reason",
            m.rejected.clone(),
        );
        registry.register("errors", "Failed jobs and leadership attempts, by edge", m.errors.clone());
        registry.register(
            "schedule_skipped",
            "Fires skipped because the previous job was still running",
            m.skipped.clone(),
        );
        registry.register(
            "job_last_success_timestamp_seconds",
            "Unix time of the schedule's last successful job (the process start until its first)",
            m.last_success.clone(),
        );
        registry.register(
            "schedule_ttl_seconds",
            "The shortest TTL among the families a schedule refreshes",
            m.schedule_ttl.clone(),
        );
        registry.register("leader", "1 while this instance holds the writer lease", m.leader.clone());
        registry.register("leader_epoch", "The fencing epoch this instance last led under", m.epoch.clone());
        registry.register(
            "dependency_up",
            "1 when the dependency (mongodb, redis) answered the last readiness check",
            m.up.clone(),
        );
        registry.register(
            "changestream_event_lag_seconds",
            "Per applied batch: now minus the newest event's cluster time",
            watch.lag_histogram.0.clone(),
        );
        // Series that alerts divide or compare exist from the start.
        for edge in ["mongodb", "redis", "lease", "guard", "other"] {
            let _ = m.errors.get_or_create(&vec![("edge", edge.to_string())]);
        }
        for outcome in ["completed", "failed"] {
            let labels = vec![("trigger", "cron".to_string()), ("outcome", outcome.to_string())];
            let _ = m.runs.get_or_create(&labels);
            let _ = m.duration.get_or_create(&labels);
        }
        for family in crate::registry::FamilyId::ALL {
            let labels = vec![("family", family.name().to_string())];
            let _ = m.written.get_or_create(&labels);
            let _ = m.deleted.get_or_create(&labels);
        }
        registry.register_collector(Box::new(WatchCollector(watch)));
        registry.register_collector(Box::new(m.redis.clone()));
        ServeMetrics { registry, ..m }
    }

    /// Declares a schedule: its TTL bound, and "now" as the last success
    /// so the staleness alert counts from the start of the process.
    pub fn schedule(&self, name: &str, ttl_seconds: u64) {
        let labels = vec![("schedule", name.to_string())];
        let _ = self.skipped.get_or_create(&labels);
        self.schedule_ttl.get_or_create(&labels).set(ttl_seconds as i64);
        self.last_success.get_or_create(&labels).set(crate::status::unix_now() as f64);
    }

    pub fn completed(&self, trigger: &str, schedule: &str, summary: &RunSummary) {
        let labels = vec![("trigger", trigger.to_string()), ("outcome", "completed".to_string())];
        self.runs.get_or_create(&labels).inc();
        self.duration.get_or_create(&labels).observe(summary.duration.as_secs_f64());
        for (f, n) in &summary.written {
            self.written.get_or_create(&vec![("family", f.name().to_string())]).inc_by(*n);
        }
        for (f, n) in &summary.deleted {
            self.deleted.get_or_create(&vec![("family", f.name().to_string())]).inc_by(*n);
        }
        for (collection, report) in &summary.collections {
            for (reason, count) in &report.rejected {
                let labels = vec![("collection", collection.clone()), ("reason", reason.to_string())];
                self.rejected.get_or_create(&labels).inc_by(count.count);
            }
        }
        self.last_success
            .get_or_create(&vec![("schedule", schedule.to_string())])
            .set(crate::status::unix_now() as f64);
    }

    pub fn failed(&self, trigger: &str, edge: &str, took: std::time::Duration) {
        let labels = vec![("trigger", trigger.to_string()), ("outcome", "failed".to_string())];
        self.runs.get_or_create(&labels).inc();
        self.duration.get_or_create(&labels).observe(took.as_secs_f64());
        self.error(edge);
    }

    /// Counts a failure at an edge (mongodb, redis, lease, guard, other).
    pub fn error(&self, edge: &str) {
        self.errors.get_or_create(&vec![("edge", edge.to_string())]).inc();
    }

    /// Records whether this instance leads, and under which epoch.
    pub fn leadership(&self, leader: bool, epoch: u64) {
        self.leader.set(i64::from(leader));
        self.epoch.set(epoch as i64);
    }

    pub fn skipped(&self, schedule: &str) {
        self.skipped.get_or_create(&vec![("schedule", schedule.to_string())]).inc();
    }

    /// Whether a dependency answered the last readiness check.
    pub fn dependency(&self, name: &str, up: bool) {
        self.up.get_or_create(&vec![("dependency", name.to_string())]).set(i64::from(up));
    }

    /// Redis's figures as last read; `None` when Redis did not answer (the
    /// Redis metrics are then left out of the scrape).
    pub fn redis_stats(&self, stats: Option<RedisStats>) {
        *self.redis.0.lock().unwrap_or_else(|e| e.into_inner()) = stats;
    }

    /// Prometheus text exposition (format 0.0.4).
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry);
        out
    }
}

fn counter<N>(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: N) -> std::fmt::Result
where
    ConstCounter<N>: EncodeMetric,
{
    ConstCounter::new(value).encode(encoder.encode_descriptor(name, help, None, MetricType::Counter)?)
}

fn gauge<N>(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: N) -> std::fmt::Result
where
    ConstGauge<N>: EncodeMetric,
{
    ConstGauge::new(value).encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

/// The watcher's figures, read from its atomics at each scrape.
#[derive(Debug)]
struct WatchCollector(Arc<WatchMetrics>);

impl Collector for WatchCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let w = &self.0;
        let mut family = encoder.encode_descriptor(
            "changestream_events",
            "Change events applied, by collection",
            None,
            MetricType::Counter,
        )?;
        for (name, slot) in ["Channel", "Category", "Tag", "VideoMedia"].iter().zip(&w.applied) {
            let labels = [("collection", *name)];
            ConstCounter::new(slot.load(Ordering::Relaxed)).encode(family.encode_family(&labels)?)?;
        }
        gauge(
            &mut encoder,
            "changestream_lag_seconds",
            "Now minus the newest applied event's cluster time, at its application",
            w.lag_ms.load(Ordering::Relaxed) as f64 / 1000.0,
        )?;
        gauge(
            &mut encoder,
            "changestream_last_event_age_seconds",
            "Seconds since the watcher last applied an event (-1 before the first)",
            w.last_event_age().unwrap_or(-1.0),
        )?;
        gauge(
            &mut encoder,
            "changestream_streaming",
            "1 while the watcher's change streams are open and applied",
            i64::from(w.is_streaming()),
        )?;
        counter(
            &mut encoder,
            "changestream_rebuilds",
            "Full rebuilds the watcher triggered",
            w.rebuilds.load(Ordering::Relaxed),
        )?;
        counter(
            &mut encoder,
            "changestream_errors",
            "Change stream failures (the watcher reopens from its saved tokens)",
            w.stream_errors.load(Ordering::Relaxed),
        )?;
        counter(
            &mut encoder,
            "watch_visited_videos",
            "Scope members the watcher's batch planning read: the members of the scopes the batches touched, and their videos",
            w.visited_videos.load(Ordering::Relaxed),
        )?;
        counter(
            &mut encoder,
            "watch_state_cpu_seconds",
            "CPU seconds the watcher's batches spent applying events to its state and planning their writes (decoding a video's document, done as its event arrives, is not counted)",
            w.state_cpu_us.load(Ordering::Relaxed) as f64 / 1e6,
        )?;
        gauge(
            &mut encoder,
            "watch_deferred_keys",
            "Keys the watcher could not write because no live master covers their slot; written once it is covered",
            w.deferred_keys.load(Ordering::Relaxed) as i64,
        )?;
        let uncovered: u32 =
            w.uncovered_slots.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(a, b)| u32::from(b - a) + 1).sum();
        gauge(
            &mut encoder,
            "redis_uncovered_slots",
            "Redis Cluster slots no live master covered when the watcher last looked",
            i64::from(uncovered),
        )?;
        counter(
            &mut encoder,
            "watch_patched_keys",
            "Keys the watcher changed in place (the members that moved) instead of replacing them whole",
            w.patched_keys.load(Ordering::Relaxed),
        )?;
        counter(
            &mut encoder,
            "watch_rounds",
            "Batches the watcher ended, idle ones included (about one a second with nothing to apply): flat while streaming means its loop is stuck",
            w.rounds.load(Ordering::Relaxed),
        )?;
        counter(
            &mut encoder,
            "watch_patch_steps",
            "Steps after the first of patches too big for one atomic unit, each its own transaction",
            w.patch_steps.load(Ordering::Relaxed),
        )?;
        for (name, help, counts) in [
            (
                "drift_checked",
                "Keys the leader's drift check compared with what a rebuild would write, by family",
                &w.drift_checked,
            ),
            (
                "drift_found",
                "Keys the drift check found different (another writer, an eviction, a lost write) and rewrote, by family",
                &w.drift_found,
            ),
        ] {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (id, n) in crate::registry::FamilyId::ALL.iter().zip(counts) {
                let labels = [("family", id.name())];
                ConstCounter::new(n.load(Ordering::Relaxed)).encode(family.encode_family(&labels)?)?;
            }
        }
        let problems = w.problems.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut family = encoder.encode_descriptor(
            "changestream_rejected",
            "Documents the watcher rejected and change events it could not use, by collection and reason",
            None,
            MetricType::Counter,
        )?;
        for ((collection, reason), (n, _)) in &problems {
            let labels = [("collection", collection.as_str()), ("reason", reason.as_str())];
            ConstCounter::new(*n).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// Redis's figures as the `/metrics` handler last read them.
#[derive(Debug, Default, Clone)]
struct RedisCollector(Arc<Mutex<Option<RedisStats>>>);

impl Collector for RedisCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        let Some(stats) = *self.0.lock().unwrap_or_else(|e| e.into_inner()) else { return Ok(()) };
        gauge(&mut encoder, "redis_used_memory_bytes", "Redis INFO used_memory", stats.used_memory as i64)?;
        gauge(&mut encoder, "redis_maxmemory_bytes", "Redis INFO maxmemory (0: no limit)", stats.maxmemory as i64)?;
        counter(
            &mut encoder,
            "redis_keyspace_hits",
            "Redis INFO keyspace_hits: reads that found their key",
            stats.keyspace_hits,
        )?;
        counter(
            &mut encoder,
            "redis_keyspace_misses",
            "Redis INFO keyspace_misses: reads that found no key",
            stats.keyspace_misses,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_every_documented_family() {
        let watch = Arc::new(WatchMetrics::default());
        let m = ServeMetrics::new(watch.clone());
        m.schedule("counts", 3600);
        m.failed("cron", "redis", std::time::Duration::from_millis(20));
        m.leadership(true, 7);
        m.redis_stats(Some(RedisStats { used_memory: 10, maxmemory: 0, keyspace_hits: 3, keyspace_misses: 1 }));
        watch.lag_histogram.observe(0.3);
        let text = m.render();
        for line in [
            "cachewright_job_runs_total{trigger=\"cron\",outcome=\"failed\"} 1",
            "cachewright_errors_total{edge=\"redis\"} 1",
            "cachewright_leader 1",
            "cachewright_leader_epoch 7",
            "cachewright_schedule_ttl_seconds{schedule=\"counts\"} 3600",
            "cachewright_redis_keyspace_hits_total 3",
            "cachewright_changestream_event_lag_seconds_count 1",
            "cachewright_changestream_streaming 0",
            "cachewright_watch_deferred_keys 0",
            "cachewright_redis_uncovered_slots 0",
            "cachewright_drift_checked_total{family=\"video:detail\"} 0",
            "cachewright_drift_found_total{family=\"category:all\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
        }
        assert!(text.contains("# TYPE cachewright_job_duration_seconds histogram"), "{text}");
    }

    #[test]
    fn redis_figures_come_from_info() {
        let info = "# Memory\r\nused_memory:1024\r\nmaxmemory:0\r\n# Stats\r\nkeyspace_hits:9\r\nkeyspace_misses:2\r\n";
        assert_eq!(
            RedisStats::from_info(info),
            RedisStats { used_memory: 1024, maxmemory: 0, keyspace_hits: 9, keyspace_misses: 2 }
        );
    }
}
