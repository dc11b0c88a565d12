//! Read-only inspection of keys, for `verify` and `memory`: bounded
//! pipelined batches of TYPE, TTL, value reads and MEMORY USAGE; never a
//! blocking command.

use crate::sink::{Sink, SinkError};

/// What a key holds in Redis, normalised for comparison: set members
/// sorted, zset members sorted by member.
#[derive(Debug, Clone, PartialEq)]
pub enum Observed {
    Missing,
    String(String),
    Set(Vec<String>),
    List(Vec<String>),
    Zset(Vec<(String, f64)>),
    Other(String),
}

impl Observed {
    pub fn type_name(&self) -> &str {
        match self {
            Observed::Missing => "none",
            Observed::String(_) => "string",
            Observed::Set(_) => "set",
            Observed::List(_) => "list",
            Observed::Zset(_) => "zset",
            Observed::Other(t) => t,
        }
    }
}

/// One inspected key: its contents and TTL in seconds (-1: none).
#[derive(Debug, Clone, PartialEq)]
pub struct Inspected {
    pub value: Observed,
    pub ttl: i64,
}

impl Sink {
    /// Up to `n` names drawn at random from the keyspace (`RANDOMKEY`; on a
    /// cluster a share from each master). An empty keyspace and names that
    /// are not UTF-8 give nothing.
    pub async fn random_keys(&self, n: usize) -> Result<Vec<String>, SinkError> {
        let err = |source| SinkError::Scan { attempts: 1, source };
        // Spread over the masters (one on one node), one pipeline each.
        let masters = self.topology().masters();
        if masters.is_empty() {
            return Ok(Vec::new());
        }
        let mut replies = Vec::with_capacity(n);
        for (i, node) in masters.iter().enumerate() {
            let share = n / masters.len() + usize::from(i < n % masters.len());
            if share == 0 {
                continue;
            }
            let mut pipe = redis::pipe();
            for _ in 0..share {
                pipe.cmd("RANDOMKEY");
            }
            replies.extend(self.topology().pipeline_on_node(node, &pipe).await.map_err(err)?);
        }
        Ok(replies
            .into_iter()
            .filter_map(|v| match v {
                redis::Value::BulkString(bytes) => String::from_utf8(bytes).ok(),
                _ => None,
            })
            .collect())
    }

    /// Reads the type, TTL and value of each key (two round trips).
    pub async fn inspect(&self, keys: &[String]) -> Result<Vec<Inspected>, SinkError> {
        let err = |source| SinkError::Scan { attempts: 1, source };
        let mut conn = self.connection();
        let mut meta = redis::pipe();
        for key in keys {
            meta.cmd("TYPE").arg(key).cmd("TTL").arg(key);
        }
        let meta: Vec<redis::Value> = meta.query_async(&mut conn).await.map_err(err)?;
        let kinds: Vec<String> = meta
            .iter()
            .step_by(2)
            .map(|v| match v {
                redis::Value::SimpleString(s) => s.clone(),
                redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                _ => "none".into(),
            })
            .collect();
        let ttls: Vec<i64> =
            meta.iter().skip(1).step_by(2).map(|v| redis::from_redis_value(v.clone()).unwrap_or(-2)).collect();
        let mut reads = redis::pipe();
        for (key, kind) in keys.iter().zip(&kinds) {
            match kind.as_str() {
                "string" => {
                    reads.cmd("GET").arg(key);
                }
                "set" => {
                    reads.cmd("SMEMBERS").arg(key);
                }
                "list" => {
                    reads.cmd("LRANGE").arg(key).arg(0).arg(-1);
                }
                "zset" => {
                    reads.cmd("ZRANGE").arg(key).arg(0).arg(-1).arg("WITHSCORES");
                }
                _ => {
                    reads.cmd("ECHO").arg("");
                }
            }
        }
        let values: Vec<redis::Value> = reads.query_async(&mut conn).await.map_err(err)?;
        let mut out = Vec::with_capacity(keys.len());
        for ((kind, ttl), value) in kinds.into_iter().zip(ttls).zip(values) {
            let observed = match kind.as_str() {
                "none" => Observed::Missing,
                "string" => Observed::String(redis::from_redis_value(value).unwrap_or_default()),
                "set" => {
                    let mut m: Vec<String> = redis::from_redis_value(value).unwrap_or_default();
                    m.sort();
                    Observed::Set(m)
                }
                "list" => Observed::List(redis::from_redis_value(value).unwrap_or_default()),
                "zset" => {
                    let mut m: Vec<(String, f64)> = redis::from_redis_value(value).unwrap_or_default();
                    m.sort_by(|a, b| a.0.cmp(&b.0));
                    Observed::Zset(m)
                }
                _ => Observed::Other(kind),
            };
            out.push(Inspected { value: observed, ttl });
        }
        Ok(out)
    }

    /// MEMORY USAGE of each key, in bytes (0 when the key is gone).
    pub async fn memory_usage(&self, keys: &[String]) -> Result<Vec<u64>, SinkError> {
        let mut conn = self.connection();
        let mut pipe = redis::pipe();
        for key in keys {
            pipe.cmd("MEMORY").arg("USAGE").arg(key).arg("SAMPLES").arg(5);
        }
        let values: Vec<Option<u64>> =
            pipe.query_async(&mut conn).await.map_err(|source| SinkError::Scan { attempts: 1, source })?;
        Ok(values.into_iter().map(Option::unwrap_or_default).collect())
    }

    /// Unlinks keys in one call (fenced when the sink is).
    pub async fn unlink(&self, keys: &[String]) -> Result<(), SinkError> {
        if keys.is_empty() {
            return Ok(());
        }
        self.send_with(|unit| unit.unlink(keys)).await
    }
}
