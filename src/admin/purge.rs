//! `cachewright purge --prefix OLD`: after the readers moved to a new
//! prefix, deletes the registered-family keys under the old one (SCAN and
//! UNLINK page by page). Keys of no registered family are left alone.

use crate::keys::Keys;
use crate::plan::FamilySet;
use crate::progress::Progress;
use crate::registry::FamilyId;
use crate::sink::{Sink, SinkError};
use std::collections::BTreeMap;

/// Keys deleted (or found, on a dry run) per family. The keys are
/// deleted page by page as the scan finds them: memory stays one page,
/// whatever the number of keys.
pub async fn purge(
    sink: &Sink,
    old_prefix: &str,
    dry_run: bool,
    progress: &Progress,
) -> Result<BTreeMap<FamilyId, u64>, SinkError> {
    let keys = Keys::new(old_prefix);
    let stage = progress.stage(if dry_run { "counting" } else { "purging" }, 0);
    let counts = sink.unlink_families(&keys, FamilySet::all(), dry_run, |n| stage.inc(n)).await?;
    stage.finish();
    Ok(counts)
}
