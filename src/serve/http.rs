//! A small HTTP/1.1 server for `/health`, `/metrics` and `/status`: GET
//! only, one request per connection. Enough for probes and Prometheus
//! without a web framework.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

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
        Response { status, content_type: "text/plain; version=0.0.4", body }
    }
}

pub type Handler = Arc<dyn Fn(String) -> Pin<Box<dyn Future<Output = Response> + Send>> + Send + Sync>;

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

async fn serve_one(mut stream: TcpStream, handler: Handler) -> std::io::Result<()> {
    let mut buf = vec![0u8; 8192];
    let mut len = 0;
    while !buf[..len].windows(4).any(|w| w == b"\r\n\r\n") {
        if len == buf.len() {
            return Ok(());
        }
        let n = stream.read(&mut buf[len..]).await?;
        if n == 0 {
            return Ok(());
        }
        len += n;
    }
    let head = String::from_utf8_lossy(&buf[..len]);
    let mut parts = head.lines().next().unwrap_or_default().split_whitespace();
    let (method, path) = (parts.next().unwrap_or_default(), parts.next().unwrap_or("/"));
    let response = if method == "GET" {
        handler(path.split('?').next().unwrap_or("/").to_string()).await
    } else {
        Response::text(405, "only GET\n".into())
    };
    let header = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        response.status,
        reason(response.status),
        response.content_type,
        response.body.len()
    );
    stream.write_all(header.as_bytes()).await?;
    stream.write_all(response.body.as_bytes()).await?;
    stream.shutdown().await
}

/// Serves until `shutdown` resolves.
pub async fn serve(listener: TcpListener, handler: Handler, shutdown: impl Future<Output = ()>) {
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            accepted = listener.accept() => {
                if let Ok((stream, _)) = accepted {
                    let handler = handler.clone();
                    tokio::spawn(async move {
                        if let Err(err) = serve_one(stream, handler).await {
                            tracing::debug!(error = %err, "http connection failed");
                        }
                    });
                }
            }
        }
    }
}
