//! A TCP forwarder the watcher benchmark puts between the watcher and
//! MongoDB. While it holds, the watcher's requests wait in it (its
//! sockets stay open, as on a slow network) and a backlog builds up in
//! the change streams; once released, the watcher drains that backlog at
//! its own pace, not at the pace MongoDB took the writes.

use crate::tasks::{Owned, spawn};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

pub struct Hold {
    port: u16,
    /// `true` while bytes flow; dropping it ends every connection.
    flowing: watch::Sender<bool>,
    _accept: Owned<()>,
}

impl Hold {
    /// Listens on a free loopback port and forwards every connection to
    /// `host:port`.
    pub async fn start(host: String, port: u16) -> std::io::Result<Hold> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let local = listener.local_addr()?.port();
        let flowing = watch::channel(true).0;
        let accept = {
            let flowing = flowing.clone();
            spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let (host, flowing) = (host.clone(), flowing.subscribe());
                    // Each connection ends with its sockets, or when the
                    // `Hold` is dropped and its gate closes.
                    tokio::spawn(async move {
                        let Ok(server) = TcpStream::connect((host.as_str(), port)).await else { return };
                        let _ = (client.set_nodelay(true), server.set_nodelay(true));
                        let ((client_in, client_out), (server_in, server_out)) =
                            (client.into_split(), server.into_split());
                        tokio::join!(
                            forward(client_in, server_out, flowing.clone()),
                            forward(server_in, client_out, flowing)
                        );
                    });
                }
            })
        };
        Ok(Hold { port: local, flowing, _accept: accept })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// Holds every byte, both ways, until [`Hold::release`].
    pub fn hold(&self) {
        self.flowing.send_replace(false);
    }

    pub fn release(&self) {
        self.flowing.send_replace(true);
    }
}

/// Copies one direction until either end closes; a chunk read while the
/// gate is shut is written once it opens.
async fn forward(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut flowing: watch::Receiver<bool>) {
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(n @ 1..) = from.read(&mut buf).await {
        if flowing.wait_for(|open| *open).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

/// A URI's parts around its one host: `(before, host, port, after)`.
/// `None` for what one forwarder cannot stand in for: several hosts, a
/// DNS seed list, TLS, an IPv6 literal.
fn parts(uri: &str) -> Option<(&str, &str, u16, &str)> {
    let rest = uri.strip_prefix("mongodb://")?;
    let lower = uri.to_ascii_lowercase();
    if lower.contains("tls=true") || lower.contains("ssl=true") {
        return None;
    }
    let (authority, tail) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    let (auth, host) = match authority.rfind('@') {
        Some(at) => authority.split_at(at + 1),
        None => ("", authority),
    };
    if host.contains(',') || host.starts_with('[') {
        return None;
    }
    match host.rsplit_once(':') {
        Some((name, port)) => Some((auth, name, port.parse().ok()?, tail)),
        None => Some((auth, host, 27017, tail)),
    }
}

/// The host and port `uri` names, when one forwarder can stand in for it.
pub fn target(uri: &str) -> Option<(String, u16)> {
    parts(uri).map(|(_, host, port, _)| (host.to_string(), port))
}

/// `uri` pointed at a forwarder on `127.0.0.1:port`, with a direct
/// connection asked for: else the driver would follow the replica set's
/// own member address around the forwarder.
pub fn through(uri: &str, port: u16) -> Option<String> {
    let (auth, _, _, tail) = parts(uri)?;
    let tail = if tail.contains("directConnection=") {
        tail.to_string()
    } else if tail.contains('?') {
        format!("{tail}&directConnection=true")
    } else {
        format!("{}?directConnection=true", if tail.is_empty() { "/" } else { tail })
    };
    Some(format!("mongodb://{auth}127.0.0.1:{port}{tail}"))
}

#[cfg(test)]
mod tests {
    use super::{target, through};

    #[test]
    fn the_uri_points_at_the_forwarder() {
        let uri = "mongodb://db.local:27117/?directConnection=true";
        assert_eq!(target(uri), Some(("db.local".into(), 27117)));
        assert_eq!(through(uri, 4000).unwrap(), "mongodb://127.0.0.1:4000/?directConnection=true");
        let uri = "mongodb://u:p@mongo/app?w=1";
        assert_eq!(target(uri), Some(("mongo".into(), 27017)));
        assert_eq!(through(uri, 4000).unwrap(), "mongodb://u:p@127.0.0.1:4000/app?w=1&directConnection=true");
        assert_eq!(through("mongodb://h:1", 4000).unwrap(), "mongodb://127.0.0.1:4000/?directConnection=true");
        for unsupported in
            ["mongodb://a:1,b:2/?replicaSet=rs", "mongodb+srv://cluster.example.com", "mongodb://h:1/?tls=true"]
        {
            assert_eq!(target(unsupported), None, "{unsupported}");
        }
    }

    /// Bytes sent while the forwarder holds arrive once it releases.
    #[tokio::test]
    async fn holds_and_releases() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let server = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let target = server.local_addr().unwrap().port();
        let hold = super::Hold::start("127.0.0.1".into(), target).await.unwrap();
        let mut client = tokio::net::TcpStream::connect(("127.0.0.1", hold.port())).await.unwrap();
        let (mut accepted, _) = server.accept().await.unwrap();
        hold.hold();
        client.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        let early = tokio::time::timeout(std::time::Duration::from_millis(200), accepted.read(&mut buf)).await;
        assert!(early.is_err(), "nothing passes while held");
        hold.release();
        accepted.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
    }
}
