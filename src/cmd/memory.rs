//! `cachewright memory`: memory per key family.

use super::*;

pub async fn run(global: &GlobalArgs, args: &MemoryArgs) -> anyhow::Result<ExitCode> {
    let cfg = load_config(global)?;
    let sink = cachewright::sink::Sink::connect_for(&cfg.redis(), cachewright::sink::Access::Read).await?;
    let keys = cachewright::keys::Keys::new(cfg.prefix.clone());
    let report = admin::memory::measure(&sink, &keys, args.sample.max(1)).await?;
    match args.format {
        ReportFormat::Table => print!("{}", report.render()),
        ReportFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
    }
    Ok(ExitCode::SUCCESS)
}
