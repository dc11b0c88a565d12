//! `cachewright purge`: registered-family keys under an old prefix.

use super::*;

pub async fn run(global: &GlobalArgs, args: &PurgeArgs) -> anyhow::Result<ExitCode> {
    let Some(old) = global.settings.0.prefix.clone() else {
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
    let sink = cachewright::sink::Sink::connect_for(&cfg.redis(), cachewright::sink::Access::Write).await?;
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
