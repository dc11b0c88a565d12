//! `cachewright bench`: reading, planning and writing measured alone.

use super::*;

pub async fn run(global: &GlobalArgs, args: &BenchArgs) -> anyhow::Result<ExitCode> {
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
