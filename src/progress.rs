//! Progress for long runs: bars on a terminal, periodic log lines
//! otherwise, nothing in tests.

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Clone)]
pub enum Progress {
    Bars(MultiProgress),
    Logs,
    Hidden,
}

impl Progress {
    /// Bars when stderr is a terminal, log lines otherwise.
    pub fn auto() -> Progress {
        if std::io::stderr().is_terminal() {
            Progress::Bars(MultiProgress::with_draw_target(ProgressDrawTarget::stderr()))
        } else {
            Progress::Logs
        }
    }

    /// Starts a stage with a known (or estimated, 0 = unknown) total.
    pub fn stage(&self, name: &'static str, total: u64) -> Stage {
        let bar = match self {
            Progress::Bars(multi) => {
                let bar = multi.add(if total > 0 { ProgressBar::new(total) } else { ProgressBar::no_length() });
                let style = ProgressStyle::with_template("{prefix:>16} [{bar:30}] {pos}/{len} {per_sec} {elapsed}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> ");
                bar.set_style(style);
                bar.set_prefix(name);
                bar.enable_steady_tick(Duration::from_millis(200));
                Some(bar)
            }
            _ => None,
        };
        Stage {
            name,
            total: AtomicU64::new(total),
            current: AtomicU64::new(0),
            bar,
            logs: matches!(self, Progress::Logs),
            last_log: Mutex::new(Instant::now()),
        }
    }
}

pub struct Stage {
    name: &'static str,
    total: AtomicU64,
    current: AtomicU64,
    bar: Option<ProgressBar>,
    logs: bool,
    last_log: Mutex<Instant>,
}

impl Stage {
    pub fn inc(&self, n: u64) {
        let current = self.current.fetch_add(n, Ordering::Relaxed) + n;
        if let Some(bar) = &self.bar {
            bar.inc(n);
        } else if self.logs {
            let mut last = self.last_log.lock().unwrap_or_else(|e| e.into_inner());
            if last.elapsed() >= Duration::from_secs(2) {
                *last = Instant::now();
                tracing::info!(stage = self.name, current, total = self.total.load(Ordering::Relaxed), "progress");
            }
        }
    }

    pub fn set_total(&self, total: u64) {
        self.total.store(total, Ordering::Relaxed);
        if let Some(bar) = &self.bar {
            bar.set_length(total);
        }
    }

    pub fn current(&self) -> u64 {
        self.current.load(Ordering::Relaxed)
    }

    pub fn finish(&self) {
        let current = self.current();
        if let Some(bar) = &self.bar {
            bar.set_length(current);
            bar.finish();
        } else if self.logs {
            tracing::info!(stage = self.name, current, "stage done");
        }
    }
}
