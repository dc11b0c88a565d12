//! `cachewright status`: recent runs, one run with its builders, or live
//! progress from pub/sub.

use crate::keys::status::StatusKeys;
use crate::table;
use futures::StreamExt;
use redis::aio::ConnectionManager;
use std::collections::HashMap;

pub type Fields = HashMap<String, String>;

/// The job hashes of the runs still listed in the state sets, newest first.
pub async fn recent_runs(
    conn: &mut ConnectionManager,
    keys: &StatusKeys,
    limit: usize,
) -> redis::RedisResult<Vec<Fields>> {
    let mut ids: Vec<String> = Vec::new();
    for state in ["active", "completed", "failed"] {
        let members: Vec<String> = redis::cmd("SMEMBERS").arg(keys.jobs(state)).query_async(conn).await?;
        ids.extend(members);
    }
    let mut runs = Vec::new();
    for id in ids {
        let fields: Fields = redis::cmd("HGETALL").arg(keys.job(&id)).query_async(conn).await?;
        if !fields.is_empty() {
            runs.push(fields);
        }
    }
    let started = |f: &Fields| f.get("started_at").and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
    runs.sort_by_key(|f| std::cmp::Reverse(started(f)));
    runs.truncate(limit);
    Ok(runs)
}

/// One run's job hash and its builder hashes by name.
pub async fn run_detail(
    conn: &mut ConnectionManager,
    keys: &StatusKeys,
    run_id: &str,
) -> redis::RedisResult<(Fields, Vec<(String, Fields)>)> {
    let job: Fields = redis::cmd("HGETALL").arg(keys.job(run_id)).query_async(conn).await?;
    let mut builders = Vec::new();
    let mut cursor: u64 = 0;
    let prefix = keys.builder(run_id, "");
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(keys.builders_glob(run_id))
            .arg("COUNT")
            .arg(1000)
            .query_async(conn)
            .await?;
        for key in batch {
            let fields: Fields = redis::cmd("HGETALL").arg(&key).query_async(conn).await?;
            builders.push((key.strip_prefix(&prefix).unwrap_or(&key).to_string(), fields));
        }
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    builders.sort_by_key(|(_, f)| f.get("started_at").cloned().unwrap_or_default());
    Ok((job, builders))
}

fn get<'a>(f: &'a Fields, k: &str) -> &'a str {
    f.get(k).map(String::as_str).unwrap_or("")
}

pub fn render_runs(runs: &[Fields]) -> String {
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|f| {
            let duration = match (get(f, "started_at").parse::<u64>(), get(f, "finished_at").parse::<u64>()) {
                (Ok(s), Ok(e)) => format!("{}s", e.saturating_sub(s)),
                _ => "-".into(),
            };
            ["run_id", "trigger", "status", "started_at"]
                .iter()
                .map(|k| get(f, k).to_string())
                .chain([duration])
                .chain(["keys_written", "keys_deleted", "rejected", "last_error"].iter().map(|k| get(f, k).to_string()))
                .collect()
        })
        .collect();
    table::render(
        &["run", "trigger", "status", "started_at", "took", "written", "deleted", "rejected", "last error"],
        &rows,
        &[5, 6, 7],
    )
}

pub fn render_detail(job: &Fields, builders: &[(String, Fields)]) -> String {
    let mut keys: Vec<&String> = job.keys().collect();
    keys.sort();
    let rows: Vec<Vec<String>> = keys.iter().map(|k| vec![k.to_string(), job[*k].clone()]).collect();
    let mut out = table::render(&["field", "value"], &rows, &[]);
    out.push('\n');
    let rows: Vec<Vec<String>> = builders
        .iter()
        .map(|(name, f)| {
            [name.clone()]
                .into_iter()
                .chain(["status", "current", "total", "started_at", "updated_at"].iter().map(|k| get(f, k).to_string()))
                .collect()
        })
        .collect();
    out.push_str(&table::render(
        &["builder", "status", "current", "total", "started_at", "updated_at"],
        &rows,
        &[2, 3],
    ));
    out
}

/// Prints progress messages until interrupted, or until the given run
/// completes or fails.
pub async fn follow(client: redis::Client, keys: &StatusKeys, run_id: Option<&str>) -> redis::RedisResult<()> {
    let mut pubsub = client.get_async_pubsub().await?;
    match run_id {
        Some(id) => pubsub.subscribe(keys.progress(id)).await?,
        None => pubsub.psubscribe(keys.progress_pattern()).await?,
    }
    let mut messages = pubsub.on_message();
    while let Some(msg) = messages.next().await {
        let payload: String = msg.get_payload().unwrap_or_default();
        println!("{} {payload}", msg.get_channel_name());
        let kind =
            serde_json::from_str::<serde_json::Value>(&payload).ok().and_then(|v| v["type"].as_str().map(String::from));
        if run_id.is_some() && matches!(kind.as_deref(), Some("complete" | "error")) {
            break;
        }
    }
    Ok(())
}
