//! Stale-key removal after a full rebuild. The scan runs concurrently with
//! the rebuild (one SCAN pass, never KEYS) and collects the existing keys
//! of the selected registered families; once every write has succeeded,
//! the ones the rebuild did not produce are unlinked. Keys of unregistered
//! families are never collected, so never touched.

use super::cluster_io::Scanned;
use super::{RetryPolicy, SinkError};
use crate::keys::Keys;
use crate::plan::FamilySet;
use crate::registry::FamilyId;
use std::collections::BTreeMap;

/// A 128-bit digest of a key, so that a million produced keys cost 16
/// bytes each instead of a string; two independent 64-bit hashes make a
/// collision (a stale key surviving) practically impossible.
pub fn digest(key: &str) -> u128 {
    use std::hash::{BuildHasher, Hasher};
    let mut a = rustc_hash::FxBuildHasher.build_hasher();
    a.write(key.as_bytes());
    let mut b = std::hash::BuildHasherDefault::<std::hash::DefaultHasher>::default().build_hasher();
    b.write(key.as_bytes());
    (u128::from(a.finish()) << 64) | u128::from(b.finish())
}

/// The produced keys' digests.
pub type Produced = rustc_hash::FxHashSet<u128>;

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SweepOutcome {
    /// Keys deleted (or, on a dry run, that would be) per family.
    pub deleted: BTreeMap<FamilyId, u64>,
    pub scanned: u64,
}

/// Existing keys of the selected families, found by [`super::Sink::scan_existing`].
#[derive(Debug, Default)]
pub struct Existing {
    pub keys: Vec<(FamilyId, String)>,
    pub scanned: u64,
    /// Keys under the prefix whose names are not UTF-8: no registered
    /// family can match them, so they are skipped and only counted.
    pub not_utf8: u64,
}

/// The existing keys a rebuild did not produce: what its sweep deletes.
#[derive(Debug, Default)]
pub struct Stale {
    pub keys: Vec<(FamilyId, String)>,
    /// How many keys of the selected families existed.
    pub existing: u64,
    pub scanned: u64,
}

/// Splits off the existing keys that were not produced.
pub fn stale(existing: Existing, produced: &Produced) -> Stale {
    let count = existing.keys.len() as u64;
    let keys = existing.keys.into_iter().filter(|(_, key)| !produced.contains(&digest(key))).collect();
    Stale { keys, existing: count, scanned: existing.scanned }
}

const SCAN_COUNT: usize = 5000;
const UNLINK_BATCH: usize = 1000;

impl super::Sink {
    /// Collects every key under the prefix that belongs to a selected
    /// registered family.
    pub async fn scan_existing(&self, keys: &Keys, families: FamilySet) -> Result<Existing, SinkError> {
        let glob = format!("{}*", keys.scan_glob_prefix());
        let mut existing = Existing::default();
        self.for_each_key(&glob, |scanned| {
            let batch = match scanned {
                Scanned::Restart => {
                    existing = Existing::default();
                    return;
                }
                Scanned::Keys(batch) => batch,
            };
            existing.scanned += batch.len() as u64;
            for raw in batch {
                let Ok(key) = String::from_utf8(raw) else {
                    existing.not_utf8 += 1;
                    continue;
                };
                if let Some(family) = keys.classify(&key).filter(|f| families.contains(*f)) {
                    existing.keys.push((family, key));
                }
            }
        })
        .await?;
        if existing.not_utf8 > 0 {
            tracing::warn!(keys = existing.not_utf8, "keys under the prefix whose names are not UTF-8 were skipped");
        }
        Ok(existing)
    }

    /// Calls `visit` with every batch of keys matching `glob`: one SCAN
    /// pass on a single Redis; on a cluster, one on every master, made
    /// again (after `Scanned::Restart`) when slots moved meanwhile.
    pub(super) async fn for_each_key(&self, glob: &str, mut visit: impl FnMut(Scanned)) -> Result<(), SinkError> {
        if self.is_cluster() {
            return self.scan_masters(glob, SCAN_COUNT, visit).await;
        }
        let mut conn = self.connection();
        let mut cursor: u64 = 0;
        loop {
            let (next, batch) = scan(&self.retry, &mut conn, cursor, glob).await?;
            visit(Scanned::Keys(batch));
            cursor = next;
            if cursor == 0 {
                return Ok(());
            }
        }
    }

    /// Unlinks the stale keys in batches (fenced when the sink is); with
    /// `dry_run`, only counts them.
    pub async fn sweep(&self, stale: &Stale, dry_run: bool) -> Result<SweepOutcome, SinkError> {
        let mut outcome = SweepOutcome { scanned: stale.scanned, ..SweepOutcome::default() };
        for (family, _) in &stale.keys {
            *outcome.deleted.entry(*family).or_default() += 1;
        }
        if !dry_run {
            for chunk in stale.keys.chunks(UNLINK_BATCH) {
                let keys: Vec<String> = chunk.iter().map(|(_, k)| k.clone()).collect();
                self.unlink(&keys).await?;
            }
        }
        Ok(outcome)
    }
}

async fn scan(
    retry: &RetryPolicy,
    conn: &mut super::RedisConn,
    cursor: u64,
    glob: &str,
) -> Result<(u64, Vec<Vec<u8>>), SinkError> {
    retry
        .run(|| {
            let mut conn = conn.clone();
            async move {
                redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(glob)
                    .arg("COUNT")
                    .arg(SCAN_COUNT)
                    .query_async(&mut conn)
                    .await
            }
        })
        .await
        .map_err(|(attempts, source)| SinkError::Scan { attempts, source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_keys_are_the_unproduced_ones() {
        let existing = Existing {
            keys: vec![
                (FamilyId::TagAll, "app:tag:all".into()),
                (FamilyId::VideoDetail, "app:video:detail:v1".into()),
                (FamilyId::VideoDetail, "app:video:detail:v2".into()),
            ],
            scanned: 7,
            not_utf8: 1,
        };
        let produced: Produced = ["app:tag:all", "app:video:detail:v2"].iter().map(|k| digest(k)).collect();
        let stale = stale(existing, &produced);
        assert_eq!(stale.existing, 3);
        assert_eq!(stale.scanned, 7);
        assert_eq!(stale.keys, vec![(FamilyId::VideoDetail, "app:video:detail:v1".to_string())]);
    }

    #[test]
    fn digests_differ_for_different_keys() {
        let keys: Vec<String> = (0..100_000).map(|i| format!("app:video:detail:{i:024x}")).collect();
        let set: rustc_hash::FxHashSet<u128> = keys.iter().map(|k| digest(k)).collect();
        assert_eq!(set.len(), keys.len());
        assert_eq!(digest("a"), digest("a"));
    }
}
