//! One test's settings, built in one place: which servers it talks to,
//! its own database and key prefixes, and whatever else it changes.
//!
//! ```ignore
//! let cfg = TestEnv::new("lease").on(Setup::Cluster).config();
//! let cfg = TestEnv::named(&name).redis(&proxy.redis_url()).prefix("w1").home_limit(5).config();
//! ```

use super::{Setup, shared, unique};
use cachewright::config::{Config, RawConfig};
use cachewright::keys::status::StatusKeys;

/// A test's configuration under construction. By default: the shared
/// MongoDB and one-node Redis, a database named after the test, data keys
/// under `<name>:`, status keys under `cw-<name>:`, home sections of 3.
#[derive(Debug, Clone)]
pub struct TestEnv {
    name: String,
    raw: RawConfig,
}

impl TestEnv {
    /// A test under a fresh name made from `tag` (see [`unique`]).
    pub fn new(tag: &str) -> TestEnv {
        TestEnv::named(&unique(tag))
    }

    /// A test under exactly `name`: its database and prefixes.
    pub fn named(name: &str) -> TestEnv {
        let s = shared();
        let raw = RawConfig {
            mongodb_uri: Some(s.mongo.uri()),
            mongodb_db: Some(name.to_string()),
            redis_url: Some(s.redis.url()),
            prefix: Some(format!("{name}:")),
            status_prefix: Some(format!("cw-{name}:")),
            home_limit: Some(3),
            ..RawConfig::default()
        };
        TestEnv { name: name.to_string(), raw }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// On the shared Redis of `setup` (one node, or the cluster).
    pub fn on(self, setup: Setup) -> TestEnv {
        self.redis(&setup.redis_url())
    }

    pub fn redis(mut self, url: &str) -> TestEnv {
        self.raw.redis_url = Some(url.to_string());
        self
    }

    pub fn mongo(mut self, uri: &str) -> TestEnv {
        self.raw.mongodb_uri = Some(uri.to_string());
        self
    }

    /// Data keys under `<prefix>:` and status keys under `cw-<prefix>:`.
    pub fn prefix(mut self, prefix: &str) -> TestEnv {
        self.raw.prefix = Some(format!("{prefix}:"));
        self.raw.status_prefix = Some(format!("cw-{prefix}:"));
        self
    }

    /// Status keys under exactly `status_prefix`.
    pub fn status_prefix(mut self, status_prefix: &str) -> TestEnv {
        self.raw.status_prefix = Some(status_prefix.to_string());
        self
    }

    /// Home sections of `limit` videos (`None`: the contract's default).
    pub fn home_limit(mut self, limit: Option<usize>) -> TestEnv {
        self.raw.home_limit = limit;
        self
    }

    /// Every tier's TTL ten days, so no key expires during a long test.
    pub fn long_ttls(mut self) -> TestEnv {
        let ttl = Some(864_000);
        (self.raw.ttl_count, self.raw.ttl_index, self.raw.ttl_detail, self.raw.ttl_catalog) = (ttl, ttl, ttl, ttl);
        self
    }

    /// Any other setting, as a configuration file or the environment
    /// would give it.
    pub fn with(mut self, change: impl FnOnce(&mut RawConfig)) -> TestEnv {
        change(&mut self.raw);
        self
    }

    /// The configuration, validated as the binary validates it.
    pub fn config(&self) -> Config {
        Config::from_raw(self.raw.clone()).expect("the test's configuration is valid")
    }
}

/// The status keys (contract §3 and the watcher's own) of `cfg`.
pub fn status_keys(cfg: &Config) -> StatusKeys {
    StatusKeys::new(cfg.status_prefix.clone())
}
