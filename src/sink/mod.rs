//! The Redis edge: pipelined, atomic writes with tier TTLs and jitter,
//! retries with backoff, and the sweep of keys a rebuild did not produce.

mod inspect;
mod pipeline;
mod retry;
mod sweep;
mod writer;

pub use inspect::{Inspected, Observed};
pub use pipeline::{build_change_pipeline, build_pipeline, ttl_with_jitter};
pub use retry::RetryPolicy;
pub use sweep::{Existing, Produced, SweepOutcome, digest};
pub use writer::{WriteOutcome, run_writer};

use crate::config::{Config, TierSeconds, redact_url};
use crate::plan::Op;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error(
        "cannot connect to Redis at {url}: {source} (check REDIS_URL / REDIS_PASSWORD and that the server is running)"
    )]
    Connect {
        url: String,
        #[source]
        source: redis::RedisError,
    },
    #[error("writing to Redis failed after {attempts} attempt(s): {source}")]
    Write {
        attempts: u32,
        #[source]
        source: redis::RedisError,
    },
    #[error("the rebuild lease was lost to another instance; stopped before the next batch")]
    LeaseLost,
    #[error("stopped before the next batch: shutdown")]
    Stopped,
    #[error("scanning Redis keys failed after {attempts} attempt(s): {source}")]
    Scan {
        attempts: u32,
        #[source]
        source: redis::RedisError,
    },
}

impl SinkError {
    pub fn is_retriable(&self) -> bool {
        match self {
            SinkError::Connect { source, .. } | SinkError::Write { source, .. } | SinkError::Scan { source, .. } => {
                is_retriable(source)
            }
            SinkError::LeaseLost | SinkError::Stopped => false,
        }
    }
}

/// Whether a Redis error may go away by itself: lost connections,
/// timeouts, a server still loading its data set.
pub fn is_retriable(err: &redis::RedisError) -> bool {
    err.is_io_error()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_timeout()
        || matches!(err.code(), Some("LOADING" | "BUSY" | "TRYAGAIN" | "MASTERDOWN" | "READONLY"))
}

/// A connected Redis, with the write settings of one run.
#[derive(Clone)]
pub struct Sink {
    conn: ConnectionManager,
    ttl: TierSeconds,
    jitter: f64,
    retry: RetryPolicy,
}

/// Builds a client from the URL plus `REDIS_PASSWORD` / `REDIS_DB`.
pub fn client(cfg: &Config) -> Result<redis::Client, SinkError> {
    use redis::IntoConnectionInfo;
    let connect_err = |source| SinkError::Connect { url: redact_url(&cfg.redis_url), source };
    let mut info = cfg.redis_url.as_str().into_connection_info().map_err(connect_err)?;
    let mut settings = info.redis_settings().clone();
    if let Some(password) = &cfg.redis_password {
        settings = settings.set_password(password);
    }
    if let Some(db) = cfg.redis_db {
        settings = settings.set_db(db);
    }
    info = info.set_redis_settings(settings);
    redis::Client::open(info).map_err(connect_err)
}

impl Sink {
    /// Connects and pings. Reconnects later happen inside the manager.
    pub async fn connect(cfg: &Config) -> Result<Sink, SinkError> {
        let connect_err = |source| SinkError::Connect { url: redact_url(&cfg.redis_url), source };
        let client = client(cfg)?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(5)))
            // Big index keys take a while to apply; a short timeout would
            // retry work that is still running.
            .set_response_timeout(Some(Duration::from_secs(60)))
            .set_number_of_retries(3)
            .set_max_delay(Duration::from_secs(2));
        let mut conn =
            tokio::time::timeout(Duration::from_secs(10), ConnectionManager::new_with_config(client, manager_config))
                .await
                .map_err(|_| {
                    connect_err(redis::RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "connection timed out",
                    )))
                })?
                .map_err(connect_err)?;
        redis::cmd("PING").query_async::<()>(&mut conn).await.map_err(connect_err)?;
        Ok(Sink { conn, ttl: cfg.ttl, jitter: cfg.ttl_jitter, retry: RetryPolicy::default() })
    }

    pub fn with_retry(mut self, retry: RetryPolicy) -> Sink {
        self.retry = retry;
        self
    }

    pub fn connection(&self) -> ConnectionManager {
        self.conn.clone()
    }

    /// Writes one batch atomically (MULTI/EXEC), retrying retriable
    /// failures. A batch replaces whole keys, so sending it again is safe.
    pub async fn write(&self, ops: &[Op]) -> Result<(), SinkError> {
        self.send(build_pipeline(ops, &self.ttl, self.jitter, rand::random::<f64>)).await
    }

    /// Sends one idempotent pipeline, retrying retriable failures.
    async fn send(&self, pipe: redis::Pipeline) -> Result<(), SinkError> {
        let conn = &self.conn;
        self.retry
            .run(|| {
                let pipe = &pipe;
                let mut conn = conn.clone();
                async move { pipe.query_async::<()>(&mut conn).await }
            })
            .await
            .map_err(|(attempts, source)| SinkError::Write { attempts, source })
    }

    /// Applies the watcher's changes in one transaction, retrying
    /// retriable failures (every change is idempotent).
    pub async fn apply_changes(&self, changes: &[crate::plan::Change]) -> Result<(), SinkError> {
        if changes.is_empty() {
            return Ok(());
        }
        self.send(build_change_pipeline(changes, &self.ttl, self.jitter, rand::random::<f64>)).await
    }

    /// The server's `run_id`, which changes when Redis restarts.
    pub async fn run_id(&self) -> Result<String, SinkError> {
        let conn = &self.conn;
        let info: String = self
            .retry
            .run(|| {
                let mut conn = conn.clone();
                async move { redis::cmd("INFO").arg("server").query_async(&mut conn).await }
            })
            .await
            .map_err(|(attempts, source)| SinkError::Scan { attempts, source })?;
        Ok(info.lines().find_map(|l| l.strip_prefix("run_id:")).unwrap_or_default().trim().to_string())
    }

    /// `used_memory` from INFO memory, in bytes.
    pub async fn used_memory(&self) -> Result<u64, SinkError> {
        let mut conn = self.conn.clone();
        let info: String = redis::cmd("INFO")
            .arg("memory")
            .query_async(&mut conn)
            .await
            .map_err(|source| SinkError::Scan { attempts: 1, source })?;
        Ok(info.lines().find_map(|l| l.strip_prefix("used_memory:")).and_then(|v| v.trim().parse().ok()).unwrap_or(0))
    }
}
