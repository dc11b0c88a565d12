//! `cachewright status`: rendering recent runs, one run with its
//! builders, and live progress (the reads are in [`crate::sink::jobs`]).

use crate::table;

pub use crate::sink::jobs::Fields;

fn get<'a>(f: &'a Fields, k: &str) -> &'a str {
    f.get(k).map(String::as_str).unwrap_or("")
}

pub fn render_runs(runs: &[Fields]) -> String {
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|f| {
            let duration = match (get(f, "started_at").parse::<u64>(), get(f, "finished_at").parse::<u64>()) {
                (Ok(s), Ok(e)) => format!("{}s", e.saturating_sub(s)),
                _ => "-".into(),
            };
            ["run_id", "trigger", "status", "started_at"]
                .iter()
                .map(|k| get(f, k).to_string())
                .chain([duration])
                .chain(["keys_written", "keys_deleted", "rejected", "last_error"].iter().map(|k| get(f, k).to_string()))
                .collect()
        })
        .collect();
    table::render(
        &["run", "trigger", "status", "started_at", "took", "written", "deleted", "rejected", "last error"],
        &rows,
        &[5, 6, 7],
    )
}

pub fn render_detail(job: &Fields, builders: &[(String, Fields)]) -> String {
    let mut keys: Vec<&String> = job.keys().collect();
    keys.sort();
    let rows: Vec<Vec<String>> = keys.iter().map(|k| vec![k.to_string(), job[*k].clone()]).collect();
    let mut out = table::render(&["field", "value"], &rows, &[]);
    out.push('\n');
    let rows: Vec<Vec<String>> = builders
        .iter()
        .map(|(name, f)| {
            [name.clone()]
                .into_iter()
                .chain(["status", "current", "total", "started_at", "updated_at"].iter().map(|k| get(f, k).to_string()))
                .collect()
        })
        .collect();
    out.push_str(&table::render(
        &["builder", "status", "current", "total", "started_at", "updated_at"],
        &rows,
        &[2, 3],
    ));
    out
}

/// A progress payload made safe for a terminal: control characters
/// (escape sequences included) are shown as `\u{…}` instead of acting.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if c.is_control() {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn escape_sequences_are_shown_not_run() {
        let shown = super::printable("{\"m\":\"\u{1b}]0;pwned\u{7}\u{1b}[2Jok\"}");
        assert!(!shown.chars().any(char::is_control), "{shown}");
        assert_eq!(shown, "{\"m\":\"\\u{1b}]0;pwned\\u{7}\\u{1b}[2Jok\"}");
        assert_eq!(super::printable("动作 plain"), "动作 plain");
    }
}
