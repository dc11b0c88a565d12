//! Writes a run's status keys as it goes. Status writes never fail a run:
//! they are logged and the rebuild carries on.

use crate::keys::status::StatusKeys;
use crate::progress::ProgressEvent;
use crate::sink::{Sink, Unit};
use crate::status::{JOB_TTL_SECONDS, unix_now};
use std::collections::HashSet;
use std::fmt;

/// What started a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    Cron,
    Manual,
    Migration,
    ChangeStream,
}

impl fmt::Display for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Trigger::Cron => "cron",
            Trigger::Manual => "manual",
            Trigger::Migration => "migration",
            Trigger::ChangeStream => "change-stream",
        })
    }
}

/// A run id: 16 lowercase hex characters.
pub fn new_run_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// Reports one run.
pub struct JobReporter {
    sink: Sink,
    keys: StatusKeys,
    pub run_id: String,
    builders: HashSet<&'static str>,
}

fn message(kind: &str, builder: Option<&str>, text: &str, current: u64, total: u64) -> String {
    serde_json::json!({
        "type": kind,
        "builder": builder,
        "timestamp": unix_now(),
        "data": { "message": text, "current": current, "total": total },
    })
    .to_string()
}

impl JobReporter {
    /// Registers the run as active: job hash, active set, counter, and an
    /// `info` message. Ids in the state sets whose hash expired are pruned.
    /// Its writes go through `sink`, so a fenced sink fences them too.
    pub async fn start(sink: Sink, keys: StatusKeys, trigger: Trigger) -> JobReporter {
        let reporter = JobReporter { sink, keys, run_id: new_run_id(), builders: HashSet::new() };
        reporter.prune().await;
        reporter.abandon_orphans().await;
        let now = unix_now().to_string();
        let job = reporter.keys.job(&reporter.run_id);
        let fields: [(&str, String); 14] = [
            ("run_id", reporter.run_id.clone()),
            ("trigger", trigger.to_string()),
            ("status", "running".into()),
            ("current_builder", String::new()),
            ("progress_current", "0".into()),
            ("progress_total", "0".into()),
            ("started_at", now.clone()),
            ("updated_at", now),
            ("finished_at", String::new()),
            ("error_count", "0".into()),
            ("last_error", String::new()),
            ("keys_written", "0".into()),
            ("keys_deleted", "0".into()),
            ("rejected", "0".into()),
        ];
        let mut unit = Unit::new();
        unit.cmd("HSET", &job).arg(&fields[..]);
        unit.cmd("EXPIRE", &job).arg(JOB_TTL_SECONDS);
        unit.cmd("SADD", reporter.keys.jobs("active")).arg(&reporter.run_id);
        unit.cmd("INCR", reporter.keys.total_jobs());
        let text = format!("{trigger} run started");
        unit.publish(&reporter.keys.progress(&reporter.run_id), &message("info", None, &text, 0, 0));
        reporter.apply(unit).await;
        reporter
    }

    async fn apply(&self, unit: Unit) {
        if let Err(err) = self.sink.send(unit).await {
            tracing::warn!(run_id = %self.run_id, error = %err, "could not update job status keys");
        }
    }

    /// Marks failed the runs still listed active. Only the writer-lease
    /// holder runs jobs, one at a time, so a run listed active when a new
    /// one starts belongs to an instance that lost the lease or died: its
    /// own status writes are fenced off, so the new holder closes it.
    async fn abandon_orphans(&self) {
        let ids = self.sink.members(&self.keys.jobs("active")).await.unwrap_or_default();
        if ids.is_empty() {
            return;
        }
        let now = unix_now().to_string();
        let reason = "abandoned: the instance running it lost the writer lease or stopped";
        let mut unit = Unit::new();
        for id in &ids {
            self.mark_failed(&mut unit, id, reason, &now);
        }
        tracing::warn!(runs = ids.len(), "runs left active by an instance that lost the writer lease marked failed");
        self.apply(unit).await;
    }

    /// Drops ids from the state sets whose job hash has expired.
    async fn prune(&self) {
        for state in ["active", "completed", "failed"] {
            let set = self.keys.jobs(state);
            let ids = self.sink.members(&set).await.unwrap_or_default();
            if ids.is_empty() {
                continue;
            }
            let jobs: Vec<String> = ids.iter().map(|id| self.keys.job(id)).collect();
            let exists = self.sink.exist(&jobs).await.unwrap_or_default();
            let gone: Vec<&String> = ids.iter().zip(exists).filter(|(_, e)| !e).map(|(id, _)| id).collect();
            if !gone.is_empty() {
                let mut unit = Unit::new();
                unit.cmd("SREM", &set).arg(gone);
                self.apply(unit).await;
            }
        }
    }

    /// Records a stage's progress in its builder hash and the job hash.
    pub async fn progress(&mut self, event: &ProgressEvent) {
        let now = unix_now();
        let builder = self.keys.builder(&self.run_id, event.builder);
        let job = self.keys.job(&self.run_id);
        let mut unit = Unit::new();
        if self.builders.insert(event.builder) {
            unit.cmd("HSET", &builder).arg("started_at").arg(now);
        }
        let status = if event.done { "completed" } else { "running" };
        unit.cmd("HSET", &builder).arg(
            &[
                ("status", status.to_string()),
                ("current", event.current.to_string()),
                ("total", event.total.to_string()),
                ("updated_at", now.to_string()),
            ][..],
        );
        unit.cmd("EXPIRE", &builder).arg(JOB_TTL_SECONDS);
        unit.cmd("HSET", &job).arg(
            &[
                ("current_builder", event.builder.to_string()),
                ("progress_current", event.current.to_string()),
                ("progress_total", event.total.to_string()),
                ("updated_at", now.to_string()),
            ][..],
        );
        let text = if event.done { format!("{} done", event.builder) } else { format!("{} running", event.builder) };
        let progress = message("progress", Some(event.builder), &text, event.current, event.total);
        unit.publish(&self.keys.progress(&self.run_id), &progress);
        self.apply(unit).await;
    }

    /// Marks the run completed with its totals.
    pub async fn complete(&self, keys_written: u64, keys_deleted: u64, rejected: u64) {
        let now = unix_now().to_string();
        let job = self.keys.job(&self.run_id);
        let mut unit = Unit::new();
        unit.cmd("HSET", &job).arg(
            &[
                ("status", "completed".to_string()),
                ("finished_at", now.clone()),
                ("updated_at", now),
                ("keys_written", keys_written.to_string()),
                ("keys_deleted", keys_deleted.to_string()),
                ("rejected", rejected.to_string()),
            ][..],
        );
        unit.smove(self.keys.jobs("active"), self.keys.jobs("completed"), &self.run_id);
        let text =
            format!("completed: {keys_written} keys written, {keys_deleted} deleted, {rejected} documents rejected");
        unit.publish(&self.keys.progress(&self.run_id), &message("complete", None, &text, keys_written, keys_written));
        self.apply(unit).await;
    }

    /// Marks the run failed with its reason.
    pub async fn fail(&self, reason: &str) {
        let now = unix_now().to_string();
        let mut unit = Unit::new();
        self.mark_failed(&mut unit, &self.run_id, reason, &now);
        unit.publish(&self.keys.progress(&self.run_id), &message("error", None, reason, 0, 0));
        self.apply(unit).await;
    }

    /// Adds to `unit` what marks run `id` failed: its hash and its set.
    fn mark_failed(&self, unit: &mut Unit, id: &str, reason: &str, now: &str) {
        let job = self.keys.job(id);
        unit.cmd("HINCRBY", &job).arg("error_count").arg(1);
        unit.cmd("HSET", &job)
            .arg(&[("status", "failed"), ("finished_at", now), ("updated_at", now), ("last_error", reason)][..]);
        unit.smove(self.keys.jobs("active"), self.keys.jobs("failed"), id);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn run_ids_are_16_lowercase_hex() {
        for _ in 0..100 {
            let id = super::new_run_id();
            assert_eq!(id.len(), 16);
            assert!(id.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)), "{id}");
        }
    }

    #[test]
    fn messages_have_the_contract_shape() {
        let m: serde_json::Value =
            serde_json::from_str(&super::message("progress", Some("videos"), "x", 3, 9)).unwrap();
        assert_eq!(m["type"], "progress");
        assert_eq!(m["builder"], "videos");
        assert!(m["timestamp"].as_u64().unwrap() > 1_700_000_000);
        assert_eq!(m["data"], serde_json::json!({"message": "x", "current": 3, "total": 9}));
    }
}
