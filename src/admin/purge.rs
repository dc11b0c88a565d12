//! `cachewright purge --prefix OLD`: after the readers moved to a new
//! prefix, deletes the registered-family keys under the old one (SCAN and
//! UNLINK in batches). Keys of no registered family are left alone.

use crate::keys::Keys;
use crate::plan::FamilySet;
use crate::progress::Progress;
use crate::registry::FamilyId;
use crate::sink::{Sink, SinkError};
use std::collections::BTreeMap;

const UNLINK_BATCH: usize = 500;

/// Keys deleted (or found, on a dry run) per family.
pub async fn purge(
    sink: &Sink,
    old_prefix: &str,
    dry_run: bool,
    progress: &Progress,
) -> Result<BTreeMap<FamilyId, u64>, SinkError> {
    let keys = Keys::new(old_prefix);
    let existing = sink.scan_existing(&keys, FamilySet::all()).await?;
    let stage = progress.stage(if dry_run { "counting" } else { "purging" }, existing.keys.len() as u64);
    let mut counts = BTreeMap::new();
    for chunk in existing.keys.chunks(UNLINK_BATCH) {
        for (family, _) in chunk {
            *counts.entry(*family).or_default() += 1;
        }
        if !dry_run {
            let names: Vec<String> = chunk.iter().map(|(_, k)| k.clone()).collect();
            sink.unlink(&names).await?;
        }
        stage.inc(chunk.len() as u64);
    }
    stage.finish();
    Ok(counts)
}
