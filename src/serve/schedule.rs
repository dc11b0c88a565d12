//! Schedules for `serve`: cron expressions (the `cron` crate) naming a job,
//! pure fire-time arithmetic, and the check that every TTL tier is
//! refreshed before its keys expire.

use crate::config::TierSeconds;
use crate::plan::FamilySet;
use crate::registry::Registry;
use chrono::{DateTime, Duration as ChronoDuration, Utc};
use serde::Deserialize;
use std::str::FromStr;

/// The schedules shipped in `schedules/default.toml`.
pub const DEFAULT_SCHEDULES: &str = include_str!("../../schedules/default.toml");

/// Minimum time between a refresh and the expiry it prevents.
pub const MARGIN_SECONDS: i64 = 300;

#[derive(Debug, Clone)]
pub enum Job {
    Rebuild,
    Refresh(FamilySet),
}

#[derive(Debug, Clone)]
pub struct Schedule {
    pub name: String,
    pub expression: String,
    pub cron: cron::Schedule,
    pub job: Job,
}

#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    #[error("schedules file: {0}")]
    Parse(String),
    #[error(
        "schedule `{name}`: cron expression {expression:?} is invalid: {reason} (use six fields, seconds first: \"0 0 */2 * * *\")"
    )]
    Cron { name: String, expression: String, reason: String },
    #[error("schedule `{name}`: {reason}")]
    Job { name: String, reason: String },
    #[error(
        "no schedule refreshes {tier} keys (family {family}) within their TTL of {ttl}s: add a schedule whose job covers {family}, firing at least every {need}s"
    )]
    Uncovered { tier: &'static str, family: &'static str, ttl: u64, need: u64 },
    #[error(
        "{tier} keys (family {family}) live {ttl}s but schedule `{schedule}` refreshes them only every {gap}s (+{margin}s margin): make it fire at least every {need}s or raise the {tier} tier"
    )]
    TooSlow { tier: &'static str, family: &'static str, ttl: u64, schedule: String, gap: i64, margin: i64, need: u64 },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    schedule: Vec<RawSchedule>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSchedule {
    name: String,
    cron: String,
    job: String,
    #[serde(default)]
    families: Vec<String>,
}

/// Parses a schedules file.
pub fn parse(text: &str) -> Result<Vec<Schedule>, ScheduleError> {
    let raw: RawFile = toml::from_str(text).map_err(|e| ScheduleError::Parse(e.message().to_string()))?;
    raw.schedule
        .into_iter()
        .map(|s| {
            let cron = cron::Schedule::from_str(&s.cron).map_err(|e| ScheduleError::Cron {
                name: s.name.clone(),
                expression: s.cron.clone(),
                reason: e.to_string(),
            })?;
            let job = match (s.job.as_str(), s.families.is_empty()) {
                ("rebuild", true) => Job::Rebuild,
                ("refresh", false) => Job::Refresh(
                    crate::cli::parse_only(&s.families)
                        .map_err(|reason| ScheduleError::Job { name: s.name.clone(), reason })?,
                ),
                ("rebuild", false) => {
                    return Err(ScheduleError::Job {
                        name: s.name,
                        reason: "a rebuild takes no families; use job = \"refresh\"".into(),
                    });
                }
                ("refresh", true) => {
                    return Err(ScheduleError::Job { name: s.name, reason: "a refresh needs families = [...]".into() });
                }
                (other, _) => {
                    return Err(ScheduleError::Job {
                        name: s.name,
                        reason: format!("unknown job {other:?}; use \"rebuild\" or \"refresh\""),
                    });
                }
            };
            Ok(Schedule { name: s.name, expression: s.cron, cron, job })
        })
        .collect()
}

impl Schedule {
    pub fn families(&self) -> FamilySet {
        match &self.job {
            Job::Rebuild => FamilySet::all(),
            Job::Refresh(f) => *f,
        }
    }

    /// The first fire strictly after `now`.
    pub fn next_fire(&self, now: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.cron.after(&now).next()
    }

    /// The longest gap between fires over the next eight days, in
    /// seconds (a day when the schedule never fires again).
    pub fn interval_seconds(&self, now: DateTime<Utc>) -> u64 {
        self.max_gap(now, ChronoDuration::days(8)).map(|g| g.max(1) as u64).unwrap_or(86_400)
    }

    /// The shortest TTL among the families this schedule refreshes: the
    /// age past which its keys may have expired unrefreshed.
    pub fn shortest_ttl(&self, ttl: &TierSeconds) -> u64 {
        let families = self.families();
        Registry::get()
            .families()
            .iter()
            .filter(|f| families.contains(f.id))
            .map(|f| ttl.get(f.tier))
            .min()
            .unwrap_or(ttl.count)
    }

    /// The longest time between consecutive fires within `horizon` from
    /// `from`, in seconds.
    pub fn max_gap(&self, from: DateTime<Utc>, horizon: ChronoDuration) -> Option<i64> {
        let end = from + horizon;
        // Sub-minute schedules repeat long before the horizon; a cap keeps
        // the check fast.
        let mut fires = self.cron.after(&from).take_while(|t| *t <= end).take(50_000);
        let mut last = fires.next()?;
        let mut gap = 0;
        for t in fires {
            gap = gap.max((t - last).num_seconds());
            last = t;
        }
        (gap > 0).then_some(gap)
    }
}

/// Checks that every family's TTL tier is refreshed, with a margin, by at
/// least one schedule covering it. Looks 8 days ahead, so weekly patterns
/// count.
pub fn check_coverage(schedules: &[Schedule], ttl: &TierSeconds, from: DateTime<Utc>) -> Result<(), ScheduleError> {
    let horizon = ChronoDuration::days(8);
    let gaps: Vec<Option<i64>> = schedules.iter().map(|s| s.max_gap(from, horizon)).collect();
    for family in Registry::get().families() {
        let tier_seconds = ttl.get(family.tier);
        let need = (tier_seconds as i64 - MARGIN_SECONDS).max(1) as u64;
        let covering: Vec<(&Schedule, i64)> = schedules
            .iter()
            .zip(&gaps)
            .filter(|(s, _)| s.families().contains(family.id))
            .filter_map(|(s, g)| g.map(|g| (s, g)))
            .collect();
        let Some((best, gap)) = covering.iter().min_by_key(|(_, g)| *g) else {
            return Err(ScheduleError::Uncovered {
                tier: family.tier.as_str(),
                family: family.name(),
                ttl: tier_seconds,
                need,
            });
        };
        if gap + MARGIN_SECONDS > tier_seconds as i64 {
            return Err(ScheduleError::TooSlow {
                tier: family.tier.as_str(),
                family: family.name(),
                ttl: tier_seconds,
                schedule: best.name.clone(),
                gap: *gap,
                margin: MARGIN_SECONDS,
                need,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    fn at(h: u32, m: u32) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2026, 11, 30, h, m, 0).unwrap()
    }

    const TIERS: TierSeconds = TierSeconds { count: 3600, index: 7200, detail: 86_400, catalog: 604_800 };

    #[test]
    fn the_shipped_schedules_cover_every_tier() {
        let schedules = parse(DEFAULT_SCHEDULES).unwrap();
        assert_eq!(schedules.len(), 3);
        check_coverage(&schedules, &TIERS, at(0, 0)).unwrap();
    }

    #[test]
    fn fire_times_and_gaps() {
        let s = &parse(DEFAULT_SCHEDULES).unwrap()[0];
        assert_eq!(s.next_fire(at(1, 59)).unwrap(), at(2, 0));
        assert_eq!(s.next_fire(at(2, 0)).unwrap(), at(4, 0));
        assert_eq!(s.max_gap(at(0, 0), ChronoDuration::days(2)), Some(7200));
        let counts = &parse(DEFAULT_SCHEDULES).unwrap()[2];
        assert_eq!(counts.next_fire(at(3, 10)).unwrap(), at(3, 40));
        assert_eq!(counts.max_gap(at(0, 0), ChronoDuration::days(1)), Some(1800));
    }

    #[test]
    fn a_slow_schedule_is_refused_with_a_fix() {
        let text = "[[schedule]]\nname = \"nightly\"\ncron = \"0 0 3 * * *\"\njob = \"rebuild\"\n";
        let err = check_coverage(&parse(text).unwrap(), &TIERS, at(0, 0)).unwrap_err().to_string();
        assert!(err.contains("schedule `nightly` refreshes them only every 86400s"), "{err}");
        assert!(err.contains("make it fire at least every"), "{err}");
        let only_counts = "[[schedule]]\nname = \"c\"\ncron = \"0 */10 * * * *\"\njob = \"refresh\"\nfamilies = [\"category:video:count\"]\n";
        let err = check_coverage(&parse(only_counts).unwrap(), &TIERS, at(0, 0)).unwrap_err();
        assert!(matches!(err, ScheduleError::Uncovered { .. }), "{err}");
        // Longer tiers make the nightly rebuild enough.
        let long = TierSeconds { count: 90_000, index: 90_000, detail: 90_000, catalog: 604_800 };
        check_coverage(&parse(text).unwrap(), &long, at(0, 0)).unwrap();
    }

    #[test]
    fn bad_schedules_say_what_is_wrong() {
        let err =
            parse("[[schedule]]\nname = \"x\"\ncron = \"every hour\"\njob = \"rebuild\"\n").unwrap_err().to_string();
        assert!(err.contains("cron expression \"every hour\" is invalid"), "{err}");
        let err =
            parse("[[schedule]]\nname = \"x\"\ncron = \"0 0 * * * *\"\njob = \"refresh\"\n").unwrap_err().to_string();
        assert!(err.contains("needs families"), "{err}");
        let err =
            parse("[[schedule]]\nname = \"x\"\ncron = \"0 0 * * * *\"\njob = \"refresh\"\nfamilies = [\"nope\"]\n")
                .unwrap_err()
                .to_string();
        assert!(err.contains("unknown family"), "{err}");
    }
}
