//! Stale-key removal after a full rebuild. Once every write has succeeded,
//! one SCAN pass (never KEYS; every master on a cluster) classifies the
//! keys under the prefix: keys of the selected registered families that
//! the rebuild did not produce are stale. Only the stale names are kept,
//! up to a cap, and all of them are counted, so the guard judges the whole
//! sweep before anything is deleted; above the cap, another pass finds
//! the rest after the first names are gone. Keys of unregistered families
//! are never collected, so never touched.

use crate::keys::Keys;
use crate::plan::FamilySet;
use crate::registry::FamilyId;
use crate::sample::Reservoir;
use crate::sink::SinkError;
use crate::sink::cluster_io::Scanned;
use crate::sink::fence::wire::Exclusive;
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::ops::ControlFlow;

/// A 128-bit digest of a key, so that a million produced keys cost 16
/// bytes each instead of a string. XXH3's 128-bit form makes a collision
/// (a stale key surviving) practically impossible, at a few nanoseconds
/// a key name (two 64-bit hashes, SipHash among them, cost several times
/// that).
pub fn digest(key: &str) -> u128 {
    xxhash_rust::xxh3::xxh3_128(key.as_bytes())
}

/// The produced keys' digests.
pub type Produced = rustc_hash::FxHashSet<u128>;

/// Existing keys of the selected families, found by [`crate::sink::Sink::scan_existing`].
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
    /// The stale keys' names, at most the pass's cap.
    pub keys: Vec<(FamilyId, String)>,
    /// Every stale key found, per family (beyond the cap too).
    pub by_family: BTreeMap<FamilyId, u64>,
    pub scanned: u64,
    /// Keys under the prefix whose names are not UTF-8 (skipped).
    pub not_utf8: u64,
    /// Keys the pass could not judge yet (see [`crate::sink::Sink::find_stale`]),
    /// at most the cap of them.
    pub later: Vec<(FamilyId, String)>,
    /// Whether more keys than the cap were left for later: the pass must
    /// then be made again once every key can be judged.
    pub later_dropped: bool,
}

impl Stale {
    /// Every stale key found.
    pub fn total(&self) -> u64 {
        self.by_family.values().sum()
    }

    /// Whether the pass kept every stale name it found.
    pub fn is_complete(&self) -> bool {
        self.total() == self.keys.len() as u64
    }

    /// Files one existing key of a selected family: `produced` is `None`
    /// when it cannot be judged yet.
    fn file(&mut self, family: FamilyId, key: String, produced: Option<bool>, cap: usize) {
        match produced {
            Some(true) => {}
            Some(false) => {
                *self.by_family.entry(family).or_default() += 1;
                if self.keys.len() < cap {
                    self.keys.push((family, key));
                }
            }
            None if self.later.len() < cap => self.later.push((family, key)),
            None => self.later_dropped = true,
        }
    }

    /// Judges the keys left for later, now that `produced` can.
    pub fn settle(&mut self, produced: impl Fn(&str) -> bool, cap: usize) {
        for (family, key) in std::mem::take(&mut self.later) {
            if !produced(&key) {
                *self.by_family.entry(family).or_default() += 1;
                if self.keys.len() < cap {
                    self.keys.push((family, key));
                }
            }
        }
    }
}

/// Whether a run produced a key, from its family, its placeholders' values
/// and its name; `None` when that cannot be told yet.
pub type Judge<'a> = dyn Fn(FamilyId, &[&str], &str) -> Option<bool> + Sync + 'a;

/// One scanned key, classified.
enum Filed {
    NotUtf8,
    /// Not of a selected registered family: never touched.
    Other,
    Key(FamilyId, String, Option<bool>),
}

/// Buckets one `SCAN` call walks. Redis runs each call whole, so this
/// bounds how long a scan holds readers up: at 5,000 a call of the 58K
/// benchmark's warm cache took 5.7 ms at the median and 9.2 ms at worst
/// (17 ms at 2M), against 1.1 and 1.9 ms at 1,000, near a write
/// transaction's; the scan's total time in Redis stays about the same.
pub(in crate::sink) const SCAN_COUNT: usize = 1000;
/// `SCAN` calls per master that [`crate::sink::Sink::holds_no_family_key`]
/// makes before it gives up: an empty keyspace answers in one, a
/// keyspace of a few thousand keys in a few.
const EMPTY_PROBE_CALLS: usize = 4;
const UNLINK_BATCH: usize = 1000;

impl crate::sink::Sink {
    /// Collects every key under the prefix that belongs to a selected
    /// registered family.
    pub async fn scan_existing(&self, keys: &Keys, families: FamilySet) -> Result<Existing, SinkError> {
        let all = self.find_stale(keys, families, &|_, _, _| Some(false), usize::MAX).await?;
        Ok(Existing { keys: all.keys, scanned: all.scanned, not_utf8: all.not_utf8 })
    }

    /// Calls `visit` with every batch of keys matching `glob`, as the
    /// topology scans them (see [`crate::sink::Topology::scan`]): one SCAN
    /// pass on one node; on a cluster, one on every master, made again
    /// (after `Scanned::Restart`) when slots moved meanwhile. The scan
    /// runs ahead of `visit` by a few batches, so a pass takes about as
    /// long as Redis takes to scan, not that plus the filing.
    pub(in crate::sink) async fn for_each_key<F, Fut>(&self, glob: &str, mut visit: F) -> Result<(), SinkError>
    where
        F: FnMut(Scanned) -> Fut,
        Fut: std::future::Future<Output = Result<(), SinkError>>,
    {
        let visit = |scanned| {
            let visited = visit(scanned);
            async move { visited.await.map(ControlFlow::Continue) }
        };
        self.scan_while(glob, visit).await.map(drop)
    }

    /// [`Self::for_each_key`] until `visit` breaks: true when the pass
    /// went over every key, false when it was broken off.
    async fn scan_while<F, Fut>(&self, glob: &str, mut visit: F) -> Result<bool, SinkError>
    where
        F: FnMut(Scanned) -> Fut,
        Fut: std::future::Future<Output = Result<ControlFlow<()>, SinkError>>,
    {
        let ahead = 2 * self.topology().masters().len().max(1);
        let (found, mut batches) = tokio::sync::mpsc::channel(ahead);
        let scan = self.topology().scan(self, glob, found);
        let filing = async move {
            // Owned here: a failed or broken-off visit drops it, and the
            // scan's next send ends the scan.
            while let Some(batch) = batches.recv().await {
                if visit(batch).await?.is_break() {
                    return Ok(false);
                }
            }
            Ok::<bool, SinkError>(true)
        };
        let (scanned, filed) = tokio::join!(scan, filing);
        let whole = filed?;
        scanned?;
        Ok(whole)
    }

    /// One SCAN pass over one node into `found`: the one-node answer of
    /// [`crate::sink::Topology::scan`].
    pub(in crate::sink) async fn scan_one_node(
        &self,
        glob: &str,
        found: tokio::sync::mpsc::Sender<Scanned>,
    ) -> Result<(), SinkError> {
        let node = self.topology().masters().into_iter().next().unwrap_or_default();
        self.scan_node(&node, glob, &found).await
    }

    /// One SCAN pass over the master at `node` into `found`, a batch at a
    /// time; it ends early, quietly, when `found`'s receiver is gone (the
    /// pass failed there).
    pub(in crate::sink) async fn scan_node(
        &self,
        node: &str,
        glob: &str,
        found: &tokio::sync::mpsc::Sender<Scanned>,
    ) -> Result<(), SinkError> {
        self.scan_pages(glob, found, |cmd| async move { self.on_node(node, &cmd).await }).await
    }

    /// One SCAN pass over one node on a connection of its own
    /// ([`crate::sink::fence::wire`]), the one-node answer of
    /// [`crate::sink::Topology::scan`]. A page is one reply of a thousand
    /// names; through the shared connection each went through the
    /// driver's streaming parser, about a tenth of a warm rebuild's CPU
    /// while Redis held a million keys under the prefix (ARCHITECTURE.md,
    /// "Where the rebuild's CPU goes"). A request that fails drops the
    /// connection; the retry connects afresh.
    pub(in crate::sink) async fn scan_own_connection(
        &self,
        glob: &str,
        found: tokio::sync::mpsc::Sender<Scanned>,
    ) -> Result<(), SinkError> {
        let own = std::sync::Mutex::new(None);
        let own = &own;
        self.scan_pages(glob, &found, |cmd| async move {
            let kept = own.lock().unwrap_or_else(|e| e.into_inner()).take();
            let mut conn = match kept {
                Some(conn) => conn,
                None => Exclusive::connect(&self.node_client(), self.timeout).await?,
            };
            let reply = cmd.query_async::<redis::Value>(&mut conn).await?;
            *own.lock().unwrap_or_else(|e| e.into_inner()) = Some(conn);
            Ok(reply)
        })
        .await
    }

    /// The SCAN pass both of the above make, each page sent by `request`
    /// (retried as every request is).
    async fn scan_pages<F, Fut>(
        &self,
        glob: &str,
        found: &tokio::sync::mpsc::Sender<Scanned>,
        request: F,
    ) -> Result<(), SinkError>
    where
        F: Fn(redis::Cmd) -> Fut,
        Fut: std::future::Future<Output = redis::RedisResult<redis::Value>>,
    {
        let mut cursor: u64 = 0;
        loop {
            let mut cmd = redis::cmd("SCAN");
            cmd.arg(cursor).arg("MATCH").arg(glob).arg("COUNT").arg(SCAN_COUNT);
            let reply = self
                .retry
                .run(|| request(cmd.clone()))
                .await
                .map_err(|(attempts, source)| SinkError::Scan { attempts, source })?;
            let (next, batch): (u64, Vec<Vec<u8>>) =
                redis::from_redis_value(reply).map_err(|e| SinkError::Scan { attempts: 1, source: e.into() })?;
            if found.send(Scanned::Keys(batch)).await.is_err() || next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    }

    /// One pass over the keyspace: the keys of the selected families for
    /// which `produced(family, placeholders, key)` is `Some(false)`, names
    /// kept up to `cap`. Keys it answers `None` for are kept (up to `cap`)
    /// for [`Stale::settle`]: a rebuild scans while its last keys are still
    /// being written, and judges those keys once they are.
    pub async fn find_stale(
        &self,
        keys: &Keys,
        families: FamilySet,
        produced: &Judge<'_>,
        cap: usize,
    ) -> Result<Stale, SinkError> {
        let glob = format!("{}*", keys.scan_glob_prefix());
        let mut stale = Stale::default();
        self.for_each_key(&glob, |scanned| {
            match scanned {
                Scanned::Restart => stale = Stale::default(),
                Scanned::Keys(batch) => {
                    stale.scanned += batch.len() as u64;
                    for item in file_batch(keys, families, batch, produced) {
                        match item {
                            Filed::Key(family, key, made) => stale.file(family, key, made, cap),
                            Filed::Other => {}
                            Filed::NotUtf8 => stale.not_utf8 += 1,
                        }
                    }
                }
            }
            std::future::ready(Ok(()))
        })
        .await?;
        if stale.not_utf8 > 0 {
            tracing::warn!(keys = stale.not_utf8, "keys under the prefix whose names are not UTF-8 were skipped");
        }
        Ok(stale)
    }

    /// Whether Redis holds no key of the selected families, as far as a
    /// short pass can tell: `true` only when the pass went over the whole
    /// keyspace within a few `SCAN` calls per master and found none; a
    /// larger keyspace, or one key of the families, gives `false`.
    pub async fn holds_no_family_key(&self, keys: &Keys, families: FamilySet) -> Result<bool, SinkError> {
        let glob = format!("{}*", keys.scan_glob_prefix());
        let allowed = EMPTY_PROBE_CALLS * self.topology().masters().len().max(1);
        // Counted across restarts of a cluster's pass, so that moving
        // slots cannot keep the probe going.
        let mut calls = 0;
        let mut found = false;
        let whole = self
            .scan_while(&glob, |scanned| {
                if let Scanned::Keys(batch) = scanned {
                    calls += 1;
                    let none = |_: FamilyId, _: &[&str], _: &str| Some(false);
                    found |= file_batch(keys, families, batch, &none).iter().any(|f| matches!(f, Filed::Key(..)));
                }
                let decided = found || calls >= allowed;
                std::future::ready(Ok(if decided { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }))
            })
            .await?;
        Ok(whole && !found)
    }

    /// How many keys of the selected families exist (names not kept).
    pub async fn count_existing(&self, keys: &Keys, families: FamilySet) -> Result<u64, SinkError> {
        Ok(self.find_stale(keys, families, &|_, _, _| Some(false), 0).await?.total())
    }

    /// Every key of the selected families, counted by family, with a
    /// uniform random draw of at most `draw` names of each (reservoir
    /// sampling): memory for the draw, whatever the number of keys.
    pub async fn draw_existing(
        &self,
        keys: &Keys,
        families: FamilySet,
        draw: usize,
    ) -> Result<BTreeMap<FamilyId, Reservoir<String>>, SinkError> {
        let glob = format!("{}*", keys.scan_glob_prefix());
        let mut out: BTreeMap<FamilyId, Reservoir<String>> = BTreeMap::new();
        self.for_each_key(&glob, |scanned| {
            match scanned {
                Scanned::Restart => out.clear(),
                Scanned::Keys(batch) => {
                    for item in file_batch(keys, families, batch, &|_, _, _| Some(false)) {
                        if let Filed::Key(family, key, _) = item {
                            out.entry(family).or_insert_with(|| Reservoir::new(draw)).offer(key);
                        }
                    }
                }
            }
            std::future::ready(Ok(()))
        })
        .await?;
        Ok(out)
    }

    /// Unlinks every key of the selected families page by page as the
    /// scan finds them (with `dry_run`, only counts them), and gives how
    /// many per family. Nothing is held beyond a page. SCAN returns every
    /// key present from its start to its end, so deleting the keys it
    /// returned does not hide the others; on a cluster whose slots moved
    /// meanwhile the scan is made again and finds only what is left.
    pub async fn unlink_families(
        &self,
        keys: &Keys,
        families: FamilySet,
        dry_run: bool,
        on_page: impl Fn(u64),
    ) -> Result<BTreeMap<FamilyId, u64>, SinkError> {
        let glob = format!("{}*", keys.scan_glob_prefix());
        let mut counts: BTreeMap<FamilyId, u64> = BTreeMap::new();
        self.for_each_key(&glob, |scanned| {
            let mut names = Vec::new();
            match scanned {
                // What a dry run counted is counted again; what was
                // deleted is gone and is not.
                Scanned::Restart if dry_run => counts.clear(),
                Scanned::Restart => {}
                Scanned::Keys(batch) => {
                    for item in file_batch(keys, families, batch, &|_, _, _| Some(false)) {
                        if let Filed::Key(family, key, _) = item {
                            *counts.entry(family).or_default() += 1;
                            names.push(key);
                        }
                    }
                }
            }
            on_page(names.len() as u64);
            async move {
                for chunk in names.chunks(UNLINK_BATCH).filter(|_| !dry_run) {
                    self.unlink(chunk).await?;
                }
                Ok(())
            }
        })
        .await?;
        Ok(counts)
    }

    /// Unlinks the names a pass kept, in batches (fenced when the sink is).
    pub async fn unlink_stale(&self, stale: &Stale) -> Result<(), SinkError> {
        for chunk in stale.keys.chunks(UNLINK_BATCH) {
            let keys: Vec<String> = chunk.iter().map(|(_, k)| k.clone()).collect();
            self.unlink(&keys).await?;
        }
        Ok(())
    }
}

/// Classifies one page of scanned names, in parallel: at millions of
/// keys, filing them one by one would take longer than Redis takes to
/// scan them.
fn file_batch(keys: &Keys, families: FamilySet, batch: Vec<Vec<u8>>, produced: &Judge<'_>) -> Vec<Filed> {
    // Off the async worker: the scan's next page and the other tasks
    // keep running while rayon files this one.
    crate::tasks::off_runtime(|| file_page(keys, families, batch, produced))
}

fn file_page(keys: &Keys, families: FamilySet, batch: Vec<Vec<u8>>, produced: &Judge<'_>) -> Vec<Filed> {
    batch
        .into_par_iter()
        .map(|raw| {
            let Ok(key) = String::from_utf8(raw) else { return Filed::NotUtf8 };
            let Some((family, args)) = keys.parse(&key).filter(|(f, _)| families.contains(*f)) else {
                return Filed::Other;
            };
            let made = produced(family, &args, &key);
            Filed::Key(family, key, made)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_keys_are_the_unproduced_ones_named_up_to_the_cap() {
        let mut stale = Stale::default();
        stale.file(FamilyId::TagAll, "app:tag:all".into(), Some(true), 2);
        for i in 0..4 {
            stale.file(FamilyId::VideoDetail, format!("app:video:detail:v{i}"), Some(false), 2);
        }
        stale.file(FamilyId::TagList, "app:tag:list".into(), Some(false), 2);
        assert_eq!(stale.total(), 5);
        assert_eq!(stale.by_family[&FamilyId::VideoDetail], 4);
        let names: Vec<&str> = stale.keys.iter().map(|(_, k)| k.as_str()).collect();
        assert_eq!(names, ["app:video:detail:v0", "app:video:detail:v1"]);
        assert!(!stale.is_complete());
    }

    #[test]
    fn keys_left_for_later_are_judged_when_settled() {
        let mut stale = Stale::default();
        for key in ["app:tag:all", "app:tag:list", "app:channel:all"] {
            stale.file(FamilyId::TagAll, key.into(), None, 2);
        }
        assert!(stale.later_dropped, "a third key beyond the cap of 2");
        stale.settle(|key| key == "app:tag:all", 2);
        assert_eq!(stale.total(), 1);
        assert_eq!(stale.keys, vec![(FamilyId::TagAll, "app:tag:list".to_string())]);
        assert!(stale.later.is_empty());
    }

    #[test]
    fn digests_differ_for_different_keys() {
        let keys: Vec<String> = (0..100_000).map(|i| format!("app:video:detail:{i:024x}")).collect();
        let set: rustc_hash::FxHashSet<u128> = keys.iter().map(|k| digest(k)).collect();
        assert_eq!(set.len(), keys.len());
        assert_eq!(digest("a"), digest("a"));
    }
}
