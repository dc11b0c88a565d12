//! `cachewright verify`: compares Redis with what a full rebuild from the
//! current MongoDB would write, writing nothing. Reads go in bounded
//! pipelined batches with no blocking commands, so it can run against
//! production.

use crate::config::Config;
use crate::plan::plan_in_memory;
use crate::plan::{FamilySet, Value};
use crate::progress::Progress;
use crate::rebuild::{RunError, plan_ctx};
use crate::registry::FamilyId;
use crate::sink::{Observed, Sink};
use crate::source::Source;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};

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
    let c = &cfg.collections;
    let [channels, categories, tags, videos] = source.read_four(cfg).await?;
    let ctx = plan_ctx(cfg, families);
    let names = c.clone();
    let planned = {
        let ctx = ctx.clone();
        tokio::task::spawn_blocking(move || plan_in_memory(&ctx, &names, &channels, &categories, &tags, &videos))
            .await?
    };
    let expected: HashMap<String, Value> = planned.ops.into_iter().map(|op| (op.key.text, op.value)).collect();

    let mut checks: BTreeMap<FamilyId, FamilyCheck> =
        families.iter().map(|f| (f, FamilyCheck { family: f.name().to_string(), ..FamilyCheck::default() })).collect();
    let existing = sink.scan_existing(&ctx.keys, families).await?;
    for (family, key) in &existing.keys {
        if !expected.contains_key(key) {
            let check = checks.entry(*family).or_default();
            check.extra += 1;
            check.note(sample, format!("extra {key}"));
        }
    }

    let mut keys: Vec<&String> = expected.keys().collect();
    keys.sort();
    let stage = progress.stage("verifying", keys.len() as u64);
    for chunk in keys.chunks(BATCH) {
        let names: Vec<String> = chunk.iter().map(|k| (*k).clone()).collect();
        let inspected = sink.inspect(&names).await?;
        for (key, seen) in names.iter().zip(inspected) {
            let Some(family) = ctx.keys.classify(key) else { continue };
            let want = &expected[key];
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
                    format!("wrong type {key}: {} instead of {}", seen.value.type_name(), want.redis_type().as_str()),
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
    stage.finish();
    Ok(VerifyReport { families: checks.into_values().collect() })
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
