//! `cachewright rebuild`: the full rebuild and its summary.

use super::*;

pub async fn run(global: &GlobalArgs, args: &RebuildArgs) -> anyhow::Result<ExitCode> {
    let cfg = load_config(global)?;
    let Some(families) = families_or_usage(&args.only) else { return Ok(ExitCode::from(EXIT_USAGE)) };
    tracing::info!(prefix = %cfg.prefix, mongodb_db = %cfg.mongodb_db, dry_run = args.dry_run, "rebuild started");
    let cpu_before = cachewright::usage::cpu_time();
    let mut opts = RebuildOptions::only(families);
    opts.dry_run = args.dry_run;
    opts.allow_mass_delete = args.allow_mass_delete;
    let summary = match cachewright::rebuild::rebuild_with_retries(&cfg, &opts, &Progress::auto(), 3).await {
        Ok(summary) => summary,
        Err(err @ (cachewright::rebuild::RunError::Guard(_) | cachewright::rebuild::RunError::Lease(_))) => {
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
            "sweep_scanned": match summary.sweep {
                cachewright::rebuild::Sweep::Scanned(keys) => Some(keys),
                cachewright::rebuild::Sweep::Skipped => None,
            },
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
