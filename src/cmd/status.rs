//! `cachewright status`: recent runs, one run, or live progress.

use super::*;

pub async fn run(global: &GlobalArgs, args: &StatusArgs) -> anyhow::Result<ExitCode> {
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
