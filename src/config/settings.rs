//! Every configuration setting, declared once.
//!
//! The [`settings!`] table below gives each setting its field, type,
//! environment variable, file key, default and meaning. From it come the
//! raw layer struct [`RawConfig`], reading the environment, reading
//! `cachewright.toml` (unknown keys refused), the global `--flag` of each
//! setting with its `--help` text, stacking the layers, and the README's
//! configuration table ([`markdown_table`], checked by a test).
//! Validation of the stacked values lives in [`super::Config::from_raw`].

use super::ConfigError;
use std::path::{Path, PathBuf};

/// One setting as documentation and the CLI see it.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    /// The `RawConfig` field, also the flag's clap id.
    pub field: &'static str,
    pub env: &'static str,
    /// The file key; `ttl.count` is `count` under `[ttl]`.
    pub key: &'static str,
    /// The default value, parsed like any other; empty when there is none.
    pub default: &'static str,
    /// How the README shows the default, when not the value itself.
    pub shown: &'static str,
    pub help: &'static str,
    /// What to write instead, when a value does not parse.
    pub hint: &'static str,
}

impl Setting {
    /// `--ttl-count` for `ttl.count`.
    pub fn flag(&self) -> String {
        self.key.replace(['.', '_'], "-")
    }

    fn shown_default(&self) -> String {
        match (self.shown, self.default) {
            ("", "") => "–".to_string(),
            ("", value) => format!("`{value}`"),
            (shown, _) => shown.to_string(),
        }
    }
}

/// A setting's type: parsed from text (environment, flags, defaults) or
/// from a TOML value (the file).
pub trait Value: Sized {
    fn parse(text: &str) -> Option<Self>;
    fn from_toml(value: &toml::Value) -> Option<Self>;
}

impl Value for String {
    fn parse(text: &str) -> Option<Self> {
        Some(text.to_string())
    }
    fn from_toml(value: &toml::Value) -> Option<Self> {
        value.as_str().map(str::to_string)
    }
}

impl Value for PathBuf {
    fn parse(text: &str) -> Option<Self> {
        Some(PathBuf::from(text))
    }
    fn from_toml(value: &toml::Value) -> Option<Self> {
        value.as_str().map(PathBuf::from)
    }
}

impl Value for f64 {
    fn parse(text: &str) -> Option<Self> {
        text.trim().parse().ok().filter(|v: &f64| v.is_finite())
    }
    fn from_toml(value: &toml::Value) -> Option<Self> {
        value.as_float().or_else(|| value.as_integer().map(|i| i as f64))
    }
}

macro_rules! integer_value {
    ($($t:ty),*) => {$(
        impl Value for $t {
            fn parse(text: &str) -> Option<Self> {
                text.trim().parse().ok()
            }
            fn from_toml(value: &toml::Value) -> Option<Self> {
                value.as_integer().and_then(|i| <$t>::try_from(i).ok())
            }
        }
    )*};
}
integer_value!(u32, u64, usize, i64);

/// A list of lengths: `2,3` as text, `[2, 3]` in the file.
impl Value for bool {
    fn parse(text: &str) -> Option<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" => Some(true),
            "false" | "0" | "no" => Some(false),
            _ => None,
        }
    }
    fn from_toml(value: &toml::Value) -> Option<Self> {
        value.as_bool()
    }
}

impl Value for Vec<usize> {
    fn parse(text: &str) -> Option<Self> {
        text.split(',').map(|p| p.trim().parse().ok()).collect()
    }
    fn from_toml(value: &toml::Value) -> Option<Self> {
        value.as_array()?.iter().map(usize::from_toml).collect()
    }
}

fn parse_text<T: Value>(setting: &Setting, text: Option<String>) -> Result<Option<T>, ConfigError> {
    match text {
        None => Ok(None),
        Some(text) => T::parse(&text).map(Some).ok_or_else(|| super::invalid(setting.env, text, setting.hint)),
    }
}

fn lookup<'a>(table: &'a toml::Table, key: &str) -> Option<&'a toml::Value> {
    match key.split_once('.') {
        Some((section, rest)) => lookup(table.get(section)?.as_table()?, rest),
        None => table.get(key),
    }
}

/// Every dotted key of a parsed file, for refusing unknown ones.
fn dotted_keys(table: &toml::Table, prefix: &str, out: &mut Vec<String>) {
    for (key, value) in table {
        let key = format!("{prefix}{key}");
        match value.as_table() {
            Some(inner) => dotted_keys(inner, &format!("{key}."), out),
            None => out.push(key),
        }
    }
}

macro_rules! settings {
    ($($field:ident: $ty:ty {
        env: $env:literal, key: $key:literal, default: $default:literal, shown: $shown:literal,
        help: $help:literal, hint: $hint:literal $(,)?
    })*) => {
        /// One layer of settings, every field optional. The file, the
        /// environment and the flags each give one; [`RawConfig::over`]
        /// stacks them.
        #[derive(Debug, Clone, Default, PartialEq)]
        pub struct RawConfig {
            $(#[doc = $help] pub $field: Option<$ty>,)*
        }

        /// The settings, in README order.
        pub const SETTINGS: &[Setting] = &[$(Setting {
            field: stringify!($field), env: $env, key: $key, default: $default, shown: $shown, help: $help, hint: $hint,
        },)*];

        fn setting(field: &str) -> &'static Setting {
            SETTINGS.iter().find(|s| s.field == field).expect("declared setting")
        }

        impl RawConfig {
            /// Reads the environment through `get`, so tests need not touch
            /// the process environment.
            pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<RawConfig, ConfigError> {
                Ok(RawConfig { $($field: parse_text(setting(stringify!($field)), get($env))?,)* })
            }

            /// The declared defaults, as the lowest layer.
            pub fn defaults() -> RawConfig {
                let text = |default: &str| (!default.is_empty()).then(|| default.to_string());
                RawConfig { $($field: text($default).and_then(|t| <$ty as Value>::parse(&t)),)* }
            }

            /// Parses a `cachewright.toml`; unknown keys are refused.
            pub fn from_toml(path: &Path, text: &str) -> Result<RawConfig, ConfigError> {
                let err = |message: String| ConfigError::Toml { path: path.to_path_buf(), message };
                let table: toml::Table = toml::from_str(text).map_err(|e| err(e.message().to_string()))?;
                let mut keys = Vec::new();
                dotted_keys(&table, "", &mut keys);
                if let Some(unknown) = keys.iter().find(|k| !SETTINGS.iter().any(|s| s.key == k.as_str())) {
                    return Err(err(format!(
                        "unknown field `{unknown}`; the README's configuration table lists every key"
                    )));
                }
                let value = |s: &Setting| lookup(&table, s.key);
                Ok(RawConfig { $($field: match value(setting(stringify!($field))) {
                    None => None,
                    Some(v) => Some(<$ty as Value>::from_toml(v).ok_or_else(|| {
                        err(format!("{} = {v} is invalid: {}", $key, $hint))
                    })?),
                },)* })
            }

            /// Stacks `self` over `low`: a value set here wins.
            pub fn over(self, low: RawConfig) -> RawConfig {
                RawConfig { $($field: self.$field.or(low.$field),)* }
            }

            /// The values given as flags, from clap's matches.
            fn from_matches(matches: &clap::ArgMatches) -> Result<RawConfig, ConfigError> {
                Ok(RawConfig { $($field: parse_text(
                    setting(stringify!($field)),
                    matches.get_one::<String>(stringify!($field)).cloned(),
                )?,)* })
            }
        }
    };
}

settings! {
    mongodb_uri: String {
        env: "MONGODB_URI", key: "mongodb_uri", default: "mongodb://127.0.0.1:27017", shown: "",
        help: "MongoDB connection string", hint: "use a mongodb:// or mongodb+srv:// connection string",
    }
    mongodb_db: String {
        env: "MONGODB_DB", key: "mongodb_db", default: "app", shown: "",
        help: "MongoDB database", hint: "use a plain database name such as app",
    }
    mongodb_timeout_seconds: u64 {
        env: "CACHEWRIGHT_MONGODB_TIMEOUT_SECONDS", key: "mongodb_timeout_seconds", default: "60", shown: "",
        help: "How long one MongoDB read (a cursor's next batch) may go unanswered before it counts as failed: a stalled server or a network that drops packets then fails the run (retried, like any passing trouble) instead of holding it and its lease forever",
        hint: "use whole seconds such as 60",
    }
    redis_url: String {
        env: "REDIS_URL", key: "redis_url", default: "redis://127.0.0.1:6379", shown: "",
        help: "Redis URL; rediss:// for TLS; password in the URL or in REDIS_PASSWORD",
        hint: "use redis://host:port (rediss:// for TLS)",
    }
    redis_password: String {
        env: "REDIS_PASSWORD", key: "redis_password", default: "", shown: "",
        help: "Redis password, overriding the URL's (prefer the environment to the flag)", hint: "",
    }
    redis_db: i64 {
        env: "REDIS_DB", key: "redis_db", default: "", shown: "from the URL (0)",
        help: "Redis database number", hint: "use a database number such as 0",
    }
    redis_tls_ca: PathBuf {
        env: "REDIS_TLS_CA", key: "redis_tls_ca", default: "", shown: "public web roots",
        help: "PEM file of the CA that signed the Redis server's certificate (rediss:// only)", hint: "",
    }
    redis_tls_cert: PathBuf {
        env: "REDIS_TLS_CERT", key: "redis_tls_cert", default: "", shown: "",
        help: "PEM client certificate for mutual TLS (with REDIS_TLS_KEY)", hint: "",
    }
    redis_tls_key: PathBuf {
        env: "REDIS_TLS_KEY", key: "redis_tls_key", default: "", shown: "",
        help: "PEM private key of the client certificate", hint: "",
    }
    redis_cluster: bool {
        env: "REDIS_CLUSTER", key: "redis_cluster", default: "", shown: "detected (INFO cluster_enabled)",
        help: "Redis Cluster mode: true or false overrides the detection", hint: "use true or false",
    }
    redis_timeout_seconds: u64 {
        env: "CACHEWRIGHT_REDIS_TIMEOUT_SECONDS", key: "redis_timeout_seconds", default: "60", shown: "",
        help: "How long a Redis write may go unanswered before it counts as lost; it is then sent again under a raised fencing epoch, so a late copy is refused",
        hint: "use whole seconds such as 60",
    }
    redis_allow_eviction: bool {
        env: "CACHEWRIGHT_ALLOW_EVICTION", key: "redis_allow_eviction", default: "false", shown: "",
        help: "Write even when Redis may evict any key (maxmemory-policy allkeys-*), which can evict the lease, epoch and pending records",
        hint: "use true or false",
    }
    redis_restore: bool {
        env: "CACHEWRIGHT_RESTORE", key: "redis_restore", default: "true", shown: "",
        help: "Write each set, list and sorted set with one RESTORE where the Redis user may run it and every master runs Redis 5.0 or later; false always uses UNLINK, the adds and EXPIRE",
        hint: "use true or false",
    }
    redis_sentinels: String {
        env: "REDIS_SENTINELS", key: "redis_sentinels", default: "", shown: "",
        help: "Sentinels as host:port,host:port: the master comes from them and is followed across fail-overs (REDIS_URL gives scheme, user, password, database)",
        hint: "use host:port pairs separated by commas, such as 10.0.0.5:26379,10.0.0.6:26379",
    }
    redis_sentinel_master: String {
        env: "REDIS_SENTINEL_MASTER", key: "redis_sentinel_master", default: "mymaster", shown: "",
        help: "The master name the sentinels monitor", hint: "",
    }
    redis_cluster_nodes: String {
        env: "REDIS_CLUSTER_NODES", key: "redis_cluster_nodes", default: "", shown: "",
        help: "More cluster seed nodes as host:port,host:port (REDIS_URL's scheme, user and password)",
        hint: "use host:port pairs separated by commas, such as 10.0.0.2:6379,10.0.0.3:6379",
    }
    prefix: String {
        env: "CACHEWRIGHT_PREFIX", key: "prefix", default: "app:", shown: "",
        help: "Data key prefix", hint: "",
    }
    status_prefix: String {
        env: "CACHEWRIGHT_STATUS_PREFIX", key: "status_prefix", default: "cachewright:", shown: "",
        help: "Job status prefix; must not overlap the data prefix", hint: "",
    }
    ttl_jitter: f64 {
        env: "CACHEWRIGHT_TTL_JITTER", key: "ttl_jitter", default: "0.1", shown: "",
        help: "Extra random TTL, as a fraction of the tier (0-1)", hint: "use a fraction between 0 and 1, such as 0.1",
    }
    ttl_count: u64 {
        env: "CACHEWRIGHT_TTL_COUNT", key: "ttl.count", default: "3600", shown: "",
        help: "TTL seconds of the count tier", hint: "use whole seconds such as 3600",
    }
    ttl_index: u64 {
        env: "CACHEWRIGHT_TTL_INDEX", key: "ttl.index", default: "7200", shown: "",
        help: "TTL seconds of the index tier", hint: "use whole seconds such as 7200",
    }
    ttl_detail: u64 {
        env: "CACHEWRIGHT_TTL_DETAIL", key: "ttl.detail", default: "86400", shown: "",
        help: "TTL seconds of the detail tier", hint: "use whole seconds such as 86400",
    }
    ttl_catalog: u64 {
        env: "CACHEWRIGHT_TTL_CATALOG", key: "ttl.catalog", default: "604800", shown: "",
        help: "TTL seconds of the catalog tier", hint: "use whole seconds such as 604800",
    }
    collection_channel: String {
        env: "CACHEWRIGHT_COLLECTION_CHANNEL", key: "collections.channel", default: "Channel", shown: "",
        help: "Channel collection name", hint: "",
    }
    collection_category: String {
        env: "CACHEWRIGHT_COLLECTION_CATEGORY", key: "collections.category", default: "Category", shown: "",
        help: "Category collection name", hint: "",
    }
    collection_tag: String {
        env: "CACHEWRIGHT_COLLECTION_TAG", key: "collections.tag", default: "Tag", shown: "",
        help: "Tag collection name", hint: "",
    }
    collection_video: String {
        env: "CACHEWRIGHT_COLLECTION_VIDEO", key: "collections.video", default: "VideoMedia", shown: "",
        help: "VideoMedia collection name", hint: "",
    }
    tag_search_lengths: Vec<usize> {
        env: "CACHEWRIGHT_TAG_SEARCH_LENGTHS", key: "tag_search_lengths", default: "2,3", shown: "",
        help: "Tag-search prefix lengths", hint: "use comma-separated lengths such as 2,3",
    }
    home_limit: usize {
        env: "CACHEWRIGHT_HOME_LIMIT", key: "home_limit", default: "", shown: "each section's (500)",
        help: "Limit of every home section", hint: "use a positive number such as 500",
    }
    read_batch_size: u32 {
        env: "CACHEWRIGHT_READ_BATCH_SIZE", key: "read_batch_size", default: "2000", shown: "",
        help: "MongoDB cursor batch size", hint: "use a positive number such as 2000",
    }
    read_cursors: usize {
        env: "CACHEWRIGHT_READ_CURSORS", key: "read_cursors", default: "1", shown: "",
        help: "Cursors reading the video collection side by side over ObjectId _id ranges, plus one for every other _id (1: one cursor in natural order; see DEPLOYMENT.md before raising it)",
        hint: "use a positive number such as 4",
    }
    write_batch_ops: usize {
        env: "CACHEWRIGHT_WRITE_BATCH_OPS", key: "write_batch_ops", default: "1000", shown: "",
        help: "Keys per MULTI/EXEC batch", hint: "use a positive number such as 1000",
    }
    write_batch_cost: usize {
        env: "CACHEWRIGHT_WRITE_BATCH_COST", key: "write_batch_cost", default: "120000", shown: "",
        help: "Redis cost one MULTI/EXEC may carry (a script on a cluster: a quarter of it): bytes + 2,000 per key + 600 per element (1,200 per sorted-set member); a bigger collection goes through a stage key",
        hint: "use a positive number such as 120000",
    }
    write_concurrency: usize {
        env: "CACHEWRIGHT_WRITE_CONCURRENCY", key: "write_concurrency", default: "8", shown: "",
        help: "Pipelines in flight", hint: "use a positive number such as 8",
    }
    lease_seconds: u64 {
        env: "CACHEWRIGHT_LEASE_SECONDS", key: "lease_seconds", default: "30", shown: "",
        help: "Writer lease lifetime (renewed every third); a stalled leader is replaced within it",
        hint: "use whole seconds such as 30",
    }
    sweep_max_share: f64 {
        env: "CACHEWRIGHT_SWEEP_MAX_SHARE", key: "sweep_max_share", default: "0.5", shown: "",
        help: "Sweep guard: the largest share of the selected families' existing keys one rebuild may delete",
        hint: "use a fraction between 0 and 1, such as 0.5",
    }
    drift_sample_per_minute: u64 {
        env: "CACHEWRIGHT_DRIFT_SAMPLE_PER_MINUTE", key: "drift_sample_per_minute", default: "1000", shown: "",
        help: "Under serve, keys a minute the leader compares with what a rebuild would write, rewriting those that drifted (0: off)",
        hint: "use a whole number such as 1000 (0 turns the check off)",
    }
    watch_max_lag_seconds: u64 {
        env: "CACHEWRIGHT_WATCH_MAX_LAG_SECONDS", key: "watch_max_lag_seconds", default: "60", shown: "",
        help: "Under serve, the watcher lag above which /health/ready answers 503",
        hint: "use whole seconds such as 60",
    }
}

/// The settings as global flags: `--mongodb-uri`, `--ttl-count`, ...,
/// each with its environment variable and default in `--help`.
#[derive(Debug, Clone, Default)]
pub struct ConfigFlags(pub RawConfig);

impl clap::FromArgMatches for ConfigFlags {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        RawConfig::from_matches(matches)
            .map(ConfigFlags)
            .map_err(|e| clap::Error::raw(clap::error::ErrorKind::ValueValidation, format!("{e}\n")))
    }

    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(matches)?;
        Ok(())
    }
}

impl clap::Args for ConfigFlags {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        let mut cmd = cmd.next_help_heading("Configuration (flag, then environment, then file, then default)");
        for s in SETTINGS {
            let default = match (s.shown, s.default) {
                ("", "") => String::new(),
                ("", value) => format!(" [default: {value}]"),
                (shown, _) => format!(" [default: {shown}]"),
            };
            cmd = cmd.arg(
                clap::Arg::new(s.field)
                    .long(s.flag())
                    .global(true)
                    .value_name(s.env)
                    .help(format!("{} [env: {}]{default}", s.help, s.env)),
            );
        }
        cmd.next_help_heading(None)
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        Self::augment_args(cmd)
    }
}

/// The README's configuration table, generated from [`SETTINGS`].
pub fn markdown_table() -> String {
    let mut out = String::from("| environment | file key | flag | default | meaning |\n|---|---|---|---|---|\n");
    for s in SETTINGS {
        let key = match s.key.split_once('.') {
            Some((section, key)) => format!("`[{section}] {key}`"),
            None => format!("`{}`", s.key),
        };
        out.push_str(&format!(
            "| `{}` | {key} | `--{}` | {} | {} |\n",
            s.env,
            s.flag(),
            s.shown_default(),
            s.help.replace('|', "\\|")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_setting_has_distinct_names_and_a_parsable_default() {
        for (i, a) in SETTINGS.iter().enumerate() {
            for b in &SETTINGS[i + 1..] {
                assert!(a.env != b.env && a.key != b.key && a.flag() != b.flag(), "{a:?} / {b:?}");
            }
        }
        let defaults = RawConfig::defaults();
        assert_eq!(defaults.ttl_count, Some(crate::registry::Tier::Count.default_seconds()));
        assert_eq!(defaults.ttl_index, Some(crate::registry::Tier::Index.default_seconds()));
        assert_eq!(defaults.ttl_detail, Some(crate::registry::Tier::Detail.default_seconds()));
        assert_eq!(defaults.ttl_catalog, Some(crate::registry::Tier::Catalog.default_seconds()));
        assert_eq!(defaults.tag_search_lengths, Some(vec![2, 3]));
        assert_eq!(defaults.home_limit, None);
    }

    #[test]
    fn a_file_value_of_the_wrong_type_names_its_key() {
        let err = RawConfig::from_toml(Path::new("c.toml"), "[ttl]\ncount = \"soon\"\n").unwrap_err();
        assert!(err.to_string().contains("ttl.count = \"soon\" is invalid: use whole seconds"), "{err}");
        let raw = RawConfig::from_toml(Path::new("c.toml"), "tag_search_lengths = [4]\nttl_jitter = 0\n").unwrap();
        assert_eq!((raw.tag_search_lengths, raw.ttl_jitter), (Some(vec![4]), Some(0.0)));
    }
}
