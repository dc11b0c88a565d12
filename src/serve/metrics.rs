//! Prometheus metrics of a `serve` process.

use crate::rebuild::RunSummary;
use crate::watch::WatchMetrics;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::Ordering;

#[derive(Debug, Default)]
pub struct ServeMetrics {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    runs: BTreeMap<(String, String), u64>,
    duration: BTreeMap<String, f64>,
    written: BTreeMap<String, u64>,
    deleted: BTreeMap<String, u64>,
    rejected: u64,
    errors: BTreeMap<String, u64>,
    skipped: BTreeMap<String, u64>,
    leader: bool,
    epoch: u64,
}

impl ServeMetrics {
    fn with<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> T {
        f(&mut self.inner.lock().unwrap_or_else(|e| e.into_inner()))
    }

    pub fn completed(&self, trigger: &str, summary: &RunSummary) {
        self.with(|m| {
            *m.runs.entry((trigger.into(), "completed".into())).or_default() += 1;
            m.duration.insert(trigger.into(), summary.duration.as_secs_f64());
            for (f, n) in &summary.written {
                *m.written.entry(f.name().into()).or_default() += n;
            }
            for (f, n) in &summary.deleted {
                *m.deleted.entry(f.name().into()).or_default() += n;
            }
            m.rejected += summary.rejected_total();
        });
    }

    pub fn failed(&self, trigger: &str, edge: &str) {
        self.with(|m| {
            *m.runs.entry((trigger.into(), "failed".into())).or_default() += 1;
            *m.errors.entry(edge.into()).or_default() += 1;
        });
    }

    /// Records whether this instance leads, and under which epoch.
    pub fn leadership(&self, leader: bool, epoch: u64) {
        self.with(|m| {
            m.leader = leader;
            m.epoch = epoch;
        });
    }

    pub fn skipped(&self, schedule: &str) {
        self.with(|m| *m.skipped.entry(schedule.into()).or_default() += 1);
    }

    /// Prometheus text exposition.
    pub fn render(&self, watch: Option<&WatchMetrics>) -> String {
        let mut out = String::new();
        self.with(|m| {
            out.push_str("# HELP cachewright_runs_total Runs by trigger and outcome.\n# TYPE cachewright_runs_total counter\n");
            for ((trigger, outcome), n) in &m.runs {
                let _ = writeln!(out, "cachewright_runs_total{{trigger=\"{trigger}\",outcome=\"{outcome}\"}} {n}");
            }
            out.push_str("# HELP cachewright_run_duration_seconds Duration of the last completed run by trigger.\n# TYPE cachewright_run_duration_seconds gauge\n");
            for (trigger, s) in &m.duration {
                let _ = writeln!(out, "cachewright_run_duration_seconds{{trigger=\"{trigger}\"}} {s}");
            }
            out.push_str("# HELP cachewright_keys_written_total Keys written by family.\n# TYPE cachewright_keys_written_total counter\n");
            for (f, n) in &m.written {
                let _ = writeln!(out, "cachewright_keys_written_total{{family=\"{f}\"}} {n}");
            }
            out.push_str("# HELP cachewright_keys_deleted_total Stale keys deleted by family.\n# TYPE cachewright_keys_deleted_total counter\n");
            for (f, n) in &m.deleted {
                let _ = writeln!(out, "cachewright_keys_deleted_total{{family=\"{f}\"}} {n}");
            }
            out.push_str("# HELP cachewright_rejected_documents_total Documents rejected by rebuilds.\n# TYPE cachewright_rejected_documents_total counter\n");
            let _ = writeln!(out, "cachewright_rejected_documents_total {}", m.rejected);
            out.push_str("# HELP cachewright_errors_total Errors by edge.\n# TYPE cachewright_errors_total counter\n");
            for edge in ["mongodb", "redis", "lease", "guard", "other"] {
                let _ = writeln!(out, "cachewright_errors_total{{edge=\"{edge}\"}} {}", m.errors.get(edge).copied().unwrap_or(0));
            }
            out.push_str("# HELP cachewright_leader Whether this instance holds the writer lease.\n# TYPE cachewright_leader gauge\n");
            let _ = writeln!(out, "cachewright_leader {}", u8::from(m.leader));
            out.push_str("# HELP cachewright_leader_epoch The fencing epoch this instance last led under.\n# TYPE cachewright_leader_epoch gauge\n");
            let _ = writeln!(out, "cachewright_leader_epoch {}", m.epoch);
            out.push_str("# HELP cachewright_schedule_skipped_total Fires skipped because the job was still running or another instance held the lease.\n# TYPE cachewright_schedule_skipped_total counter\n");
            for (s, n) in &m.skipped {
                let _ = writeln!(out, "cachewright_schedule_skipped_total{{schedule=\"{s}\"}} {n}");
            }
        });
        if let Some(w) = watch {
            out.push_str("# HELP cachewright_changestream_events_total Change events applied by collection.\n# TYPE cachewright_changestream_events_total counter\n");
            for (name, slot) in ["Channel", "Category", "Tag", "VideoMedia"].iter().zip(&w.applied) {
                let _ = writeln!(
                    out,
                    "cachewright_changestream_events_total{{collection=\"{name}\"}} {}",
                    slot.load(Ordering::Relaxed)
                );
            }
            out.push_str("# HELP cachewright_changestream_lag_seconds Now minus the newest applied event's cluster time.\n# TYPE cachewright_changestream_lag_seconds gauge\n");
            let _ = writeln!(
                out,
                "cachewright_changestream_lag_seconds {}",
                w.lag_ms.load(Ordering::Relaxed) as f64 / 1000.0
            );
            out.push_str("# HELP cachewright_changestream_last_event_age_seconds Seconds since the last applied event.\n# TYPE cachewright_changestream_last_event_age_seconds gauge\n");
            let _ =
                writeln!(out, "cachewright_changestream_last_event_age_seconds {}", w.last_event_age().unwrap_or(-1.0));
            out.push_str("# HELP cachewright_changestream_streaming Whether the watcher is streaming.\n# TYPE cachewright_changestream_streaming gauge\n");
            let _ =
                writeln!(out, "cachewright_changestream_streaming {}", u8::from(w.streaming.load(Ordering::Relaxed)));
            out.push_str("# HELP cachewright_changestream_rebuilds_total Full rebuilds the watcher triggered.\n# TYPE cachewright_changestream_rebuilds_total counter\n");
            let _ = writeln!(out, "cachewright_changestream_rebuilds_total {}", w.rebuilds.load(Ordering::Relaxed));
            out.push_str("# HELP cachewright_changestream_rejected_total Documents the watcher rejected and change events it could not use, by collection and reason.\n# TYPE cachewright_changestream_rejected_total counter\n");
            for ((collection, reason), (n, _)) in w.problems.lock().unwrap_or_else(|e| e.into_inner()).iter() {
                let reason = reason.replace('\\', "\\\\").replace('"', "\\\"");
                let _ = writeln!(
                    out,
                    "cachewright_changestream_rejected_total{{collection=\"{collection}\",reason=\"{reason}\"}} {n}"
                );
            }
            let _ = writeln!(
                out,
                "# HELP cachewright_errors_changestream_total Change stream failures.\n# TYPE cachewright_errors_changestream_total counter\ncachewright_errors_changestream_total {}",
                w.stream_errors.load(Ordering::Relaxed)
            );
        }
        out
    }
}
