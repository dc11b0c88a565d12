//! `cachewright verify`: compares Redis with what a full rebuild from the
//! current MongoDB would write, writing nothing. Reads go in bounded
//! pipelined batches with no blocking commands, so it can run against
//! production. It streams as the rebuild does: its memory is the rebuild's
//! video table, not every planned key.

use crate::config::Config;
use crate::plan::{FamilySet, Op, PlanCtx, Value};
use crate::progress::Progress;
use crate::rebuild::{Batcher, RunError, plan_ctx, read_catalog};
use crate::registry::FamilyId;
use crate::sink::{Observed, Produced, Sink, SinkError, digest, per_video};
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

fn shorten(s: &str) -> String {
    const MAX: usize = 120;
    if s.chars().count() <= MAX { s.to_string() } else { format!("{}…", s.chars().take(MAX).collect::<String>()) }
}

/// Where two strings first differ, with a little context.
fn first_difference(expected: &str, found: &str) -> String {
    let at = expected.bytes().zip(found.bytes()).take_while(|(a, b)| a == b).count();
    let start = at.saturating_sub(30);
    let window = |s: &str| -> String {
        let mut from = start.min(s.len());
        while !s.is_char_boundary(from) {
            from -= 1;
        }
        shorten(&s[from..])
    };
    format!("at byte {at}: expected …{} found …{}", window(expected), window(found))
}

/// Describes how `found` differs from `expected`; `None` when equal.
fn compare(expected: &Value, found: &Observed) -> Option<String> {
    match (expected, found) {
        (Value::String(e), Observed::String(f)) => (e != f).then(|| first_difference(e, f)),
        (Value::Set(e), Observed::Set(f)) => {
            let mut e = e.clone();
            e.sort();
            (e != *f).then(|| {
                let missing: Vec<&String> = e.iter().filter(|m| !f.contains(m)).take(3).collect();
                let extra: Vec<&String> = f.iter().filter(|m| !e.contains(m)).take(3).collect();
                format!("members missing {missing:?}, extra {extra:?}")
            })
        }
        (Value::List(e), Observed::List(f)) => (e != f).then(|| {
            let at = e.iter().zip(f).take_while(|(a, b)| a == b).count();
            format!("lengths {} vs {}, first difference at index {at}", e.len(), f.len())
        }),
        (Value::Zset(e), Observed::Zset(f)) => {
            let mut e: Vec<(String, f64)> = e.iter().map(|(s, m)| (m.clone(), *s as f64)).collect();
            e.sort_by(|a, b| a.0.cmp(&b.0));
            (e != *f).then(|| {
                let missing: Vec<&String> =
                    e.iter().filter(|m| !f.iter().any(|x| x.0 == m.0)).map(|m| &m.0).take(3).collect();
                let extra: Vec<&String> =
                    f.iter().filter(|m| !e.iter().any(|x| x.0 == m.0)).map(|m| &m.0).take(3).collect();
                format!("members missing {missing:?}, extra {extra:?} (or scores differ)")
            })
        }
        _ => None,
    }
}

pub async fn verify(
    cfg: &Config,
    families: FamilySet,
    sample: usize,
    progress: &Progress,
) -> Result<VerifyReport, RunError> {
    let source = Source::connect(cfg).await?;
    let sink = Sink::connect_for(cfg, crate::sink::Access::Read).await?;
    let ctx = Arc::new(plan_ctx(cfg, families));
    let budget = sink.tx_budget(cfg);

    // What a rebuild would write streams through the checker as the
    // rebuild's own stages plan it (catalogue, then each video's keys,
    // then the index keys a group at a time): nothing is held whole but
    // the compact video table.
    let (tx, rx) = mpsc::channel::<Vec<Op>>(4);
    let stage = Arc::new(progress.stage("verifying", 0));
    let checker = {
        let (sink, ctx, stage) = (sink.clone(), ctx.clone(), stage.clone());
        crate::tasks::spawn(async move { check_planned(&sink, &ctx, rx, sample, &stage).await })
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
            crate::rebuild::videos::read_videos(&source, cfg, ctx.clone(), catalog.clone(), batcher, progress).await?;
        let videos = Arc::new(videos);
        let batcher = Batcher::new(tx.clone(), budget);
        crate::rebuild::videos::plan_index_keys(videos.clone(), catalog, ctx.clone(), batcher).await?;
        table = Some(videos);
    }
    drop(tx);
    let (mut checks, planned) = checker.await??;
    stage.finish();

    // Keys a rebuild would not write: one scan, per-video keys judged by
    // the video table, the others by what was planned.
    let judge = |family: FamilyId, args: &[&str], key: &str| {
        let per_video = table.as_deref().zip(args.first()).and_then(|(table, id)| table.planned(family, id));
        Some(per_video.unwrap_or_else(|| planned.contains(&digest(key))))
    };
    let extra = sink.find_stale(&ctx.keys, families, &judge, EXTRA_NAMES).await?;
    for (family, n) in &extra.by_family {
        checks.entry(*family).or_default().extra += n;
    }
    for (family, key) in &extra.keys {
        checks.entry(*family).or_default().note(sample, format!("extra {key}"));
    }
    for family in families.iter() {
        checks.entry(family).or_default().family = family.name().to_string();
    }
    Ok(VerifyReport { families: checks.into_values().collect() })
}

/// Extra key names kept for the samples (all are counted).
const EXTRA_NAMES: usize = 10_000;

/// Compares each planned key with what Redis holds, batch by batch, and
/// returns the checks and the digests of the planned keys that are not
/// per video (the video table answers for those).
async fn check_planned(
    sink: &Sink,
    ctx: &PlanCtx,
    mut rx: mpsc::Receiver<Vec<Op>>,
    sample: usize,
    stage: &crate::progress::Stage,
) -> Result<(BTreeMap<FamilyId, FamilyCheck>, Produced), SinkError> {
    let mut checks: BTreeMap<FamilyId, FamilyCheck> = BTreeMap::new();
    let mut planned = Produced::default();
    while let Some(ops) = rx.recv().await {
        for chunk in ops.chunks(BATCH) {
            let names: Vec<String> = chunk.iter().map(|op| op.key.text.clone()).collect();
            let inspected = sink.inspect(&names).await?;
            for (op, seen) in chunk.iter().zip(inspected) {
                let (key, want, family) = (&op.key.text, &op.value, op.key.family);
                if !per_video(family) {
                    planned.insert(digest(key));
                }
                if !ctx.families.contains(family) {
                    continue;
                }
                let check = checks.entry(family).or_default();
                check.checked += 1;
                if seen.value == Observed::Missing {
                    check.missing += 1;
                    check.note(sample, format!("missing {key}"));
                    continue;
                }
                if seen.value.type_name() != want.redis_type().as_str() {
                    check.wrong_type += 1;
                    check.note(
                        sample,
                        format!(
                            "wrong type {key}: {} instead of {}",
                            seen.value.type_name(),
                            want.redis_type().as_str()
                        ),
                    );
                    continue;
                }
                if let Some(detail) = compare(want, &seen.value) {
                    check.wrong_value += 1;
                    check.note(sample, format!("wrong value {key}: {detail}"));
                }
                if seen.ttl < 0 {
                    check.no_ttl += 1;
                    check.note(sample, format!("no ttl {key}"));
                }
            }
            stage.inc(chunk.len() as u64);
        }
    }
    Ok((checks, planned))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_are_described() {
        assert_eq!(compare(&Value::String("a".into()), &Observed::String("a".into())), None);
        let d = compare(&Value::String("{\"a\":1}".into()), &Observed::String("{\"a\":2}".into())).unwrap();
        assert!(d.starts_with("at byte 5"), "{d}");
        assert_eq!(
            compare(&Value::Set(vec!["b".into(), "a".into()]), &Observed::Set(vec!["a".into(), "b".into()])),
            None
        );
        assert!(
            compare(&Value::Set(vec!["a".into()]), &Observed::Set(vec!["a".into(), "x".into()]))
                .unwrap()
                .contains("extra [\"x\"]")
        );
        assert_eq!(compare(&Value::Zset(vec![(5, "v".into())]), &Observed::Zset(vec![("v".into(), 5.0)])), None);
        assert!(compare(&Value::Zset(vec![(5, "v".into())]), &Observed::Zset(vec![("v".into(), 6.0)])).is_some());
        assert!(
            compare(&Value::List(vec!["1".into(), "2".into()]), &Observed::List(vec!["2".into(), "1".into()]))
                .unwrap()
                .contains("index 0")
        );
    }
}
