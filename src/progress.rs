//! Progress for long runs: bars on a terminal, periodic log lines
//! otherwise, nothing in tests; optionally forwarded as events to the job
//! status reporter.

use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

#[derive(Clone)]
enum Display {
    Bars(MultiProgress),
    Logs,
    Hidden,
}

/// A stage's progress, as sent to the job status reporter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProgressEvent {
    pub builder: &'static str,
    pub current: u64,
    pub total: u64,
    pub done: bool,
}

#[derive(Clone)]
pub struct Progress {
    display: Display,
    events: Option<UnboundedSender<ProgressEvent>>,
}

/// How often a stage reports to the job status keys.
const EVENT_EVERY: Duration = Duration::from_millis(250);

impl Progress {
    /// Bars when stderr is a terminal, log lines otherwise.
    pub fn auto() -> Progress {
        let display = if std::io::stderr().is_terminal() {
            Display::Bars(MultiProgress::with_draw_target(ProgressDrawTarget::stderr()))
        } else {
            Display::Logs
        };
        Progress { display, events: None }
    }

    /// Shows nothing (tests, library use).
    pub fn hidden() -> Progress {
        Progress { display: Display::Hidden, events: None }
    }

    /// The same display, also sending stage events to `events`.
    pub fn with_events(&self, events: UnboundedSender<ProgressEvent>) -> Progress {
        Progress { display: self.display.clone(), events: Some(events) }
    }

    /// Starts a stage with a known (or estimated, 0 = unknown) total.
    pub fn stage(&self, name: &'static str, total: u64) -> Stage {
        let bar = match &self.display {
            Display::Bars(multi) => {
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
        let stage = Stage {
            name,
            total: AtomicU64::new(total),
            current: AtomicU64::new(0),
            bar,
            logs: matches!(self.display, Display::Logs),
            events: self.events.clone(),
            last_log: Mutex::new(Instant::now()),
            last_event: Mutex::new(Instant::now()),
        };
        stage.send(false);
        stage
    }
}

pub struct Stage {
    name: &'static str,
    total: AtomicU64,
    current: AtomicU64,
    bar: Option<ProgressBar>,
    logs: bool,
    events: Option<UnboundedSender<ProgressEvent>>,
    last_log: Mutex<Instant>,
    last_event: Mutex<Instant>,
}

impl Stage {
    fn send(&self, done: bool) {
        if let Some(events) = &self.events {
            let _ = events.send(ProgressEvent {
                builder: self.name,
                current: self.current(),
                total: self.total.load(Ordering::Relaxed),
                done,
            });
        }
    }

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
        if self.events.is_some() {
            let mut last = self.last_event.lock().unwrap_or_else(|e| e.into_inner());
            if last.elapsed() >= EVENT_EVERY {
                *last = Instant::now();
                drop(last);
                self.send(false);
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
        self.set_total(current);
        if let Some(bar) = &self.bar {
            bar.finish();
        } else if self.logs {
            tracing::info!(stage = self.name, current, "stage done");
        }
        self.send(true);
    }
}
