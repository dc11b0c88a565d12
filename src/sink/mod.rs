//! The Redis edge: pipelined, atomic writes with tier TTLs and jitter,
//! retries with backoff, and the sweep of keys a rebuild did not produce.

// Rooms by role; the modules other parts of the crate name keep their
// paths (`sink::cluster`, `sink::lease`, ...).
mod check;
mod control;
mod fence;
pub mod script;
mod topology;
mod write;

use check::{compare, inspect};
use control::state;
pub use control::{jobs, reporter};
pub use fence::lease;
use topology::cluster_io::check_cluster;
pub use topology::{acl, cluster};
use topology::{cluster_io, conn, router, sentinel, single};
use write::{pipeline, sweep, unit, writer};

pub use crate::retry::RetryPolicy;
pub use acl::Access;
pub use compare::{Difference, difference};
pub use conn::{RedisConn, Topology};
pub use inspect::{Inspected, Observed};
pub use lease::{Fence, Lease, LeaseError};
pub use pipeline::{build_commands, build_pipeline, ttl_with_jitter};
pub use state::info_value;
pub use sweep::{Existing, Produced, Stale, digest};
pub use unit::Unit;
pub use writer::{WriteOutcome, per_video, run_writer};

use crate::config::{RedisSettings, TierSeconds, redact_url, scrub};
use crate::plan::Op;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("the Redis user lacks permissions this command needs, so nothing was written: {}; {grant}", denied.join("; "))]
    Permission { denied: Vec<String>, grant: String },
    #[error(
        "Redis at {node} may evict any key when memory runs short (maxmemory-policy {policy}), cachewright's lease, \
         epoch and pending records included, which would leave the cache silently wrong; set maxmemory-policy to \
         noeviction or a volatile-* policy (every cache key carries a TTL), or set CACHEWRIGHT_ALLOW_EVICTION=true \
         to accept the risk"
    )]
    Eviction { node: String, policy: String },
    #[error("{0}")]
    Cluster(String),
    #[error("cannot read {what} file {path}: {reason} (it must be a readable PEM file)")]
    TlsFile { what: String, path: String, reason: String },
    #[error(
        "cannot connect to Redis at {url}: {reason} (check REDIS_URL / REDIS_PASSWORD and that the server is running)"
    )]
    Connect {
        /// The URL, redacted.
        url: String,
        /// The driver's message, with the URL's secrets hidden. The error
        /// itself is kept for retry decisions but never printed: drivers
        /// may quote a malformed URL.
        reason: String,
        cause: redis::RedisError,
    },
    #[error("writing to Redis failed after {attempts} attempt(s): {source}")]
    Write {
        attempts: u32,
        #[source]
        source: redis::RedisError,
    },
    #[error(
        "this instance no longer holds the writer lease (taken over, or not renewed for a whole lease TTL); \
         it stopped writing"
    )]
    LeaseLost,
    #[error(
        "Redis refused the write: the fencing epoch moved past {epoch}, so another instance took over the writer \
         lease; this instance stopped writing"
    )]
    Fenced { epoch: u64 },
    #[error(
        "writing {key} in steps failed {attempts} time(s): its stage key vanished before it was renamed onto the \
         key (is Redis restarting or failing over?); the key still holds its previous value, whole"
    )]
    StageLost { key: String, attempts: u32 },
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
    /// Whether a guarded step found its key other than the writer knew
    /// it (`DRIFTED`: a stage cut short, a patched key expired, evicted
    /// or changed by someone else). The writer replaces such keys whole.
    pub fn is_drift(&self) -> bool {
        // By text too: the cluster path reports a slot script's error
        // inside its own.
        matches!(self, SinkError::Write { source, .. }
            if error_code(source).as_deref() == Some("DRIFTED") || source.to_string().contains("DRIFTED "))
    }

    pub fn is_retriable(&self) -> bool {
        match self {
            SinkError::Connect { cause: source, .. }
            | SinkError::Write { source, .. }
            | SinkError::Scan { source, .. } => is_retriable(source),
            SinkError::StageLost { .. } => true,
            SinkError::LeaseLost
            | SinkError::Fenced { .. }
            | SinkError::Stopped
            | SinkError::TlsFile { .. }
            | SinkError::Cluster(_)
            | SinkError::Permission { .. }
            | SinkError::Eviction { .. } => false,
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
        || matches!(
            error_code(err).as_deref(),
            Some(
                "LOADING"
                    | "BUSY"
                    | "TRYAGAIN"
                    | "MASTERDOWN"
                    | "READONLY"
                    | "CLUSTERDOWN"
                    | "MOVED"
                    | "ASK"
                    | "NOREPLICAS"
            )
        )
}

/// The error code of a reply (`READONLY`, `NOREPLICAS`, …); for a
/// pipeline or transaction, of its first failed command (the driver
/// knows some codes by kind only, and others not at all).
pub fn error_code(err: &redis::RedisError) -> Option<String> {
    if let Some(code) = err.code() {
        return Some(code.to_string());
    }
    let failed = err.clone().into_server_errors()?;
    failed.first().map(|(_, server)| server.code().to_string())
}

/// Whether a failed request may still have reached Redis and run, or
/// run later: it timed out, or its connection broke after it was sent.
/// A refused connection or an error reply says it did not run.
pub fn is_ambiguous(err: &redis::RedisError) -> bool {
    !err.is_connection_refusal() && (err.is_timeout() || err.is_connection_dropped() || err.is_io_error())
}

/// A connected Redis, with the write settings of one run.
///
/// Reads and unfenced writes share one multiplexed connection. A fenced
/// sink ([`Sink::fenced`]) sends each write as `WATCH epoch`, a check that
/// the epoch is still its own, then `MULTI … EXEC`: Redis applies the
/// batch only if no take-over raised the epoch in between. `WATCH` is
/// per connection, so fenced writes use connections of their own, one
/// batch at a time each, which the sending task reads itself
/// ([`fence::wire`]). On a Redis Cluster, writes are cut by slot and
/// fenced by the epoch's copy in each slot instead (see [`cluster`]).
#[derive(Clone)]
pub struct Sink {
    conn: RedisConn,
    /// A plain client of `REDIS_URL`'s node: fenced connections on a
    /// single Redis, pub/sub and the permission probe.
    client: redis::Client,
    status_prefix: String,
    /// How long a request may go unanswered (fenced connections).
    timeout: Duration,
    /// Each with the epoch its `WATCH` was armed under.
    exclusive: std::sync::Arc<std::sync::Mutex<Vec<(u64, fence::wire::Exclusive)>>>,
    fence: Option<Fence>,
    ttl: TierSeconds,
    jitter: f64,
    retry: RetryPolicy,
    /// What one atomic unit may cost Redis: `write_batch_cost` for a
    /// transaction, a script's share of it on a cluster. A collection
    /// above it is written through a stage (see [`stage`]).
    unit_cost: usize,
    /// Keys one write transaction may carry (`write_batch_ops`).
    max_keys: usize,
    /// How collections are replaced whole: by `RESTORE` where
    /// [`Sink::may_restore`] says so; set once, before the first write.
    replace: pipeline::Replace,
}

fn connect_error(settings: &RedisSettings) -> impl Fn(redis::RedisError) -> SinkError + '_ {
    |cause: redis::RedisError| SinkError::Connect {
        url: redact_url(&settings.url),
        reason: scrub(&cause.to_string(), &settings.url),
        cause,
    }
}

/// Builds a client from the URL plus `REDIS_PASSWORD` / `REDIS_DB`.
pub fn client(settings: &RedisSettings) -> Result<redis::Client, SinkError> {
    let connect_err = connect_error(settings);
    let (info, certificates) = connection_info(settings, &settings.url)?;
    match certificates {
        None => redis::Client::open(info).map_err(connect_err),
        Some(certificates) => redis::Client::build_with_tls(info, certificates).map_err(connect_err),
    }
}

/// The connection settings of `url` with `REDIS_PASSWORD` / `REDIS_DB`
/// applied, and the TLS files when any is set.
fn connection_info(
    settings: &RedisSettings,
    url: &str,
) -> Result<(redis::ConnectionInfo, Option<redis::TlsCertificates>), SinkError> {
    use redis::IntoConnectionInfo;
    let connect_err = connect_error(settings);
    let mut info = url.into_connection_info().map_err(connect_err)?;
    let mut node = info.redis_settings().clone();
    if let Some(password) = &settings.password {
        node = node.set_password(password);
    }
    if let Some(db) = settings.db {
        node = node.set_db(db);
    }
    info = info.set_redis_settings(node);
    if !settings.tls.is_set() {
        return Ok((info, None));
    }
    let read = |path: &std::path::Path, what: &str| {
        std::fs::read(path).map_err(|e| SinkError::TlsFile {
            what: what.to_string(),
            path: path.display().to_string(),
            reason: e.to_string(),
        })
    };
    let root_cert = settings.tls.ca.as_deref().map(|p| read(p, "REDIS_TLS_CA")).transpose()?;
    let client_tls = match (&settings.tls.cert, &settings.tls.key) {
        (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
            client_cert: read(cert, "REDIS_TLS_CERT")?,
            client_key: read(key, "REDIS_TLS_KEY")?,
        }),
        _ => None,
    };
    Ok((info, Some(redis::TlsCertificates { client_tls, root_cert })))
}

/// Whether the node at `REDIS_URL` runs in cluster mode, unless
/// `REDIS_CLUSTER` decides.
async fn cluster_mode(settings: &RedisSettings, client: &redis::Client) -> Result<bool, SinkError> {
    if let Some(decided) = settings.cluster {
        return Ok(decided);
    }
    if !settings.cluster_nodes.is_empty() {
        return Ok(true);
    }
    let connect_err = connect_error(settings);
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(5)))
        .set_response_timeout(Some(Duration::from_secs(10)));
    let mut conn = client.get_multiplexed_async_connection_with_config(&config).await.map_err(connect_err)?;
    let info: String =
        redis::cmd("INFO").arg("cluster").query_async(&mut conn).await.map_err(connect_error(settings))?;
    Ok(info_value(&info, "cluster_enabled") == Some("1"))
}

/// Connects to a Redis Cluster through `REDIS_URL` and the extra seeds.
async fn connect_cluster(settings: &RedisSettings) -> Result<router::Router, SinkError> {
    if settings.db.is_some_and(|db| db != 0) {
        return Err(SinkError::Cluster(format!(
            "REDIS_DB={} is set, but a Redis Cluster has database 0 only: unset REDIS_DB or set it to 0",
            settings.db.unwrap_or(0)
        )));
    }
    let (first, certificates) = connection_info(settings, &settings.url)?;
    let scheme = if settings.url.starts_with("rediss://") { "rediss" } else { "redis" };
    let connect = router::Router::connect(first, scheme, certificates, settings.cluster_nodes.clone());
    tokio::time::timeout(Duration::from_secs(15), connect)
        .await
        .map_err(|_| connect_error(settings)(timed_out()))?
        .map_err(connect_error(settings))
}

/// Finds the master `REDIS_SENTINEL_MASTER` through `REDIS_SENTINELS`,
/// with `REDIS_URL`'s scheme, user, password, database and TLS.
async fn connect_sentinel(settings: &RedisSettings) -> Result<sentinel::Sentinel, SinkError> {
    let (template, certificates) = connection_info(settings, &settings.url)?;
    let scheme = if settings.url.starts_with("rediss://") { "rediss" } else { "redis" };
    let connect = sentinel::Sentinel::connect(sentinel::Setup {
        sentinels: settings.sentinels.clone(),
        name: settings.sentinel_master.clone(),
        template,
        certificates,
        scheme,
        response_timeout: Duration::from_secs(settings.timeout_seconds),
    });
    tokio::time::timeout(Duration::from_secs(30), connect)
        .await
        .map_err(|_| connect_error(settings)(timed_out()))?
        .map_err(connect_error(settings))
}

/// Whether the Redis servers behind `now` (a [`Sink::run_id`]) are those
/// behind `before`, so nothing they held was lost: one node's `run_id`
/// is the same, or on a cluster every live master is one that was there
/// before with the same `run_id`. A master missing from `now` has failed
/// and its slots are uncovered, which loses nothing yet; when it comes
/// back restarted, or a replica took its place, that shows.
pub fn same_servers(before: &str, now: &str) -> bool {
    let pairs = |text: &str| -> Option<std::collections::HashMap<String, String>> {
        text.split(',')
            .filter(|p| !p.is_empty())
            .map(|p| p.split_once('=').map(|(a, id)| (a.to_string(), id.to_string())))
            .collect()
    };
    match (pairs(before), pairs(now)) {
        (Some(before), Some(now)) if !now.is_empty() => now.iter().all(|(addr, id)| before.get(addr) == Some(id)),
        _ => before == now,
    }
}

/// A request or a connection that got no answer in time, as the driver
/// reports one (retriable, and ambiguous for a write).
pub(in crate::sink) fn timed_out() -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(std::io::ErrorKind::TimedOut, "connection timed out"))
}

impl Sink {
    /// Connects and pings. Reconnects later happen inside the manager.
    pub async fn connect(settings: &RedisSettings) -> Result<Sink, SinkError> {
        let connect_err = connect_error(settings);
        let client = client(settings)?;
        // The one place that tells the deployments apart: everything
        // after this asks the topology (see [`Topology`]).
        let topology: std::sync::Arc<dyn Topology> = if !settings.sentinels.is_empty() {
            std::sync::Arc::new(connect_sentinel(settings).await?)
        } else if cluster_mode(settings, &client).await? {
            check_cluster(settings)?;
            std::sync::Arc::new(connect_cluster(settings).await?)
        } else {
            let manager = Sink::connect_single(settings, &client).await?;
            std::sync::Arc::new(single::Single::new(manager, client.clone()))
        };
        let mut sink = Sink {
            conn: RedisConn::new(topology.clone()),
            client,
            status_prefix: settings.status_prefix.clone(),
            exclusive: Default::default(),
            fence: None,
            ttl: settings.ttl,
            jitter: settings.ttl_jitter,
            retry: topology.retry(),
            unit_cost: topology.unit_cost(settings.write_batch_cost),
            max_keys: settings.write_batch_ops,
            timeout: Duration::from_secs(settings.timeout_seconds),
            replace: pipeline::Replace::Commands,
        };
        redis::cmd("PING").query_async::<()>(&mut sink.conn).await.map_err(connect_err)?;
        tracing::debug!(topology = topology.name(), masters = topology.masters().len(), "connected to Redis");
        Ok(sink)
    }

    async fn connect_single(settings: &RedisSettings, client: &redis::Client) -> Result<ConnectionManager, SinkError> {
        let connect_err = connect_error(settings);
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(5)))
            // Big index keys take a while to apply; a short timeout would
            // retry work that is still running.
            .set_response_timeout(Some(Duration::from_secs(settings.timeout_seconds)))
            .set_number_of_retries(3)
            .set_max_delay(Duration::from_secs(2));
        tokio::time::timeout(
            Duration::from_secs(10),
            ConnectionManager::new_with_config(client.clone(), manager_config),
        )
        .await
        .map_err(|_| connect_err(timed_out()))?
        .map_err(connect_err)
    }

    /// Connects a writer whose user was checked already (a watcher
    /// starting again under a new lease, the benchmark's parts), choosing
    /// how it replaces collections as [`Sink::connect_for`] does.
    pub async fn connect_writer(settings: &RedisSettings) -> Result<Sink, SinkError> {
        let mut sink = Sink::connect(settings).await?;
        // Only the version is needed here (no eviction check: the user
        // was checked when the process started); unreadable, it is a
        // doubt, and the commands are kept.
        let servers = sink.topology().infos(&sink, &["server"]).await.unwrap_or_default();
        sink.replace = sink.may_restore(settings, &servers).await;
        Ok(sink)
    }

    /// Connects, then checks that the user may do what `access` needs
    /// and, for writers, that Redis will not evict control records (see
    /// [`acl`]), before the caller writes anything.
    pub async fn connect_for(settings: &RedisSettings, access: Access) -> Result<Sink, SinkError> {
        let mut sink = Sink::connect(settings).await?;
        let may_restore = sink.check_access(settings, access).await?;
        if access == Access::Write {
            // One read of every master serves both checks: `INFO`'s
            // default sections hold `memory` and `server` (Redis before
            // 7.0 takes one section a call, not a list).
            let infos = sink.topology().infos(&sink, &[]).await?;
            acl::check_eviction(&infos, settings.allow_eviction)?;
            sink.replace = acl::restore_choice(may_restore, &infos);
        }
        Ok(sink)
    }

    /// The same sink with every write fenced by `fence`'s epoch. On a
    /// cluster, the epoch's copy in every slot is raised first, so no
    /// older writer lands anything after this returns.
    pub async fn fenced(mut self, fence: Fence) -> Result<Sink, SinkError> {
        self.topology().arm(&self, &fence).await?;
        self.fence = Some(fence);
        self.exclusive = Default::default();
        Ok(self)
    }

    /// The deployment this sink writes to (see [`Topology`]).
    pub fn topology(&self) -> &dyn Topology {
        self.conn.topology()
    }

    /// What one write batch (the rebuild's or the watcher's) may carry:
    /// `write_batch_ops` keys and a Redis cost. `write_batch_cost` bounds
    /// what one Redis runs at once; a cluster cuts each batch into one
    /// script per master, so its batches carry that budget per master, at
    /// a script's share of it (see [`cluster::SCRIPT_BUDGET_DIVISOR`]).
    pub fn tx_budget(&self) -> crate::plan::TxBudget {
        // One unit per master: `unit_cost` already holds a script's share.
        let max_cost = self.unit_cost.saturating_mul(self.topology().masters().len().max(1));
        crate::plan::TxBudget { max_keys: self.max_keys, max_cost }
    }

    /// What one atomic unit may cost Redis: a transaction on one node, a
    /// slot's script on a cluster.
    pub fn unit_cost(&self) -> usize {
        self.unit_cost
    }

    /// Whether this sink replaces collections with one `RESTORE` each
    /// ([`Sink::may_restore`]).
    pub fn restores(&self) -> bool {
        self.replace == pipeline::Replace::Restore
    }

    /// Whether collections are restored inside transactions: on one
    /// node (one Redis, or Sentinel's master). On a cluster each value
    /// travels inside its slot's script, as a Lua string and then a
    /// command argument again.
    pub fn restores_in_transactions(&self) -> bool {
        self.restores() && self.topology().spans_slots()
    }

    pub fn connection(&self) -> RedisConn {
        self.conn.clone()
    }

    /// A plain client of `REDIS_URL`'s node (pub/sub works through any
    /// node of a cluster); behind Sentinel, of the master as last
    /// resolved.
    pub fn node_client(&self) -> redis::Client {
        self.topology().node_client().unwrap_or_else(|| self.client.clone())
    }

    /// Writes one batch atomically (MULTI/EXEC), retrying retriable
    /// failures. A batch replaces whole keys, so sending it again is safe.
    /// A key too big for one unit is written in steps first (see
    /// [`stage`]; the batcher sends such a key alone).
    pub async fn write(&self, ops: &[Op]) -> Result<(), SinkError> {
        let whole = self.write_staged_ops(ops).await?;
        if whole.is_empty() && !ops.is_empty() {
            return Ok(());
        }
        self.send_with(|unit| pipeline::add_ops(unit, whole, &self.ttl, self.jitter, rand::random::<f64>, self.replace))
            .await
    }

    /// Sends the unit `body` builds, like [`Sink::send`].
    pub(crate) async fn send_with(&self, body: impl FnOnce(&mut Unit)) -> Result<(), SinkError> {
        let mut unit = Unit::new();
        body(&mut unit);
        self.send(unit).await
    }

    /// Sends one idempotent atomic unit, retrying retriable failures;
    /// fenced when the sink is. The topology decides how: one
    /// transaction on one node ([`Sink::send_transaction`]); cut by slot
    /// on a cluster (see [`cluster::split`]).
    pub async fn send(&self, unit: Unit) -> Result<(), SinkError> {
        self.topology().send(self, unit).await
    }

    /// Sends `unit` as one transaction (under a fence, `MULTI … EXEC
    /// WATCH GET`, see [`Fence::frame`]): how one node, or the master
    /// behind Sentinel, applies a unit.
    pub(in crate::sink) async fn send_transaction(&self, unit: Unit) -> Result<(), SinkError> {
        if let Some(fence) = &self.fence {
            return self.send_fenced(fence, &fence.frame(unit)).await;
        }
        let mut pipe = redis::pipe();
        pipe.atomic();
        unit.append_to(&mut pipe);
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

    /// Sends an atomic pipeline under the fence: refused for good when the
    /// epoch moved (the lease is then marked lost), retried on a new
    /// connection when the network failed (a dropped connection loses its
    /// `WATCH`, so the check is made again). An attempt whose reply never
    /// came may still land later, after newer writes: before it is sent
    /// again the writer raises its own epoch ([`Fence::raise_past`]), so
    /// the late copy, watching the old epoch, is refused. Its own other
    /// writes in flight under the old epoch are refused too, and sent
    /// again under the new one.
    async fn send_fenced(&self, fence: &Fence, full: &redis::Pipeline) -> Result<(), SinkError> {
        let mut attempts = self.retry.start();
        loop {
            if !fence.is_valid() {
                return Err(SinkError::LeaseLost);
            }
            let epoch = fence.epoch();
            match self.try_fenced(fence, epoch, full).await {
                Ok(true) => return Ok(()),
                // Refused because this writer raised its own epoch since.
                Ok(false) if fence.epoch() > epoch && attempts.again_now() => {}
                Ok(false) => {
                    fence.mark_lost();
                    return Err(SinkError::Fenced { epoch });
                }
                Err(err) if is_retriable(&err) => {
                    let Some(delay) = attempts.next_pause() else {
                        return Err(SinkError::Write { attempts: attempts.made(), source: err });
                    };
                    // The pooled connections went through the same cut or
                    // restart: a retry that took the next of them would
                    // fail again, so every retry starts on a new one.
                    self.exclusive.lock().unwrap_or_else(|e| e.into_inner()).clear();
                    self.topology().follow_fail_over().await;
                    if is_ambiguous(&err) {
                        self.raise_own_epoch(fence, epoch).await?;
                    }
                    tracing::warn!(attempt = attempts.made() - 1, delay_ms = delay.as_millis() as u64, error = %err, "fenced redis write failed, retrying");
                    tokio::time::sleep(delay).await;
                }
                Err(source) => return Err(SinkError::Write { attempts: attempts.made(), source }),
            }
        }
    }

    /// Raises this fenced sink's epoch (see [`Fence::raise_past`]): every
    /// write sent under the current one and not yet applied is refused
    /// from now on. `serve` does this after aborting a stalled watcher.
    pub async fn raise_epoch(&self) -> Result<(), SinkError> {
        match &self.fence {
            Some(fence) => self.raise_own_epoch(fence, fence.epoch()).await,
            None => Ok(()),
        }
    }

    /// Raises the writer's epoch past `seen` (see [`Fence::raise_past`]),
    /// and on a cluster every slot's copy with it.
    async fn raise_own_epoch(&self, fence: &Fence, seen: u64) -> Result<(), SinkError> {
        let conn = &self.conn;
        let raised = self
            .retry
            .run(|| {
                let mut conn = conn.clone();
                async move { fence.raise_past(&mut conn, seen).await }
            })
            .await
            .map_err(|(attempts, source)| SinkError::Write { attempts, source })?;
        match raised {
            None => Err(SinkError::Fenced { epoch: seen }),
            Some(_) => self.topology().arm(self, fence).await,
        }
    }

    /// One fenced attempt: `Ok(false)` when Redis refused it.
    ///
    /// Every pooled connection carries a `WATCH` on the epoch key, set
    /// when the epoch was last read back as ours: any change of the epoch
    /// since then makes the next `EXEC` on it fail. So one round trip does
    /// the transaction and re-arms the connection for the next one
    /// (`MULTI … EXEC WATCH epoch GET epoch`); only a fresh connection needs
    /// a round trip of its own first. Small transactions (see the batch
    /// cost bound) thus cost no extra round trips.
    async fn try_fenced(&self, fence: &Fence, epoch: u64, full: &redis::Pipeline) -> redis::RedisResult<bool> {
        let Some(mut conn) = self.checkout_watched(fence, epoch).await? else { return Ok(false) };
        let (applied, current): (redis::Value, Option<u64>) = full.query_async(&mut conn).await?;
        if let redis::Value::Array(replies) = &applied
            && let Some(redis::Value::ServerError(err)) =
                replies.iter().find(|r| matches!(r, redis::Value::ServerError(_)))
        {
            return Err(err.clone().into());
        }
        let applied = !matches!(applied, redis::Value::Nil);
        // Re-armed only while the epoch is still ours; otherwise the
        // connection is dropped with its watch.
        if applied && current == Some(epoch) {
            self.checkin(epoch, conn);
        }
        Ok(applied)
    }

    /// A connection no other task uses while it is out, watching the epoch
    /// key since a moment the epoch was ours; `None` when it no longer is.
    async fn checkout_watched(&self, fence: &Fence, epoch: u64) -> redis::RedisResult<Option<fence::wire::Exclusive>> {
        loop {
            let pooled = self.exclusive.lock().unwrap_or_else(|e| e.into_inner()).pop();
            match pooled {
                Some((armed, conn)) if armed == epoch => return Ok(Some(conn)),
                // Armed under an epoch this writer has since raised: its
                // watch would refuse the next transaction; dropped.
                Some(_) => continue,
                None => break,
            }
        }
        let mut conn = fence::wire::Exclusive::connect(&self.node_client(), self.timeout).await?;
        let (current,): (Option<u64>,) = redis::pipe()
            .cmd("WATCH")
            .arg(&fence.key)
            .ignore()
            .cmd("GET")
            .arg(&fence.key)
            .query_async(&mut conn)
            .await?;
        Ok((current == Some(epoch)).then_some(conn))
    }

    fn checkin(&self, epoch: u64, conn: fence::wire::Exclusive) {
        self.exclusive.lock().unwrap_or_else(|e| e.into_inner()).push((epoch, conn));
    }

    /// Applies the watcher's changes in one transaction, retrying
    /// retriable failures (every change is idempotent); puts too big for
    /// one unit go first, in steps (see [`stage`]).
    pub async fn apply_changes(&self, changes: &[crate::plan::Change]) -> Result<(), SinkError> {
        let rest = self.write_staged_changes(changes).await?;
        if rest.is_empty() {
            return Ok(());
        }
        self.send_with(|unit| self.add_changes(unit, rest)).await
    }

    /// Appends `changes` with this sink's TTLs and jitter to `unit`.
    fn add_changes<'a>(&self, unit: &mut Unit, changes: impl IntoIterator<Item = &'a crate::plan::Change>) {
        pipeline::add_changes(unit, changes, &self.ttl, self.jitter, rand::random::<f64>, self.replace);
    }

    /// The server's `run_id`, which changes when Redis restarts; on a
    /// cluster, the masters' `run_id`s, which change when any master
    /// restarts or fails over (see [`Topology::run_id`]).
    pub async fn run_id(&self) -> Result<String, SinkError> {
        self.topology().run_id(self).await
    }

    /// The one node's `run_id` (or the master's behind Sentinel).
    pub(in crate::sink) async fn run_id_of_one_node(&self) -> Result<String, SinkError> {
        let infos = self.info_of_one_node(&["server"]).await?;
        let info = infos.first().map(|(_, info)| info.as_str()).unwrap_or_default();
        Ok(info_value(info, "run_id").unwrap_or_default().to_string())
    }

    /// `INFO` of `sections` from the one node (or the master behind
    /// Sentinel), with its address: the one-node answer of
    /// [`Topology::infos`].
    pub(in crate::sink) async fn info_of_one_node(
        &self,
        sections: &[&str],
    ) -> Result<Vec<(String, String)>, SinkError> {
        let mut cmd = redis::cmd("INFO");
        for section in sections {
            cmd.arg(*section);
        }
        let conn = &self.conn;
        let info: String = self
            .retry
            .run(|| {
                let (cmd, mut conn) = (&cmd, conn.clone());
                async move { cmd.query_async(&mut conn).await }
            })
            .await
            .map_err(|(attempts, source)| SinkError::Scan { attempts, source })?;
        let node = self.topology().masters().into_iter().next().unwrap_or_default();
        Ok(vec![(node, info)])
    }

    /// `used_memory` from INFO memory, in bytes.
    pub async fn used_memory(&self) -> Result<u64, SinkError> {
        Ok(self.info_field("memory", "used_memory").await?.and_then(|v| v.parse().ok()).unwrap_or(0))
    }
}

#[cfg(test)]
mod tests {
    use super::same_servers;

    #[test]
    fn a_failed_master_is_no_restart_but_a_new_run_id_is() {
        assert!(same_servers("abc", "abc"));
        assert!(!same_servers("abc", "abd"));
        let before = "127.0.0.1:7000=a,127.0.0.1:7001=b,127.0.0.1:7002=c";
        assert!(same_servers(before, before));
        assert!(same_servers(before, "127.0.0.1:7000=a,127.0.0.1:7002=c"), "7001 failed: its slots are uncovered");
        assert!(!same_servers(before, "127.0.0.1:7000=a,127.0.0.1:7001=z,127.0.0.1:7002=c"), "7001 restarted");
        assert!(!same_servers(before, "127.0.0.1:7000=a,127.0.0.1:7003=d,127.0.0.1:7002=c"), "a replica took over");
        assert!(!same_servers(before, ""), "no master answers");
    }
}
