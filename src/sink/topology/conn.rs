//! The shared connection: a single Redis (through a reconnecting
//! manager) or a Redis Cluster (through [`Router`], which sends each
//! command to the master of its key's slot and follows the cluster while
//! slots move).

use crate::sink::router::Router;
use crate::sink::sentinel::Sentinel;
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{Cmd, Pipeline, RedisFuture, Value};
use std::sync::Arc;

/// Reads in flight at once when a plain pipeline is spread over a
/// cluster's masters.
const SPREAD: usize = 64;

#[derive(Clone)]
pub enum RedisConn {
    Single(ConnectionManager),
    Cluster(Arc<Router>),
    /// One master found through Sentinel, followed across fail-overs.
    Sentinel(Arc<Sentinel>),
}

impl RedisConn {
    pub fn is_cluster(&self) -> bool {
        matches!(self, RedisConn::Cluster(_))
    }

    /// After a failed request: behind Sentinel, asks the sentinels where
    /// the master is now (the next attempt goes there).
    pub async fn follow_fail_over(&self) {
        if let RedisConn::Sentinel(sentinel) = self {
            let _ = sentinel.refresh().await;
        }
    }

    /// A cluster connection through the node at `url` (no TLS), for
    /// tools and tests.
    pub async fn cluster(url: &str) -> redis::RedisResult<RedisConn> {
        use redis::IntoConnectionInfo;
        let info = url.into_connection_info()?;
        Ok(RedisConn::Cluster(Arc::new(Router::connect(info, "redis", None, Vec::new()).await?)))
    }
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            RedisConn::Single(c) => c.req_packed_command(cmd),
            RedisConn::Cluster(router) => Box::pin(router.request(cmd)),
            RedisConn::Sentinel(sentinel) => Box::pin(sentinel.request(cmd)),
        }
    }

    /// A plain (non-atomic) pipeline over keys of many slots cannot go to
    /// one node of a cluster: its commands are sent each to its key's
    /// master, slots concurrently and one slot's commands in order, and
    /// the replies kept in the pipeline's order.
    /// Atomic pipelines never come here on a cluster: writes go through
    /// [`crate::sink::Sink::send`], which cuts them by slot.
    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            RedisConn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            RedisConn::Sentinel(sentinel) => Box::pin(sentinel.pipeline(pipeline, offset, count)),
            RedisConn::Cluster(router) if offset == 0 && count == pipeline.len() => {
                Box::pin(spread(router.clone(), pipeline))
            }
            RedisConn::Cluster(_) => Box::pin(async {
                Err((
                    redis::ErrorKind::Client,
                    "an atomic pipeline over a cluster must be cut by slot (Sink::send does)",
                )
                    .into())
            }),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            RedisConn::Single(c) => c.get_db(),
            RedisConn::Cluster(_) => 0,
            RedisConn::Sentinel(sentinel) => sentinel.db(),
        }
    }
}

async fn spread(router: Arc<Router>, pipeline: &Pipeline) -> redis::RedisResult<Vec<Value>> {
    use futures::{StreamExt, TryStreamExt};
    // Commands on one slot keep their order (a `DEL` then a `SET` of one
    // key must not swap); slots run concurrently. Owned commands: the
    // stream's futures outlive no borrow.
    let mut by_slot: indexmap::IndexMap<Option<u16>, Vec<(usize, Cmd)>> = indexmap::IndexMap::new();
    for (i, cmd) in pipeline.cmd_iter().enumerate() {
        by_slot.entry(crate::sink::router::command_slot(cmd)).or_default().push((i, cmd.clone()));
    }
    let answered: Vec<Vec<(usize, Value)>> = futures::stream::iter(by_slot.into_values())
        .map(move |commands| {
            let router = router.clone();
            async move {
                let mut replies = Vec::with_capacity(commands.len());
                for (i, cmd) in commands {
                    replies.push((i, router.request(&cmd).await?));
                }
                Ok::<_, redis::RedisError>(replies)
            }
        })
        .buffer_unordered(SPREAD)
        .try_collect()
        .await?;
    let mut replies = vec![Value::Nil; pipeline.len()];
    for (i, value) in answered.into_iter().flatten() {
        replies[i] = value;
    }
    Ok(replies)
}
