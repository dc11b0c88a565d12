//! Reading the job status keys (contract §3) for `status`, `/status` and
//! the reporter, and following progress messages on pub/sub.

use crate::keys::status::StatusKeys;
use crate::sink::{Sink, SinkError};
use futures::StreamExt;
use std::collections::HashMap;

pub type Fields = HashMap<String, String>;

fn read_err(source: redis::RedisError) -> SinkError {
    SinkError::Scan { attempts: 1, source }
}

impl Sink {
    /// A string key's value.
    pub async fn get_string(&self, key: &str) -> Result<Option<String>, SinkError> {
        let mut conn = self.connection();
        redis::cmd("GET").arg(key).query_async(&mut conn).await.map_err(read_err)
    }

    /// `PING`, for health checks.
    pub async fn ping(&self) -> Result<(), SinkError> {
        let mut conn = self.connection();
        redis::cmd("PING").query_async::<()>(&mut conn).await.map_err(read_err)
    }

    /// The members of a set.
    pub async fn members(&self, key: &str) -> Result<Vec<String>, SinkError> {
        let mut conn = self.connection();
        redis::cmd("SMEMBERS").arg(key).query_async(&mut conn).await.map_err(read_err)
    }

    /// Which of `keys` exist.
    pub async fn exist(&self, keys: &[String]) -> Result<Vec<bool>, SinkError> {
        let mut pipe = redis::pipe();
        for key in keys {
            pipe.cmd("EXISTS").arg(key);
        }
        let mut conn = self.connection();
        pipe.query_async(&mut conn).await.map_err(read_err)
    }

    /// The job hashes of the runs still listed in the state sets, newest
    /// first.
    pub async fn recent_runs(&self, keys: &StatusKeys, limit: usize) -> Result<Vec<Fields>, SinkError> {
        let mut conn = self.connection();
        let mut ids: Vec<String> = Vec::new();
        for state in ["active", "completed", "failed"] {
            ids.extend(self.members(&keys.jobs(state)).await?);
        }
        let mut pipe = redis::pipe();
        for id in &ids {
            pipe.cmd("HGETALL").arg(keys.job(id));
        }
        let hashes: Vec<Fields> = pipe.query_async(&mut conn).await.map_err(read_err)?;
        let mut runs: Vec<Fields> = hashes.into_iter().filter(|f| !f.is_empty()).collect();
        let started = |f: &Fields| f.get("started_at").and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
        runs.sort_by_key(|f| std::cmp::Reverse(started(f)));
        runs.truncate(limit);
        Ok(runs)
    }

    /// One run's job hash and its builder hashes by name.
    pub async fn run_detail(
        &self,
        keys: &StatusKeys,
        run_id: &str,
    ) -> Result<(Fields, Vec<(String, Fields)>), SinkError> {
        let mut conn = self.connection();
        let job: Fields = redis::cmd("HGETALL").arg(keys.job(run_id)).query_async(&mut conn).await.map_err(read_err)?;
        let prefix = keys.builder(run_id, "");
        let mut names = Vec::new();
        self.for_each_key(&keys.builders_glob(run_id), |scanned| {
            match scanned {
                crate::sink::cluster_io::Scanned::Restart => names.clear(),
                crate::sink::cluster_io::Scanned::Keys(batch) => names.extend(batch),
            }
            std::future::ready(Ok(()))
        })
        .await?;
        let mut builders = Vec::new();
        for key in names {
            let key = String::from_utf8_lossy(&key).into_owned();
            let fields: Fields = redis::cmd("HGETALL").arg(&key).query_async(&mut conn).await.map_err(read_err)?;
            builders.push((key.strip_prefix(&prefix).unwrap_or(&key).to_string(), fields));
        }
        builders.sort_by_key(|(_, f)| f.get("started_at").cloned().unwrap_or_default());
        Ok((job, builders))
    }
}

/// Calls `on_message(channel, payload)` for each progress message until
/// interrupted, or until the given run completes or fails.
pub async fn follow_progress(
    client: redis::Client,
    keys: &StatusKeys,
    run_id: Option<&str>,
    mut on_message: impl FnMut(&str, &str),
) -> redis::RedisResult<()> {
    let mut pubsub = client.get_async_pubsub().await?;
    match run_id {
        Some(id) => pubsub.subscribe(keys.progress(id)).await?,
        None => pubsub.psubscribe(keys.progress_pattern()).await?,
    }
    let mut messages = pubsub.on_message();
    while let Some(msg) = messages.next().await {
        let payload = String::from_utf8_lossy(msg.get_payload_bytes()).into_owned();
        on_message(msg.get_channel_name(), &payload);
        let kind =
            serde_json::from_str::<serde_json::Value>(&payload).ok().and_then(|v| v["type"].as_str().map(String::from));
        if run_id.is_some() && matches!(kind.as_deref(), Some("complete" | "error")) {
            break;
        }
    }
    Ok(())
}
