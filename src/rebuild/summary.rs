//! The end-of-run summary: keys written and deleted per family, documents
//! read and rejected per collection, dropped references, memory, duration.

use crate::model::report::{CollectionReport, RefReport};
use crate::plan::FamilySet;
use crate::registry::FamilyId;
use crate::table;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct RunSummary {
    pub families: FamilySet,
    pub written: BTreeMap<FamilyId, u64>,
    pub deleted: BTreeMap<FamilyId, u64>,
    pub collections: Vec<(String, CollectionReport)>,
    pub refs: RefReport,
    pub videos_indexed: usize,
    pub duration: Duration,
    pub memory_before: Option<u64>,
    pub memory_after: Option<u64>,
    pub dry_run: bool,
    /// Keys under the prefix whose names are not UTF-8 (skipped).
    pub not_utf8: u64,
    /// How the sweep found the keys it deleted.
    pub sweep: Sweep,
    /// The written keys of [`super::RebuildOptions::keep_names`]' families.
    pub kept_names: Vec<String>,
}

/// How a run's sweep went over the existing keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sweep {
    /// One pass (or more, above the cap) scanned this many keys.
    Scanned(u64),
    /// Redis held no key of the run's families when it began, so no
    /// key could be stale and none was scanned.
    Skipped,
}

fn mib(bytes: Option<u64>) -> String {
    bytes.map(|b| format!("{:.1} MiB", b as f64 / 1_048_576.0)).unwrap_or_else(|| "?".into())
}

impl RunSummary {
    pub fn rejected_total(&self) -> u64 {
        self.collections.iter().map(|(_, r)| r.rejected_total()).sum()
    }

    pub fn written_total(&self) -> u64 {
        self.written.values().sum()
    }

    pub fn deleted_total(&self) -> u64 {
        self.deleted.values().sum()
    }

    /// The human-readable report printed at the end of a run.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let (w, d) = if self.dry_run { ("would write", "would delete") } else { ("written", "deleted") };
        let mut rows: Vec<Vec<String>> = self
            .families
            .iter()
            .map(|f| {
                vec![
                    f.name().to_string(),
                    self.written.get(&f).copied().unwrap_or(0).to_string(),
                    self.deleted.get(&f).copied().unwrap_or(0).to_string(),
                ]
            })
            .collect();
        rows.push(vec!["total".into(), self.written_total().to_string(), self.deleted_total().to_string()]);
        out.push_str(&table::render(&["family", w, d], &rows, &[1, 2]));
        out.push('\n');

        let mut rows = Vec::new();
        for (name, report) in &self.collections {
            let reasons: Vec<String> = report
                .rejected
                .iter()
                .map(|(reason, c)| format!("{reason}: {} (e.g. {})", c.count, c.samples.join(", ")))
                .collect();
            rows.push(vec![
                name.clone(),
                report.read.to_string(),
                report.rejected_total().to_string(),
                if reasons.is_empty() { "-".into() } else { reasons.join("; ") },
            ]);
        }
        out.push_str(&table::render(&["collection", "read", "rejected", "reasons"], &rows, &[1, 2]));
        out.push('\n');

        let sites: std::collections::BTreeSet<&str> =
            self.refs.dangling.keys().chain(self.refs.unusable.keys()).copied().collect();
        if !sites.is_empty() {
            let rows: Vec<Vec<String>> = sites
                .iter()
                .map(|s| {
                    vec![
                        s.to_string(),
                        self.refs.dangling.get(s).copied().unwrap_or(0).to_string(),
                        self.refs.unusable.get(s).copied().unwrap_or(0).to_string(),
                    ]
                })
                .collect();
            out.push_str(&table::render(&["reference", "dangling", "unusable"], &rows, &[1, 2]));
            out.push('\n');
        }
        let _ = writeln!(out, "active videos indexed: {}", self.videos_indexed);
        let _ = match self.sweep {
            Sweep::Scanned(keys) => writeln!(out, "sweep: {keys} existing keys scanned"),
            Sweep::Skipped => writeln!(out, "sweep: skipped (Redis held no key of these families when the run began)"),
        };
        if self.not_utf8 > 0 {
            let _ = writeln!(out, "keys under the prefix that are not UTF-8 (skipped, left alone): {}", self.not_utf8);
        }
        if self.refs.lossy_values > 0 {
            let _ = writeln!(out, "values without a JSON form (written as text): {}", self.refs.lossy_values);
        }
        let _ =
            writeln!(out, "redis used_memory: {} before, {} after", mib(self.memory_before), mib(self.memory_after));
        let _ = writeln!(
            out,
            "duration: {:.2}s{}",
            self.duration.as_secs_f64(),
            if self.dry_run { " (dry run: nothing written)" } else { "" }
        );
        out
    }
}
