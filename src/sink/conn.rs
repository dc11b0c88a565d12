//! The shared connection: a single Redis (through a reconnecting
//! manager) or a Redis Cluster (through the cluster client, which routes
//! each command to the master of its key's slot and follows `MOVED` and
//! `ASK` while slots move).

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// Reads in flight at once when a plain pipeline is spread over a
/// cluster's masters.
const SPREAD: usize = 64;

#[derive(Clone)]
pub enum RedisConn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl RedisConn {
    pub fn is_cluster(&self) -> bool {
        matches!(self, RedisConn::Cluster(_))
    }
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConn::Single(c) => c.req_packed_command(cmd),
            RedisConn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    /// A plain (non-atomic) pipeline over keys of many slots cannot go to
    /// one node of a cluster: its commands are sent one by one, each to
    /// its key's master, many at once, and the replies kept in order.
    /// Atomic pipelines never come here on a cluster: writes go through
    /// [`super::Sink::send`], which cuts them by slot.
    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConn::Cluster(c) if offset == 0 && count == pipeline.len() => {
                let conn = c.clone();
                Box::pin(spread(conn, pipeline))
            }
            RedisConn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Single(c) => c.get_db(),
            RedisConn::Cluster(_) => 0,
        }
    }
}

async fn spread(conn: ClusterConnection, pipeline: &Pipeline) -> redis::RedisResult<Vec<Value>> {
    use futures::{StreamExt, TryStreamExt};
    // Owned commands: the stream's futures outlive no borrow.
    let commands: Vec<Cmd> = pipeline.cmd_iter().cloned().collect();
    futures::stream::iter(commands)
        .map(move |cmd| {
            let mut conn = conn.clone();
            async move { conn.req_packed_command(&cmd).await }
        })
        .buffered(SPREAD)
        .try_collect()
        .await
}
