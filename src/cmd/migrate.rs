//! `cachewright migrate`: the MongoDB side of migration day, then rebuild and verify.

use super::*;

pub async fn run(global: &GlobalArgs, args: &MigrateArgs) -> anyhow::Result<ExitCode> {
    let cfg = load_config(global)?;
    let source = cachewright::source::Source::connect(&cfg.mongo()).await?;
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
    let summary = cachewright::rebuild::rebuild_with_retries(&cfg, &opts, &progress, 3)
        .await
        .context("rebuild after migration failed")?;
    println!();
    print!("{}", summary.render());
    let report =
        admin::verify::verify(&cfg, admin::verify::VerifyOptions::all(cachewright::plan::FamilySet::all()), &progress)
            .await?;
    println!();
    print!("{}", report.render());
    Ok(if report.ok() { ExitCode::SUCCESS } else { ExitCode::from(EXIT_FAILED) })
}
