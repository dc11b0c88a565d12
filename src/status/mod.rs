//! Job status in Redis (contract §3): the job hash, per-builder hashes, the
//! active / completed / failed sets, progress messages on pub/sub and the
//! total-jobs counter. The writer lease lives in [`crate::sink::lease`].

pub mod show;

pub use crate::sink::reporter::{JobReporter, Trigger, new_run_id};

/// Seconds since the epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// How long job and builder hashes live.
pub const JOB_TTL_SECONDS: i64 = 24 * 3600;
