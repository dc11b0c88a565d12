//! The writer lease and its fencing epoch.
//!
//! One instance at a time may write the cache: it holds the lease key
//! (`lock:rebuild:full`, SET NX PX with a token naming the holder) and,
//! on taking it, raises the epoch key (`lock:epoch`) that only grows.
//! Every write the holder sends is checked by Redis itself against that
//! epoch (see [`crate::sink::Sink::fenced`]), so a holder that stalled past its
//! lease cannot land a batch after another instance took over, even one
//! it sent before the stall.
//!
//! Renewal extends the lease only while the key still holds this
//! instance's token; it never takes back a lease that expired. A holder
//! that could not renew for a whole TTL counts itself out by its own
//! clock. Dropping a [`Lease`] stops its renewer and releases it.

use crate::keys::status::StatusKeys;
use crate::sink::RedisConn;
use crate::sink::script::Script;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error(
        "another instance holds the writer lease {key}: {holder}. It is a `serve` or `watch` leader, or a rebuild \
         in progress, and it keeps the cache current. Wait for it to finish, or stop that instance (its lease \
         expires within one lease TTL) and run this again"
    )]
    Held { key: String, holder: String },
    #[error("cannot take the writer lease: {0}")]
    Redis(#[from] redis::RedisError),
}

/// Takes the lease if free and raises the epoch to `max(epoch + 1, now
/// in ms)`: the clock part keeps it growing even after a Redis that kept
/// no data restarted and forgot the old value. A lease that already holds
/// this token was taken by an earlier attempt whose reply was lost (a
/// router or a caller sent it again): it is this holder's, with the epoch
/// that attempt set, which no one else can have raised since (only a
/// holder raises it), so it answers that epoch instead of waiting out its
/// own lease.
static ACQUIRE: Script = Script::new(
    "\
local held = redis.call('GET', KEYS[1])
if held == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(redis.call('GET', KEYS[2]) or '0')
end
if held then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
local e = tonumber(redis.call('GET', KEYS[2]) or '0') + 1
local t = tonumber(ARGV[3])
if t > e then e = t end
redis.call('SET', KEYS[2], string.format('%d', e))
return e",
);
/// Extends the lease only while it is ours.
static RENEW: Script = Script::new(
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end return 0",
);
static RELEASE: Script =
    Script::new("if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) else return 0 end");

/// What the holder knows of its lease, shared with its fences.
#[derive(Debug)]
struct LeaseState {
    held: AtomicBool,
    origin: Instant,
    /// When (ms after `origin`) the last successful renewal was sent.
    renewed_at_ms: AtomicU64,
    ttl: Duration,
    /// Cancelled once the lease is lost.
    lost: tokio_util::sync::CancellationToken,
}

impl LeaseState {
    fn since_origin_ms(&self) -> u64 {
        self.origin.elapsed().as_millis() as u64
    }

    fn valid(&self) -> bool {
        self.held.load(Ordering::SeqCst)
            && self.since_origin_ms().saturating_sub(self.renewed_at_ms.load(Ordering::SeqCst))
                < self.ttl.as_millis() as u64
    }

    fn mark_lost(&self) {
        self.held.store(false, Ordering::SeqCst);
        self.lost.cancel();
    }
}

/// What a writer needs to have Redis check its writes: the epoch key and
/// the epoch it writes under: the one it took the lease with, raised by
/// the holder itself after a write whose fate it cannot know (see
/// [`Fence::raise_past`]). Cheap to clone; clones share the epoch.
#[derive(Debug, Clone)]
pub struct Fence {
    pub(in crate::sink) key: String,
    epoch: Arc<AtomicU64>,
    /// Held while the holder raises its own epoch, so that writes failing
    /// together raise it once.
    raising: Arc<tokio::sync::Mutex<()>>,
    state: Arc<LeaseState>,
}

/// Raises the epoch from `ARGV[1]` to `ARGV[2]` only while it still holds
/// `ARGV[1]`: the caller's own epoch, which only a take-over moves.
static RAISE_OWN: Script = Script::new(
    "\
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2])
  return 1
end
return 0",
);

impl Fence {
    /// The epoch writes go under now.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Moves this holder's own epoch past `seen` (the epoch a write was
    /// sent under, whose reply never came): that write may still be on
    /// its way and land after newer ones, and fencing orders epochs, not
    /// the writes of one epoch. Once the epoch key holds a new epoch, a
    /// late copy is refused as any stale writer's is. Writes that fail
    /// together raise it once: a caller whose `seen` is already behind
    /// returns at once. Returns the new epoch; `Ok(None)` when the epoch
    /// key no longer holds `seen`, so another instance took over (the
    /// lease is then marked lost).
    pub(in crate::sink) async fn raise_past(&self, conn: &mut RedisConn, seen: u64) -> redis::RedisResult<Option<u64>> {
        let _one_at_a_time = self.raising.lock().await;
        let current = self.epoch();
        if current > seen {
            return Ok(Some(current));
        }
        let next = current + 1;
        let raised: i64 = eval(conn, &RAISE_OWN, &[&self.key], &[current.to_string(), next.to_string()]).await?;
        if raised != 1 {
            self.mark_lost();
            return Ok(None);
        }
        tracing::warn!(
            from = current,
            to = next,
            "raised this writer's epoch: writes still on their way under the old one are refused"
        );
        self.epoch.store(next, Ordering::SeqCst);
        Ok(Some(next))
    }

    /// Whether the lease still holds by this instance's own knowledge: not
    /// lost, and renewed within the last TTL.
    pub fn is_valid(&self) -> bool {
        self.state.valid()
    }

    /// `MULTI`, `unit` as one node runs it, `EXEC`, then `WATCH` and
    /// `GET` of the epoch key, which re-arm the connection for its next
    /// transaction (see `Sink::try_fenced`). The replies kept are `EXEC`'s
    /// and the epoch read back.
    pub(in crate::sink) fn frame(&self, unit: crate::sink::Unit) -> redis::Pipeline {
        let mut full = redis::pipe();
        full.cmd("MULTI").ignore();
        unit.append_to(&mut full);
        full.cmd("EXEC").cmd("WATCH").arg(&self.key).ignore().cmd("GET").arg(&self.key);
        full
    }

    /// Records that Redis refused a write under this epoch.
    pub(in crate::sink) fn mark_lost(&self) {
        self.state.mark_lost();
    }

    /// Resolves once the lease is lost (taken over, or not renewed for a
    /// whole TTL).
    pub async fn lost(&self) {
        self.state.lost.cancelled().await;
    }
}

/// A held lease, renewed in the background until released or dropped.
pub struct Lease {
    key: String,
    token: String,
    conn: RedisConn,
    fence: Fence,
    renewer: tokio::task::JoinHandle<()>,
    released: bool,
}

/// A holder token that says who holds the lease: host, pid, and a random
/// part that tells two holders in one process apart.
fn holder_token() -> String {
    let host = hostname();
    format!("{host}/pid-{}/{:012x}", std::process::id(), rand::random::<u64>() & 0xffff_ffff_ffff)
}

fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its whole length and gethostname
    // writes at most that many bytes.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let name = if rc == 0 {
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        String::from_utf8_lossy(&buf[..end]).into_owned()
    } else {
        String::new()
    };
    if name.is_empty() { "unknown-host".into() } else { name }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

impl Lease {
    /// Takes the lease, or says who holds it.
    pub async fn acquire(conn: RedisConn, keys: &StatusKeys, ttl: Duration) -> Result<Lease, LeaseError> {
        Lease::acquire_as(conn, keys, ttl, holder_token()).await
    }

    /// Takes the lease as the holder `token`. Sent again under the same
    /// token after a lost reply, it finds the lease its own and answers
    /// the epoch the first attempt set (see [`ACQUIRE`]).
    pub async fn acquire_as(
        conn: RedisConn,
        keys: &StatusKeys,
        ttl: Duration,
        token: String,
    ) -> Result<Lease, LeaseError> {
        let key = keys.rebuild_lock();
        let mut c = conn.clone();
        let args = [token.clone(), ttl.as_millis().to_string(), unix_ms().to_string()];
        // Once the script is sent it may take the lease whatever becomes of
        // this future: dropped while it waits (a cancelled job) or failed
        // on a lost reply, the guard releases what it may have taken.
        let guard = Unclaimed { conn: Some(conn.clone()), key: key.clone(), token: token.clone() };
        let epoch: u64 = eval(&mut c, &ACQUIRE, &[&key, &keys.epoch()], &args).await?;
        guard.disarm();
        if epoch == 0 {
            let holder: Option<String> = redis::cmd("GET").arg(&key).query_async(&mut c).await?;
            return Err(LeaseError::Held { key, holder: holder.unwrap_or_else(|| "(just released)".into()) });
        }
        let lost = tokio_util::sync::CancellationToken::new();
        let state = Arc::new(LeaseState {
            held: AtomicBool::new(true),
            origin: Instant::now(),
            renewed_at_ms: AtomicU64::new(0),
            ttl,
            lost,
        });
        let renewer = tokio::spawn(renew(conn.clone(), key.clone(), token.clone(), state.clone()));
        tracing::info!(key = %key, holder = %token, epoch, "writer lease taken");
        let fence = Fence {
            key: keys.epoch(),
            epoch: Arc::new(AtomicU64::new(epoch)),
            raising: Arc::new(tokio::sync::Mutex::new(())),
            state,
        };
        Ok(Lease { key, token, conn, fence, renewer, released: false })
    }

    /// Waits until the lease can be taken (polling every third of its
    /// TTL), logging who holds it meanwhile.
    pub async fn acquire_waiting(conn: RedisConn, keys: &StatusKeys, ttl: Duration) -> Result<Lease, LeaseError> {
        let mut last_holder = String::new();
        // One token for every attempt: an attempt whose reply was lost may
        // have taken the lease. Its guard releases it; should that release
        // be lost too, the next attempt finds the lease its own.
        let token = holder_token();
        loop {
            match Lease::acquire_as(conn.clone(), keys, ttl, token.clone()).await {
                Ok(lease) => return Ok(lease),
                Err(LeaseError::Held { holder, .. }) => {
                    if holder != last_holder {
                        tracing::info!(leader = %holder, "following: another instance is the leader");
                        last_holder = holder;
                    }
                }
                Err(LeaseError::Redis(err)) if crate::sink::is_retriable(&err) => {
                    tracing::warn!(error = %err, "cannot reach Redis to take the writer lease; retrying");
                }
                Err(err) => return Err(err),
            }
            tokio::time::sleep(ttl / 3).await;
        }
    }

    pub fn fence(&self) -> Fence {
        self.fence.clone()
    }

    pub fn holder(&self) -> &str {
        &self.token
    }

    /// Releases the lease if it is still ours.
    pub async fn release(mut self) {
        self.released = true;
        self.renewer.abort();
        release(self.conn.clone(), self.key.clone(), self.token.clone()).await;
    }
}

impl Drop for Lease {
    /// A lease dropped without `release` (a cancelled job, an error path,
    /// a panic) still stops renewing and is released, so no lock leaks.
    fn drop(&mut self) {
        self.renewer.abort();
        if self.released {
            return;
        }
        self.fence.state.held.store(false, Ordering::SeqCst);
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(release(self.conn.clone(), self.key.clone(), self.token.clone()));
        }
    }
}

/// A lease acquisition in flight: dropped before it is disarmed, it
/// releases the lease its script may have taken under its token (the
/// release deletes the lock only while that token holds it), so a
/// cancelled acquisition leaks no lock until its TTL.
struct Unclaimed {
    conn: Option<RedisConn>,
    key: String,
    token: String,
}

impl Unclaimed {
    /// The script answered: the lease is claimed by a [`Lease`] or held by
    /// someone else.
    fn disarm(mut self) {
        self.conn = None;
    }
}

impl Drop for Unclaimed {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else { return };
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            tracing::debug!(key = %self.key, "lease acquisition abandoned; releasing what it may have taken");
            handle.spawn(release(conn, std::mem::take(&mut self.key), std::mem::take(&mut self.token)));
        }
    }
}

/// Runs `script` by hash, or by text where that server does not hold it
/// yet (new, restarted or just promoted); both go to the master of the
/// script's keys (see [`crate::sink::script`]).
async fn eval<T: redis::FromRedisValue>(
    conn: &mut RedisConn,
    script: &'static Script,
    keys: &[&str],
    args: &[String],
) -> redis::RedisResult<T> {
    script.run(&script.with(keys, args), conn).await
}

async fn release(mut conn: RedisConn, key: String, token: String) {
    let released: redis::RedisResult<i64> = eval(&mut conn, &RELEASE, &[&key], std::slice::from_ref(&token)).await;
    match released {
        Ok(_) => tracing::debug!(key = %key, "writer lease released"),
        Err(err) => {
            tracing::warn!(key = %key, error = %err, "could not release the writer lease; it expires by itself")
        }
    }
}

/// Renews every third of the TTL. A renewal that fails or does not answer
/// within that third is retried; after a whole TTL without one, the
/// holder counts the lease as lost.
async fn renew(mut conn: RedisConn, key: String, token: String, state: Arc<LeaseState>) {
    let every = state.ttl / 3;
    loop {
        tokio::time::sleep(every).await;
        let sent = state.since_origin_ms();
        let args = [token.clone(), state.ttl.as_millis().to_string()];
        let renewed: Result<redis::RedisResult<i64>, _> =
            tokio::time::timeout(every, eval(&mut conn, &RENEW, &[&key], &args)).await;
        match renewed {
            Ok(Ok(1)) => state.renewed_at_ms.store(sent, Ordering::SeqCst),
            Ok(Ok(_)) => {
                tracing::error!(key = %key, "writer lease taken over by another instance; stopping writes");
                state.mark_lost();
                return;
            }
            Ok(Err(err)) => tracing::warn!(key = %key, error = %err, "could not renew the writer lease"),
            Err(_) => tracing::warn!(key = %key, "renewing the writer lease got no answer in time"),
        }
        if !state.valid() {
            tracing::error!(key = %key, ttl_ms = state.ttl.as_millis() as u64, "writer lease not renewed for a whole TTL; stopping writes");
            state.mark_lost();
            return;
        }
    }
}
