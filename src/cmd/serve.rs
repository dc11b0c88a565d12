//! `cachewright serve`: schedules, leadership, the supervised watcher and HTTP.

use super::*;

pub async fn run(global: &GlobalArgs, args: &ServeArgs) -> anyhow::Result<ExitCode> {
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
    tracing::info!(http = %listener.local_addr()?, "http endpoints: /health/live /health/ready /metrics /status");
    let opts = serve::ServeOptions {
        schedules,
        watch: !args.no_watch,
        window: std::time::Duration::from_millis(args.window_ms),
        http: serve::http::Limits {
            max_connections: args.http_max_connections.max(1),
            header_timeout: std::time::Duration::from_secs(args.http_timeout.max(1)),
            request_timeout: std::time::Duration::from_secs(args.http_timeout.max(1) * 3),
        },
        grace: serve::SHUTDOWN_GRACE,
        clock: serve::clock::system(),
    };
    cachewright::usage::raise_open_file_limit();
    serve::run(&cfg, opts, listener, shutdown_signal()).await.context("serve stopped with an error")?;
    Ok(ExitCode::SUCCESS)
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
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
