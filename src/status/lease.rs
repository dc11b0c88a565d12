//! The lease lock at `lock:rebuild:full`: SET NX PX with a random token,
//! renewed while the job runs, released with compare-and-delete. An
//! instance that fails to renew marks the lease lost, and the writer stops
//! before its next batch.

use redis::aio::ConnectionManager;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("another instance holds the rebuild lock {key} (token {holder}); wait for its run to finish")]
    Held { key: String, holder: String },
    #[error("cannot take the rebuild lock: {0}")]
    Redis(#[from] redis::RedisError),
}

/// Extends the lease if it is ours; takes it back if it vanished (a Redis
/// restart without persistence) and nobody else took it; else fails.
const RENEW: &str = "local v = redis.call('GET', KEYS[1]) \
    if v == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end \
    if not v then redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end \
    return 0";
const RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end";

/// A held lease; renewed in the background until released or dropped.
pub struct Lease {
    key: String,
    token: String,
    conn: ConnectionManager,
    held: Arc<AtomicBool>,
    renewer: tokio::task::JoinHandle<()>,
}

impl Lease {
    /// Takes the lease or says who holds it.
    pub async fn acquire(conn: ConnectionManager, key: String, ttl: Duration) -> Result<Lease, LeaseError> {
        let token = format!("{:016x}{:016x}", rand::random::<u64>(), rand::random::<u64>());
        let mut c = conn.clone();
        let ok: Option<String> = redis::cmd("SET")
            .arg(&key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(ttl.as_millis() as u64)
            .query_async(&mut c)
            .await?;
        if ok.is_none() {
            let holder: Option<String> = redis::cmd("GET").arg(&key).query_async(&mut c).await?;
            return Err(LeaseError::Held { key, holder: holder.unwrap_or_default() });
        }
        let held = Arc::new(AtomicBool::new(true));
        let renewer = {
            let (mut c, key, token, held) = (conn.clone(), key.clone(), token.clone(), held.clone());
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(ttl / 3).await;
                    let renewed: redis::RedisResult<i64> = redis::Script::new(RENEW)
                        .key(&key)
                        .arg(&token)
                        .arg(ttl.as_millis() as u64)
                        .invoke_async(&mut c)
                        .await;
                    match renewed {
                        Ok(1) => {}
                        Ok(_) => {
                            tracing::error!(key = %key, "rebuild lease lost to another instance; stopping writes");
                            held.store(false, Ordering::SeqCst);
                            return;
                        }
                        // A failed renewal is not yet a lost lease; the next
                        // attempt may succeed before it expires.
                        Err(err) => tracing::warn!(key = %key, error = %err, "could not renew the rebuild lease"),
                    }
                }
            })
        };
        Ok(Lease { key, token, conn, held, renewer })
    }

    /// A flag that turns false when the lease is lost.
    pub fn held_flag(&self) -> Arc<AtomicBool> {
        self.held.clone()
    }

    /// Releases the lease if it is still ours.
    pub async fn release(self) {
        self.renewer.abort();
        let mut c = self.conn.clone();
        let released: redis::RedisResult<i64> =
            redis::Script::new(RELEASE).key(&self.key).arg(&self.token).invoke_async(&mut c).await;
        if let Err(err) = released {
            tracing::warn!(key = %self.key, error = %err, "could not release the rebuild lease; it expires by itself");
        }
    }
}
