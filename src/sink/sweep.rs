//! After a full rebuild: delete every key of a selected registered family
//! under the prefix that the rebuild did not produce. One SCAN pass (never
//! KEYS); keys of unregistered families are never touched.

use super::{RetryPolicy, SinkError};
use crate::keys::Keys;
use crate::plan::FamilySet;
use crate::registry::FamilyId;
use redis::aio::ConnectionManager;
use std::collections::{BTreeMap, HashSet};

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct SweepOutcome {
    /// Keys deleted (or, on a dry run, that would be) per family.
    pub deleted: BTreeMap<FamilyId, u64>,
    pub scanned: u64,
}

const SCAN_COUNT: usize = 1000;
const UNLINK_BATCH: usize = 500;

impl super::Sink {
    /// Sweeps stale keys. With `dry_run`, only counts them.
    pub async fn sweep(
        &self,
        keys: &Keys,
        families: FamilySet,
        produced: &HashSet<String>,
        dry_run: bool,
    ) -> Result<SweepOutcome, SinkError> {
        let glob = format!("{}*", keys.scan_glob_prefix());
        let mut conn = self.connection();
        let mut outcome = SweepOutcome::default();
        let mut doomed: Vec<String> = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, batch): (u64, Vec<String>) = scan(&self.retry, &mut conn, cursor, &glob).await?;
            outcome.scanned += batch.len() as u64;
            for key in batch {
                let stale = keys.classify(&key).filter(|f| families.contains(*f) && !produced.contains(&key));
                if let Some(family) = stale {
                    *outcome.deleted.entry(family).or_default() += 1;
                    doomed.push(key);
                }
            }
            if !dry_run && doomed.len() >= UNLINK_BATCH {
                unlink(&self.retry, &mut conn, &doomed).await?;
                doomed.clear();
            }
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
        if !dry_run && !doomed.is_empty() {
            unlink(&self.retry, &mut conn, &doomed).await?;
        }
        Ok(outcome)
    }
}

async fn scan(
    retry: &RetryPolicy,
    conn: &mut ConnectionManager,
    cursor: u64,
    glob: &str,
) -> Result<(u64, Vec<String>), SinkError> {
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

async fn unlink(retry: &RetryPolicy, conn: &mut ConnectionManager, keys: &[String]) -> Result<(), SinkError> {
    retry
        .run(|| {
            let mut conn = conn.clone();
            async move { redis::cmd("UNLINK").arg(keys).query_async::<()>(&mut conn).await }
        })
        .await
        .map_err(|(attempts, source)| SinkError::Write { attempts, source })
}
