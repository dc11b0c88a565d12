//! A reader beside a benchmark: one client sending `GET key`, one request
//! at a time, each timed, until told to stop; then its latency
//! percentiles.
//!
//! `redis-benchmark -n N` stops after N requests and reports nothing when
//! interrupted, so a fixed N covered only the first second or so of a
//! 10-second rebuild. This one runs exactly as long as what it measures:
//! until a file appears, or for a number of seconds. It is a plain
//! blocking loop over one socket, so its own share of the machine stays
//! what a C client's would (a reader in Python cost about 30 µs of CPU a
//! request, a tenth of a core taken from what it measured).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// When the reader stops.
#[derive(Debug, Clone)]
pub enum Until<'a> {
    /// Once this file exists.
    File(&'a Path),
    /// After this long.
    Elapsed(Duration),
}

/// What the reader saw.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ReaderReport {
    pub requests: usize,
    pub seconds: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub p99_9_ms: f64,
    pub max_ms: f64,
}

/// Sends `GET key` to `addr` until `until`, each request after the reply
/// to the one before.
pub fn read_until(addr: &str, key: &str, until: Until<'_>) -> std::io::Result<ReaderReport> {
    let stream = TcpStream::connect(addr)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let request = format!("*2\r\n$3\r\nGET\r\n${}\r\n{key}\r\n", key.len());
    let mut samples: Vec<u64> = Vec::with_capacity(1 << 20);
    let mut line = Vec::new();
    let started = Instant::now();
    loop {
        // The stop condition costs a system call: checked once every 256
        // requests (a few milliseconds).
        for _ in 0..256 {
            let sent = Instant::now();
            writer.write_all(request.as_bytes())?;
            read_bulk(&mut reader, &mut line)?;
            samples.push(sent.elapsed().as_nanos() as u64);
        }
        let done = match until {
            Until::File(path) => path.exists(),
            Until::Elapsed(limit) => started.elapsed() >= limit,
        };
        if done {
            break;
        }
    }
    Ok(report(samples, started.elapsed()))
}

/// Reads one bulk-string (or nil) reply; anything else is an error.
fn read_bulk(reader: &mut impl BufRead, line: &mut Vec<u8>) -> std::io::Result<()> {
    line.clear();
    reader.read_until(b'\n', line)?;
    let invalid = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
    let head = line.strip_suffix(b"\r\n").ok_or_else(|| invalid("the connection closed".into()))?;
    let text = String::from_utf8_lossy(head);
    let size: i64 = match head.first() {
        Some(b'$') => text[1..].parse().map_err(|_| invalid(format!("unexpected reply {text:?}")))?,
        _ => return Err(invalid(format!("unexpected reply {text:?}"))),
    };
    if size >= 0 {
        // The value and its CRLF.
        std::io::copy(&mut reader.by_ref().take(size as u64 + 2), &mut std::io::sink())?;
    }
    Ok(())
}

/// The percentiles of `samples` (nanoseconds), nearest rank.
fn report(mut samples: Vec<u64>, elapsed: Duration) -> ReaderReport {
    samples.sort_unstable();
    let at = |q: f64| -> f64 {
        let rank = ((samples.len() as f64 * q / 100.0).ceil() as usize).clamp(1, samples.len().max(1));
        samples.get(rank - 1).map_or(0.0, |ns| *ns as f64 / 1e6)
    };
    ReaderReport {
        requests: samples.len(),
        seconds: elapsed.as_secs_f64(),
        p50_ms: at(50.0),
        p99_ms: at(99.0),
        p99_9_ms: at(99.9),
        max_ms: at(100.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank() {
        // 1..=1000 µs: the 500th, 990th and 999th values.
        let samples: Vec<u64> = (1..=1000).rev().map(|us| us * 1000).collect();
        let r = report(samples, Duration::from_secs(1));
        assert_eq!((r.requests, r.p50_ms, r.p99_ms, r.p99_9_ms, r.max_ms), (1000, 0.5, 0.99, 0.999, 1.0));
    }

    #[test]
    fn a_bulk_reply_and_a_nil_are_read_whole_and_an_error_is_refused() {
        let mut input: &[u8] = b"$5\r\nvalue\r\n$-1\r\n$0\r\n\r\n-ERR wrong\r\n";
        let mut line = Vec::new();
        for _ in 0..3 {
            read_bulk(&mut input, &mut line).unwrap();
        }
        let err = read_bulk(&mut input, &mut line).unwrap_err();
        assert!(err.to_string().contains("-ERR wrong"), "{err}");
        assert!(input.is_empty());
    }
}
