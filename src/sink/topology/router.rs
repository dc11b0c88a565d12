//! A small Redis Cluster router of our own: the slot map from `CLUSTER
//! SLOTS`, one multiplexed connection per node, and each command sent to
//! the master of its key's slot, following `MOVED` and `ASK`, waiting
//! out `TRYAGAIN`, refreshing the map after a fail-over (`READONLY`,
//! `LOADING`, `MASTERDOWN`, `CLUSTERDOWN`, a lost connection; see
//! `reaction`), and reconnecting to a master that restarted.
//!
//! Why not the driver's cluster client: after a master restart, it was
//! seen to hold every request, on every master, until the response
//! timeout, again and again (its slot refresh never completed). Here a
//! failed request only refreshes the map and retries, with a bound.

use crate::retry::RetryPolicy;
use crate::sink::cluster;
use redis::aio::MultiplexedConnection;
use redis::{Cmd, ErrorKind, RedisResult, ServerErrorKind, Value};
use std::collections::HashMap;
use std::sync::{Mutex, RwLock};
use std::time::{Duration, Instant};

/// Attempts per command and the pauses between them
/// (`RetryPolicy::CLUSTER_COMMAND`: about 6 s in all).
const RETRY: RetryPolicy = RetryPolicy::CLUSTER_COMMAND;
/// A refresh right after another is skipped: a burst of `MOVED` replies
/// needs one new map, not one each.
const REFRESH_GAP: Duration = Duration::from_millis(50);

/// Who owns each slot.
#[derive(Debug, Clone, Default)]
struct SlotMap {
    /// `host:port` of every master.
    nodes: Vec<String>,
    /// Per slot, an index into `nodes` (`None`: not covered).
    owners: Vec<Option<usize>>,
}

pub struct Router {
    template: redis::ConnectionInfo,
    scheme: &'static str,
    certificates: Option<redis::TlsCertificates>,
    seeds: Vec<String>,
    map: RwLock<SlotMap>,
    conns: Mutex<HashMap<String, MultiplexedConnection>>,
    last_refresh: tokio::sync::Mutex<Option<Instant>>,
}

/// The slot a command's key hashes to; `None` for commands without a key.
pub(in crate::sink) fn command_slot(cmd: &Cmd) -> Option<u16> {
    let args = cluster::cmd_args(cmd);
    let name = args.first()?.to_ascii_uppercase();
    let key = match name.as_slice() {
        b"EVAL" | b"EVALSHA" | b"EVAL_RO" | b"EVALSHA_RO" | b"FCALL" => {
            let keys: usize = std::str::from_utf8(args.get(2)?).ok()?.parse().ok()?;
            if keys == 0 {
                return None;
            }
            args.get(3)?
        }
        b"MEMORY" | b"OBJECT" => args.get(2)?,
        b"PING" | b"INFO" | b"PUBLISH" | b"CLUSTER" | b"SCRIPT" | b"ECHO" | b"DBSIZE" | b"TIME" | b"ACL"
        | b"CONFIG" | b"CLIENT" | b"LATENCY" | b"WAIT" => return None,
        _ => args.get(1)?,
    };
    Some(cluster::slot(key))
}

/// What the router does about a failed request before its next attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reaction {
    /// The slot lives elsewhere now: note the new owner, refresh the map.
    Moved,
    /// The slot is moving: send the one command to the importing master.
    Ask,
    /// The slot is busy on its master (`TRYAGAIN`: keys of a moving slot).
    Wait,
    /// The node is not (or not yet) the slot's master: a fail-over turned
    /// it into a replica (`READONLY`), it is still loading its data
    /// (`LOADING`), its master is gone (`MASTERDOWN`), the cluster is
    /// down or the connection failed. Pause, then ask the cluster who
    /// owns the slot now.
    WaitAndRefresh,
    /// Anything else is the caller's to handle.
    GiveUp,
}

fn reaction(err: &redis::RedisError) -> Reaction {
    match err.kind() {
        ErrorKind::Server(ServerErrorKind::Moved) => Reaction::Moved,
        ErrorKind::Server(ServerErrorKind::Ask) => Reaction::Ask,
        ErrorKind::Server(ServerErrorKind::TryAgain) => Reaction::Wait,
        ErrorKind::Server(
            ServerErrorKind::ClusterDown
            | ServerErrorKind::MasterDown
            | ServerErrorKind::ReadOnly
            | ServerErrorKind::BusyLoading,
        ) => Reaction::WaitAndRefresh,
        _ if matches!(err.code(), Some("READONLY" | "LOADING" | "MASTERDOWN" | "CLUSTERDOWN")) => {
            Reaction::WaitAndRefresh
        }
        _ if is_connection_error(err) => Reaction::WaitAndRefresh,
        _ => Reaction::GiveUp,
    }
}

fn is_connection_error(err: &redis::RedisError) -> bool {
    err.is_io_error() || err.is_connection_dropped() || err.is_connection_refusal() || err.is_timeout()
}

impl Router {
    pub async fn connect(
        first: redis::ConnectionInfo,
        scheme: &'static str,
        certificates: Option<redis::TlsCertificates>,
        seeds: Vec<String>,
    ) -> RedisResult<Router> {
        let router = Router {
            template: first,
            scheme,
            certificates,
            seeds,
            map: RwLock::new(SlotMap::default()),
            conns: Mutex::new(HashMap::new()),
            last_refresh: tokio::sync::Mutex::new(None),
        };
        router.refresh().await?;
        Ok(router)
    }

    fn client(&self, addr: &str) -> RedisResult<redis::Client> {
        use redis::IntoConnectionInfo;
        let info = format!("{}://{addr}", self.scheme)
            .into_connection_info()?
            .set_redis_settings(self.template.redis_settings().clone());
        match &self.certificates {
            None => redis::Client::open(info),
            Some(certificates) => redis::Client::build_with_tls(info, certificates.clone()),
        }
    }

    async fn conn(&self, addr: &str) -> RedisResult<MultiplexedConnection> {
        if let Some(conn) = self.conns.lock().unwrap_or_else(|e| e.into_inner()).get(addr) {
            return Ok(conn.clone());
        }
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(2)))
            .set_response_timeout(Some(Duration::from_secs(10)));
        let conn = self.client(addr)?.get_multiplexed_async_connection_with_config(&config).await?;
        self.conns.lock().unwrap_or_else(|e| e.into_inner()).insert(addr.to_string(), conn.clone());
        Ok(conn)
    }

    fn forget(&self, addr: &str) {
        self.conns.lock().unwrap_or_else(|e| e.into_inner()).remove(addr);
    }

    /// The seed nodes: `REDIS_URL`'s host and port, then
    /// `REDIS_CLUSTER_NODES`.
    fn seed_addrs(&self) -> Vec<String> {
        let first = match self.template.addr() {
            redis::ConnectionAddr::Tcp(host, port) | redis::ConnectionAddr::TcpTls { host, port, .. } => {
                cluster::node_addr(host, *port)
            }
            _ => String::new(),
        };
        let seeds = self.seeds.iter().map(|seed| cluster::redirect_addr(seed));
        std::iter::once(first).chain(seeds).filter(|a| !a.is_empty()).collect()
    }

    /// Reads the slot map from the first node that answers, of the
    /// masters known so far and the seeds.
    pub async fn refresh(&self) -> RedisResult<()> {
        let mut last = self.last_refresh.lock().await;
        if last.is_some_and(|at| at.elapsed() < REFRESH_GAP) {
            return Ok(());
        }
        let mut candidates = self.map.read().unwrap_or_else(|e| e.into_inner()).nodes.clone();
        candidates.extend(self.seed_addrs());
        candidates.sort();
        candidates.dedup();
        if candidates.is_empty() {
            return Err((ErrorKind::Io, "no cluster node to ask for CLUSTER SLOTS").into());
        }
        // Every node is asked at once and the first answer wins: a node
        // that stalls (a paused process, a frozen VM) would otherwise hold
        // the refresh for a whole response timeout before the next is
        // tried.
        let asks = candidates.into_iter().map(|addr| Box::pin(self.read_map(addr)));
        let (map, _) = futures::future::select_ok(asks).await?;
        *self.map.write().unwrap_or_else(|e| e.into_inner()) = map;
        *last = Some(Instant::now());
        Ok(())
    }

    /// The slot map as the node at `addr` sees it: the slots and, from the
    /// same node, which masters the cluster agreed have failed (their
    /// slots count as uncovered).
    async fn read_map(&self, addr: String) -> RedisResult<SlotMap> {
        let reply = match self.conn(&addr).await {
            Ok(mut conn) => {
                redis::pipe()
                    .cmd("CLUSTER")
                    .arg("SLOTS")
                    .cmd("CLUSTER")
                    .arg("NODES")
                    .query_async::<(Value, String)>(&mut conn)
                    .await
            }
            Err(err) => Err(err),
        };
        let (reply, nodes) = reply.inspect_err(|_| self.forget(&addr))?;
        let ranges = cluster::slot_ranges(&reply, cluster::addr_host(&addr))
            .ok_or_else(|| redis::RedisError::from((ErrorKind::Parse, "unreadable CLUSTER SLOTS reply")))?;
        let failed = cluster::failed_nodes(&nodes);
        let ids = cluster::slot_range_ids(&reply);
        let mut map = SlotMap { nodes: Vec::new(), owners: vec![None; cluster::SLOTS] };
        for (i, (start, end, node)) in ranges.into_iter().enumerate() {
            if ids.get(i).and_then(Option::as_ref).is_some_and(|id| failed.contains(id)) {
                continue;
            }
            let index = match map.nodes.iter().position(|n| *n == node) {
                Some(i) => i,
                None => {
                    map.nodes.push(node);
                    map.nodes.len() - 1
                }
            };
            for slot in start..=end.min(cluster::SLOTS as u16 - 1) {
                map.owners[usize::from(slot)] = Some(index);
            }
        }
        Ok(map)
    }

    /// The master that owns `slot` by the current map (any master for
    /// `None`).
    pub fn owner(&self, slot: Option<u16>) -> Option<String> {
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        match slot {
            Some(slot) => map.owners[usize::from(slot)].map(|i| map.nodes[i].clone()),
            None => map.nodes.first().cloned(),
        }
    }

    /// `items` grouped by the master of each one's slot, by one reading
    /// of the map, masters in the map's order; items whose slot no master
    /// covers come back apart.
    pub fn by_master<T>(&self, items: Vec<T>, slot: impl Fn(&T) -> u16) -> (Vec<(String, Vec<T>)>, Vec<T>) {
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        let mut groups: Vec<Vec<T>> = map.nodes.iter().map(|_| Vec::new()).collect();
        let mut uncovered = Vec::new();
        for item in items {
            match map.owners[usize::from(slot(&item))] {
                Some(i) => groups[i].push(item),
                None => uncovered.push(item),
            }
        }
        let grouped = map.nodes.iter().cloned().zip(groups).filter(|(_, items)| !items.is_empty()).collect();
        (grouped, uncovered)
    }

    /// The masters that cover slots, in address order.
    pub fn masters(&self) -> Vec<String> {
        let mut nodes = self.map.read().unwrap_or_else(|e| e.into_inner()).nodes.clone();
        nodes.sort();
        nodes
    }

    /// The slots no live master covers by the current map (unassigned, or
    /// their master failed with no replica to take over), as ranges.
    pub fn uncovered(&self) -> Vec<(u16, u16)> {
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        slot_runs(map.owners.iter().map(Option::is_none))
    }

    /// Sends a plain pipeline to the node at `addr` in one round trip;
    /// each command's error comes back as its reply.
    pub async fn pipeline_on_node(&self, addr: &str, pipe: &redis::Pipeline) -> RedisResult<Vec<Value>> {
        let result = match self.conn(addr).await {
            Ok(mut conn) => pipe.query_async::<Vec<Value>>(&mut conn).await,
            Err(err) => Err(err),
        };
        if result.as_ref().is_err_and(is_connection_error) {
            self.forget(addr);
        }
        result
    }

    /// Sends `cmd` to the node at `addr`, once.
    pub async fn on_node(&self, addr: &str, cmd: &Cmd) -> RedisResult<Value> {
        let result = match self.conn(addr).await {
            Ok(mut conn) => cmd.query_async::<Value>(&mut conn).await,
            Err(err) => Err(err),
        };
        if result.as_ref().is_err_and(is_connection_error) {
            self.forget(addr);
        }
        result
    }

    /// Sends `cmd` to the master of its key's slot (any master when it
    /// has no key; `SCRIPT LOAD` to every master), following the cluster
    /// until it answers or the attempts run out.
    pub async fn request(&self, cmd: &Cmd) -> RedisResult<Value> {
        if command_slot(cmd).is_none() && is_script_load(cmd) {
            let mut reply = Value::Nil;
            for addr in self.masters() {
                reply = self.on_node(&addr, cmd).await?;
            }
            return Ok(reply);
        }
        let slot = command_slot(cmd);
        let mut asking: Option<String> = None;
        let mut attempts = RETRY.start();
        loop {
            let target = match asking.take() {
                Some(addr) => Ok((addr, true)),
                None => self.owner(slot).map(|a| (a, false)).ok_or_else(|| {
                    redis::RedisError::from((ErrorKind::Server(ServerErrorKind::ClusterDown), "slot not covered"))
                }),
            };
            let result = match target {
                Ok((addr, true)) => self.asking(&addr, cmd).await,
                Ok((addr, false)) => self.on_node(&addr, cmd).await,
                Err(err) => Err(err),
            };
            let err = match result {
                Ok(value) => return Ok(value),
                Err(err) => err,
            };
            // Every failed attempt counts, whatever the reaction; a
            // redirection goes on at once, without its pause.
            let Some(pause) = attempts.next_pause() else { return Err(err) };
            match reaction(&err) {
                Reaction::Moved => {
                    if let Some((addr, moved)) = err.redirect_node() {
                        self.set_owner(moved, &cluster::redirect_addr(addr));
                    }
                    let _ = self.refresh().await;
                }
                Reaction::Ask => asking = err.redirect_node().map(|(addr, _)| cluster::redirect_addr(addr)),
                Reaction::Wait => tokio::time::sleep(pause).await,
                Reaction::WaitAndRefresh => {
                    tokio::time::sleep(pause).await;
                    let _ = self.refresh().await;
                }
                Reaction::GiveUp => return Err(err),
            }
        }
    }

    /// `ASKING` then `cmd` on one connection: the importing master
    /// accepts the one command for a slot it does not own yet.
    async fn asking(&self, addr: &str, cmd: &Cmd) -> RedisResult<Value> {
        let mut pipe = redis::pipe();
        pipe.cmd("ASKING").ignore().add_command(cmd.clone());
        let result = match self.conn(addr).await {
            Ok(mut conn) => pipe.query_async::<(Value,)>(&mut conn).await.map(|(v,)| v),
            Err(err) => Err(err),
        };
        if result.as_ref().is_err_and(is_connection_error) {
            self.forget(addr);
        }
        result
    }

    fn set_owner(&self, slot: u16, addr: &str) {
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        let index = match map.nodes.iter().position(|n| n == addr) {
            Some(i) => i,
            None => {
                map.nodes.push(addr.to_string());
                map.nodes.len() - 1
            }
        };
        if let Some(owner) = map.owners.get_mut(usize::from(slot)) {
            *owner = Some(index);
        }
    }
}

/// The runs of `true` in a per-slot sequence, as inclusive ranges.
fn slot_runs(flags: impl Iterator<Item = bool>) -> Vec<(u16, u16)> {
    let mut runs: Vec<(u16, u16)> = Vec::new();
    for (slot, flag) in flags.enumerate() {
        let slot = slot as u16;
        match runs.last_mut() {
            Some((_, end)) if flag && *end + 1 == slot => *end = slot,
            _ if flag => runs.push((slot, slot)),
            _ => {}
        }
    }
    runs
}

fn is_script_load(cmd: &Cmd) -> bool {
    let args = cluster::cmd_args(cmd);
    args.len() >= 2 && args[0].eq_ignore_ascii_case(b"SCRIPT") && args[1].eq_ignore_ascii_case(b"LOAD")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_route_by_their_key() {
        let slot = |c: &Cmd| command_slot(c);
        assert_eq!(slot(redis::cmd("GET").arg("foo")), Some(12182));
        assert_eq!(slot(redis::cmd("EVALSHA").arg("abc").arg(2).arg("foo").arg("x")), Some(12182));
        assert_eq!(slot(redis::cmd("EVALSHA").arg("abc").arg(0)), None);
        assert_eq!(slot(redis::cmd("MEMORY").arg("USAGE").arg("bar")), Some(5061));
        assert_eq!(slot(redis::cmd("PUBLISH").arg("chan").arg("m")), None);
        assert_eq!(slot(&redis::cmd("PING")), None);
        assert!(is_script_load(redis::cmd("SCRIPT").arg("LOAD").arg("return 1")));
        assert!(!is_script_load(redis::cmd("SCRIPT").arg("FLUSH")));
    }

    /// Every fail-over state leads to a pause, a refresh of the slot map
    /// and another attempt (bounded by `RETRY`), never to an error
    /// passed up while attempts remain.
    #[test]
    fn fail_over_states_refresh_and_retry() {
        let server = |kind| redis::RedisError::from((ErrorKind::Server(kind), "from the server"));
        for kind in [
            ServerErrorKind::ReadOnly,
            ServerErrorKind::BusyLoading,
            ServerErrorKind::MasterDown,
            ServerErrorKind::ClusterDown,
        ] {
            assert_eq!(reaction(&server(kind)), Reaction::WaitAndRefresh, "{kind:?}");
        }
        assert_eq!(reaction(&server(ServerErrorKind::TryAgain)), Reaction::Wait);
        assert_eq!(reaction(&server(ServerErrorKind::Moved)), Reaction::Moved);
        assert_eq!(reaction(&server(ServerErrorKind::Ask)), Reaction::Ask);
        let reset = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert_eq!(reaction(&reset), Reaction::WaitAndRefresh);
        assert_eq!(reaction(&server(ServerErrorKind::NoScript)), Reaction::GiveUp);
        assert_eq!(reaction(&redis::RedisError::from((ErrorKind::Client, "bad"))), Reaction::GiveUp);
    }

    #[test]
    fn uncovered_slots_come_as_ranges() {
        fn flags(set: &[u16]) -> impl Iterator<Item = bool> + '_ {
            (0..10u16).map(move |s| set.contains(&s))
        }
        assert_eq!(slot_runs(flags(&[])), vec![]);
        assert_eq!(slot_runs(flags(&[0, 1, 2, 5, 9])), vec![(0, 2), (5, 5), (9, 9)]);
    }

    #[test]
    fn pauses_outlast_a_restarting_master() {
        let mut attempts = RETRY.start();
        let total: Duration = std::iter::from_fn(|| attempts.next_pause()).sum();
        assert!(total >= Duration::from_secs(5), "{total:?}");
    }
}
