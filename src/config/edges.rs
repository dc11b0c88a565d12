//! The narrow settings each edge takes, derived from the whole
//! [`Config`]: the Redis edge ([`crate::sink::Sink`]) and the MongoDB edge
//! ([`crate::source::Source`]) see only what they use, so a change to how
//! a rebuild plans or a watcher batches never reaches them.

use super::{Collections, Config, RedisTls, TierSeconds, redact_url};

/// What connecting to Redis and writing to it needs.
#[derive(Clone, PartialEq)]
pub struct RedisSettings {
    /// `REDIS_URL`: scheme, host, port and optional credentials.
    pub url: String,
    pub password: Option<String>,
    pub db: Option<i64>,
    pub tls: RedisTls,
    /// `Some` overrides the detection of Redis Cluster.
    pub cluster: Option<bool>,
    pub cluster_nodes: Vec<String>,
    pub sentinels: Vec<String>,
    pub sentinel_master: String,
    pub timeout_seconds: u64,
    pub allow_eviction: bool,
    /// `RESTORE` may write collections (`CACHEWRIGHT_RESTORE`).
    pub restore: bool,
    /// Data keys' prefix (the permission preflight probes under it).
    pub prefix: String,
    pub status_prefix: String,
    pub ttl: TierSeconds,
    pub ttl_jitter: f64,
    /// Keys one write transaction may carry.
    pub write_batch_ops: usize,
    /// The Redis cost one write transaction may carry.
    pub write_batch_cost: usize,
}

impl std::fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSettings")
            .field("url", &redact_url(&self.url))
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("cluster_nodes", &self.cluster_nodes)
            .field("sentinels", &self.sentinels)
            .field("status_prefix", &self.status_prefix)
            .finish_non_exhaustive()
    }
}

/// What connecting to MongoDB and reading the collections needs.
#[derive(Clone, PartialEq)]
pub struct MongoSettings {
    /// `MONGODB_URI`, with the driver's options.
    pub uri: String,
    pub db: String,
    pub collections: Collections,
    pub read_batch_size: u32,
    pub read_cursors: usize,
    /// How long one read may go unanswered (see [`crate::source::Source`]).
    pub read_timeout: std::time::Duration,
}

impl std::fmt::Debug for MongoSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MongoSettings").field("uri", &redact_url(&self.uri)).field("db", &self.db).finish()
    }
}

impl Config {
    /// The Redis edge's settings.
    pub fn redis(&self) -> RedisSettings {
        RedisSettings {
            url: self.redis_url.clone(),
            password: self.redis_password.clone(),
            db: self.redis_db,
            tls: self.redis_tls.clone(),
            cluster: self.redis_cluster,
            cluster_nodes: self.redis_cluster_nodes.clone(),
            sentinels: self.redis_sentinels.clone(),
            sentinel_master: self.redis_sentinel_master.clone(),
            timeout_seconds: self.redis_timeout_seconds,
            allow_eviction: self.redis_allow_eviction,
            restore: self.redis_restore,
            prefix: self.prefix.clone(),
            status_prefix: self.status_prefix.clone(),
            ttl: self.ttl,
            ttl_jitter: self.ttl_jitter,
            write_batch_ops: self.write_batch_ops,
            write_batch_cost: self.write_batch_cost,
        }
    }

    /// The MongoDB edge's settings.
    pub fn mongo(&self) -> MongoSettings {
        MongoSettings {
            uri: self.mongodb_uri.clone(),
            db: self.mongodb_db.clone(),
            collections: self.collections.clone(),
            read_batch_size: self.read_batch_size,
            read_cursors: self.read_cursors,
            read_timeout: std::time::Duration::from_secs(self.mongodb_timeout_seconds),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RawConfig;

    #[test]
    fn edge_settings_carry_the_config_and_hide_secrets() {
        let cfg = Config::from_raw(RawConfig {
            redis_url: Some("redis://u:hunter2@h:6379".into()),
            mongodb_uri: Some("mongodb://u:s3cret@m:27017".into()),
            write_batch_ops: Some(77),
            ..RawConfig::default()
        })
        .unwrap();
        let redis = cfg.redis();
        assert_eq!((redis.url.as_str(), redis.write_batch_ops), ("redis://u:hunter2@h:6379", 77));
        assert_eq!(cfg.mongo().collections, cfg.collections);
        let shown = format!("{redis:?} {:?}", cfg.mongo());
        assert!(!shown.contains("hunter2") && !shown.contains("s3cret"), "{shown}");
    }
}
