//! One Redis, through a reconnecting manager: every default of the seam
//! is the one-node answer, so this only says how to reach the node.

use super::conn::Topology;
use redis::aio::{ConnectionLike, ConnectionManager};
use redis::{Cmd, Pipeline, RedisFuture, Value};

pub struct Single {
    manager: ConnectionManager,
    client: redis::Client,
    /// `host:port` (or the socket path) of the node, for reports.
    addr: String,
}

impl Single {
    pub fn new(manager: ConnectionManager, client: redis::Client) -> Single {
        let addr = client.get_connection_info().addr().to_string();
        Single { manager, client, addr }
    }
}

impl Topology for Single {
    fn name(&self) -> &'static str {
        "single"
    }

    fn request<'a>(&'a self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        // The manager is a handle on one shared connection: a clone per
        // request costs a reference count.
        let mut manager = self.manager.clone();
        Box::pin(async move { manager.req_packed_command(cmd).await })
    }

    fn pipeline<'a>(&'a self, pipe: &'a Pipeline, offset: usize, count: usize) -> RedisFuture<'a, Vec<Value>> {
        let mut manager = self.manager.clone();
        Box::pin(async move { manager.req_packed_commands(pipe, offset, count).await })
    }

    fn db(&self) -> i64 {
        self.manager.get_db()
    }

    fn masters(&self) -> Vec<String> {
        vec![self.addr.clone()]
    }

    fn owner(&self, _slot: u16) -> Option<String> {
        Some(self.addr.clone())
    }

    fn on_node<'a>(&'a self, _addr: &'a str, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.request(cmd)
    }

    fn pipeline_on_node<'a>(&'a self, _addr: &'a str, pipe: &'a Pipeline) -> RedisFuture<'a, Vec<Value>> {
        let mut manager = self.manager.clone();
        Box::pin(async move { pipe.query_async(&mut manager).await })
    }

    fn node_client(&self) -> Option<redis::Client> {
        Some(self.client.clone())
    }

    /// On a connection of the scan's own: nothing else shares it, so the
    /// pages need no connection task and parse with the raw reader.
    fn scan<'a>(
        &'a self,
        sink: &'a crate::sink::Sink,
        glob: &'a str,
        found: tokio::sync::mpsc::Sender<crate::sink::cluster_io::Scanned>,
    ) -> super::conn::Seam<'a, ()> {
        Box::pin(sink.scan_own_connection(glob, found))
    }
}
