//! A TCP proxy inside the test, between cachewright and a real server: it
//! forwards bytes both ways and, on command, stalls (holds every byte
//! while the sockets stay open, as a stalled network does) or cuts (drops
//! every connection and refuses new ones). The server keeps running with
//! its data throughout.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

struct State {
    target: u16,
    stalled: watch::Sender<bool>,
    /// Bumped on every cut; connections older than it close.
    generation: watch::Sender<u64>,
    refusing: AtomicBool,
    /// Stall as soon as the client sends these bytes.
    stall_on: std::sync::Mutex<Option<Vec<u8>>>,
    /// Hold the one connection whose client sends these bytes.
    hold_on: std::sync::Mutex<Option<Vec<u8>>>,
    /// Whether that connection's bytes are held now.
    holding: watch::Sender<bool>,
    /// What the server answered on the held connection, once released.
    held_replies: std::sync::Mutex<Vec<u8>>,
    /// The id of the held connection (ids count from 1).
    held_id: AtomicU64,
    next_id: AtomicU64,
    /// Bytes from clients, forwarded or held.
    from_clients: AtomicU64,
    accepted: AtomicU64,
    /// Connections forwarding now (closed ones are gone from it).
    open: AtomicU64,
}

pub struct Proxy {
    pub port: u16,
    state: Arc<State>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Starts a proxy to `127.0.0.1:target` on a free loopback port.
    pub async fn start(target: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let port = listener.local_addr().expect("addr").port();
        let state = Arc::new(State {
            target,
            stalled: watch::channel(false).0,
            generation: watch::channel(0).0,
            refusing: AtomicBool::new(false),
            stall_on: std::sync::Mutex::new(None),
            hold_on: std::sync::Mutex::new(None),
            holding: watch::channel(false).0,
            held_replies: std::sync::Mutex::new(Vec::new()),
            held_id: AtomicU64::new(0),
            next_id: AtomicU64::new(1),
            from_clients: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            open: AtomicU64::new(0),
        });
        let task = {
            let state = state.clone();
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    if state.refusing.load(Ordering::SeqCst) {
                        drop(client);
                        continue;
                    }
                    state.accepted.fetch_add(1, Ordering::SeqCst);
                    tokio::spawn(connection(client, state.clone()));
                }
            })
        };
        Proxy { port, state, task }
    }

    pub fn redis_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn mongo_uri(&self) -> String {
        format!("mongodb://127.0.0.1:{}/?directConnection=true", self.port)
    }

    /// Holds every byte in both directions until [`Proxy::resume`].
    pub fn stall(&self) {
        self.state.stalled.send_replace(true);
    }

    /// Stalls as soon as a client sends `pattern`: the bytes carrying it
    /// are held too.
    pub fn stall_on(&self, pattern: &[u8]) {
        *self.state.stall_on.lock().unwrap() = Some(pattern.to_vec());
    }

    /// Holds the one connection whose client sends `pattern` next (the
    /// bytes carrying it included) until [`Proxy::release_held`], as a
    /// network that delays one request does; every other connection,
    /// new ones included, flows on.
    pub fn hold_on(&self, pattern: &[u8]) {
        *self.state.hold_on.lock().unwrap() = Some(pattern.to_vec());
    }

    /// Waits until a connection is held (after [`Proxy::hold_on`]).
    pub async fn wait_held(&self) {
        let mut rx = self.state.holding.subscribe();
        let _ = rx.wait_for(|h| *h).await;
    }

    /// Delivers the held connection's bytes, and lets it flow on.
    pub fn release_held(&self) {
        self.state.holding.send_replace(false);
    }

    /// What the server has answered on the held connection so far
    /// (recorded even when its client is gone).
    pub fn held_replies(&self) -> Vec<u8> {
        self.state.held_replies.lock().unwrap().clone()
    }

    pub fn is_stalled(&self) -> bool {
        *self.state.stalled.borrow()
    }

    /// Waits until the proxy stalled (after [`Proxy::stall_on`]).
    pub async fn wait_stalled(&self) {
        let mut rx = self.state.stalled.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    pub fn resume(&self) {
        self.state.stalled.send_replace(false);
    }

    /// Drops every connection; with `refuse`, new ones are closed at once
    /// until [`Proxy::heal`].
    pub fn cut(&self, refuse: bool) {
        self.state.refusing.store(refuse, Ordering::SeqCst);
        self.state.generation.send_modify(|g| *g += 1);
    }

    pub fn heal(&self) {
        self.state.refusing.store(false, Ordering::SeqCst);
        self.state.stalled.send_replace(false);
    }

    pub fn bytes_from_clients(&self) -> u64 {
        self.state.from_clients.load(Ordering::SeqCst)
    }

    pub fn connections_accepted(&self) -> u64 {
        self.state.accepted.load(Ordering::SeqCst)
    }

    pub fn connections_open(&self) -> u64 {
        self.state.open.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
        self.cut(true);
    }
}

async fn connection(client: TcpStream, state: Arc<State>) {
    let Ok(server) = TcpStream::connect(("127.0.0.1", state.target)).await else { return };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let born = *state.generation.borrow();
    let id = state.next_id.fetch_add(1, Ordering::SeqCst);
    state.open.fetch_add(1, Ordering::SeqCst);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let up = pump(client_read, server_write, state.clone(), born, id, true);
    let down = pump(server_read, client_write, state.clone(), born, id, false);
    tokio::pin!(up, down);
    tokio::select! {
        // The client is gone (its end closed after what it sent): as TCP
        // would, the server still gets it all and answers, for a while.
        _ = &mut up => {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), &mut down).await;
        }
        _ = &mut down => {}
    }
    state.open.fetch_sub(1, Ordering::SeqCst);
}

/// Copies one direction until EOF, an error, or a cut.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    state: Arc<State>,
    born: u64,
    id: u64,
    from_client: bool,
) {
    let mut generation = state.generation.subscribe();
    let mut buf = vec![0u8; 64 * 1024];
    let mut tail: Vec<u8> = Vec::new();
    let mut held_tail: Vec<u8> = Vec::new();
    let mut held = false;
    loop {
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            _ = generation.wait_for(|g| *g != born) => return,
        };
        if from_client {
            state.from_clients.fetch_add(n as u64, Ordering::SeqCst);
            let pattern = state.stall_on.lock().unwrap().clone();
            if let Some(pattern) = pattern {
                // Look across the chunk boundary too.
                tail.extend_from_slice(&buf[..n]);
                if tail.windows(pattern.len()).any(|w| w == pattern.as_slice()) {
                    *state.stall_on.lock().unwrap() = None;
                    state.stalled.send_replace(true);
                }
                let keep = tail.len().saturating_sub(pattern.len());
                tail.drain(..keep);
            }
            let pattern = state.hold_on.lock().unwrap().clone();
            if let Some(pattern) = pattern {
                held_tail.extend_from_slice(&buf[..n]);
                if held_tail.windows(pattern.len()).any(|w| w == pattern.as_slice()) {
                    *state.hold_on.lock().unwrap() = None;
                    state.held_id.store(id, Ordering::SeqCst);
                    state.holding.send_replace(true);
                    held = true;
                }
                let keep = held_tail.len().saturating_sub(pattern.len());
                held_tail.drain(..keep);
            }
        }
        if !from_client && state.held_id.load(Ordering::SeqCst) == id {
            state.held_replies.lock().unwrap().extend_from_slice(&buf[..n]);
        }
        if held {
            let mut holding = state.holding.subscribe();
            tokio::select! {
                _ = holding.wait_for(|h| !*h) => held = false,
                _ = generation.wait_for(|g| *g != born) => return,
            }
        }
        let mut stalled = state.stalled.subscribe();
        tokio::select! {
            _ = stalled.wait_for(|s| !*s) => {}
            _ = generation.wait_for(|g| *g != born) => return,
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
