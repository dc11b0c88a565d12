//! Redis behind Sentinel: the master's address comes from the sentinels
//! (`SENTINEL get-master-addr-by-name`), and is asked again whenever the
//! master stops answering as a master.
//!
//! After a fail-over the old master is demoted to a replica: Sentinel
//! kills its clients, and a write that still reaches it is refused with
//! `READONLY`. Either way the request fails, this connection asks the
//! sentinels for the new master (checking with `ROLE` that it is one,
//! since a sentinel may still name the old one for a moment), reconnects,
//! and sends the request again, for a bounded time. Fenced writes use
//! connections of their own from [`Sentinel::client`], which always
//! points at the master last resolved; their retries go through
//! [`Sentinel::refresh`] too (see `Sink::send_fenced`).
//!
//! Nothing else changes: a fail-over promotes another server, whose
//! `run_id` differs, so a rebuild that spans it is redone and the watcher
//! reloads its state, as after a restart; fencing works as on one node.

use crate::retry::RetryPolicy;
use futures::future::BoxFuture;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{Cmd, ErrorKind, Pipeline, RedisFuture, RedisResult, Value};
use std::sync::RwLock;
use std::time::{Duration, Instant};

/// How long a request keeps following fail-overs before it gives up
/// (`RetryPolicy::FOLLOW_SENTINEL`: 30 s of pauses of 200 ms): a manual
/// fail-over takes a second or two, an automatic one
/// `down-after-milliseconds` plus an election.
const FOLLOW: RetryPolicy = RetryPolicy::FOLLOW_SENTINEL;
/// The shortest gap between two questions to the sentinels.
const PAUSE: Duration = Duration::from_millis(200);

/// The master as last resolved.
struct Master {
    addr: String,
    client: redis::Client,
    conn: ConnectionManager,
}

/// Where the sentinels are and how to reach the data nodes they name.
pub struct Setup {
    pub sentinels: Vec<String>,
    /// The master's name at the sentinels.
    pub name: String,
    /// Scheme, user, password, database and TLS for the data nodes.
    pub template: redis::ConnectionInfo,
    pub certificates: Option<redis::TlsCertificates>,
    pub scheme: &'static str,
    pub response_timeout: Duration,
}

pub struct Sentinel {
    setup: Setup,
    master: RwLock<Master>,
    /// Held while the sentinels are asked: one question at a time.
    asking: tokio::sync::Mutex<Asking>,
}

/// When the sentinels were last asked, and a connection to each kept
/// from then on: `Sink::run_id` asks before every watcher batch, which
/// must not cost a new connection each time.
struct Asking {
    at: Instant,
    conns: Vec<Option<MultiplexedConnection>>,
}

/// Whether `err` says the node is no longer (or not yet) a usable master.
fn is_fail_over(err: &redis::RedisError) -> bool {
    err.is_io_error()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || err.is_timeout()
        || matches!(crate::sink::error_code(err).as_deref(), Some("READONLY" | "LOADING" | "MASTERDOWN" | "NOREPLICAS"))
}

impl Sentinel {
    /// Asks the sentinels for the master and connects to it.
    pub async fn connect(setup: Setup) -> RedisResult<Sentinel> {
        let mut asking = Asking { at: Instant::now(), conns: vec![None; setup.sentinels.len()] };
        let resolved = resolve(&setup, &mut asking.conns, "").await?;
        let (addr, client, conn) = resolved.expect("no master is known yet, so any is new");
        Ok(Sentinel {
            setup,
            master: RwLock::new(Master { addr, client, conn }),
            asking: tokio::sync::Mutex::new(asking),
        })
    }

    /// A client of the master as last resolved.
    pub fn client(&self) -> redis::Client {
        self.master.read().unwrap_or_else(|e| e.into_inner()).client.clone()
    }

    /// The master's `host:port` as last resolved.
    pub fn master_addr(&self) -> String {
        self.master.read().unwrap_or_else(|e| e.into_inner()).addr.clone()
    }

    fn conn(&self) -> ConnectionManager {
        self.master.read().unwrap_or_else(|e| e.into_inner()).conn.clone()
    }

    /// Asks the sentinels again (once per pause, however many requests
    /// failed together) and reconnects when the master moved.
    pub async fn refresh(&self) -> RedisResult<()> {
        self.refresh_if(|last| last.elapsed() >= PAUSE).await
    }

    /// Asks the sentinels now which node is master, following it when it
    /// moved. A run asks before it trusts its writes (see `Sink::run_id`):
    /// during a fail-over the old master still answers as a master for a
    /// moment, and what it accepts then is lost when it is demoted, so
    /// only the sentinels' word tells the run it wrote to the wrong node.
    pub async fn refresh_now(&self) -> RedisResult<()> {
        self.refresh_if(|_| true).await
    }

    async fn refresh_if(&self, due: impl FnOnce(&Instant) -> bool) -> RedisResult<()> {
        let mut asking = self.asking.lock().await;
        if !due(&asking.at) {
            return Ok(());
        }
        let current = self.master_addr();
        let resolved = resolve(&self.setup, &mut asking.conns, &current).await;
        asking.at = Instant::now();
        let Some((addr, client, conn)) = resolved? else { return Ok(()) };
        let mut master = self.master.write().unwrap_or_else(|e| e.into_inner());
        tracing::warn!(from = %master.addr, to = %addr, master = %self.setup.name, "Redis master failed over; following it");
        *master = Master { addr, client, conn };
        Ok(())
    }

    /// Runs `send` on the master, following fail-overs for a bounded time.
    async fn follow<T, F, Fut>(&self, mut send: F) -> RedisResult<T>
    where
        F: FnMut(ConnectionManager) -> Fut,
        Fut: std::future::Future<Output = RedisResult<T>>,
    {
        let mut attempts = FOLLOW.start();
        loop {
            let err = match send(self.conn()).await {
                Ok(value) => return Ok(value),
                Err(err) if is_fail_over(&err) => err,
                Err(err) => return Err(err),
            };
            let Some(pause) = attempts.next_pause() else { return Err(err) };
            tracing::debug!(error = %err, "Redis master not answering as a master; asking the sentinels");
            tokio::time::sleep(pause).await;
            let _ = self.refresh().await;
        }
    }

    pub async fn request(&self, cmd: &Cmd) -> RedisResult<Value> {
        self.follow(|mut conn| async move { conn.req_packed_command(cmd).await }).await
    }

    pub async fn pipeline(&self, pipeline: &Pipeline, offset: usize, count: usize) -> RedisResult<Vec<Value>> {
        self.follow(|mut conn| async move { conn.req_packed_commands(pipeline, offset, count).await }).await
    }

    pub fn db(&self) -> i64 {
        self.setup.template.redis_settings().db()
    }
}

/// Redis behind Sentinel is one node that can move: the one-node
/// defaults of the seam, with requests following the master and `run_id`
/// asked of the master the sentinels name now (a fail-over shows as a
/// new `run_id`).
impl crate::sink::Topology for Sentinel {
    fn name(&self) -> &'static str {
        "sentinel"
    }

    fn request<'a>(&'a self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(Sentinel::request(self, cmd))
    }

    fn pipeline<'a>(&'a self, pipe: &'a Pipeline, offset: usize, count: usize) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(Sentinel::pipeline(self, pipe, offset, count))
    }

    fn db(&self) -> i64 {
        Sentinel::db(self)
    }

    fn masters(&self) -> Vec<String> {
        vec![self.master_addr()]
    }

    fn owner(&self, _slot: u16) -> Option<String> {
        Some(self.master_addr())
    }

    fn on_node<'a>(&'a self, _addr: &'a str, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(Sentinel::request(self, cmd))
    }

    fn pipeline_on_node<'a>(&'a self, _addr: &'a str, pipe: &'a Pipeline) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(self.follow(move |mut conn| async move { pipe.query_async(&mut conn).await }))
    }

    fn node_client(&self) -> Option<redis::Client> {
        Some(self.client())
    }

    fn follow_fail_over(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {
            let _ = self.refresh().await;
        })
    }

    fn refresh_masters(&self) -> BoxFuture<'_, RedisResult<()>> {
        Box::pin(self.refresh_now())
    }

    fn retry(&self) -> RetryPolicy {
        RetryPolicy::REDIS_SENTINEL
    }

    fn run_id<'a>(&'a self, sink: &'a crate::sink::Sink) -> crate::sink::conn::Seam<'a, String> {
        Box::pin(async move {
            self.refresh_now().await.map_err(|source| crate::sink::SinkError::Scan { attempts: 1, source })?;
            sink.run_id_of_one_node().await
        })
    }
}

/// The master's address from the first sentinel that knows it and whose
/// answer is a master indeed (`ROLE`), connected; `None` when it is
/// `known` (the master already connected to). `kept` holds a connection
/// per sentinel, made on first use and dropped when it fails.
async fn resolve(
    setup: &Setup,
    kept: &mut [Option<MultiplexedConnection>],
    known: &str,
) -> RedisResult<Option<(String, redis::Client, ConnectionManager)>> {
    use redis::IntoConnectionInfo;
    let Setup { sentinels, name, template, certificates, scheme, response_timeout } = setup;
    let mut last: Option<redis::RedisError> = None;
    for (sentinel, slot) in sentinels.iter().zip(kept.iter_mut()) {
        let asked = async {
            let mut conn = match slot.clone() {
                Some(conn) => conn,
                None => {
                    // Sentinels speak plain RESP without the data nodes' user.
                    let conn =
                        redis::Client::open(format!("redis://{sentinel}"))?.get_multiplexed_async_connection().await?;
                    *slot = Some(conn.clone());
                    conn
                }
            };
            let reply: Option<(String, u16)> =
                redis::cmd("SENTINEL").arg("get-master-addr-by-name").arg(name).query_async(&mut conn).await?;
            let Some((host, port)) = reply else {
                return Err(redis::RedisError::from((
                    ErrorKind::Client,
                    "this sentinel does not monitor the master",
                    name.to_string(),
                )));
            };
            let addr = crate::sink::cluster::node_addr(&host, port);
            if addr == known {
                return Ok(None);
            }
            let info = format!("{scheme}://{addr}")
                .into_connection_info()?
                .set_redis_settings(template.redis_settings().clone());
            let client = match certificates {
                None => redis::Client::open(info)?,
                Some(certificates) => redis::Client::build_with_tls(info, certificates.clone())?,
            };
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(Duration::from_secs(5)))
                .set_response_timeout(Some(*response_timeout))
                .set_number_of_retries(1);
            let mut conn = ConnectionManager::new_with_config(client.clone(), config).await?;
            let role: Vec<Value> = redis::cmd("ROLE").query_async(&mut conn).await?;
            let is_master = matches!(role.first(), Some(Value::BulkString(r)) if r == b"master");
            if !is_master {
                return Err(redis::RedisError::from((
                    ErrorKind::Server(redis::ServerErrorKind::ReadOnly),
                    "the sentinel named a node that is not a master (yet)",
                    addr,
                )));
            }
            Ok(Some((addr, client, conn)))
        };
        let err = match tokio::time::timeout(Duration::from_secs(5), asked).await {
            Ok(Ok(found)) => return Ok(found),
            Ok(Err(err)) => err,
            Err(_) => (ErrorKind::Io, "a sentinel did not answer in time").into(),
        };
        *slot = None;
        last = Some(err);
    }
    Err(last.unwrap_or_else(|| (ErrorKind::Io, "no sentinel given").into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fail_over_states_are_followed() {
        let server = |kind| redis::RedisError::from((ErrorKind::Server(kind), "from the server"));
        assert!(is_fail_over(&server(redis::ServerErrorKind::ReadOnly)));
        assert!(is_fail_over(&server(redis::ServerErrorKind::BusyLoading)));
        assert!(is_fail_over(&server(redis::ServerErrorKind::MasterDown)));
        assert!(is_fail_over(&redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset))));
        assert!(!is_fail_over(&server(redis::ServerErrorKind::NoScript)));
        assert!(!is_fail_over(&redis::RedisError::from((ErrorKind::Client, "bad"))));
    }
}
