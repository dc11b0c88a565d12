//! Checks of the operations files in `ops/` against a real `/metrics`
//! scrape, with Prometheus's own tools.

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Stdio};

fn promtool() -> Command {
    assert!(
        Command::new("promtool").arg("--version").output().is_ok_and(|o| o.status.success()),
        "promtool is missing: install Debian's prometheus package (scripts/test.sh does)"
    );
    Command::new("promtool")
}

/// Parses a scrape with Prometheus's text-format parser (`promtool check
/// metrics`); lint remarks are allowed, parse errors are not.
pub fn check_metrics_text(text: &str) {
    let mut child = promtool()
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "promtool check metrics refused the scrape:\n{said}\n--- scrape ---\n{text}");
}

/// Every sample name a scrape can carry: sample lines, and for each
/// declared family the names its type implies (a histogram without
/// observations yet still exports `_bucket`, `_sum` and `_count`).
pub fn exported_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut parts = rest.split_whitespace();
            let (name, kind) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
            names.insert(name.to_string());
            if kind == "histogram" {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
        } else if !line.starts_with('#') && !line.is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_string());
        }
    }
    names
}

/// The `cachewright_*` names used by the dashboard and the alert rules.
pub fn ops_metric_names() -> BTreeSet<String> {
    let root = super::root().join("ops");
    let mut names = BTreeSet::new();
    for file in ["prometheus/cachewright-alerts.yml", "grafana/cachewright-dashboard.json"] {
        let text = std::fs::read_to_string(root.join(file)).unwrap_or_else(|e| panic!("ops/{file}: {e}"));
        let mut rest = text.as_str();
        while let Some(at) = rest.find("cachewright_") {
            let tail = &rest[at..];
            let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
            names.insert(tail[..end].to_string());
            rest = &tail[end..];
        }
    }
    assert!(names.len() > 10, "the ops files name too few metrics: {names:?}");
    names
}

pub fn assert_ops_metrics_exported(scrape: &str) {
    let exported = exported_names(scrape);
    let missing: Vec<_> = ops_metric_names().into_iter().filter(|n| !exported.contains(n)).collect();
    assert!(missing.is_empty(), "the dashboard or alerts use metrics /metrics does not export: {missing:?}\n{scrape}");
}
