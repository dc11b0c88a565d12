//! Retry with exponential backoff, for retriable Redis errors only.

use std::future::Future;
use std::time::Duration;

#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    pub attempts: u32,
    pub first_delay: Duration,
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy { attempts: 6, first_delay: Duration::from_millis(100), max_delay: Duration::from_secs(5) }
    }
}

impl RetryPolicy {
    /// The pause before attempt `n + 1` (n counts from 1).
    pub fn delay(&self, n: u32) -> Duration {
        let factor = 2u32.saturating_pow(n.saturating_sub(1));
        self.first_delay.saturating_mul(factor).min(self.max_delay)
    }

    /// Runs `op` until it succeeds, fails for good, or runs out of
    /// attempts; the error comes back with the number of attempts made.
    pub async fn run<T, F, Fut>(&self, mut op: F) -> Result<T, (u32, redis::RedisError)>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let mut attempt = 1;
        loop {
            match op().await {
                Ok(value) => return Ok(value),
                Err(err) if attempt < self.attempts && crate::sink::is_retriable(&err) => {
                    let delay = self.delay(attempt);
                    tracing::warn!(attempt, delay_ms = delay.as_millis() as u64, error = %err, "redis write failed, retrying");
                    tokio::time::sleep(delay).await;
                    attempt += 1;
                }
                Err(err) => return Err((attempt, err)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap() {
        let p = RetryPolicy::default();
        assert_eq!(p.delay(1), Duration::from_millis(100));
        assert_eq!(p.delay(2), Duration::from_millis(200));
        assert_eq!(p.delay(4), Duration::from_millis(800));
        assert_eq!(p.delay(30), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn retries_only_retriable_errors() {
        let p = RetryPolicy::default();
        let mut calls = 0;
        let result: Result<(), _> = p
            .run(|| {
                calls += 1;
                async { Err(redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset))) }
            })
            .await;
        assert_eq!(result.unwrap_err().0, 6);
        assert_eq!(calls, 6);

        let mut calls = 0;
        let result: Result<(), _> = p
            .run(|| {
                calls += 1;
                async { Err(redis::RedisError::from((redis::ErrorKind::Client, "bad"))) }
            })
            .await;
        assert_eq!(result.unwrap_err().0, 1);
        assert_eq!(calls, 1);
    }
}
