//! The `cachewright` binary: CLI glue around the library. Errors are
//! printed with their causes (`{:#}`) and mapped to exit codes.

use anyhow::Context;
use cachewright::admin;
use cachewright::cli::{
    BenchArgs, Cli, Command, FixturesCommand, GlobalArgs, KeysArgs, KeysFormat, LogFormat, MemoryArgs, MigrateArgs,
    PurgeArgs, RebuildArgs, ReportFormat, ServeArgs, StatusArgs, VerifyArgs, WatchArgs,
};
use cachewright::config::{Config, ConfigError};
use cachewright::progress::Progress;
use cachewright::rebuild::{self, RebuildOptions};
use cachewright::registry::Registry;
use cachewright::{fixtures, generate, table};
use clap::Parser;
use std::process::ExitCode;

// The planner allocates many small strings; mimalloc keeps that cheap.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

const EXIT_FAILED: u8 = 1;
const EXIT_USAGE: u8 = 2;
const EXIT_REJECTED: u8 = 3;
const EXIT_REFUSED: u8 = 4;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if std::env::var_os("CACHEWRIGHT_THP").is_none() {
        cachewright::usage::disable_transparent_huge_pages();
    }
    init_logging(&cli.global);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(err) => {
            eprintln!("error: cannot start the async runtime: {err}");
            return ExitCode::from(EXIT_FAILED);
        }
    };
    match runtime.block_on(dispatch(cli)) {
        Ok(code) => code,
        Err(err) => {
            if let Some(cfg) = err.downcast_ref::<ConfigError>() {
                eprintln!("error: {cfg}");
                return ExitCode::from(EXIT_USAGE);
            }
            eprintln!("error: {err:#}");
            ExitCode::from(EXIT_FAILED)
        }
    }
}

fn init_logging(global: &GlobalArgs) {
    use tracing_subscriber::EnvFilter;
    let filter = global
        .log
        .clone()
        .map(EnvFilter::new)
        .unwrap_or_else(|| EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match global.log_format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.with_target(false).init(),
    }
}

/// `--only` as families; prints the problem and gives `None` when a name
/// is unknown (exit code 2).
fn families_or_usage(only: &[String]) -> Option<cachewright::plan::FamilySet> {
    cachewright::cli::parse_only(only).map_err(|msg| eprintln!("error: {msg}")).ok()
}

fn load_config(global: &GlobalArgs) -> Result<Config, ConfigError> {
    Config::load(global.raw_config(), global.config.as_deref(), |k| std::env::var(k).ok())
}

async fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Keys(args) => keys(&args),
        Command::Rebuild(args) => rebuild_cmd(&cli.global, &args).await,
        Command::Fixtures(FixturesCommand::Generate(args)) => {
            let cfg = load_config(&cli.global)?;
            let source = cachewright::source::Source::connect(&cfg).await?;
            let progress = Progress::auto();
            let stage = progress.stage("generating videos", args.videos as u64);
            let shape = generate::Shape {
                channels: args.channels,
                categories: args.categories,
                tags: args.tags,
                videos: args.videos,
            };
            let counts = generate::generate(source.database(), &cfg.collections, shape, args.seed, |n| stage.inc(n))
                .await
                .context("writing the generated data set to MongoDB failed")?;
            stage.finish();
            tracing::info!(
                channels = counts[0],
                categories = counts[1],
                tags = counts[2],
                videos = counts[3],
                seed = args.seed,
                "data set generated"
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Fixtures(FixturesCommand::Load(args)) => {
            let cfg = load_config(&cli.global)?;
            let c = &cfg.collections;
            let sets = fixtures::read_dir(&args.dir, &[&c.channel, &c.category, &c.tag, &c.video])?;
            let source = cachewright::source::Source::connect(&cfg).await?;
            fixtures::load(source.database(), &sets).await.context("loading fixtures into MongoDB failed")?;
            for (name, docs) in &sets {
                tracing::info!(collection = %name, documents = docs.len(), "fixtures loaded");
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Bench(args) => bench(&cli.global, &args).await,
        Command::Migrate(args) => migrate(&cli.global, &args).await,
        Command::Verify(args) => verify(&cli.global, &args).await,
        Command::Memory(args) => memory(&cli.global, &args).await,
        Command::Purge(args) => purge(&cli.global, &args).await,
        Command::Status(args) => status(&cli.global, &args).await,
        Command::Watch(args) => watch(&cli.global, &args).await,
        Command::Serve(args) => serve(&cli.global, &args).await,
    }
}

async fn serve(global: &GlobalArgs, args: &ServeArgs) -> anyhow::Result<ExitCode> {
    use cachewright::serve::{self, schedule};
    let cfg = load_config(global)?;
    let text = match &args.schedules {
        None => schedule::DEFAULT_SCHEDULES.to_string(),
        Some(dir) => {
            let mut files: Vec<_> = std::fs::read_dir(dir)
                .with_context(|| format!("cannot read the schedules directory {}", dir.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "toml"))
                .collect();
            files.sort();
            let mut text = String::new();
            for f in files {
                text.push_str(&std::fs::read_to_string(&f).with_context(|| format!("cannot read {}", f.display()))?);
                text.push('\n');
            }
            text
        }
    };
    let schedules = match schedule::parse(&text).and_then(|s| {
        schedule::check_coverage(&s, &cfg.ttl, chrono::Utc::now())?;
        Ok(s)
    }) {
        Ok(s) => s,
        Err(err) => {
            eprintln!("error: {err}");
            return Ok(ExitCode::from(EXIT_USAGE));
        }
    };
    let listener = tokio::net::TcpListener::bind(&args.http)
        .await
        .with_context(|| format!("cannot listen on {} (set --http or CACHEWRIGHT_HTTP_ADDR)", args.http))?;
    tracing::info!(http = %listener.local_addr()?, "http endpoints: /health /metrics /status");
    let opts = serve::ServeOptions {
        schedules,
        watch: !args.no_watch,
        window: std::time::Duration::from_millis(args.window_ms),
    };
    serve::run(&cfg, opts, listener, shutdown_signal()).await.context("serve stopped with an error")?;
    Ok(ExitCode::SUCCESS)
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(term) => term,
            Err(_) => {
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutdown requested");
}

async fn watch(global: &GlobalArgs, args: &WatchArgs) -> anyhow::Result<ExitCode> {
    let cfg = load_config(global)?;
    let opts = cachewright::watch::WatchOptions {
        window: std::time::Duration::from_millis(args.window_ms),
        ..Default::default()
    };
    let metrics = std::sync::Arc::new(cachewright::watch::WatchMetrics::default());
    cachewright::watch::run(&cfg, &opts, metrics.clone(), shutdown_signal()).await.context("the watcher stopped")?;
    tracing::info!(events = metrics.total_applied(), "watcher stopped cleanly; resume tokens are saved");
    Ok(ExitCode::SUCCESS)
}

async fn status(global: &GlobalArgs, args: &StatusArgs) -> anyhow::Result<ExitCode> {
    use cachewright::status::show;
    let cfg = load_config(global)?;
    let keys = cachewright::keys::status::StatusKeys::new(cfg.status_prefix.clone());
    let sink = cachewright::sink::Sink::connect(&cfg).await?;
    let mut conn = sink.connection();
    if args.follow {
        let client = cachewright::sink::client(&cfg)?;
        show::follow(client, &keys, args.run_id.as_deref()).await.context("following progress failed")?;
        return Ok(ExitCode::SUCCESS);
    }
    match &args.run_id {
        Some(id) => {
            let (job, builders) = show::run_detail(&mut conn, &keys, id).await?;
            if job.is_empty() {
                eprintln!("error: no run {id:?} (job hashes live 24 hours); `cachewright status` lists recent runs");
                return Ok(ExitCode::from(EXIT_FAILED));
            }
            print!("{}", show::render_detail(&job, &builders));
        }
        None => {
            let runs = show::recent_runs(&mut conn, &keys, args.limit).await?;
            print!("{}", show::render_runs(&runs));
            let total: Option<String> = redis::cmd("GET").arg(keys.total_jobs()).query_async(&mut conn).await?;
            println!("total jobs: {}", total.unwrap_or_else(|| "0".into()));
            let health: Option<String> = redis::cmd("GET").arg(keys.health()).query_async(&mut conn).await?;
            match health {
                Some(h) => println!("health: {h}"),
                None => println!("health: no running watcher has reported in the last 60 s"),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn migrate(global: &GlobalArgs, args: &MigrateArgs) -> anyhow::Result<ExitCode> {
    let cfg = load_config(global)?;
    let source = cachewright::source::Source::connect(&cfg).await?;
    let progress = Progress::auto();
    let steps =
        admin::migrate::migrate(source.database(), &cfg.collections, args.batch.max(1), args.dry_run, &progress)
            .await
            .context("migration failed; it is safe to run `cachewright migrate` again, it resumes where it stopped")?;
    print!("{}", admin::migrate::render(&steps, args.dry_run));
    if args.dry_run {
        return Ok(ExitCode::SUCCESS);
    }
    tracing::info!(trigger = "migration", "data steps done, running a full rebuild");
    let opts = RebuildOptions::full().trigger(cachewright::status::Trigger::Migration);
    let summary =
        rebuild::rebuild_with_retries(&cfg, &opts, &progress, 3).await.context("rebuild after migration failed")?;
    println!();
    print!("{}", summary.render());
    let report = admin::verify::verify(&cfg, cachewright::plan::FamilySet::all(), 3, &progress).await?;
    println!();
    print!("{}", report.render());
    Ok(if report.ok() { ExitCode::SUCCESS } else { ExitCode::from(EXIT_FAILED) })
}

async fn verify(global: &GlobalArgs, args: &VerifyArgs) -> anyhow::Result<ExitCode> {
    let cfg = load_config(global)?;
    let Some(families) = families_or_usage(&args.only) else { return Ok(ExitCode::from(EXIT_USAGE)) };
    let report =
        admin::verify::verify(&cfg, families, args.sample, &Progress::auto()).await.context("verify could not run")?;
    match args.format {
        ReportFormat::Table => print!("{}", report.render()),
        ReportFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
    }
    Ok(if report.ok() { ExitCode::SUCCESS } else { ExitCode::from(EXIT_FAILED) })
}

async fn memory(global: &GlobalArgs, args: &MemoryArgs) -> anyhow::Result<ExitCode> {
    let cfg = load_config(global)?;
    let sink = cachewright::sink::Sink::connect(&cfg).await?;
    let keys = cachewright::keys::Keys::new(cfg.prefix.clone());
    let report = admin::memory::measure(&sink, &keys, args.sample.max(1)).await?;
    match args.format {
        ReportFormat::Table => print!("{}", report.render()),
        ReportFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
    }
    Ok(ExitCode::SUCCESS)
}

async fn purge(global: &GlobalArgs, args: &PurgeArgs) -> anyhow::Result<ExitCode> {
    let Some(old) = global.prefix.clone() else {
        eprintln!("error: purge needs the old prefix: cachewright purge --prefix OLD [--dry-run]");
        return Ok(ExitCode::from(EXIT_USAGE));
    };
    // The active prefix is the one configured without the flag.
    let mut flags = global.raw_config();
    flags.prefix = None;
    let active = Config::load(flags, global.config.as_deref(), |k| std::env::var(k).ok())?;
    if old == active.prefix {
        eprintln!(
            "error: refusing to purge {old:?}: it is the active data prefix. Point CACHEWRIGHT_PREFIX at the new prefix first"
        );
        return Ok(ExitCode::from(EXIT_USAGE));
    }
    let cfg = load_config(global)?;
    let sink = cachewright::sink::Sink::connect(&cfg).await?;
    let counts = admin::purge::purge(&sink, &old, args.dry_run, &Progress::auto()).await.context("purge failed")?;
    let rows: Vec<Vec<String>> = counts.iter().map(|(f, n)| vec![f.name().to_string(), n.to_string()]).collect();
    let header = ["family", if args.dry_run { "would delete" } else { "deleted" }];
    print!("{}", table::render(&header, &rows, &[1]));
    println!(
        "{} keys under {old:?}{}",
        counts.values().sum::<u64>(),
        if args.dry_run { " (dry run)" } else { " deleted" }
    );
    Ok(ExitCode::SUCCESS)
}

fn keys(args: &KeysArgs) -> anyhow::Result<ExitCode> {
    let reg = Registry::get();
    let rows: Vec<Vec<String>> = reg
        .families()
        .iter()
        .map(|f| {
            vec![
                f.name().to_string(),
                format!("{{prefix}}{}", f.pattern),
                f.redis_type.as_str().to_string(),
                format!("{} ({}s)", f.tier.as_str(), f.tier.default_seconds()),
                f.meaning.clone(),
            ]
        })
        .collect();
    let header = ["family", "pattern", "type", "ttl tier", "meaning"];
    match args.format {
        KeysFormat::Table => print!("{}", table::render(&header, &rows, &[])),
        KeysFormat::Markdown => print!("{}", cachewright::docs::markdown()),
        KeysFormat::Typescript => print!("{}", cachewright::docs::typescript()),
        KeysFormat::Json => {
            let items: Vec<serde_json::Value> = reg
                .families()
                .iter()
                .map(|f| {
                    serde_json::json!({
                        "family": f.name(),
                        "collection": f.collection,
                        "pattern": f.pattern.to_string(),
                        "type": f.redis_type.as_str(),
                        "tier": f.tier.as_str(),
                        "ttl_seconds": f.tier.default_seconds(),
                        "meaning": f.meaning,
                        "payload": f.payload,
                        "invalidated_by": f.invalidated_by,
                    })
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&items)?);
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn rebuild_cmd(global: &GlobalArgs, args: &RebuildArgs) -> anyhow::Result<ExitCode> {
    let cfg = load_config(global)?;
    let Some(families) = families_or_usage(&args.only) else { return Ok(ExitCode::from(EXIT_USAGE)) };
    tracing::info!(prefix = %cfg.prefix, mongodb_db = %cfg.mongodb_db, dry_run = args.dry_run, "rebuild started");
    let cpu_before = cachewright::usage::cpu_time();
    let mut opts = RebuildOptions::only(families);
    opts.dry_run = args.dry_run;
    opts.allow_mass_delete = args.allow_mass_delete;
    let summary = match rebuild::rebuild_with_retries(&cfg, &opts, &Progress::auto(), 3).await {
        Ok(summary) => summary,
        Err(err @ (rebuild::RunError::Guard(_) | rebuild::RunError::Lease(_))) => {
            eprintln!("error: {err}");
            return Ok(ExitCode::from(EXIT_REFUSED));
        }
        Err(err) => {
            return Err(anyhow::Error::new(err).context(
                "rebuild failed; every key is either as before or fully rewritten, and nothing was swept. Fix the cause and run it again",
            ));
        }
    };
    print!("{}", summary.render());
    let cpu = (cachewright::usage::cpu_time() - cpu_before).as_secs_f64();
    let rss = cachewright::usage::peak_rss().unwrap_or(0);
    println!("cpu: {cpu:.2}s, peak rss: {:.1} MiB", rss as f64 / 1_048_576.0);
    if let Some(path) = &args.summary_json {
        let json = serde_json::json!({
            "written": summary.written.iter().map(|(f, n)| (f.name(), *n)).collect::<std::collections::BTreeMap<_, _>>(),
            "deleted": summary.deleted.iter().map(|(f, n)| (f.name(), *n)).collect::<std::collections::BTreeMap<_, _>>(),
            "rejected": summary.rejected_total(),
            "dangling": summary.refs.dangling_total(),
            "unusable": summary.refs.unusable_total(),
            "duration_seconds": summary.duration.as_secs_f64(),
            "cpu_seconds": cpu,
            "peak_rss_bytes": rss,
            "used_memory_before": summary.memory_before,
            "used_memory_after": summary.memory_after,
        });
        std::fs::write(path, serde_json::to_string_pretty(&json)?)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    let rejected = summary.rejected_total();
    if rejected > 0 {
        tracing::warn!(rejected, "documents were rejected; see the table above for reasons and sample ids");
    }
    tracing::info!(
        keys_written = summary.written_total(),
        keys_deleted = summary.deleted_total(),
        rejected,
        "rebuild completed"
    );
    Ok(if args.strict && rejected > 0 { ExitCode::from(EXIT_REJECTED) } else { ExitCode::SUCCESS })
}

async fn bench(global: &GlobalArgs, args: &BenchArgs) -> anyhow::Result<ExitCode> {
    let cfg = load_config(global)?;
    let json = if args.watch {
        serde_json::to_string_pretty(
            &cachewright::bench_watch::run(&cfg, args.rate.max(1), args.seconds.max(1)).await?,
        )?
    } else {
        serde_json::to_string_pretty(&cachewright::bench::run(&cfg).await?)?
    };
    match &args.out {
        Some(path) => std::fs::write(path, json).with_context(|| format!("cannot write {}", path.display()))?,
        None => println!("{json}"),
    }
    Ok(ExitCode::SUCCESS)
}
