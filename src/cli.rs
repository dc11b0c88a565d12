//! Command-line definitions. Global flags override the environment, which
//! overrides `cachewright.toml`, which overrides the defaults.

use crate::config::{ConfigFlags, RawConfig};
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

#[derive(Debug, Parser)]
#[command(
    name = "cachewright",
    version,
    about = "Keeps a Redis cache true to a MongoDB video catalogue",
    long_about = "Keeps a Redis cache true to a MongoDB video catalogue.\n\n\
        cachewright reads the Channel, Category, Tag and VideoMedia collections, builds the \
        denormalised payloads and indexes of the cache contract, and writes them to Redis \
        through atomic pipelines with tiered TTLs.\n\n\
        Exit codes: 0 success; 1 the run failed; 2 bad configuration or usage; \
        3 completed but documents were rejected (only with --strict); 4 refused for safety \
        (another instance holds the writer lease, or the sweep guard stopped a run that read \
        nothing or would delete too much)."
)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args)]
pub struct GlobalArgs {
    /// Config file (TOML). Default: $CACHEWRIGHT_CONFIG, else ./cachewright.toml if present
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub settings: ConfigFlags,
    /// Log format on stderr
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log filter, e.g. debug or cachewright=debug [env: RUST_LOG] [default: info]
    #[arg(long, global = true, value_name = "FILTER")]
    pub log: Option<String>,
}

impl GlobalArgs {
    /// Loads the configuration: these flags over the environment over the
    /// config file.
    pub fn load_config(&self) -> Result<crate::config::Config, crate::config::ConfigError> {
        crate::config::Config::load(self.raw_config(), self.config.as_deref(), |k| std::env::var(k).ok())
    }

    /// Logs to stderr in the chosen format, filtered by `--log` or
    /// `RUST_LOG` (default `info`).
    pub fn init_logging(&self) {
        use tracing_subscriber::EnvFilter;
        let filter = self
            .log
            .clone()
            .map(EnvFilter::new)
            .unwrap_or_else(|| EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")));
        // Colour only for a terminal: a log sent to a file or a pipe
        // (`demo.sh > demo.log`, a service manager) stays plain text.
        // `NO_COLOR` turns it off on a terminal too.
        use std::io::IsTerminal;
        let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
        let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
        match self.log_format {
            LogFormat::Json => builder.json().init(),
            LogFormat::Text => builder.with_target(false).init(),
        }
    }

    /// The flags as the highest configuration layer.
    pub fn raw_config(&self) -> RawConfig {
        self.settings.0.clone()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Rebuild every key (or the selected families) from MongoDB, then delete stale keys
    Rebuild(RebuildArgs),
    /// Print the key registry: every family with its pattern, type, TTL tier and meaning
    Keys(KeysArgs),
    /// Migration day: fold VideoMedia.categoryId into categoryIds, drop legacy channelId, rebuild, verify
    Migrate(MigrateArgs),
    /// Compare Redis with what a full rebuild would write; read-only (exit 0 only when all match)
    Verify(VerifyArgs),
    /// Memory per key family, Redis used_memory and hit rate, next to the 58K planning estimates
    Memory(MemoryArgs),
    /// Delete the registered-family keys under an old prefix: `cachewright purge --prefix OLD`
    Purge(PurgeArgs),
    /// Follow MongoDB change streams and apply each change to Redis within a fraction of a second
    Watch(WatchArgs),
    /// Run the scheduled jobs of schedules/*.toml and the watcher, with /health, /metrics and /status over HTTP
    Serve(ServeArgs),
    /// Recent runs, one run with its builders, or live progress (--follow)
    Status(StatusArgs),
    /// Print the least-privilege Redis ACL rule for the configured prefixes
    Acl(AclArgs),
}

#[derive(Debug, Args)]
pub struct WatchArgs {
    /// Coalescing window: events arriving within it are applied together
    #[arg(long, default_value_t = 200, value_name = "MS")]
    pub window_ms: u64,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// HTTP address for /health/live, /health/ready, /metrics and /status.
    /// Keep it on loopback or a private interface: /status shows errors
    /// and run history
    #[arg(long, env = "CACHEWRIGHT_HTTP_ADDR", default_value = "127.0.0.1:3002", value_name = "ADDR")]
    pub http: String,
    /// A directory of schedule files (*.toml) instead of the shipped schedules/default.toml
    #[arg(long, env = "CACHEWRIGHT_SCHEDULES", value_name = "DIR")]
    pub schedules: Option<PathBuf>,
    /// Do not run the change-stream watcher
    #[arg(long)]
    pub no_watch: bool,
    /// The watcher's coalescing window
    #[arg(long, default_value_t = 200, value_name = "MS")]
    pub window_ms: u64,
    /// Open HTTP connections at most; at the limit a newcomer evicts the
    /// oldest connection that has not sent a complete request
    #[arg(long, env = "CACHEWRIGHT_HTTP_MAX_CONNECTIONS", default_value_t = 256, value_name = "N")]
    pub http_max_connections: usize,
    /// Seconds a client has to send its request headers; the whole
    /// exchange may take three times as long
    #[arg(long, env = "CACHEWRIGHT_HTTP_TIMEOUT", default_value_t = 5, value_name = "SECONDS")]
    pub http_timeout: u64,
}

#[derive(Debug, Args)]
#[command(long_about = "Print the least-privilege Redis ACL rule for the configured prefixes.\n\n\
    The rule allows the data prefix (CACHEWRIGHT_PREFIX) and the status prefix (CACHEWRIGHT_STATUS_PREFIX), \
    the progress channels under the status prefix, and only the commands cachewright sends. Replace \
    <password> (or pass --password-env) and run it with redis-cli as an administrator.")]
pub struct AclArgs {
    /// The Redis user name
    #[arg(long, default_value = "cachewright", value_name = "NAME")]
    pub user: String,
    /// Take the password from this environment variable instead of printing <password>
    #[arg(long, value_name = "VAR")]
    pub password_env: Option<String>,
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// A run id (16 hex characters) to show in detail
    pub run_id: Option<String>,
    /// Print live progress messages from pub/sub (until the run ends, with RUN_ID)
    #[arg(long)]
    pub follow: bool,
    /// How many recent runs to list
    #[arg(long, default_value_t = 20)]
    pub limit: usize,
}

#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// Print how many documents each step would change, with samples; write nothing
    #[arg(long)]
    pub dry_run: bool,
    /// Documents per batch
    #[arg(long, default_value_t = 500, value_name = "N")]
    pub batch: usize,
}

#[derive(Debug, Args)]
pub struct VerifyArgs {
    /// Only these families (names or collection groups, as for rebuild --only)
    #[arg(long, value_delimiter = ',', value_name = "FAMILY,...")]
    pub only: Vec<String>,
    /// Compare N keys of every family, drawn at random from what a rebuild
    /// would write, instead of every key (MongoDB is still read whole, in
    /// the rebuild's bounded memory; key names are still all judged for
    /// extras)
    #[arg(long, value_name = "N")]
    pub sample: Option<usize>,
    /// Differences listed per family (all are counted)
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub show: usize,
    #[arg(long, value_enum, default_value_t = ReportFormat::Table)]
    pub format: ReportFormat,
}

#[derive(Debug, Args)]
pub struct MemoryArgs {
    /// Keys sampled per family for MEMORY USAGE
    #[arg(long, default_value_t = 200, value_name = "N")]
    pub sample: usize,
    #[arg(long, value_enum, default_value_t = ReportFormat::Table)]
    pub format: ReportFormat,
}

#[derive(Debug, Args)]
#[command(long_about = "Delete the registered-family keys under an old prefix.\n\n\
    Give the old prefix with the global --prefix flag: `cachewright purge --prefix app: --dry-run`. \
    The active data prefix (CACHEWRIGHT_PREFIX or the config file) is refused, and keys under the old \
    prefix that belong to no registered family (including those of a newer prefix nested inside it) \
    are left alone.")]
pub struct PurgeArgs {
    /// Count what would be deleted; delete nothing
    #[arg(long)]
    pub dry_run: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReportFormat {
    Table,
    Json,
}

#[derive(Debug, Args)]
pub struct RebuildArgs {
    /// Only these families (comma-separated names from `cachewright keys`, or a
    /// collection group: channel, category, tag, video)
    #[arg(long, value_delimiter = ',', value_name = "FAMILY,...")]
    pub only: Vec<String>,
    /// Read and plan, write nothing, and print the same summary
    #[arg(long)]
    pub dry_run: bool,
    /// Exit with code 3 when any document was rejected
    #[arg(long)]
    pub strict: bool,
    /// Also write the summary as JSON to this file
    #[arg(long, value_name = "PATH")]
    pub summary_json: Option<PathBuf>,
    /// Skip the sweep guard: write even when a collection gave no usable
    /// document, and sweep even when more than CACHEWRIGHT_SWEEP_MAX_SHARE
    /// of the existing keys would go
    #[arg(long)]
    pub allow_mass_delete: bool,
}

#[derive(Debug, Args)]
pub struct KeysArgs {
    #[arg(long, value_enum, default_value_t = KeysFormat::Table)]
    pub format: KeysFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum KeysFormat {
    Table,
    /// The readers' reference, docs/CACHE_SEMANTICS.md
    Markdown,
    Json,
    /// Key constructors and payload interfaces, docs/cache-keys.ts
    Typescript,
}

/// The README's table of `serve` settings, generated from the `serve`
/// arguments that take an environment variable.
pub fn serve_settings_table() -> String {
    use clap::CommandFactory;
    let cli = Cli::command();
    let serve = cli.find_subcommand("serve").expect("serve is a command");
    let mut out = String::from("| environment | flag | default | meaning |\n|---|---|---|---|\n");
    for arg in serve.get_arguments() {
        let Some(env) = arg.get_env() else { continue };
        let default = arg.get_default_values().first().map(|d| format!("`{}`", d.to_string_lossy()));
        let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default().replace('\n', " ");
        out.push_str(&format!(
            "| `{}` | `--{}` | {} | {} |\n",
            env.to_string_lossy(),
            arg.get_long().unwrap_or_default(),
            default.unwrap_or_else(|| "–".into()),
            help.replace('|', "\\|")
        ));
    }
    out
}

/// Resolves `--only` names to families.
pub fn parse_only(names: &[String]) -> Result<crate::plan::FamilySet, String> {
    use crate::registry::{FamilyId, Registry};
    if names.is_empty() {
        return Ok(crate::plan::FamilySet::all());
    }
    let mut picked = Vec::new();
    for name in names {
        let name = name.trim();
        let group: Vec<FamilyId> =
            Registry::get().families().iter().filter(|f| f.collection == name).map(|f| f.id).collect();
        if !group.is_empty() {
            picked.extend(group);
        } else if let Some(id) = FamilyId::from_name(name) {
            picked.push(id);
        } else {
            let known: Vec<&str> = FamilyId::ALL.iter().map(|f| f.name()).collect();
            return Err(format!(
                "unknown family `{name}` in --only; use channel, category, tag, video or one of: {}",
                known.join(", ")
            ));
        }
    }
    Ok(crate::plan::FamilySet::of(picked))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::FamilyId;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_valid() {
        Cli::command().debug_assert();
    }

    #[test]
    fn only_takes_families_and_groups() {
        let set = parse_only(&["tag".into(), "video:detail".into()]).unwrap();
        assert!(set.contains(FamilyId::TagSearch));
        assert!(set.contains(FamilyId::VideoDetail));
        assert!(!set.contains(FamilyId::VideoCategories));
        assert!(parse_only(&["nope".into()]).unwrap_err().contains("unknown family `nope`"));
    }
}
