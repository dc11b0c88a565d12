//! `cachewright status`: recent runs, one run, or live progress.

use super::*;

pub async fn run(global: &GlobalArgs, args: &StatusArgs) -> anyhow::Result<ExitCode> {
    use cachewright::status::show;
    let cfg = load_config(global)?;
    let keys = cachewright::keys::status::StatusKeys::new(cfg.status_prefix.clone());
    let sink = cachewright::sink::Sink::connect(&cfg.redis()).await?;
    if args.follow {
        let client = cachewright::sink::client(&cfg.redis())?;
        cachewright::sink::jobs::follow_progress(client, &keys, args.run_id.as_deref(), |channel, payload| {
            println!("{} {}", show::printable(channel), show::printable(payload))
        })
        .await
        .context("following progress failed")?;
        return Ok(ExitCode::SUCCESS);
    }
    match &args.run_id {
        Some(id) => {
            let (job, builders) = sink.run_detail(&keys, id).await?;
            if job.is_empty() {
                eprintln!("error: no run {id:?} (job hashes live 24 hours); `cachewright status` lists recent runs");
                return Ok(ExitCode::from(EXIT_FAILED));
            }
            print!("{}", show::render_detail(&job, &builders));
        }
        None => {
            let runs = sink.recent_runs(&keys, args.limit).await?;
            print!("{}", show::render_runs(&runs));
            let total = sink.get_string(&keys.total_jobs()).await?;
            println!("total jobs: {}", total.unwrap_or_else(|| "0".into()));
            let health = sink.get_string(&keys.health()).await?;
            match health {
                Some(h) => println!("health: {}", show::printable(&h)),
                None => println!("health: no running watcher has reported in the last 60 s"),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
