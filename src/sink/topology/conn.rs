//! The seam between the sink and the way Redis is deployed: one
//! [`Topology`] trait, implemented once per deployment — one node
//! ([`super::single::Single`]), a cluster ([`super::router::Router`],
//! in `cluster_io.rs`) and Sentinel ([`super::sentinel::Sentinel`]) —
//! and [`RedisConn`], the shared handle that hides which one it is.
//!
//! Only [`crate::sink::Sink::connect`] knows the three apart: it picks
//! one. Everything else asks the trait: how an atomic unit is sent, how
//! the writer's fence is armed, how keys are scanned, what INFO and
//! `run_id` say across masters, where a slot lives. The defaults are the
//! one-node answers, which Sentinel shares (a fail-over there only moves
//! the one master); the cluster overrides what its slots change.

use crate::retry::RetryPolicy;
use crate::sink::cluster_io::Scanned;
use crate::sink::{Fence, Sink, SinkError, Unit};
use futures::future::BoxFuture;
use redis::aio::ConnectionLike;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use std::sync::Arc;

/// A future of the seam, borrowing what it was given.
pub type Seam<'a, T> = BoxFuture<'a, Result<T, SinkError>>;

/// What differs between a single Redis, a Redis Cluster and Redis behind
/// Sentinel. Requests come first (what every connection does), then the
/// nodes, then writing and reading as the sink does them.
pub trait Topology: Send + Sync {
    /// `single`, `cluster` or `sentinel`, for logs.
    fn name(&self) -> &'static str;

    /// Sends one command where its key lives (any master when it names
    /// none), following the deployment while it changes.
    fn request<'a>(&'a self, cmd: &'a Cmd) -> RedisFuture<'a, Value>;

    /// Sends a plain pipeline's commands, replies in their order. Atomic
    /// pipelines only where one node holds every key (see [`Topology::send`]).
    fn pipeline<'a>(&'a self, pipe: &'a Pipeline, offset: usize, count: usize) -> RedisFuture<'a, Vec<Value>>;

    fn db(&self) -> i64 {
        0
    }

    /// Every live master's `host:port`, in address order: the one node,
    /// the master Sentinel names now, or the cluster's masters.
    fn masters(&self) -> Vec<String>;

    /// Sends `cmd` to the master at `addr` (one of [`Topology::masters`]),
    /// once.
    fn on_node<'a>(&'a self, addr: &'a str, cmd: &'a Cmd) -> RedisFuture<'a, Value>;

    /// Sends `pipe` as it is (an atomic one included) to the master at
    /// `addr` in one round trip.
    fn pipeline_on_node<'a>(&'a self, addr: &'a str, pipe: &'a Pipeline) -> RedisFuture<'a, Vec<Value>>;

    /// The master that holds `slot` now; `None` when no live master
    /// covers it.
    fn owner(&self, slot: u16) -> Option<String>;

    /// Whether a live master covers `key`'s slot: asked for every key a
    /// watcher batch writes, so it costs nothing where one node holds all.
    fn covers(&self, key: &[u8]) -> bool {
        let _ = key;
        true
    }

    /// The slots no live master covers, as ranges.
    fn uncovered(&self) -> Vec<(u16, u16)> {
        Vec::new()
    }

    /// A plain client of the master, for connections of their own
    /// (fenced transactions, pub/sub); `None` where `REDIS_URL`'s node
    /// serves.
    fn node_client(&self) -> Option<redis::Client> {
        None
    }

    /// After a failed request: finds out where the masters are now.
    fn follow_fail_over(&self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    /// Reads where the masters are now.
    fn refresh_masters(&self) -> BoxFuture<'_, redis::RedisResult<()>> {
        Box::pin(async { Ok(()) })
    }

    /// How requests are retried on this deployment.
    fn retry(&self) -> RetryPolicy {
        RetryPolicy::REDIS
    }

    /// What one atomic unit may cost Redis, out of `write_batch_cost`.
    fn unit_cost(&self, batch_cost: usize) -> usize {
        batch_cost
    }

    /// Whether one atomic unit may span keys of any slot (one node), so a
    /// batch's writes and its resume tokens can land together.
    fn spans_slots(&self) -> bool {
        true
    }

    /// Sends one idempotent atomic unit, fenced when `sink` is.
    fn send<'a>(&'a self, sink: &'a Sink, unit: Unit) -> Seam<'a, ()> {
        Box::pin(sink.send_transaction(unit))
    }

    /// Makes `fence`'s epoch refuse every older writer from now on,
    /// before the new writer's first write (nothing to do where the epoch
    /// key itself is watched).
    fn arm<'a>(&'a self, sink: &'a Sink, fence: &'a Fence) -> Seam<'a, ()> {
        let _ = (sink, fence);
        Box::pin(async { Ok(()) })
    }

    /// Sends every key matching `glob` into `found`, a batch at a time;
    /// `Scanned::Restart` voids the batches sent before it.
    fn scan<'a>(&'a self, sink: &'a Sink, glob: &'a str, found: tokio::sync::mpsc::Sender<Scanned>) -> Seam<'a, ()> {
        Box::pin(sink.scan_one_node(glob, found))
    }

    /// `INFO` of `sections` from every live master, with its address.
    fn infos<'a>(&'a self, sink: &'a Sink, sections: &'a [&'a str]) -> Seam<'a, Vec<(String, String)>> {
        Box::pin(sink.info_of_one_node(sections))
    }

    /// What changes when a server restarts or fails over: one node's
    /// `run_id`, or the cluster's masters' (see
    /// [`crate::sink::same_servers`]).
    fn run_id<'a>(&'a self, sink: &'a Sink) -> Seam<'a, String> {
        Box::pin(sink.run_id_of_one_node())
    }
}

/// The shared connection: whichever [`Topology`] `Sink::connect` chose,
/// as a `ConnectionLike` for plain commands and pipelines.
#[derive(Clone)]
pub struct RedisConn(Arc<dyn Topology>);

impl RedisConn {
    pub fn new(topology: Arc<dyn Topology>) -> RedisConn {
        RedisConn(topology)
    }

    /// One node through a reconnecting manager, for tools and tests.
    pub fn single(manager: redis::aio::ConnectionManager, client: redis::Client) -> RedisConn {
        RedisConn(Arc::new(super::single::Single::new(manager, client)))
    }

    /// A cluster connection through the node at `url` (no TLS), for
    /// tools and tests.
    pub async fn cluster(url: &str) -> redis::RedisResult<RedisConn> {
        use redis::IntoConnectionInfo;
        let info = url.into_connection_info()?;
        let router = super::router::Router::connect(info, "redis", None, Vec::new()).await?;
        Ok(RedisConn(Arc::new(router)))
    }

    pub fn topology(&self) -> &dyn Topology {
        &*self.0
    }
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.0.request(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.0.pipeline(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.0.db()
    }
}
