//! `cachewright watch`: change streams as a leader.

use super::*;

pub async fn run(global: &GlobalArgs, args: &WatchArgs) -> anyhow::Result<ExitCode> {
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
