//! The sweep guard: a rebuild that read nothing, or that would delete
//! most of the cache, refuses to write anything destructive.
//!
//! A typo in `MONGODB_DB`, a renamed collection or a schema change that
//! gets every document rejected looks, to a rebuild, exactly like an
//! empty catalogue; its sweep would then delete every key and the site
//! would serve from an empty cache. The two checks here run before the
//! damage: the empty-source check before any key of the collection's
//! families is written, the share check before anything is unlinked.

use crate::plan::FamilySet;
use crate::registry::Registry;

/// The guard's settings for one run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GuardPolicy {
    /// The largest share (0–1) of the selected families' existing keys a
    /// sweep may delete.
    pub max_share: f64,
    /// `--allow-mass-delete`: skip both checks.
    pub force: bool,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GuardError {
    #[error(
        "refusing to write: collection {collection} in database {db} gave no usable document (read {read}, rejected \
         {rejected}), yet Redis holds {keys} keys of its families. A wrong MONGODB_DB, a renamed collection or a \
         schema change would otherwise empty the cache. Check the settings; if the collection really is empty, run \
         `cachewright rebuild --allow-mass-delete`"
    )]
    EmptySource { collection: String, db: String, read: u64, rejected: u64, keys: u64 },
    #[error(
        "refusing to sweep: it would delete {doomed} of the {existing} existing keys of the selected families \
         ({share:.1}%), more than the allowed {max:.1}%. The keys this run wrote are in place and nothing was \
         deleted. If that many deletions are right, run `cachewright rebuild --allow-mass-delete` or raise \
         CACHEWRIGHT_SWEEP_MAX_SHARE"
    )]
    MassDelete { doomed: u64, existing: u64, share: f64, max: f64 },
}

/// The selected families whose keys a collection with no usable
/// documents would wipe: those of its group, and for videos every family
/// planned from videos.
pub fn families_fed_by(group: &str, selected: FamilySet) -> FamilySet {
    let reg = Registry::get();
    FamilySet::of(selected.iter().filter(|&f| {
        let family = reg.family(f);
        if group == "video" { f.needs_videos() } else { family.collection == group && !f.needs_videos() }
    }))
}

impl GuardPolicy {
    /// The empty-source check, given what a collection yielded and how
    /// many keys its families hold.
    pub fn check_source(
        &self,
        collection: &str,
        db: &str,
        read: u64,
        rejected: u64,
        existing_keys: u64,
    ) -> Result<(), GuardError> {
        if self.force || read > rejected || existing_keys == 0 {
            return Ok(());
        }
        Err(GuardError::EmptySource {
            collection: collection.to_string(),
            db: db.to_string(),
            read,
            rejected,
            keys: existing_keys,
        })
    }

    /// The share check of a run's sweep: `doomed` stale keys against what
    /// the families hold once the run's `written` keys have landed (the
    /// stale ones and every key written). Not against what the sweep's
    /// scan counted: it runs beside the writes and sees however many have
    /// landed by then, so on a small keyspace it could see none of them
    /// and refuse to delete a few stale keys.
    pub fn check_sweep_after_writes(&self, doomed: u64, written: u64) -> Result<(), GuardError> {
        self.check_sweep(doomed, doomed + written)
    }

    /// The share check, before a sweep.
    pub fn check_sweep(&self, doomed: u64, existing: u64) -> Result<(), GuardError> {
        if self.force || existing == 0 {
            return Ok(());
        }
        let share = doomed as f64 / existing as f64;
        if share <= self.max_share {
            return Ok(());
        }
        Err(GuardError::MassDelete { doomed, existing, share: share * 100.0, max: self.max_share * 100.0 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::FamilyId;

    const POLICY: GuardPolicy = GuardPolicy { max_share: 0.5, force: false };

    #[test]
    fn an_empty_collection_with_cached_keys_is_refused() {
        let err = POLICY.check_source("Channel", "ap", 0, 0, 12).unwrap_err();
        let text = err.to_string();
        assert!(text.contains("Channel") && text.contains("ap") && text.contains("12 keys"), "{text}");
        assert!(text.contains("--allow-mass-delete"), "{text}");
        // Every document rejected counts as empty too.
        assert!(POLICY.check_source("Tag", "app", 5, 5, 1).is_err());
        assert!(POLICY.check_source("Tag", "app", 5, 4, 1).is_ok());
        // Nothing cached: a first run on an empty database is fine.
        assert!(POLICY.check_source("Tag", "app", 0, 0, 0).is_ok());
        assert!(GuardPolicy { force: true, ..POLICY }.check_source("Tag", "app", 0, 0, 9).is_ok());
    }

    #[test]
    fn sweeping_more_than_the_share_is_refused() {
        assert!(POLICY.check_sweep(50, 100).is_ok());
        let err = POLICY.check_sweep(51, 100).unwrap_err();
        assert_eq!(err, GuardError::MassDelete { doomed: 51, existing: 100, share: 51.0, max: 50.0 });
        assert!(err.to_string().contains("CACHEWRIGHT_SWEEP_MAX_SHARE"));
        assert!(POLICY.check_sweep(0, 0).is_ok());
        assert!(GuardPolicy { force: true, ..POLICY }.check_sweep(100, 100).is_ok());
        assert!(GuardPolicy { max_share: 1.0, force: false }.check_sweep(100, 100).is_ok());
    }

    /// The verdict is the same whatever a scan beside the writes saw: a
    /// few stale keys beside a run that wrote hundreds pass, and a run
    /// that wrote fewer keys than it would delete is refused.
    #[test]
    fn a_sweep_is_judged_against_the_keys_once_written() {
        assert!(POLICY.check_sweep_after_writes(4, 300).is_ok());
        let err = POLICY.check_sweep_after_writes(4, 0).unwrap_err();
        assert_eq!(err, GuardError::MassDelete { doomed: 4, existing: 4, share: 100.0, max: 50.0 });
        assert!(POLICY.check_sweep_after_writes(30, 10).is_err());
        assert!(POLICY.check_sweep_after_writes(0, 0).is_ok());
    }

    #[test]
    fn families_follow_their_collection() {
        let all = FamilySet::all();
        let channel = families_fed_by("channel", all);
        assert!(channel.contains(FamilyId::ChannelAll));
        assert!(!channel.contains(FamilyId::VideoListHome));
        let video = families_fed_by("video", all);
        assert!(video.contains(FamilyId::VideoDetail));
        assert!(video.contains(FamilyId::CategoryVideoCount));
        assert!(!families_fed_by("category", all).contains(FamilyId::CategoryVideoCount));
    }
}
