//! The HTTP endpoint on hyper: `/health/live`, `/health/ready` (and
//! `/health`), `/metrics` and `/status`, GET only, one request per
//! connection.
//!
//! Probes must be answered while clients misbehave, so the server bounds
//! what a client may hold:
//! - a request's headers must arrive within [`Limits::header_timeout`],
//!   and the whole exchange, writing included, must end within
//!   [`Limits::request_timeout`];
//! - at most [`Limits::max_connections`] are open at once. At the limit a
//!   new connection evicts the oldest one that has not yet sent a complete
//!   request (half-open or slow clients), so 2,000 idle sockets cannot
//!   keep a readiness probe out; if every slot is serving a request, the
//!   new connection is closed at once;
//! - an accept error (file descriptors exhausted, say) pauses accepting
//!   for 100 ms instead of spinning.

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use indexmap::IndexMap;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::AbortHandle;

/// A response: status code, content type, body.
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: String,
}

impl Response {
    pub fn json(status: u16, value: &serde_json::Value) -> Response {
        Response { status, content_type: "application/json", body: value.to_string() }
    }

    pub fn text(status: u16, body: String) -> Response {
        Response { status, content_type: "text/plain; charset=utf-8", body }
    }
}

pub type Handler = Arc<dyn Fn(String) -> Pin<Box<dyn Future<Output = Response> + Send>> + Send + Sync>;

/// What one client may hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub request_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: 256,
            header_timeout: Duration::from_secs(5),
            request_timeout: Duration::from_secs(15),
        }
    }
}

/// Open connections in accept order, with whether each has sent a
/// complete request yet.
#[derive(Default)]
struct Table {
    next_id: u64,
    open: IndexMap<u64, (AbortHandle, bool)>,
}

type SharedTable = Arc<Mutex<Table>>;

fn lock(table: &SharedTable) -> std::sync::MutexGuard<'_, Table> {
    table.lock().unwrap_or_else(|e| e.into_inner())
}

/// Removes its connection from the table however the task ends (done,
/// timed out or aborted).
struct Slot {
    table: SharedTable,
    id: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        lock(&self.table).open.shift_remove(&self.id);
    }
}

/// Makes room for one more connection: `false` when every open one is
/// serving a request.
fn make_room(table: &mut Table, max: usize) -> bool {
    while table.open.len() >= max {
        let Some(idle) = table.open.iter().find(|(_, (_, busy))| !busy).map(|(id, _)| *id) else {
            return false;
        };
        if let Some((abort, _)) = table.open.shift_remove(&idle) {
            abort.abort();
        }
    }
    true
}

async fn respond(handler: Handler, req: Request<Incoming>) -> Result<hyper::Response<Full<Bytes>>, Infallible> {
    let response = if req.method() == Method::GET {
        handler(req.uri().path().to_string()).await
    } else {
        Response::text(405, "only GET\n".into())
    };
    let status = StatusCode::from_u16(response.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut out = hyper::Response::new(Full::new(Bytes::from(response.body)));
    *out.status_mut() = status;
    out.headers_mut()
        .insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(response.content_type));
    if status == StatusCode::METHOD_NOT_ALLOWED {
        out.headers_mut().insert(hyper::header::ALLOW, hyper::header::HeaderValue::from_static("GET"));
    }
    Ok(out)
}

/// Serves until `shutdown` resolves.
pub async fn serve(listener: TcpListener, handler: Handler, limits: Limits, shutdown: impl Future<Output = ()>) {
    let table: SharedTable = Arc::default();
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(false)
        .max_buf_size(16 * 1024);
    let builder = Arc::new(builder);
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(err) => {
                    tracing::warn!(error = %err, "http accept failed; pausing accepts for 100 ms");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let mut t = lock(&table);
        if !make_room(&mut t, limits.max_connections.max(1)) {
            tracing::debug!("http connection limit reached with every connection busy; closing the new one");
            continue;
        }
        let id = t.next_id;
        t.next_id += 1;
        let slot = Slot { table: table.clone(), id };
        let (handler, builder, busy_table) = (handler.clone(), builder.clone(), table.clone());
        let task = tokio::spawn(async move {
            let _slot = slot;
            let service = hyper::service::service_fn(move |req| {
                // A complete request: this connection may no longer be
                // evicted for a newcomer.
                if let Some(entry) = lock(&busy_table).open.get_mut(&id) {
                    entry.1 = true;
                }
                respond(handler.clone(), req)
            });
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(limits.request_timeout, conn).await {
                Ok(Err(err)) => tracing::debug!(error = %err, "http connection failed"),
                Err(_) => tracing::debug!("http connection timed out"),
                Ok(Ok(())) => {}
            }
        });
        t.open.insert(id, (task.abort_handle(), false));
    }
    for (_, (abort, _)) in lock(&table).open.drain(..) {
        abort.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_oldest_idle_connection_makes_room() {
        let mut table = Table::default();
        for (id, busy) in [(1, true), (2, false), (3, false)] {
            let task = tokio::spawn(std::future::pending::<()>());
            table.open.insert(id, (task.abort_handle(), busy));
        }
        assert!(make_room(&mut table, 3));
        assert_eq!(table.open.keys().copied().collect::<Vec<_>>(), vec![1, 3]);
        table.open.get_mut(&3).unwrap().1 = true;
        assert!(!make_room(&mut table, 2), "every slot busy: the newcomer is refused");
    }
}
