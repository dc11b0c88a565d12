//! Renders planned ops or live Redis contents in one readable text form,
//! so golden files and real servers are compared the same way.

use cachewright::model::report::{CollectionReport, RefReport};
use cachewright::plan::{Op, Value};
use std::fmt::Write;

/// One key's contents, normalised: set members sorted, zsets in Redis'
/// own order (score, then member).
#[derive(Debug, Clone, PartialEq)]
pub enum Content {
    String(String),
    Set(Vec<String>),
    List(Vec<String>),
    Zset(Vec<(f64, String)>),
}

impl Content {
    pub fn from_value(value: &Value) -> Content {
        match value {
            Value::String(s) => Content::String(s.clone()),
            Value::Set(m) => Content::Set(sorted(m.clone())),
            Value::List(m) => Content::List(m.clone()),
            Value::Zset(m) => Content::zset(m.iter().map(|(s, v)| (*s as f64, v.clone())).collect()),
        }
    }

    /// Back into a planner value (what a patch applies to).
    pub fn to_value(&self) -> Value {
        match self {
            Content::String(s) => Value::String(s.clone()),
            Content::Set(m) => Value::Set(m.clone()),
            Content::List(m) => Value::List(m.clone()),
            Content::Zset(m) => Value::Zset(m.iter().map(|(s, v)| (*s as i64, v.clone())).collect()),
        }
    }

    pub fn zset(mut members: Vec<(f64, String)>) -> Content {
        members.sort_by(|a, b| a.0.total_cmp(&b.0).then_with(|| a.1.as_bytes().cmp(b.1.as_bytes())));
        Content::Zset(members)
    }
}

pub fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    v
}

/// `key type` then one indented line per value, strings quoted Rust-style.
pub fn render(mut keys: Vec<(String, Content)>) -> String {
    keys.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let mut out = String::new();
    for (key, content) in keys {
        match content {
            Content::String(s) => {
                let _ = writeln!(out, "{key} string\n  {s:?}");
            }
            Content::Set(m) => {
                let _ = writeln!(out, "{key} set");
                for v in m {
                    let _ = writeln!(out, "  {v:?}");
                }
            }
            Content::List(m) => {
                let _ = writeln!(out, "{key} list");
                for v in m {
                    let _ = writeln!(out, "  {v:?}");
                }
            }
            Content::Zset(m) => {
                let _ = writeln!(out, "{key} zset");
                for (s, v) in m {
                    let _ = writeln!(out, "  {s} {v:?}");
                }
            }
        }
    }
    out
}

pub fn render_ops(ops: &[Op]) -> String {
    render(ops.iter().map(|op| (op.key.text.clone(), Content::from_value(&op.value))).collect())
}

/// The run's findings: rejections per collection and reason with samples,
/// and dropped references.
pub fn render_report(collections: &[(String, CollectionReport)], refs: &RefReport) -> String {
    let mut out = String::new();
    for (name, report) in collections {
        let _ = writeln!(out, "{name}: read {}, rejected {}", report.read, report.rejected_total());
        for (reason, count) in &report.rejected {
            let _ = writeln!(out, "  {reason}: {} {:?}", count.count, count.samples);
        }
    }
    for (site, n) in &refs.dangling {
        let _ = writeln!(out, "dangling {site}: {n}");
    }
    for (site, n) in &refs.unusable {
        let _ = writeln!(out, "unusable {site}: {n}");
    }
    let _ = writeln!(out, "lossy values: {}", refs.lossy_values);
    out
}

/// Compares with a golden file; `UPDATE_GOLDEN=1` rewrites it instead.
pub fn assert_golden(path: &std::path::Path, actual: &str) {
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(path, actual).expect("write golden file");
        return;
    }
    let expected = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {} ({e}); run with UPDATE_GOLDEN=1 to create it", path.display()));
    if expected != actual {
        let diff = similar::TextDiff::from_lines(&expected, actual);
        panic!(
            "{} differs (- expected, + actual; UPDATE_GOLDEN=1 rewrites it after review):\n{}",
            path.display(),
            diff.unified_diff().context_radius(2)
        );
    }
}
