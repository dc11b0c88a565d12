//! `cachewright verify`: compares Redis with what a full rebuild from the
//! current MongoDB would write, writing nothing. Reads go in bounded
//! pipelined batches with no blocking commands, so it can run against
//! production. It streams as the rebuild does: its memory is the rebuild's
//! video table, not every planned key.

use crate::config::Config;
use crate::plan::{FamilySet, Op, PlanCtx};
use crate::progress::Progress;
use crate::rebuild::{Batcher, RunError, plan_ctx, read_catalog};
use crate::registry::FamilyId;
use crate::sample::Reservoir;
use crate::sink::{Difference, Produced, Sink, SinkError, difference, digest, per_video};
use crate::source::Source;
use serde::Serialize;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::mpsc;

/// Keys read per round trip.
const BATCH: usize = 200;

#[derive(Debug, Clone, Default, Serialize)]
pub struct FamilyCheck {
    pub family: String,
    pub checked: u64,
    pub missing: u64,
    pub extra: u64,
    pub wrong_type: u64,
    pub wrong_value: u64,
    pub no_ttl: u64,
    pub samples: Vec<String>,
}

impl FamilyCheck {
    fn problems(&self) -> u64 {
        self.missing + self.extra + self.wrong_type + self.wrong_value + self.no_ttl
    }

    fn note(&mut self, limit: usize, line: String) {
        if self.samples.len() < limit {
            self.samples.push(line);
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct VerifyReport {
    pub families: Vec<FamilyCheck>,
}

impl VerifyReport {
    pub fn ok(&self) -> bool {
        self.families.iter().all(|f| f.problems() == 0)
    }

    pub fn render(&self) -> String {
        let rows: Vec<Vec<String>> = self
            .families
            .iter()
            .map(|f| {
                [f.family.clone()]
                    .into_iter()
                    .chain(
                        [f.checked, f.missing, f.extra, f.wrong_type, f.wrong_value, f.no_ttl].map(|n| n.to_string()),
                    )
                    .collect()
            })
            .collect();
        let mut out = crate::table::render(
            &["family", "checked", "missing", "extra", "wrong type", "wrong value", "no ttl"],
            &rows,
            &[1, 2, 3, 4, 5, 6],
        );
        for f in self.families.iter().filter(|f| !f.samples.is_empty()) {
            out.push_str(&format!("\n{}:\n", f.family));
            for s in &f.samples {
                out.push_str(&format!("  {s}\n"));
            }
        }
        out.push_str(if self.ok() {
            "\nverify: Redis matches MongoDB\n"
        } else {
            "\nverify: Redis differs from MongoDB\n"
        });
        out
    }
}

/// What `verify` compares and how much of it it shows.
#[derive(Debug, Clone, Copy)]
pub struct VerifyOptions {
    pub families: FamilySet,
    /// Differences listed per family (all are counted).
    pub show: usize,
    /// Compare only this many keys of each family, drawn at random from
    /// what a rebuild would write (`None`: every key).
    pub sample: Option<usize>,
}

impl VerifyOptions {
    /// Every key of `families`, three differences shown per family.
    pub fn all(families: FamilySet) -> VerifyOptions {
        VerifyOptions { families, show: 3, sample: None }
    }
}

pub async fn verify(cfg: &Config, opts: VerifyOptions, progress: &Progress) -> Result<VerifyReport, RunError> {
    let families = opts.families;
    let source = Source::connect(&cfg.mongo()).await?;
    let sink = Sink::connect_for(&cfg.redis(), crate::sink::Access::Read).await?;
    let ctx = Arc::new(plan_ctx(cfg, families));
    let budget = sink.tx_budget();

    // What a rebuild would write streams through the checker as the
    // rebuild's own stages plan it (catalogue, then each video's keys,
    // then the index keys a group at a time): nothing is held whole but
    // the compact video table (and, when sampling, the drawn keys).
    let (tx, rx) = mpsc::channel::<Vec<Op>>(4);
    let stage = Arc::new(progress.stage("verifying", 0));
    let checker = {
        let (sink, ctx, stage) = (sink.clone(), ctx.clone(), stage.clone());
        crate::tasks::spawn(async move { check_planned(&sink, &ctx, rx, opts, &stage).await })
    };
    let (catalog, _, _) = read_catalog(&source, cfg).await?;
    let catalog = Arc::new(catalog);
    let (ops, _) = {
        let (catalog, ctx) = (catalog.clone(), ctx.clone());
        tokio::task::spawn_blocking(move || crate::plan::plan_catalog(&catalog, &ctx)).await?
    };
    {
        // Each batcher holds a sender: the checker ends when all are gone.
        let mut batcher = Batcher::new(tx.clone(), budget);
        let _ = batcher.send(ops).await && batcher.flush().await;
    }
    let mut table = None;
    if families.needs_videos() {
        let batcher = Batcher::new(tx.clone(), budget);
        let (videos, _) =
            crate::rebuild::videos::read_videos(&source, &cfg.mongo(), ctx.clone(), catalog.clone(), batcher, progress)
                .await?;
        let videos = Arc::new(videos);
        let batcher = Batcher::new(tx.clone(), budget);
        crate::rebuild::videos::plan_index_keys(videos.clone(), catalog, ctx.clone(), batcher).await?;
        table = Some(videos);
    }
    drop(tx);
    let (mut checks, planned) = checker.await??;
    stage.finish();

    // Keys a rebuild would not write: one scan of the names (no values
    // read), per-video keys judged by the video table, the others by
    // what was planned. Sampled or not, every name is judged.
    let judge = |family: FamilyId, args: &[&str], key: &str| {
        let per_video = table.as_deref().zip(args.first()).and_then(|(table, id)| table.planned(family, id));
        Some(per_video.unwrap_or_else(|| planned.contains(&digest(key))))
    };
    let extra = sink.find_stale(&ctx.keys, families, &judge, EXTRA_NAMES).await?;
    for (family, n) in &extra.by_family {
        checks.entry(*family).or_default().extra += n;
    }
    for (family, key) in &extra.keys {
        checks.entry(*family).or_default().note(opts.show, Difference::Extra.describe(key));
    }
    for family in families.iter() {
        checks.entry(family).or_default().family = family.name().to_string();
    }
    Ok(VerifyReport { families: checks.into_values().collect() })
}

/// Extra key names kept for the samples (all are counted).
const EXTRA_NAMES: usize = 10_000;

/// Compares planned keys with what Redis holds (every one as it comes,
/// or a draw of them at the end) and returns the checks and the digests
/// of the planned keys that are not per video (the video table answers
/// for those).
async fn check_planned(
    sink: &Sink,
    ctx: &PlanCtx,
    mut rx: mpsc::Receiver<Vec<Op>>,
    opts: VerifyOptions,
    stage: &crate::progress::Stage,
) -> Result<(BTreeMap<FamilyId, FamilyCheck>, Produced), SinkError> {
    let mut checks: BTreeMap<FamilyId, FamilyCheck> = BTreeMap::new();
    let mut planned = Produced::default();
    // A draw of `n` planned keys per family, whatever the number planned.
    let mut draw = opts.sample.map(|n| (n, BTreeMap::<FamilyId, Reservoir<Op>>::new()));
    while let Some(ops) = rx.recv().await {
        let mut wanted = Vec::with_capacity(ops.len());
        for op in ops {
            if !per_video(op.key.family) {
                planned.insert(digest(&op.key.text));
            }
            if !ctx.families.contains(op.key.family) {
                continue;
            }
            match &mut draw {
                Some((n, draw)) => draw.entry(op.key.family).or_insert_with(|| Reservoir::new(*n)).offer(op),
                None => wanted.push(op),
            }
        }
        check_ops(sink, &wanted, opts.show, &mut checks, stage).await?;
    }
    if let Some((_, draw)) = draw {
        let drawn: Vec<Op> = draw.into_values().flat_map(Reservoir::into_kept).collect();
        check_ops(sink, &drawn, opts.show, &mut checks, stage).await?;
    }
    Ok((checks, planned))
}

async fn check_ops(
    sink: &Sink,
    ops: &[Op],
    show: usize,
    checks: &mut BTreeMap<FamilyId, FamilyCheck>,
    stage: &crate::progress::Stage,
) -> Result<(), SinkError> {
    for chunk in ops.chunks(BATCH) {
        let names: Vec<String> = chunk.iter().map(|op| op.key.text.clone()).collect();
        let inspected = sink.inspect(&names).await?;
        for (op, seen) in chunk.iter().zip(inspected) {
            let check = checks.entry(op.key.family).or_default();
            check.checked += 1;
            let Some(found) = difference(Some(&op.value), &seen) else { continue };
            match found {
                Difference::Missing => check.missing += 1,
                Difference::Extra => check.extra += 1,
                Difference::WrongType(..) => check.wrong_type += 1,
                Difference::WrongValue(_) => check.wrong_value += 1,
                Difference::NoTtl => check.no_ttl += 1,
            }
            check.note(show, found.describe(&op.key.text));
        }
        stage.inc(chunk.len() as u64);
    }
    Ok(())
}
