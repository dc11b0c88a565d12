//! Configuration: parsed raw from a TOML file, the environment and CLI
//! flags (highest first: flags, environment, file, defaults), then
//! validated without IO. Connectivity is checked later, by the edges.

use crate::registry::{Registry, Tier};
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// A configuration problem, worded for the operator: what is wrong and how
/// to fix it. Values that may hold secrets are redacted.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {}: {source} (pass --config PATH or unset CACHEWRIGHT_CONFIG)", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("config file {}: {message}", path.display())]
    Toml { path: PathBuf, message: String },
    #[error("{setting} = {value:?} is invalid: {hint}")]
    Invalid { setting: &'static str, value: String, hint: String },
}

fn invalid(setting: &'static str, value: impl ToString, hint: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { setting, value: value.to_string(), hint: hint.into() }
}

/// Collection names; defaults are Prisma's model names.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawCollections {
    pub channel: Option<String>,
    pub category: Option<String>,
    pub tag: Option<String>,
    pub video: Option<String>,
}

/// Tier seconds.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawTtl {
    pub count: Option<u64>,
    pub index: Option<u64>,
    pub detail: Option<u64>,
    pub catalog: Option<u64>,
}

/// One layer of settings, every field optional. The file, the environment
/// and the flags each give one; [`RawConfig::over`] stacks them.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    pub mongodb_uri: Option<String>,
    pub mongodb_db: Option<String>,
    pub redis_url: Option<String>,
    pub redis_password: Option<String>,
    pub redis_db: Option<i64>,
    pub redis_tls_ca: Option<PathBuf>,
    pub redis_tls_cert: Option<PathBuf>,
    pub redis_tls_key: Option<PathBuf>,
    pub prefix: Option<String>,
    pub status_prefix: Option<String>,
    pub ttl_jitter: Option<f64>,
    pub tag_search_lengths: Option<Vec<usize>>,
    pub home_limit: Option<usize>,
    pub read_batch_size: Option<u32>,
    pub write_batch_ops: Option<usize>,
    pub write_concurrency: Option<usize>,
    pub lease_seconds: Option<u64>,
    pub sweep_max_share: Option<f64>,
    pub watch_max_lag_seconds: Option<u64>,
    #[serde(default)]
    pub collections: RawCollections,
    #[serde(default)]
    pub ttl: RawTtl,
}

macro_rules! take_over {
    ($high:expr, $low:expr, $($field:ident).+) => {
        $high.$($field).+ = $high.$($field).+.take().or_else(|| $low.$($field).+.take())
    };
}

impl RawConfig {
    /// Parses a `cachewright.toml`.
    pub fn from_toml(path: &Path, text: &str) -> Result<RawConfig, ConfigError> {
        toml::from_str(text)
            .map_err(|e| ConfigError::Toml { path: path.to_path_buf(), message: e.message().to_string() })
    }

    pub fn from_file(path: &Path) -> Result<RawConfig, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        RawConfig::from_toml(path, &text)
    }

    /// Reads the environment through `get`, so tests need not touch the
    /// process environment.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<RawConfig, ConfigError> {
        fn parse<T: std::str::FromStr>(
            get: &impl Fn(&str) -> Option<String>,
            name: &'static str,
            hint: &str,
        ) -> Result<Option<T>, ConfigError> {
            match get(name) {
                None => Ok(None),
                Some(v) => v.trim().parse().map(Some).map_err(|_| invalid(name, v, hint)),
            }
        }
        let lengths = match get("CACHEWRIGHT_TAG_SEARCH_LENGTHS") {
            None => None,
            Some(v) => {
                Some(v.split(',').map(|p| p.trim().parse::<usize>()).collect::<Result<Vec<_>, _>>().map_err(|_| {
                    invalid("CACHEWRIGHT_TAG_SEARCH_LENGTHS", &v, "use comma-separated lengths such as 2,3")
                })?)
            }
        };
        Ok(RawConfig {
            mongodb_uri: get("MONGODB_URI"),
            mongodb_db: get("MONGODB_DB"),
            redis_url: get("REDIS_URL"),
            redis_password: get("REDIS_PASSWORD"),
            redis_db: parse(&get, "REDIS_DB", "use a database number such as 0")?,
            redis_tls_ca: get("REDIS_TLS_CA").map(PathBuf::from),
            redis_tls_cert: get("REDIS_TLS_CERT").map(PathBuf::from),
            redis_tls_key: get("REDIS_TLS_KEY").map(PathBuf::from),
            prefix: get("CACHEWRIGHT_PREFIX"),
            status_prefix: get("CACHEWRIGHT_STATUS_PREFIX"),
            ttl_jitter: parse(&get, "CACHEWRIGHT_TTL_JITTER", "use a fraction between 0 and 1, such as 0.1")?,
            tag_search_lengths: lengths,
            home_limit: parse(&get, "CACHEWRIGHT_HOME_LIMIT", "use a positive number such as 500")?,
            read_batch_size: parse(&get, "CACHEWRIGHT_READ_BATCH_SIZE", "use a positive number such as 2000")?,
            write_batch_ops: parse(&get, "CACHEWRIGHT_WRITE_BATCH_OPS", "use a positive number such as 1000")?,
            write_concurrency: parse(&get, "CACHEWRIGHT_WRITE_CONCURRENCY", "use a positive number such as 4")?,
            lease_seconds: parse(&get, "CACHEWRIGHT_LEASE_SECONDS", "use whole seconds such as 30")?,
            sweep_max_share: parse(&get, "CACHEWRIGHT_SWEEP_MAX_SHARE", "use a fraction between 0 and 1, such as 0.5")?,
            watch_max_lag_seconds: parse(&get, "CACHEWRIGHT_WATCH_MAX_LAG_SECONDS", "use whole seconds such as 60")?,
            collections: RawCollections {
                channel: get("CACHEWRIGHT_COLLECTION_CHANNEL"),
                category: get("CACHEWRIGHT_COLLECTION_CATEGORY"),
                tag: get("CACHEWRIGHT_COLLECTION_TAG"),
                video: get("CACHEWRIGHT_COLLECTION_VIDEO"),
            },
            ttl: RawTtl {
                count: parse(&get, "CACHEWRIGHT_TTL_COUNT", "use whole seconds such as 3600")?,
                index: parse(&get, "CACHEWRIGHT_TTL_INDEX", "use whole seconds such as 7200")?,
                detail: parse(&get, "CACHEWRIGHT_TTL_DETAIL", "use whole seconds such as 86400")?,
                catalog: parse(&get, "CACHEWRIGHT_TTL_CATALOG", "use whole seconds such as 604800")?,
            },
        })
    }

    /// Stacks `self` over `low`: a value set here wins.
    pub fn over(mut self, mut low: RawConfig) -> RawConfig {
        take_over!(self, low, mongodb_uri);
        take_over!(self, low, mongodb_db);
        take_over!(self, low, redis_url);
        take_over!(self, low, redis_password);
        take_over!(self, low, redis_db);
        take_over!(self, low, redis_tls_ca);
        take_over!(self, low, redis_tls_cert);
        take_over!(self, low, redis_tls_key);
        take_over!(self, low, prefix);
        take_over!(self, low, status_prefix);
        take_over!(self, low, ttl_jitter);
        take_over!(self, low, tag_search_lengths);
        take_over!(self, low, home_limit);
        take_over!(self, low, read_batch_size);
        take_over!(self, low, write_batch_ops);
        take_over!(self, low, write_concurrency);
        take_over!(self, low, lease_seconds);
        take_over!(self, low, sweep_max_share);
        take_over!(self, low, watch_max_lag_seconds);
        take_over!(self, low, collections.channel);
        take_over!(self, low, collections.category);
        take_over!(self, low, collections.tag);
        take_over!(self, low, collections.video);
        take_over!(self, low, ttl.count);
        take_over!(self, low, ttl.index);
        take_over!(self, low, ttl.detail);
        take_over!(self, low, ttl.catalog);
        self
    }
}

/// TLS material for Redis, as file paths (read when connecting).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisTls {
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

impl RedisTls {
    pub fn is_set(&self) -> bool {
        self.ca.is_some() || self.cert.is_some() || self.key.is_some()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collections {
    pub channel: String,
    pub category: String,
    pub tag: String,
    pub video: String,
}

/// TTL seconds per tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TierSeconds {
    pub count: u64,
    pub index: u64,
    pub detail: u64,
    pub catalog: u64,
}

impl TierSeconds {
    pub fn get(&self, tier: Tier) -> u64 {
        match tier {
            Tier::Count => self.count,
            Tier::Index => self.index,
            Tier::Detail => self.detail,
            Tier::Catalog => self.catalog,
        }
    }
}

/// Validated configuration.
#[derive(Clone, PartialEq)]
pub struct Config {
    pub mongodb_uri: String,
    pub mongodb_db: String,
    pub redis_url: String,
    pub redis_password: Option<String>,
    pub redis_db: Option<i64>,
    /// PEM files for `rediss://`: a private CA to trust instead of the
    /// public web roots, and a client certificate with its key.
    pub redis_tls: RedisTls,
    pub prefix: String,
    pub status_prefix: String,
    pub ttl_jitter: f64,
    pub collections: Collections,
    pub ttl: TierSeconds,
    pub tag_search_lengths: Vec<usize>,
    pub home_limit: Option<usize>,
    pub read_batch_size: u32,
    pub write_batch_ops: usize,
    pub write_concurrency: usize,
    /// The writer lease's lifetime; it is renewed every third of it.
    pub lease_seconds: u64,
    /// The largest share of a family set's existing keys one sweep may
    /// delete (the sweep guard).
    pub sweep_max_share: f64,
    /// Under `serve`, the watcher lag above which `/health` answers 503.
    pub watch_max_lag_seconds: u64,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("mongodb_uri", &redact_url(&self.mongodb_uri))
            .field("mongodb_db", &self.mongodb_db)
            .field("redis_url", &redact_url(&self.redis_url))
            .field("redis_password", &self.redis_password.as_ref().map(|_| "***"))
            .field("prefix", &self.prefix)
            .field("status_prefix", &self.status_prefix)
            .finish_non_exhaustive()
    }
}

/// Query parameters whose values are secrets (compared lowercased):
/// Redis `pass`/`password`, MongoDB `tlsCertificateKeyFilePassword`,
/// `authMechanismProperties` (may carry AWS session tokens) and anything
/// that names a password, secret or token.
fn secret_param(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["pass", "secret", "token", "authmechanismproperties"].iter().any(|s| name.contains(s))
}

/// Hides the secrets of a connection string: the whole user-info but the
/// user name (`scheme://user:***@host`), whatever characters the password
/// holds (`/`, `@`, `:`, `?` included: everything up to the last `@` is
/// user-info), and the value of the first secret query parameter with
/// everything after it (`?db=0&pass=***`).
/// Works on malformed strings too, erring on the side of hiding more.
pub fn redact_url(url: &str) -> String {
    let url = hide_secret_params(url);
    let scheme_end = url.find("://").map(|i| i + 3).unwrap_or(0);
    let (head, rest) = url.split_at(scheme_end);
    match rest.rfind('@') {
        Some(at) => {
            let masked = match rest[..at].split_once(':') {
                Some((user, _)) => format!("{user}:***"),
                None => "***".to_string(),
            };
            format!("{head}{masked}{}", &rest[at..])
        }
        None => url.to_string(),
    }
}

/// Hides, from the first secret query parameter on, everything after the
/// first `?`: a secret value may itself hold `&`, `=`, `@` or `#`.
fn hide_secret_params(url: &str) -> String {
    let Some((path, query)) = url.split_once('?') else { return url.to_string() };
    let mut shown: Vec<&str> = Vec::new();
    for param in query.split('&') {
        match param.split_once('=') {
            Some((name, _)) if secret_param(name) => {
                return format!("{path}?{}{}{name}=***", shown.join("&"), if shown.is_empty() { "" } else { "&" });
            }
            _ => shown.push(param),
        }
    }
    url.to_string()
}

fn check_prefix(setting: &'static str, value: &str) -> Result<(), ConfigError> {
    if value.is_empty() {
        return Err(invalid(setting, value, "set a non-empty prefix ending in ':', such as app:"));
    }
    if value.chars().any(|c| c.is_whitespace() || c.is_control() || "*?[]\\{}".contains(c)) {
        return Err(invalid(setting, value, "use letters, digits, '_', '-', '.' and ':' only"));
    }
    Ok(())
}

impl Config {
    /// Validates a stacked raw configuration, filling in defaults.
    pub fn from_raw(raw: RawConfig) -> Result<Config, ConfigError> {
        let mongodb_uri = raw.mongodb_uri.unwrap_or_else(|| "mongodb://127.0.0.1:27017".into());
        if !(mongodb_uri.starts_with("mongodb://") || mongodb_uri.starts_with("mongodb+srv://")) {
            return Err(invalid(
                "MONGODB_URI",
                redact_url(&mongodb_uri),
                "use a mongodb:// or mongodb+srv:// connection string",
            ));
        }
        let mongodb_db = raw.mongodb_db.unwrap_or_else(|| "app".into());
        if mongodb_db.is_empty() || mongodb_db.contains(['/', '\\', '.', ' ', '"', '$']) {
            return Err(invalid("MONGODB_DB", &mongodb_db, "use a plain database name such as app"));
        }
        let redis_url = raw.redis_url.unwrap_or_else(|| "redis://127.0.0.1:6379".into());
        if !(redis_url.starts_with("redis://")
            || redis_url.starts_with("rediss://")
            || redis_url.starts_with("redis+unix://")
            || redis_url.starts_with("unix://"))
        {
            return Err(invalid("REDIS_URL", redact_url(&redis_url), "use redis://host:port (rediss:// for TLS)"));
        }
        if let Err(err) = redis::Client::open(redis_url.as_str()) {
            return Err(invalid(
                "REDIS_URL",
                redact_url(&redis_url),
                format!("{} (expected redis://[:password@]host:port[/db])", redact_url(&err.to_string())),
            ));
        }
        let redis_tls = RedisTls { ca: raw.redis_tls_ca, cert: raw.redis_tls_cert, key: raw.redis_tls_key };
        if redis_tls.cert.is_some() != redis_tls.key.is_some() {
            let (setting, other) = if redis_tls.cert.is_some() {
                ("REDIS_TLS_CERT", "REDIS_TLS_KEY")
            } else {
                ("REDIS_TLS_KEY", "REDIS_TLS_CERT")
            };
            return Err(invalid(setting, "set", format!("a client certificate needs its key: set {other} as well")));
        }
        if redis_tls.is_set() && !redis_url.starts_with("rediss://") {
            return Err(invalid(
                "REDIS_URL",
                redact_url(&redis_url),
                "REDIS_TLS_CA, REDIS_TLS_CERT and REDIS_TLS_KEY apply to TLS: use a rediss:// URL",
            ));
        }
        if let Some(db) = raw.redis_db.filter(|db| !(0..=1_000_000).contains(db)) {
            return Err(invalid("REDIS_DB", db, "use a database number such as 0"));
        }
        let prefix = raw.prefix.unwrap_or_else(|| "app:".into());
        let status_prefix = raw.status_prefix.unwrap_or_else(|| "cachewright:".into());
        check_prefix("CACHEWRIGHT_PREFIX", &prefix)?;
        check_prefix("CACHEWRIGHT_STATUS_PREFIX", &status_prefix)?;
        if prefix.starts_with(&status_prefix) || status_prefix.starts_with(&prefix) {
            return Err(invalid(
                "CACHEWRIGHT_STATUS_PREFIX",
                &status_prefix,
                format!(
                    "job status keys must not live under the data prefix {prefix:?}; pick prefixes where neither starts with the other"
                ),
            ));
        }
        let ttl_jitter = raw.ttl_jitter.unwrap_or(0.1);
        if !(0.0..=1.0).contains(&ttl_jitter) {
            return Err(invalid("CACHEWRIGHT_TTL_JITTER", ttl_jitter, "use a fraction between 0 and 1, such as 0.1"));
        }
        let sweep_max_share = raw.sweep_max_share.unwrap_or(0.5);
        if !(0.0..=1.0).contains(&sweep_max_share) {
            return Err(invalid(
                "CACHEWRIGHT_SWEEP_MAX_SHARE",
                sweep_max_share,
                "use a fraction between 0 and 1, such as 0.5 (1 lets a sweep delete everything)",
            ));
        }
        let tier = |v: Option<u64>, t: Tier, setting: &'static str| -> Result<u64, ConfigError> {
            match v.unwrap_or(t.default_seconds()) {
                0 => Err(invalid(setting, 0, "every key needs a TTL; use a positive number of seconds")),
                s => Ok(s),
            }
        };
        let ttl = TierSeconds {
            count: tier(raw.ttl.count, Tier::Count, "CACHEWRIGHT_TTL_COUNT")?,
            index: tier(raw.ttl.index, Tier::Index, "CACHEWRIGHT_TTL_INDEX")?,
            detail: tier(raw.ttl.detail, Tier::Detail, "CACHEWRIGHT_TTL_DETAIL")?,
            catalog: tier(raw.ttl.catalog, Tier::Catalog, "CACHEWRIGHT_TTL_CATALOG")?,
        };
        let tag_search_lengths = raw.tag_search_lengths.unwrap_or_else(|| vec![2, 3]);
        if tag_search_lengths.is_empty() || tag_search_lengths.iter().any(|&l| l == 0 || l > 64) {
            return Err(invalid(
                "CACHEWRIGHT_TAG_SEARCH_LENGTHS",
                format!("{tag_search_lengths:?}"),
                "use one or more lengths between 1 and 64, such as 2,3",
            ));
        }
        if raw.home_limit == Some(0) {
            return Err(invalid("CACHEWRIGHT_HOME_LIMIT", 0, "use a positive number such as 500"));
        }
        let positive = |v: Option<usize>, default: usize, setting: &'static str| match v.unwrap_or(default) {
            0 => Err(invalid(setting, 0, "use a positive number")),
            n => Ok(n),
        };
        let collection = |v: Option<String>, default: &str, setting: &'static str| {
            let name = v.unwrap_or_else(|| default.to_string());
            if name.is_empty() || name.contains('$') || name.contains('\0') {
                Err(invalid(setting, &name, "use a plain collection name"))
            } else {
                Ok(name)
            }
        };
        Ok(Config {
            collections: Collections {
                channel: collection(raw.collections.channel, "Channel", "CACHEWRIGHT_COLLECTION_CHANNEL")?,
                category: collection(raw.collections.category, "Category", "CACHEWRIGHT_COLLECTION_CATEGORY")?,
                tag: collection(raw.collections.tag, "Tag", "CACHEWRIGHT_COLLECTION_TAG")?,
                video: collection(raw.collections.video, "VideoMedia", "CACHEWRIGHT_COLLECTION_VIDEO")?,
            },
            read_batch_size: raw.read_batch_size.unwrap_or(2000).max(1),
            write_batch_ops: positive(raw.write_batch_ops, 1000, "CACHEWRIGHT_WRITE_BATCH_OPS")?,
            write_concurrency: positive(raw.write_concurrency, 4, "CACHEWRIGHT_WRITE_CONCURRENCY")?,
            lease_seconds: positive(raw.lease_seconds.map(|s| s as usize), 30, "CACHEWRIGHT_LEASE_SECONDS")? as u64,
            sweep_max_share,
            watch_max_lag_seconds: positive(
                raw.watch_max_lag_seconds.map(|s| s as usize),
                60,
                "CACHEWRIGHT_WATCH_MAX_LAG_SECONDS",
            )? as u64,
            mongodb_uri,
            mongodb_db,
            redis_url,
            redis_password: raw.redis_password.filter(|p| !p.is_empty()),
            redis_db: raw.redis_db,
            redis_tls,
            prefix,
            status_prefix,
            ttl_jitter,
            ttl,
            tag_search_lengths,
            home_limit: raw.home_limit,
        })
    }

    /// The home sections declared in `builders/`, with `home_limit`
    /// applied to each when set.
    pub fn home_sections(&self) -> Vec<crate::registry::HomeSection> {
        Registry::get()
            .home_sections()
            .iter()
            .cloned()
            .map(|mut s| {
                if let Some(limit) = self.home_limit {
                    s.limit = limit;
                }
                s
            })
            .collect()
    }

    /// Stacks flags over the environment over the file (if any).
    pub fn load(
        flags: RawConfig,
        file: Option<&Path>,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let from_env = RawConfig::from_env(&env)?;
        let path = file.map(Path::to_path_buf).or_else(|| env("CACHEWRIGHT_CONFIG").map(PathBuf::from));
        let from_file = match path {
            Some(path) => RawConfig::from_file(&path)?,
            None if Path::new("cachewright.toml").exists() => RawConfig::from_file(Path::new("cachewright.toml"))?,
            None => RawConfig::default(),
        };
        Config::from_raw(flags.over(from_env).over(from_file))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    proptest! {
        /// Random secrets, with the characters that broke the old
        /// redaction, go through every path that prints a connection
        /// string: the redactor, configuration errors, the config's Debug.
        #[test]
        fn secrets_never_show(secret in "[A-Za-z0-9/@:?#%&=+._~-]{6,24}", user in "[a-z]{1,8}") {
            prop_assume!(!user.contains(&secret) && !"redis://127.0.0.1:6379/0mongodb://h:27017/dbrediss+unixsock".contains(&secret));
            let forms = [
                format!("redis://{user}:{secret}@127.0.0.1:6379/0"),
                format!("rediss://:{secret}@h:6380"),
                format!("mongodb://{user}:{secret}@h1:27017,h2:27017/db?replicaSet=rs"),
                format!("redis+unix:///tmp/r.sock?db=0&pass={secret}"),
                format!("mongodb://h:27017/?tls=true&tlsCertificateKeyFilePassword={secret}"),
            ];
            for url in &forms {
                let shown = redact_url(url);
                prop_assert!(!shown.contains(&secret), "{} -> {}", url, shown);
                let raw = RawConfig { redis_url: Some(url.clone()), mongodb_uri: Some(url.clone()), ..RawConfig::default() };
                if let Err(err) = Config::from_raw(raw) {
                    prop_assert!(!err.to_string().contains(&secret), "{}", err);
                }
                let redis_only = RawConfig { redis_url: Some(url.clone()), ..RawConfig::default() };
                match Config::from_raw(redis_only) {
                    Ok(cfg) => {
                        let shown = format!("{cfg:?}");
                        prop_assert!(!shown.contains(&secret), "{}", shown);
                    }
                    Err(err) => prop_assert!(!err.to_string().contains(&secret), "{}", err),
                }
            }
        }
    }

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn defaults_match_the_contract() {
        let cfg = Config::from_raw(RawConfig::default()).unwrap();
        assert_eq!(cfg.mongodb_uri, "mongodb://127.0.0.1:27017");
        assert_eq!(cfg.mongodb_db, "app");
        assert_eq!(cfg.redis_url, "redis://127.0.0.1:6379");
        assert_eq!(cfg.prefix, "app:");
        assert_eq!(cfg.status_prefix, "cachewright:");
        assert_eq!(cfg.ttl_jitter, 0.1);
        assert_eq!(cfg.ttl, TierSeconds { count: 3600, index: 7200, detail: 86_400, catalog: 604_800 });
        assert_eq!(cfg.tag_search_lengths, vec![2, 3]);
        assert_eq!(cfg.collections.video, "VideoMedia");
        assert_eq!(cfg.home_sections()[0].limit, 500);
    }

    #[test]
    fn flags_beat_env_beat_file() {
        let file = RawConfig::from_toml(
            Path::new("x.toml"),
            "prefix = \"file:\"\nmongodb_db = \"filedb\"\nhome_limit = 7\n[ttl]\ncount = 60\n",
        )
        .unwrap();
        let from_env = RawConfig::from_env(env(&[("CACHEWRIGHT_PREFIX", "env:"), ("MONGODB_DB", "envdb")])).unwrap();
        let flags = RawConfig { prefix: Some("flag:".into()), ..RawConfig::default() };
        let cfg = Config::from_raw(flags.over(from_env).over(file)).unwrap();
        assert_eq!(cfg.prefix, "flag:");
        assert_eq!(cfg.mongodb_db, "envdb");
        assert_eq!(cfg.ttl.count, 60);
        assert_eq!(cfg.home_sections()[0].limit, 7);
    }

    #[test]
    fn unknown_file_settings_are_refused() {
        let err = RawConfig::from_toml(Path::new("c.toml"), "prefx = \"a:\"").unwrap_err();
        assert!(err.to_string().contains("unknown field `prefx`"), "{err}");
    }

    #[test]
    fn bad_values_say_what_to_do() {
        let err = RawConfig::from_env(env(&[("CACHEWRIGHT_TTL_JITTER", "lots")])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "CACHEWRIGHT_TTL_JITTER = \"lots\" is invalid: use a fraction between 0 and 1, such as 0.1"
        );
        let raw = RawConfig { status_prefix: Some("app:status:".into()), ..RawConfig::default() };
        assert!(Config::from_raw(raw).unwrap_err().to_string().contains("must not live under the data prefix"));
        let raw = RawConfig { ttl: RawTtl { index: Some(0), ..RawTtl::default() }, ..RawConfig::default() };
        assert!(Config::from_raw(raw).is_err());
    }

    #[test]
    fn passwords_never_show() {
        let raw = RawConfig { redis_url: Some("http://u:s3cret@h".into()), ..RawConfig::default() };
        let err = Config::from_raw(raw).unwrap_err().to_string();
        assert!(!err.contains("s3cret"), "{err}");
        // An `@` in the query hides more than needed, never less.
        assert_eq!(redact_url("mongodb://user:pw@h:1/db?x=1"), "mongodb://user:***@h:1/db?x=1");
        assert_eq!(redact_url("redis://u:pa/ss@w:rd?x@host:6379/0"), "redis://u:***@host:6379/0");
        assert_eq!(redact_url("redis+unix:///tmp/r.sock?db=0&pass=s3"), "redis+unix:///tmp/r.sock?db=0&pass=***");
        assert_eq!(
            redact_url("mongodb://h/?tls=true&tlsCertificateKeyFilePassword=k3y"),
            "mongodb://h/?tls=true&tlsCertificateKeyFilePassword=***"
        );
        assert_eq!(redact_url("not a url, pw@host"), "***@host");
        assert_eq!(redact_url("redis://:pw@h:6379"), "redis://:***@h:6379");
        assert_eq!(redact_url("redis://h:6379"), "redis://h:6379");
        let cfg = Config::from_raw(RawConfig {
            mongodb_uri: Some("mongodb://a:topsecret@h".into()),
            redis_password: Some("pw2".into()),
            ..RawConfig::default()
        })
        .unwrap();
        let shown = format!("{cfg:?}");
        assert!(!shown.contains("topsecret") && !shown.contains("pw2"), "{shown}");
    }
}
