//! `cachewright-dev`: development tools kept out of the product binary.
//! Built only with `--features dev` (see `src/dev/`); the release image
//! ships `cachewright` alone.
//!
//! Every command here writes to the configured MongoDB database or Redis
//! prefix, so each refuses data it did not create unless given `--yes`.

use cachewright::cli::GlobalArgs;
use cachewright::dev::{self, DevResult};
use cachewright::progress::Progress;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(
    name = "cachewright-dev",
    version,
    about = "Development tools for cachewright: data sets, fixtures and benchmarks",
    long_about = "Development tools for cachewright: data sets, fixtures and benchmarks.\n\n\
        These commands replace or rewrite MongoDB collections and write cache keys. Point them at a \
        scratch database and prefix. Each refuses a database that already holds documents unless \
        given --yes; `bench` always needs --yes.\n\n\
        Exit codes: 0 success; 1 failed; 2 bad configuration or usage; 4 refused (pass --yes)."
)]
struct Cli {
    #[command(flatten)]
    global: GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Test and benchmark data sets
    #[command(subcommand)]
    Fixtures(FixturesCommand),
    /// Measure reading alone, planning alone and writing alone (see scripts/bench.sh)
    Bench(BenchArgs),
    /// Print the README's settings tables, generated from the declarations
    ReadmeTables,
    /// Time one client's GETs of a key until a file appears or for a while, and print their
    /// percentiles as JSON (the reader beside scripts/bench.sh's warm rebuild)
    Reader(ReaderArgs),
}

#[derive(Debug, Subcommand)]
enum FixturesCommand {
    /// Fill MongoDB with a deterministic production-shaped data set (replaces the four collections)
    Generate(GenerateArgs),
    /// Load Extended JSON fixture files (fixtures/<set>/<Collection>.json) into MongoDB
    Load(LoadArgs),
}

#[derive(Debug, Args)]
struct GenerateArgs {
    /// Replace the four collections even when they hold documents
    #[arg(long)]
    yes: bool,
    /// Number of VideoMedia documents
    #[arg(long, default_value_t = 58_000)]
    videos: usize,
    /// Random seed; the same seed gives the same data set
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long, default_value_t = 50)]
    channels: usize,
    #[arg(long, default_value_t = 2000)]
    categories: usize,
    #[arg(long, default_value_t = 10_000)]
    tags: usize,
}

#[derive(Debug, Args)]
struct LoadArgs {
    /// Load even when the four collections hold documents
    #[arg(long)]
    yes: bool,
    /// Directory holding Channel.json, Category.json, Tag.json, VideoMedia.json
    dir: PathBuf,
}

#[derive(Debug, Args)]
struct BenchArgs {
    /// Required: the benchmark writes cache keys under the configured
    /// prefix, and with --watch rewrites video documents
    #[arg(long)]
    yes: bool,
    /// Where to write the JSON result (stdout when absent)
    #[arg(long, value_name = "PATH")]
    out: Option<PathBuf>,
    /// Benchmark the watcher instead: latency at --rate updates/s, the sustained rate of a
    /// flood, then the rate a watcher drains a backlog held back from it
    #[arg(long)]
    watch: bool,
    /// Video updates per second for the latency phase
    #[arg(long, default_value_t = 1000)]
    rate: u64,
    /// Seconds per phase
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Which changes --watch makes: titles only, a platform's mix of
    /// uploads, deletes, category moves, status flips and catalogue edits,
    /// or that mix without its catalogue edits (the same batch at any
    /// catalogue size)
    #[arg(long, value_enum, default_value = "platform")]
    mix: cachewright::dev::change_mix::Mix,
    /// Seed of the --watch mix's choices (which videos, categories and
    /// tags it changes, and how): the same seed on the same data makes the
    /// same changes, so two binaries compare on one workload. Default: a
    /// new seed each run
    #[arg(long)]
    seed: Option<u64>,
    /// Also write the final state as plain commands, one `host_port.resp`
    /// file per master, for `redis-cli --pipe` (the physical write limit)
    #[arg(long, value_name = "DIR")]
    resp_dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("until").required(true).args(["until_file", "seconds"])))]
struct ReaderArgs {
    /// The Redis node to read from, host:port
    #[arg(long, default_value = "127.0.0.1:6379")]
    addr: String,
    /// The key to GET (set it first: the reader reads, never writes)
    #[arg(long)]
    key: String,
    /// Stop once this file exists
    #[arg(long, value_name = "PATH")]
    until_file: Option<PathBuf>,
    /// Stop after this many seconds
    #[arg(long)]
    seconds: Option<f64>,
    /// Where to write the JSON result (stdout when absent)
    #[arg(long, value_name = "PATH")]
    out: Option<PathBuf>,
}

const EXIT_REFUSED: u8 = 4;

fn main() -> ExitCode {
    let cli = Cli::parse();
    // As the product's `rebuild`, or its `watch` for the watcher's bench.
    cachewright::usage::configure_process(matches!(&cli.command, Command::Bench(args) if args.watch));
    cli.global.init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {err}");
            let mut cause = err.source();
            while let Some(c) = cause {
                eprintln!("  caused by: {c}");
                cause = c.source();
            }
            if err.is::<dev::Refused>() {
                ExitCode::from(EXIT_REFUSED)
            } else if err.is::<cachewright::config::ConfigError>() {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

async fn run(cli: &Cli) -> DevResult<()> {
    if let Command::ReadmeTables = cli.command {
        print!("{}\n{}", cachewright::config::markdown_table(), cachewright::cli::serve_settings_table());
        return Ok(());
    }
    // Needs no configuration: it talks to the one node it is given.
    if let Command::Reader(args) = &cli.command {
        return reader(args).await;
    }
    let cfg = cli.global.load_config()?;
    match &cli.command {
        Command::Fixtures(FixturesCommand::Generate(args)) => generate(&cfg, args).await,
        Command::Fixtures(FixturesCommand::Load(args)) => load(&cfg, args).await,
        Command::Bench(args) => bench(&cfg, args).await,
        Command::ReadmeTables | Command::Reader(_) => Ok(()),
    }
}

async fn reader(args: &ReaderArgs) -> DevResult<()> {
    let (addr, key, file) = (args.addr.clone(), args.key.clone(), args.until_file.clone());
    // clap requires exactly one of the two.
    let limit = match args.seconds {
        Some(s) => Some(
            std::time::Duration::try_from_secs_f64(s)
                .map_err(|_| format!("--seconds {s}: give a number of seconds"))?,
        ),
        None => None,
    };
    // A blocking loop on a thread of its own: each request is timed from
    // its send to its reply, with no runtime in between.
    let report = tokio::task::spawn_blocking(move || {
        let until = match (&file, limit) {
            (Some(path), _) => dev::reader::Until::File(path),
            (None, limit) => dev::reader::Until::Elapsed(limit.unwrap_or_default()),
        };
        dev::reader::read_until(&addr, &key, until)
    })
    .await?
    .map_err(|e| format!("reading {} from {} failed: {e}", args.key, args.addr))?;
    let json = serde_json::to_string(&report)?;
    match &args.out {
        Some(path) => std::fs::write(path, json + "\n")?,
        None => println!("{json}"),
    }
    Ok(())
}

async fn generate(cfg: &cachewright::config::Config, args: &GenerateArgs) -> DevResult<()> {
    let source = cachewright::source::Source::connect(&cfg.mongo()).await?;
    dev::guard(cfg, source.database(), "fixtures generate", args.yes).await?;
    let progress = Progress::auto();
    let stage = progress.stage("generating videos", args.videos as u64);
    let shape = dev::generate::Shape {
        channels: args.channels,
        categories: args.categories,
        tags: args.tags,
        videos: args.videos,
    };
    let counts = dev::generate::generate(source.database(), &cfg.collections, shape, args.seed, |n| stage.inc(n))
        .await
        .map_err(|e| format!("writing the generated data set to MongoDB failed: {e}"))?;
    stage.finish();
    tracing::info!(
        channels = counts[0],
        categories = counts[1],
        tags = counts[2],
        videos = counts[3],
        seed = args.seed,
        "data set generated"
    );
    Ok(())
}

async fn load(cfg: &cachewright::config::Config, args: &LoadArgs) -> DevResult<()> {
    let c = &cfg.collections;
    let sets = dev::fixtures::read_dir(&args.dir, &[&c.channel, &c.category, &c.tag, &c.video])?;
    let source = cachewright::source::Source::connect(&cfg.mongo()).await?;
    dev::guard(cfg, source.database(), "fixtures load", args.yes).await?;
    dev::fixtures::load(source.database(), &sets)
        .await
        .map_err(|e| format!("loading fixtures into MongoDB failed: {e}"))?;
    for (name, docs) in &sets {
        tracing::info!(collection = %name, documents = docs.len(), "fixtures loaded");
    }
    Ok(())
}

async fn bench(cfg: &cachewright::config::Config, args: &BenchArgs) -> DevResult<()> {
    if !args.yes {
        let rewrites =
            if args.watch { format!(" and rewrites video documents of {:?}", cfg.mongodb_db) } else { String::new() };
        let reason = format!("the benchmark writes cache keys under {:?}{rewrites}", cfg.prefix);
        return Err(Box::new(dev::Refused { what: "bench", reason }));
    }
    let json = if args.watch {
        serde_json::to_string_pretty(
            &dev::bench_watch::run(cfg, args.mix, args.seed, args.rate.max(1), args.seconds.max(1)).await?,
        )?
    } else {
        serde_json::to_string_pretty(&dev::bench::run(cfg, args.resp_dir.as_deref()).await?)?
    };
    match &args.out {
        Some(path) => std::fs::write(path, json).map_err(|e| format!("cannot write {}: {e}", path.display()))?,
        None => println!("{json}"),
    }
    Ok(())
}
