//! Every retry's pacing, in one place: each loop that tries again (a
//! Redis write, a cluster command following a fail-over, reopening the
//! change streams, restarting a failed watcher, a rebuild run again) takes
//! its attempts and pauses from one of the policies below, through
//! `backon`'s exponential backoff.
//!
//! What a loop does between attempts stays with the loop, since it is
//! what differs: a fenced write raises its epoch after a failure whose
//! outcome is unknown, a cluster part repairs an epoch copy, the router
//! reads the slot map again. Only the counting and the pauses are shared.

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder, Retryable};
use std::future::Future;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::time::Duration;

/// How often and how patiently to try: exponential pauses (doubling from
/// `first` up to `max`), a bounded or unbounded number of attempts. No
/// jitter: one leader writes, so there is no herd to spread out, and
/// fixed pauses keep the fault tests' timings readable.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    first: Duration,
    max: Duration,
    /// Attempts in all, the first included; `None`: until it works or
    /// the loop is stopped.
    attempts: Option<u32>,
    /// The most time spent pausing, whatever the attempts.
    within: Option<Duration>,
}

impl RetryPolicy {
    /// Redis writes, reads and scans: 6 attempts, 100 ms doubling to 5 s
    /// (about 3 s in all, enough for a restarted Redis to load).
    pub const REDIS: RetryPolicy = RetryPolicy::new(Duration::from_millis(100), Duration::from_secs(5), Some(6));
    /// The same behind Sentinel, whose fail-over refuses writes for
    /// seconds (the old master demoted, the new one waiting for a replica
    /// under `min-replicas-to-write`): 12 attempts, about 30 s in all.
    pub const REDIS_SENTINEL: RetryPolicy = RetryPolicy::REDIS.with_attempts(12);
    /// A request behind Sentinel following a fail-over: every 200 ms
    /// for up to 30 s.
    pub const FOLLOW_SENTINEL: RetryPolicy =
        RetryPolicy::new(Duration::from_millis(200), Duration::from_millis(200), None).within(Duration::from_secs(30));
    /// One cluster command following redirections and fail-overs: 16
    /// attempts, 20 ms doubling to 500 ms (about 6 s in all), long enough
    /// for a restarted master to listen again or a slot to settle.
    pub const CLUSTER_COMMAND: RetryPolicy =
        RetryPolicy::new(Duration::from_millis(20), Duration::from_millis(500), Some(16));
    /// A whole rebuild run again after a failure that may pass (a server
    /// restarted mid-run): 1 s doubling to 5 s; the caller sets the
    /// attempts.
    pub const REBUILD: RetryPolicy = RetryPolicy::new(Duration::from_secs(1), Duration::from_secs(5), Some(3));
    /// Reopening the change streams from the saved tokens: forever, 200 ms
    /// doubling to 10 s.
    pub const REOPEN_STREAMS: RetryPolicy = RetryPolicy::new(Duration::from_millis(200), Duration::from_secs(10), None);
    /// Restarting a failed watcher under `serve`: forever, 500 ms doubling
    /// to 30 s.
    pub const RESTART_WATCHER: RetryPolicy =
        RetryPolicy::new(Duration::from_millis(500), Duration::from_secs(30), None);

    pub const fn new(first: Duration, max: Duration, attempts: Option<u32>) -> RetryPolicy {
        RetryPolicy { first, max, attempts, within: None }
    }

    /// The same, giving up once its pauses add up to `total`.
    pub const fn within(self, total: Duration) -> RetryPolicy {
        RetryPolicy { within: Some(total), ..self }
    }

    /// The same pauses with `attempts` attempts in all.
    pub const fn with_attempts(self, attempts: u32) -> RetryPolicy {
        RetryPolicy { attempts: Some(attempts), ..self }
    }

    /// Attempts in all, the first included (`None`: no bound).
    pub fn attempts(&self) -> Option<u32> {
        self.attempts
    }

    fn builder(&self) -> ExponentialBuilder {
        let builder = (ExponentialBuilder::new().with_factor(2.0))
            .with_min_delay(self.first)
            .with_max_delay(self.max)
            .with_total_delay(self.within);
        match self.attempts {
            // backon counts the retries, not the first attempt.
            Some(n) => builder.with_max_times(n.saturating_sub(1) as usize),
            None => builder.without_max_times(),
        }
    }

    /// A fresh count for one operation's attempts.
    pub fn start(&self) -> Attempts {
        Attempts { policy: *self, pauses: self.builder().build(), made: 1 }
    }

    /// Runs `op` until it succeeds, fails for good (an error
    /// `crate::sink::is_retriable` refuses), or runs out of attempts; the
    /// error comes back with the number of attempts made.
    pub async fn run<T, F, Fut>(&self, mut op: F) -> Result<T, (u32, redis::RedisError)>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        // Atomic only so that the future stays `Send`; one task counts.
        let made = AtomicU32::new(0);
        let attempt = || {
            made.fetch_add(1, Relaxed);
            op()
        };
        attempt
            .retry(self.builder())
            // Sleeps with tokio's timer (backon's `tokio-sleep` feature).
            .when(crate::sink::is_retriable)
            .notify(|err, delay| {
                tracing::warn!(attempt = made.load(Relaxed), delay_ms = delay.as_millis() as u64, error = %err,
                    "redis request failed, retrying");
            })
            .await
            .map_err(|err| (made.load(Relaxed), err))
    }
}

/// One operation's attempts under a policy: the loop asks for the pause
/// before each next attempt, and stops when there is none.
#[derive(Debug)]
pub struct Attempts {
    policy: RetryPolicy,
    pauses: ExponentialBackoff,
    made: u32,
}

impl Attempts {
    /// Counts one more attempt and gives the pause before it; `None`
    /// when the policy's attempts are spent (the count stays).
    pub fn next_pause(&mut self) -> Option<Duration> {
        let pause = self.pauses.next()?;
        self.made += 1;
        Some(pause)
    }

    /// Counts one more attempt made at once (a refusal the loop knows
    /// how to answer without waiting); `false` when none is left.
    pub fn again_now(&mut self) -> bool {
        self.next_pause().is_some()
    }

    /// The pause before the next attempt of a loop that never gives up;
    /// once a bounded policy is spent, its longest pause.
    pub fn pause(&mut self) -> Duration {
        self.next_pause().unwrap_or(self.policy.max)
    }

    /// Starts the count over when the attempt that just failed had
    /// worked for `ran`, longer than the policy's longest pause: a
    /// failure after a long healthy run starts a new series, so it waits
    /// the first pause, not the longest.
    pub fn start_over_after(&mut self, ran: Duration) {
        if ran > self.policy.max {
            *self = self.policy.start();
        }
    }

    /// Attempts made so far, the first included.
    pub fn made(&self) -> u32 {
        self.made
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The pauses to the nearest millisecond (`backon` doubles in `f32`,
    /// so 40 ms comes out a few nanoseconds off).
    fn pauses(policy: RetryPolicy, n: usize) -> Vec<Duration> {
        let mut attempts = policy.start();
        std::iter::from_fn(|| attempts.next_pause().map(ms_of)).take(n).collect()
    }

    fn ms_of(d: Duration) -> Duration {
        Duration::from_millis((d.as_secs_f64() * 1000.0).round() as u64)
    }

    #[test]
    fn pauses_double_up_to_the_cap_and_stop_with_the_attempts() {
        let ms = Duration::from_millis;
        assert_eq!(pauses(RetryPolicy::REDIS, 99), [ms(100), ms(200), ms(400), ms(800), ms(1600)]);
        let sentinel = pauses(RetryPolicy::REDIS_SENTINEL, 99);
        assert_eq!(sentinel.len(), 11);
        assert_eq!(sentinel.last(), Some(&Duration::from_secs(5)));
        let cluster = pauses(RetryPolicy::CLUSTER_COMMAND, 99);
        assert_eq!(cluster.len(), 15);
        assert_eq!(cluster[..6], [ms(20), ms(40), ms(80), ms(160), ms(320), ms(500)]);
        // Unbounded policies go on at their cap.
        let reopen = pauses(RetryPolicy::REOPEN_STREAMS, 1000);
        assert_eq!(reopen.len(), 1000);
        assert_eq!(reopen[999], Duration::from_secs(10));
        assert_eq!(RetryPolicy::REOPEN_STREAMS.attempts(), None);
        // Bounded by time: 150 pauses of 200 ms.
        let follow = pauses(RetryPolicy::FOLLOW_SENTINEL, 1000);
        assert_eq!((follow.len(), follow.iter().sum::<Duration>()), (150, Duration::from_secs(30)));
    }

    #[test]
    fn attempts_are_counted_with_the_first() {
        let mut attempts = RetryPolicy::REDIS.with_attempts(3).start();
        assert_eq!(attempts.made(), 1);
        assert!(attempts.again_now());
        assert!(attempts.next_pause().is_some());
        assert_eq!(attempts.made(), 3);
        assert!(!attempts.again_now());
        assert_eq!(attempts.made(), 3);
        let mut once = RetryPolicy::REDIS.with_attempts(1).start();
        assert_eq!(once.next_pause(), None);
        assert_eq!(once.pause(), Duration::from_secs(5));
    }

    #[test]
    fn a_long_healthy_run_starts_the_pauses_over() {
        let mut attempts = RetryPolicy::RESTART_WATCHER.start();
        let ms = Duration::from_millis;
        let mut pause = || ms_of(attempts.pause());
        assert_eq!([pause(), pause(), pause()], [ms(500), ms(1000), ms(2000)]);
        // Failing again soon after: the series goes on.
        attempts.start_over_after(Duration::from_secs(5));
        assert_eq!(ms_of(attempts.pause()), ms(4000));
        // After a run longer than the longest pause: a new series.
        attempts.start_over_after(Duration::from_secs(31));
        assert_eq!((ms_of(attempts.pause()), attempts.made()), (ms(500), 2));
    }

    #[tokio::test(start_paused = true)]
    async fn retries_only_retriable_errors() {
        let p = RetryPolicy::REDIS;
        let mut calls = 0;
        let started = tokio::time::Instant::now();
        let result: Result<(), _> = p
            .run(|| {
                calls += 1;
                async { Err(redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset))) }
            })
            .await;
        assert_eq!(result.unwrap_err().0, 6);
        assert_eq!(calls, 6);
        // Paused time: the pauses are the policy's (the timer rounds each
        // up to its next millisecond).
        let slept = started.elapsed().as_millis();
        assert!((3100..3110).contains(&slept), "{slept} ms");

        let mut calls = 0;
        let result: Result<(), _> = p
            .run(|| {
                calls += 1;
                async { Err(redis::RedisError::from((redis::ErrorKind::Client, "bad"))) }
            })
            .await;
        assert_eq!(result.unwrap_err().0, 1);
        assert_eq!(calls, 1);

        let mut calls = 0;
        let result = p
            .run(|| {
                calls += 1;
                let fail = calls < 3;
                async move {
                    match fail {
                        true => Err(redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::BrokenPipe))),
                        false => Ok(calls),
                    }
                }
            })
            .await;
        assert_eq!(result.unwrap(), 3);
    }
}
