//! `cachewright verify`: Redis compared with what a full rebuild would write.

use super::*;

pub async fn run(global: &GlobalArgs, args: &VerifyArgs) -> anyhow::Result<ExitCode> {
    let cfg = load_config(global)?;
    let Some(families) = families_or_usage(&args.only) else { return Ok(ExitCode::from(EXIT_USAGE)) };
    let opts = admin::verify::VerifyOptions { families, show: args.show, sample: args.sample };
    let report = admin::verify::verify(&cfg, opts, &Progress::auto()).await.context("verify could not run")?;
    match args.format {
        ReportFormat::Table => print!("{}", report.render()),
        ReportFormat::Json => println!("{}", serde_json::to_string_pretty(&report)?),
    }
    Ok(if report.ok() { ExitCode::SUCCESS } else { ExitCode::from(EXIT_FAILED) })
}
