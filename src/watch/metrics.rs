//! What the watcher has done, for logs, `status` and metrics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Counts and sample ids by (collection, reason).
pub type Problems = std::collections::BTreeMap<(String, String), (u64, Vec<String>)>;

/// How many key families there are (the drift counters' length).
pub const FAMILIES: usize = crate::registry::FamilyId::ALL.len();

/// Sample ids kept per problem.
const MAX_SAMPLES: usize = 5;

#[derive(Debug, Default)]
pub struct WatchMetrics {
    /// Per applied batch, now − the newest event's cluster time (seconds).
    pub lag_histogram: LagHistogram,
    /// Events applied per collection (Channel, Category, Tag, VideoMedia).
    pub applied: [AtomicU64; 4],
    pub batches: AtomicU64,
    /// Batches ended, those of idle streams alone included (each stream
    /// reports idle about once a second): a round ends after every write,
    /// counter and token of the one before, so a count read now and seen
    /// larger later means the batch then in flight is done.
    pub rounds: AtomicU64,
    pub rebuilds: AtomicU64,
    pub stream_errors: AtomicU64,
    /// Batches Redis failed after every retry (rolled back, the streams
    /// reopened from the saved tokens and the batch replayed).
    pub failed_batches: AtomicU64,
    /// Cluster time (unix seconds) of the newest applied event.
    pub last_event_cluster_time: AtomicU64,
    /// Wall time (unix ms) when the newest event was applied.
    pub last_applied_at_ms: AtomicU64,
    /// now − the newest event's cluster time, at its application (ms).
    pub lag_ms: AtomicU64,
    /// Video documents rejected while streaming (counted and skipped).
    pub rejected: AtomicU64,
    /// Scope members the batches' planning read: the members of the
    /// scopes they touched and their videos (never a walk over the whole
    /// catalogue).
    pub visited_videos: AtomicU64,
    /// CPU the batches' in-memory work took, in µs: applying their events
    /// to the state and planning their writes (what grows with the
    /// catalogue if anything does; the benchmark divides it by changes).
    pub state_cpu_us: AtomicU64,
    /// Keys the batches changed in place (see `watch::delta`) instead of
    /// replacing them whole.
    pub patched_keys: AtomicU64,
    /// Steps of patches too big for one atomic unit, after their first
    /// (see `watch::delta`).
    pub patch_steps: AtomicU64,
    /// Keys the drift check compared, by family (`FamilyId as usize`).
    pub drift_checked: [AtomicU64; FAMILIES],
    /// Keys the drift check found different and rewrote, by family.
    pub drift_found: [AtomicU64; FAMILIES],
    /// When the heartbeat was last written (unix seconds).
    pub last_heartbeat: AtomicU64,
    /// True once the streams are open and events are being applied.
    pub streaming: std::sync::atomic::AtomicBool,
    /// Documents rejected and events unusable while streaming, by
    /// collection and reason, with a few sample ids.
    pub problems: std::sync::Mutex<Problems>,
    /// Keys waiting for their slot to be covered (see `watch::deferred`).
    pub deferred_keys: AtomicU64,
    /// The Redis Cluster slots no live master covered when last seen.
    pub uncovered_slots: std::sync::Mutex<Vec<(u16, u16)>>,
}

/// Slot ranges as `0-5460,10923` (one slot alone without a dash).
pub fn slot_ranges_text(ranges: &[(u16, u16)]) -> String {
    let each = ranges.iter().map(|(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") });
    each.collect::<Vec<_>>().join(",")
}

/// The lag histogram, bucketed around the watcher's 200 ms window: a
/// cluster time has one-second resolution, so most batches land between
/// 0 and 1 s.
#[derive(Debug, Clone)]
pub struct LagHistogram(pub prometheus_client::metrics::histogram::Histogram);

impl Default for LagHistogram {
    fn default() -> Self {
        LagHistogram(prometheus_client::metrics::histogram::Histogram::new([
            0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0, 300.0,
        ]))
    }
}

impl std::ops::Deref for LagHistogram {
    type Target = prometheus_client::metrics::histogram::Histogram;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

impl WatchMetrics {
    pub fn is_streaming(&self) -> bool {
        self.streaming.load(Ordering::Relaxed)
    }

    /// Records which slots were uncovered and how many keys wait for them.
    pub fn coverage(&self, uncovered: &[(u16, u16)], deferred: usize) {
        *self.uncovered_slots.lock().unwrap_or_else(|e| e.into_inner()) = uncovered.to_vec();
        self.deferred_keys.store(deferred as u64, Ordering::Relaxed);
    }

    /// Why the cache is not being kept whole, when slots have no master or
    /// keys still wait for theirs.
    pub fn coverage_problem(&self) -> Option<String> {
        let uncovered = self.uncovered_slots.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let waiting = self.deferred_keys.load(Ordering::Relaxed);
        match (uncovered.is_empty(), waiting) {
            (true, 0) => None,
            (true, n) => Some(format!("{n} deferred keys are being written now that their slots are covered")),
            (false, n) => Some(format!(
                "Redis Cluster slots {} have no live master: {n} keys wait for them (the other slots are kept \
                 current); fail the master over to a replica or bring it back",
                slot_ranges_text(&uncovered)
            )),
        }
    }

    /// Counts a problem by collection and reason (a fixed label), keeping
    /// the first few distinct sample ids.
    fn problem(&self, collection: &str, reason: String, id: String) {
        let mut problems = self.problems.lock().unwrap_or_else(|e| e.into_inner());
        let entry = problems.entry((collection.to_string(), reason)).or_default();
        entry.0 += 1;
        if entry.1.len() < MAX_SAMPLES && !entry.1.contains(&id) {
            entry.1.push(id);
        }
    }

    /// Counts video documents a batch rejected, as a rebuild would.
    pub fn rejected(&self, rejections: &[crate::model::report::Rejection]) {
        for r in rejections {
            tracing::warn!(id = %r.id, reason = %r.reason, "video document rejected");
            self.rejected.fetch_add(1, Ordering::Relaxed);
            self.problem("VideoMedia", r.reason.to_string(), r.id.clone());
        }
    }

    /// Counts a change event that could not be used (its document is read
    /// again by id).
    pub fn poison(&self, coll: super::model::Coll, id: &str, reason: &str) {
        let name = match coll {
            super::model::Coll::Channel => "Channel",
            super::model::Coll::Category => "Category",
            super::model::Coll::Tag => "Tag",
            super::model::Coll::Video => "VideoMedia",
        };
        self.problem(name, format!("unusable change event: {reason}"), id.to_string());
    }

    /// Counts keys the drift check compared.
    pub fn drift_checked(&self, family: crate::registry::FamilyId) {
        self.drift_checked[family as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a key the drift check found different.
    pub fn drift_found(&self, family: crate::registry::FamilyId) {
        self.drift_found[family as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts the videos a batch's planning visited.
    pub fn visited(&self, n: usize) {
        self.visited_videos.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Adds CPU a batch's in-memory work took.
    pub fn state_cpu(&self, took: Duration) {
        self.state_cpu_us.fetch_add(took.as_micros() as u64, Ordering::Relaxed);
    }

    /// Rejections and unusable events as JSON rows.
    pub fn problems_json(&self) -> serde_json::Value {
        let problems = self.problems.lock().unwrap_or_else(|e| e.into_inner());
        serde_json::Value::Array(
            problems
                .iter()
                .map(|((collection, reason), (count, samples))| {
                    serde_json::json!({"collection": collection, "reason": reason, "count": count, "samples": samples})
                })
                .collect(),
        )
    }

    pub fn rebuild(&self) {
        self.rebuilds.fetch_add(1, Ordering::Relaxed);
    }

    pub fn stream_error(&self) {
        self.stream_errors.fetch_add(1, Ordering::Relaxed);
    }

    pub fn applied(&self, per_collection: [u64; 4], newest_cluster_time: u32, took: Duration) {
        let total: u64 = per_collection.iter().sum();
        self.rounds.fetch_add(1, Ordering::Relaxed);
        for (slot, n) in self.applied.iter().zip(per_collection) {
            slot.fetch_add(n, Ordering::Relaxed);
        }
        if total == 0 {
            // Only idle streams reported: nothing is waiting, the watcher
            // is caught up (after a replay of old events too).
            self.lag_ms.store(0, Ordering::Relaxed);
            return;
        }
        self.batches.fetch_add(1, Ordering::Relaxed);
        let now = now_ms();
        self.last_applied_at_ms.store(now, Ordering::Relaxed);
        if newest_cluster_time > 0 {
            self.last_event_cluster_time.store(u64::from(newest_cluster_time), Ordering::Relaxed);
            let lag_ms = now.saturating_sub(u64::from(newest_cluster_time) * 1000);
            self.lag_ms.store(lag_ms, Ordering::Relaxed);
            self.lag_histogram.observe(lag_ms as f64 / 1000.0);
        }
        tracing::info!(
            events = total,
            channel = per_collection[0],
            category = per_collection[1],
            tag = per_collection[2],
            video = per_collection[3],
            apply_ms = took.as_millis() as u64,
            lag_ms = self.lag_ms.load(Ordering::Relaxed),
            "change batch applied"
        );
    }

    /// The heartbeat JSON written to `health:current`.
    pub fn heartbeat(&self) -> serde_json::Value {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        serde_json::json!({
            "service": "cachewright watch",
            "pid": std::process::id(),
            "timestamp": crate::status::unix_now(),
            "streaming": self.streaming.load(Ordering::Relaxed),
            "events_applied": {
                "Channel": load(&self.applied[0]),
                "Category": load(&self.applied[1]),
                "Tag": load(&self.applied[2]),
                "VideoMedia": load(&self.applied[3]),
            },
            "batches": load(&self.batches),
            "rebuilds_triggered": load(&self.rebuilds),
            "stream_errors": load(&self.stream_errors),
            "failed_batches": load(&self.failed_batches),
            "patched_keys": load(&self.patched_keys),
            "patch_steps": load(&self.patch_steps),
            "rejected": load(&self.rejected),
            "problems": self.problems_json(),
            "lag_ms": load(&self.lag_ms),
            "deferred_keys": load(&self.deferred_keys),
            "uncovered_slots": slot_ranges_text(&self.uncovered_slots.lock().unwrap_or_else(|e| e.into_inner())),
            "last_event_age_s": self.last_event_age(),
        })
    }

    /// Total events applied.
    pub fn total_applied(&self) -> u64 {
        self.applied.iter().map(|a| a.load(Ordering::Relaxed)).sum()
    }

    /// Seconds since the last applied event, if any.
    pub fn last_event_age(&self) -> Option<f64> {
        let at = self.last_applied_at_ms.load(Ordering::Relaxed);
        (at > 0).then(|| now_ms().saturating_sub(at) as f64 / 1000.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lag_returns_to_zero_when_only_idle_streams_report() {
        let m = WatchMetrics::default();
        // A replayed event an hour old.
        let old = (now_ms() / 1000).saturating_sub(3600) as u32;
        m.applied([0, 0, 0, 1], old, Duration::from_millis(5));
        assert!(m.lag_ms.load(Ordering::Relaxed) >= 3_600_000);
        m.applied([0; 4], 0, Duration::ZERO);
        assert_eq!(m.lag_ms.load(Ordering::Relaxed), 0, "caught up: no lag");
        assert_eq!(m.batches.load(Ordering::Relaxed), 1, "an idle batch is not counted");
    }

    #[test]
    fn uncovered_slots_are_named_until_their_keys_are_written() {
        let m = WatchMetrics::default();
        assert_eq!(m.coverage_problem(), None);
        m.coverage(&[(5461, 10922), (16383, 16383)], 12);
        let problem = m.coverage_problem().unwrap();
        assert!(problem.contains("slots 5461-10922,16383 have no live master: 12 keys wait"), "{problem}");
        m.coverage(&[], 3);
        assert!(m.coverage_problem().unwrap().starts_with("3 deferred keys"));
        m.coverage(&[], 0);
        assert_eq!(m.coverage_problem(), None);
    }

    #[test]
    fn problems_keep_a_few_distinct_samples_per_reason() {
        let m = WatchMetrics::default();
        for i in 0..20 {
            m.poison(super::super::model::Coll::Video, &format!("v{}", i % 8), "event too large");
        }
        let rows = m.problems_json();
        assert_eq!(rows.as_array().map(Vec::len), Some(1), "one row per collection and reason: {rows}");
        assert_eq!(rows[0]["count"], 20);
        assert_eq!(rows[0]["samples"].as_array().map(Vec::len), Some(MAX_SAMPLES));
    }
}
