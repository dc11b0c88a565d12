//! Configuration: parsed raw from a TOML file, the environment and CLI
//! flags (highest first: flags, environment, file, defaults), then
//! validated without IO. Connectivity is checked later, by the edges.

use crate::registry::{Registry, Tier};
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

pub(crate) fn invalid(setting: &'static str, value: impl ToString, hint: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { setting, value: value.to_string(), hint: hint.into() }
}

mod edges;
mod settings;

pub use edges::{MongoSettings, RedisSettings};
pub use settings::{ConfigFlags, RawConfig, SETTINGS, Setting, markdown_table};

impl RawConfig {
    pub fn from_file(path: &Path) -> Result<RawConfig, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
        RawConfig::from_toml(path, &text)
    }
}

/// A setting every layer left unset although it has a declared default:
/// only possible for a `RawConfig` built without [`RawConfig::defaults`].
fn given<T>(value: Option<T>, setting: &'static str) -> Result<T, ConfigError> {
    value.ok_or_else(|| invalid(setting, "", "set a value"))
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
    /// `Some` overrides the detection of Redis Cluster (INFO
    /// `cluster_enabled`).
    pub redis_cluster: Option<bool>,
    /// Further cluster seed nodes (`host:port`), reached with REDIS_URL's
    /// scheme and credentials.
    pub redis_cluster_nodes: Vec<String>,
    pub prefix: String,
    pub status_prefix: String,
    pub ttl_jitter: f64,
    pub collections: Collections,
    pub ttl: TierSeconds,
    pub tag_search_lengths: Vec<usize>,
    pub home_limit: Option<usize>,
    pub read_batch_size: u32,
    /// Cursors over the video collection (see [`crate::source::ranges`]).
    pub read_cursors: usize,
    pub write_batch_ops: usize,
    /// The Redis cost (see [`crate::plan::Op::cost`]) one MULTI/EXEC
    /// batch may carry.
    pub write_batch_cost: usize,
    pub write_concurrency: usize,
    /// The writer lease's lifetime; it is renewed every third of it.
    pub lease_seconds: u64,
    /// The largest share of a family set's existing keys one sweep may
    /// delete (the sweep guard).
    pub sweep_max_share: f64,
    /// Under `serve`, the watcher lag above which `/health` answers 503.
    pub watch_max_lag_seconds: u64,
    /// Under `serve`, keys a minute the drift check compares (0: off).
    pub drift_sample_per_minute: u64,
    /// Sentinels to find the master through (empty: none).
    pub redis_sentinels: Vec<String>,
    pub redis_sentinel_master: String,
    /// How long a Redis request on one node may go unanswered.
    pub redis_timeout_seconds: u64,
    /// How long one MongoDB read may go unanswered.
    pub mongodb_timeout_seconds: u64,
    /// Write even under an `allkeys-*` eviction policy (see `sink::acl`).
    pub redis_allow_eviction: bool,
    /// Whether collections may be written by `RESTORE` (see
    /// `sink::acl::Sink::may_restore`).
    pub redis_restore: bool,
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

/// Parses `host:port,host:port` (blank: none) for `setting`; an IPv6
/// host may come with or without brackets (`[::1]:7000`, `::1:7000`).
fn host_ports(text: &str, setting: &'static str) -> Result<Vec<String>, ConfigError> {
    let mut nodes = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let valid = part.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && !host.contains('/') && port.parse::<u16>().is_ok_and(|p| p > 0)
        });
        if !valid {
            return Err(invalid(
                setting,
                part,
                "use host:port pairs separated by commas, such as 10.0.0.2:6379,10.0.0.3:6379",
            ));
        }
        nodes.push(part.to_string());
    }
    Ok(nodes)
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

/// The secrets a connection string carries: its password (everything
/// between the user name and the last `@`) and the values of its secret
/// query parameters, each also percent-decoded.
fn secrets_of(url: &str) -> Vec<String> {
    let mut secrets = Vec::new();
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or(url);
    if let Some(at) = rest.rfind('@')
        && let Some((_, password)) = rest[..at].split_once(':')
    {
        secrets.push(password.to_string());
    }
    if let Some((_, query)) = url.split_once('?') {
        // From the first secret parameter on, the rest may all be secret.
        if let Some(pos) = query.split('&').position(|p| p.split_once('=').is_some_and(|(n, _)| secret_param(n))) {
            let tail: Vec<&str> = query.split('&').skip(pos).collect();
            secrets.push(tail.join("&").split_once('=').map(|(_, v)| v.to_string()).unwrap_or_default());
            for param in tail {
                if let Some((_, value)) = param.split_once('=') {
                    secrets.push(value.to_string());
                }
            }
        }
    }
    let decoded: Vec<String> = secrets.iter().map(|s| percent_decode(s)).collect();
    secrets.extend(decoded);
    secrets.retain(|s| s.len() >= 3);
    // Longest first, so a secret is hidden whole before its parts.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    secrets
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1).copied().and_then(hex), bytes.get(i + 2).copied().and_then(hex)) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A driver's message about `url`, with any secret of `url` it quotes
/// replaced by `***`: drivers may echo parts of a malformed string.
pub fn scrub(message: &str, url: &str) -> String {
    let mut message = message.to_string();
    for secret in secrets_of(url) {
        message = message.replace(&secret, "***");
    }
    message
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
        let raw = raw.over(RawConfig::defaults());
        let mongodb_uri = given(raw.mongodb_uri, "MONGODB_URI")?;
        if !(mongodb_uri.starts_with("mongodb://") || mongodb_uri.starts_with("mongodb+srv://")) {
            return Err(invalid(
                "MONGODB_URI",
                redact_url(&mongodb_uri),
                "use a mongodb:// or mongodb+srv:// connection string",
            ));
        }
        let mongodb_db = given(raw.mongodb_db, "MONGODB_DB")?;
        if mongodb_db.is_empty() || mongodb_db.contains(['/', '\\', '.', ' ', '"', '$']) {
            return Err(invalid("MONGODB_DB", &mongodb_db, "use a plain database name such as app"));
        }
        let redis_url = given(raw.redis_url, "REDIS_URL")?;
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
        let redis_cluster_nodes = host_ports(raw.redis_cluster_nodes.as_deref().unwrap_or(""), "REDIS_CLUSTER_NODES")?;
        let redis_sentinels = host_ports(raw.redis_sentinels.as_deref().unwrap_or(""), "REDIS_SENTINELS")?;
        if !redis_sentinels.is_empty() && (raw.redis_cluster == Some(true) || !redis_cluster_nodes.is_empty()) {
            return Err(invalid(
                "REDIS_SENTINELS",
                redis_sentinels.join(","),
                "Sentinel and Redis Cluster exclude each other: unset REDIS_SENTINELS or the cluster settings",
            ));
        }
        if raw.redis_cluster == Some(false) && !redis_cluster_nodes.is_empty() {
            return Err(invalid(
                "REDIS_CLUSTER_NODES",
                redis_cluster_nodes.join(","),
                "seed nodes are for Redis Cluster: unset REDIS_CLUSTER=false or these nodes",
            ));
        }
        let prefix = given(raw.prefix, "CACHEWRIGHT_PREFIX")?;
        let status_prefix = given(raw.status_prefix, "CACHEWRIGHT_STATUS_PREFIX")?;
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
        let ttl_jitter = given(raw.ttl_jitter, "CACHEWRIGHT_TTL_JITTER")?;
        if !(0.0..=1.0).contains(&ttl_jitter) {
            return Err(invalid("CACHEWRIGHT_TTL_JITTER", ttl_jitter, "use a fraction between 0 and 1, such as 0.1"));
        }
        let sweep_max_share = given(raw.sweep_max_share, "CACHEWRIGHT_SWEEP_MAX_SHARE")?;
        if !(0.0..=1.0).contains(&sweep_max_share) {
            return Err(invalid(
                "CACHEWRIGHT_SWEEP_MAX_SHARE",
                sweep_max_share,
                "use a fraction between 0 and 1, such as 0.5 (1 lets a sweep delete everything)",
            ));
        }
        let tier = |v: Option<u64>, setting: &'static str| -> Result<u64, ConfigError> {
            match given(v, setting)? {
                0 => Err(invalid(setting, 0, "every key needs a TTL; use a positive number of seconds")),
                s => Ok(s),
            }
        };
        let ttl = TierSeconds {
            count: tier(raw.ttl_count, "CACHEWRIGHT_TTL_COUNT")?,
            index: tier(raw.ttl_index, "CACHEWRIGHT_TTL_INDEX")?,
            detail: tier(raw.ttl_detail, "CACHEWRIGHT_TTL_DETAIL")?,
            catalog: tier(raw.ttl_catalog, "CACHEWRIGHT_TTL_CATALOG")?,
        };
        let tag_search_lengths = given(raw.tag_search_lengths, "CACHEWRIGHT_TAG_SEARCH_LENGTHS")?;
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
        let positive = |v: Option<u64>, setting: &'static str| match given(v, setting)? {
            0 => Err(invalid(setting, 0, "use a positive number")),
            n => Ok(n),
        };
        let collection = |v: Option<String>, setting: &'static str| {
            let name = given(v, setting)?;
            if name.is_empty() || name.contains('$') || name.contains('\0') {
                Err(invalid(setting, &name, "use a plain collection name"))
            } else {
                Ok(name)
            }
        };
        Ok(Config {
            collections: Collections {
                channel: collection(raw.collection_channel, "CACHEWRIGHT_COLLECTION_CHANNEL")?,
                category: collection(raw.collection_category, "CACHEWRIGHT_COLLECTION_CATEGORY")?,
                tag: collection(raw.collection_tag, "CACHEWRIGHT_COLLECTION_TAG")?,
                video: collection(raw.collection_video, "CACHEWRIGHT_COLLECTION_VIDEO")?,
            },
            read_batch_size: positive(raw.read_batch_size.map(u64::from), "CACHEWRIGHT_READ_BATCH_SIZE")? as u32,
            read_cursors: positive(raw.read_cursors.map(|n| n as u64), "CACHEWRIGHT_READ_CURSORS")? as usize,
            write_batch_ops: positive(raw.write_batch_ops.map(|n| n as u64), "CACHEWRIGHT_WRITE_BATCH_OPS")? as usize,
            write_batch_cost: positive(raw.write_batch_cost.map(|n| n as u64), "CACHEWRIGHT_WRITE_BATCH_COST")?
                as usize,
            write_concurrency: positive(raw.write_concurrency.map(|n| n as u64), "CACHEWRIGHT_WRITE_CONCURRENCY")?
                as usize,
            lease_seconds: positive(raw.lease_seconds, "CACHEWRIGHT_LEASE_SECONDS")?,
            sweep_max_share,
            watch_max_lag_seconds: positive(raw.watch_max_lag_seconds, "CACHEWRIGHT_WATCH_MAX_LAG_SECONDS")?,
            drift_sample_per_minute: given(raw.drift_sample_per_minute, "CACHEWRIGHT_DRIFT_SAMPLE_PER_MINUTE")?,
            mongodb_uri,
            mongodb_db,
            redis_url,
            redis_password: raw.redis_password.filter(|p| !p.is_empty()),
            redis_db: raw.redis_db,
            redis_tls,
            redis_cluster: raw.redis_cluster,
            redis_allow_eviction: raw.redis_allow_eviction.unwrap_or(false),
            redis_restore: raw.redis_restore.unwrap_or(true),
            redis_sentinels,
            redis_sentinel_master: raw.redis_sentinel_master.unwrap_or_else(|| "mymaster".into()),
            redis_timeout_seconds: positive(raw.redis_timeout_seconds, "CACHEWRIGHT_REDIS_TIMEOUT_SECONDS")?,
            mongodb_timeout_seconds: positive(raw.mongodb_timeout_seconds, "CACHEWRIGHT_MONGODB_TIMEOUT_SECONDS")?,
            redis_cluster_nodes,
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
            prop_assume!(!user.contains(&secret) && !"redis://127.0.0.1:6379/0mongodb://h:27017/dbrediss+unixsock?authSource=admin".contains(&secret));
            let forms = [
                format!("redis://{user}:{secret}@127.0.0.1:6379/0"),
                format!("rediss://:{secret}@h:6380"),
                format!("mongodb://{user}:{secret}@h1:27017,h2:27017/db?replicaSet=rs"),
                format!("redis+unix:///tmp/r.sock?db=0&pass={secret}"),
                format!("mongodb://{user}:{secret}@h:27017/?authSource=admin"),
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
                        // The Redis edge's errors, as printed with their causes.
                        if let Err(err) = crate::sink::client(&cfg.redis()) {
                            prop_assert!(!format!("{err} {err:?}").contains(&secret), "{}", err);
                        }
                    }
                    Err(err) => prop_assert!(!err.to_string().contains(&secret), "{}", err),
                }
                // The MongoDB edge parses the URI; its errors quote it at times.
                let mongo_only = RawConfig { mongodb_uri: Some(url.clone()), ..RawConfig::default() };
                if let Ok(cfg) = Config::from_raw(mongo_only) {
                    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
                    if let Err(err) = rt.block_on(crate::source::client_options(&cfg.mongo())) {
                        prop_assert!(!err.to_string().contains(&secret), "{}", err);
                    }
                }
                let quoted = scrub(&format!("driver said: {url}"), url);
                prop_assert!(!quoted.contains(&secret), "{}", quoted);
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
        let raw = RawConfig { ttl_index: Some(0), ..RawConfig::default() };
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

    #[test]
    fn cluster_seeds_are_host_port_pairs() {
        let raw = |nodes: &str, cluster: Option<bool>| RawConfig {
            redis_cluster_nodes: Some(nodes.to_string()),
            redis_cluster: cluster,
            ..RawConfig::default()
        };
        let cfg = Config::from_raw(raw(" 10.0.0.2:6379, redis-b.internal:7000 ,", None)).unwrap();
        assert_eq!(cfg.redis_cluster_nodes, vec!["10.0.0.2:6379", "redis-b.internal:7000"]);
        assert!(Config::from_raw(raw("", None)).unwrap().redis_cluster_nodes.is_empty());
        for bad in ["10.0.0.2", "host:0", "host:port", ":6379", "redis://h:6379"] {
            let err = Config::from_raw(raw(bad, None)).unwrap_err().to_string();
            assert!(err.contains("REDIS_CLUSTER_NODES") && err.contains("host:port"), "{bad}: {err}");
        }
        let err = Config::from_raw(raw("10.0.0.2:6379", Some(false))).unwrap_err().to_string();
        assert!(err.contains("REDIS_CLUSTER=false"), "{err}");
    }
}
