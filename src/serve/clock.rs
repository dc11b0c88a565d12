//! Where `serve`'s schedules read the time and wait for a fire: the
//! system clock in production, a clock the caller moves in tests, so a
//! schedule test fires exactly when it says instead of sleeping against a
//! wall-clock cron.

use chrono::{DateTime, Utc};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// A source of time for the schedules.
pub trait Clock: Send + Sync {
    fn now(&self) -> DateTime<Utc>;
    /// Resolves once [`Clock::now`] has reached `at`.
    fn sleep_until(&self, at: DateTime<Utc>) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
}

/// The system's clock; a wait is a tokio sleep for the time left.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }

    fn sleep_until(&self, at: DateTime<Utc>) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        let left = (at - Utc::now()).to_std().unwrap_or_default();
        Box::pin(tokio::time::sleep(left))
    }
}

/// The system clock, shared.
pub fn system() -> Arc<dyn Clock> {
    Arc::new(SystemClock)
}

/// A clock that only moves when told ([`ManualClock::set`]); whoever waits
/// on it wakes when it passes their time.
#[derive(Debug)]
pub struct ManualClock {
    now: tokio::sync::watch::Sender<DateTime<Utc>>,
}

impl ManualClock {
    pub fn new(start: DateTime<Utc>) -> ManualClock {
        ManualClock { now: tokio::sync::watch::Sender::new(start) }
    }

    /// Moves the clock to `at` (never back).
    pub fn set(&self, at: DateTime<Utc>) {
        self.now.send_if_modified(|now| {
            let later = at > *now;
            if later {
                *now = at;
            }
            later
        });
    }
}

impl Clock for ManualClock {
    fn now(&self) -> DateTime<Utc> {
        *self.now.borrow()
    }

    fn sleep_until(&self, at: DateTime<Utc>) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        let mut rx = self.now.subscribe();
        Box::pin(async move {
            let _ = rx.wait_for(|now| *now >= at).await;
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_manual_clock_wakes_its_sleepers_when_it_passes_their_time() {
        let start = DateTime::parse_from_rfc3339("2026-01-01T00:00:00Z").unwrap().to_utc();
        let clock = Arc::new(ManualClock::new(start));
        let at = start + chrono::Duration::seconds(2);
        let sleeper = {
            let clock = clock.clone();
            tokio::spawn(async move { clock.sleep_until(at).await })
        };
        clock.set(start + chrono::Duration::seconds(1));
        tokio::task::yield_now().await;
        assert!(!sleeper.is_finished(), "one second short");
        clock.set(at);
        sleeper.await.unwrap();
        clock.set(start);
        assert_eq!(clock.now(), at, "the clock never goes back");
    }
}
