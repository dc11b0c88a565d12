//! The fenced writer's own connections: one task at a time each, so a
//! request is written and its replies read by the task that sends it.
//!
//! The driver's multiplexed connection hands every request to a task of
//! its own through a channel, and parses every reply with a general
//! streaming parser into a boxed partial state. For the fenced frame
//! (`MULTI`, a few hundred commands, `EXEC`, `WATCH`, `GET`) that was
//! about a tenth of a warm 58K rebuild's CPU (the codec 5.9%, the
//! connection's task 3.4%): two replies a command (`QUEUED`, then its
//! place in `EXEC`'s array), each parsed through the parser's layers,
//! and a wake-up of the connection's task and then of the sender for
//! every batch. A
//! fenced connection is exclusive anyway (its `WATCH` is its own), so
//! here the sending task writes the packed frame and reads the replies
//! itself, with a reader for the RESP2 replies these requests get.
//!
//! Only plain TCP with RESP2 goes this way; TLS, Unix sockets and RESP3
//! keep the driver's connection ([`Exclusive::Driver`]). Both answer
//! through [`ConnectionLike`], with the values the driver would give: the
//! reader is held to the driver's parser by a unit test.

use crate::sink::timed_out;
use redis::aio::ConnectionLike;
use redis::{Cmd, ConnectionAddr, Pipeline, ProtocolVersion, RedisError, RedisFuture, RedisResult, Value};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A connection the fenced writer holds alone.
pub enum Exclusive {
    /// This module's connection: plain TCP, RESP2.
    Raw(RawConn),
    /// The driver's, for what the raw one does not speak.
    Driver(redis::aio::MultiplexedConnection),
}

impl Exclusive {
    /// Connects to `client`'s node, raw where its address and protocol
    /// allow it. `timeout` bounds each request, as the driver's response
    /// timeout does.
    pub async fn connect(client: &redis::Client, timeout: Duration) -> RedisResult<Exclusive> {
        let info = client.get_connection_info();
        if let Some((host, port)) = raw_address(info) {
            return Ok(Exclusive::Raw(RawConn::connect(host, port, info.redis_settings(), timeout).await?));
        }
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(CONNECT_TIMEOUT))
            .set_response_timeout(Some(timeout));
        Ok(Exclusive::Driver(client.get_multiplexed_async_connection_with_config(&config).await?))
    }
}

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Where the raw connection may go: plain TCP spoken in RESP2.
fn raw_address(info: &redis::ConnectionInfo) -> Option<(&str, u16)> {
    match (info.addr(), info.redis_settings().protocol()) {
        (ConnectionAddr::Tcp(host, port), ProtocolVersion::RESP2) => Some((host, *port)),
        _ => None,
    }
}

impl ConnectionLike for Exclusive {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Exclusive::Raw(raw) => Box::pin(async move {
                let mut replies = raw.request(&cmd.get_packed_command(), 1).await?;
                replies.pop().ok_or_else(|| protocol_error("no reply"))
            }),
            Exclusive::Driver(conn) => conn.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Exclusive::Raw(raw) => Box::pin(async move {
                let replies = raw.request(&pipeline.get_packed_pipeline(), offset + count).await?;
                kept_replies(pipeline.is_transaction(), offset, replies)
            }),
            Exclusive::Driver(conn) => conn.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Exclusive::Raw(raw) => raw.db,
            Exclusive::Driver(conn) => conn.get_db(),
        }
    }
}

/// The replies a pipeline's caller gets, as the driver hands them over:
/// the `offset` first skipped, the rest as they came (a transaction's
/// `EXEC` array stays whole; `Pipeline::query_async` unpacks it). An
/// error among a transaction's skipped replies (a command refused while
/// queued) fails the request, as the driver's does.
fn kept_replies(transaction: bool, offset: usize, mut replies: Vec<Value>) -> RedisResult<Vec<Value>> {
    if transaction
        && let Some(Value::ServerError(err)) =
            replies[..offset.min(replies.len())].iter().find(|r| matches!(r, Value::ServerError(_)))
    {
        return Err(err.clone().into());
    }
    Ok(replies.split_off(offset.min(replies.len())))
}

/// A plain TCP connection speaking RESP2, used by one task at a time.
pub struct RawConn {
    stream: TcpStream,
    /// Bytes read and not yet taken, from `taken` on.
    buf: Vec<u8>,
    taken: usize,
    timeout: Duration,
    db: i64,
    /// A request failed part way (timed out, cut, unreadable): what
    /// arrives next cannot be matched to a request, so none is sent.
    broken: bool,
}

impl RawConn {
    async fn connect(
        host: &str,
        port: u16,
        settings: &redis::RedisConnectionInfo,
        timeout: Duration,
    ) -> RedisResult<RawConn> {
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect((host, port)))
            .await
            .map_err(|_| timed_out())??;
        stream.set_nodelay(true)?;
        let mut conn =
            RawConn { stream, buf: Vec::with_capacity(16 * 1024), taken: 0, timeout, db: settings.db(), broken: false };
        let mut hello = Pipeline::new();
        if let Some(password) = settings.password() {
            let auth = hello.cmd("AUTH");
            if let Some(user) = settings.username() {
                auth.arg(user);
            }
            auth.arg(password);
        }
        if settings.db() != 0 {
            hello.cmd("SELECT").arg(settings.db());
        }
        let count = hello.cmd_iter().count();
        if count > 0 {
            for reply in conn.request(&hello.get_packed_pipeline(), count).await? {
                if let Value::ServerError(err) = reply {
                    return Err(err.into());
                }
            }
        }
        Ok(conn)
    }

    /// Writes `packed` and reads its `count` replies, an error reply
    /// among them as the driver gives it (`Value::ServerError`).
    async fn request(&mut self, packed: &[u8], count: usize) -> RedisResult<Vec<Value>> {
        if self.broken {
            return Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the connection failed during an earlier request",
            )));
        }
        self.broken = true;
        let timeout = self.timeout;
        let replies = tokio::time::timeout(timeout, self.exchange(packed, count)).await.map_err(|_| timed_out())??;
        self.broken = false;
        Ok(replies)
    }

    async fn exchange(&mut self, packed: &[u8], count: usize) -> RedisResult<Vec<Value>> {
        self.stream.write_all(packed).await?;
        let mut replies = Vec::with_capacity(count);
        while replies.len() < count {
            match reply(&self.buf[self.taken..], 0)? {
                Some((value, used)) => {
                    self.taken += used;
                    replies.push(value);
                }
                None => self.fill().await?,
            }
        }
        Ok(replies)
    }

    /// Reads more bytes after those not taken yet.
    async fn fill(&mut self) -> RedisResult<()> {
        if self.taken > 0 {
            self.buf.drain(..self.taken);
            self.taken = 0;
        }
        if self.buf.capacity() - self.buf.len() < 4096 {
            self.buf.reserve(self.buf.len().max(16 * 1024));
        }
        match self.stream.read_buf(&mut self.buf).await? {
            0 => Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::ConnectionReset,
                "Redis closed the connection",
            ))),
            _ => Ok(()),
        }
    }
}

fn protocol_error(what: &'static str) -> RedisError {
    RedisError::from((redis::ErrorKind::Parse, "unreadable reply from Redis", what.to_string()))
}

/// Nesting a reply may have: these requests get two levels at most.
const MAX_DEPTH: usize = 16;

/// The RESP2 reply at the start of `buf` and the bytes it takes; `None`
/// while it has not all arrived.
fn reply(buf: &[u8], depth: usize) -> RedisResult<Option<(Value, usize)>> {
    if depth > MAX_DEPTH {
        return Err(protocol_error("a reply nested too deep"));
    }
    let Some(end) = line_end(buf)? else { return Ok(None) };
    let (line, next) = (&buf[1..end], end + 2);
    let value = match buf[0] {
        b'+' if line == b"OK" => Value::Okay,
        b'+' => {
            Value::SimpleString(String::from_utf8(line.to_vec()).map_err(|_| protocol_error("a status not in UTF-8"))?)
        }
        // Rare, and the driver's parser knows every error code's kind.
        b'-' => redis::parse_redis_value(&buf[..next])?,
        b':' => Value::Int(number(line)?),
        b'$' => {
            let Ok(len) = usize::try_from(number(line)?) else { return Ok(Some((Value::Nil, next))) };
            let Some(body) = buf.get(next..next + len + 2) else { return Ok(None) };
            if &body[len..] != b"\r\n" {
                return Err(protocol_error("a bulk string without its end"));
            }
            return Ok(Some((Value::BulkString(body[..len].to_vec()), next + len + 2)));
        }
        b'*' => {
            let Ok(len) = usize::try_from(number(line)?) else { return Ok(Some((Value::Nil, next))) };
            // Room for what has arrived at most, however long it says.
            let mut items = Vec::with_capacity(len.min(buf.len() / 4));
            let mut at = next;
            for _ in 0..len {
                let Some((item, used)) = reply(&buf[at..], depth + 1)? else { return Ok(None) };
                items.push(item);
                at += used;
            }
            return Ok(Some((Value::Array(items), at)));
        }
        _ => return Err(protocol_error("a reply of a type RESP2 does not have")),
    };
    Ok(Some((value, next)))
}

/// Where the first line's `\r\n` starts, once it has arrived.
fn line_end(buf: &[u8]) -> RedisResult<Option<usize>> {
    match buf.iter().position(|&b| b == b'\r') {
        None => Ok(None),
        Some(at) => match buf.get(at + 1) {
            None => Ok(None),
            Some(b'\n') => Ok(Some(at)),
            Some(_) => Err(protocol_error("a line without its end")),
        },
    }
}

fn number(digits: &[u8]) -> RedisResult<i64> {
    std::str::from_utf8(digits).ok().and_then(|text| text.parse().ok()).ok_or_else(|| protocol_error("not a number"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replies of every shape these connections meet, and some they do
    /// not, read here and by the driver's parser: the same values.
    #[test]
    fn replies_read_as_the_driver_reads_them() {
        let replies: &[&[u8]] = &[
            b"+OK\r\n",
            b"+QUEUED\r\n",
            b"+PONG\r\n",
            b"-ERR wrong number of arguments for 'set' command\r\n",
            b"-EXECABORT Transaction discarded because of previous errors.\r\n",
            b"-NOSCRIPT No matching script. Please use EVAL.\r\n",
            b"-READONLY You can't write against a read only replica.\r\n",
            b"-DRIFTED app:tag:list:t1 LLEN 3\r\n",
            b":0\r\n",
            b":-17\r\n",
            b":9223372036854775807\r\n",
            b"$-1\r\n",
            b"$0\r\n\r\n",
            b"$5\r\nhello\r\n",
            b"$4\r\na\r\nb\r\n",
            b"*-1\r\n",
            b"*0\r\n",
            b"*3\r\n+OK\r\n:1\r\n$2\r\n42\r\n",
            b"*2\r\n*2\r\n+OK\r\n-ERR inner\r\n$-1\r\n",
        ];
        for bytes in replies {
            let driver = redis::parse_redis_value(bytes).unwrap();
            let (ours, used) = reply(bytes, 0).unwrap().expect("complete");
            assert_eq!(ours, driver, "{}", String::from_utf8_lossy(bytes));
            assert_eq!(used, bytes.len());
            // Every shorter prefix is incomplete, never an error or a value.
            for cut in 0..bytes.len() {
                assert!(
                    reply(&bytes[..cut], 0).unwrap().is_none(),
                    "{:?} cut at {cut}",
                    String::from_utf8_lossy(bytes)
                );
            }
        }
    }

    /// Plain TCP in RESP2 goes raw (what every fault test through a
    /// proxy then runs through); TLS, a Unix socket and RESP3 do not.
    #[test]
    fn only_plain_tcp_in_resp2_goes_raw() {
        let address = |url: &str| {
            let client = redis::Client::open(url).unwrap();
            raw_address(client.get_connection_info()).map(|(host, port)| format!("{host}:{port}"))
        };
        assert_eq!(address("redis://127.0.0.1:6390").as_deref(), Some("127.0.0.1:6390"));
        assert_eq!(address("redis://user:pw@redis.internal:6379/2").as_deref(), Some("redis.internal:6379"));
        assert_eq!(address("rediss://127.0.0.1:6390"), None);
        assert_eq!(address("redis+unix:///tmp/redis.sock"), None);
        assert_eq!(address("redis://127.0.0.1:6390/?protocol=resp3"), None);
    }

    /// What a pipeline's caller gets back matches the driver: the
    /// skipped replies dropped, a transaction's `EXEC` array left whole
    /// for `Pipeline::query_async` to unpack, and a transaction whose
    /// command was refused while queued failed with that error.
    #[test]
    fn a_pipeline_gets_the_replies_the_driver_would_hand_over() {
        let queued = || Value::SimpleString("QUEUED".into());
        let exec = Value::Array(vec![Value::Okay, Value::Int(1)]);
        let replies = vec![Value::Okay, queued(), queued(), exec.clone()];
        assert_eq!(kept_replies(true, 3, replies.clone()).unwrap(), vec![exec.clone()]);
        assert_eq!(kept_replies(false, 0, replies.clone()).unwrap(), replies);
        let refused = redis::parse_redis_value(b"-ERR wrong number of arguments for 'set' command\r\n").unwrap();
        let aborted = redis::parse_redis_value(b"-EXECABORT Transaction discarded\r\n").unwrap();
        let err = kept_replies(true, 3, vec![Value::Okay, queued(), refused, aborted]).unwrap_err();
        assert_eq!(err.code(), Some("ERR"));
        // Outside a transaction an error is a reply like any other.
        let pipeline = vec![Value::Okay, redis::parse_redis_value(b"-ERR no\r\n").unwrap()];
        assert_eq!(kept_replies(false, 0, pipeline.clone()).unwrap(), pipeline);
    }

    #[test]
    fn replies_follow_each_other_in_one_buffer() {
        let bytes = b"+OK\r\n+QUEUED\r\n*2\r\n+OK\r\n:3\r\n$1\r\n7\r\n";
        let mut at = 0;
        let mut values = Vec::new();
        while let Some((value, used)) = reply(&bytes[at..], 0).unwrap() {
            values.push(value);
            at += used;
        }
        assert_eq!(at, bytes.len());
        assert_eq!(values.len(), 4);
        assert_eq!(values[3], Value::BulkString(b"7".to_vec()));
    }

    #[test]
    fn broken_replies_are_errors_not_waits() {
        for bytes in [&b"?what\r\n"[..], b":x\r\n", b"$3\r\nabcde\r\n", b"+OK\rX", b"*1\r\n!\r\n"] {
            assert!(reply(bytes, 0).is_err(), "{}", String::from_utf8_lossy(bytes));
        }
        let deep = "*1\r\n".repeat(MAX_DEPTH + 2) + ":1\r\n";
        assert!(reply(deep.as_bytes(), 0).is_err());
    }
}
