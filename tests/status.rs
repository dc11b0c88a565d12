//! Job status keys, progress messages and the rebuild lease (contract §3),
//! against real servers.

mod common;

use cachewright::progress::Progress;
use cachewright::rebuild::{RebuildOptions, RunError, rebuild};
use futures::StreamExt;
use std::collections::HashMap;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_rebuild_reports_its_job_status_and_progress() {
    let s = common::shared();
    let name = common::unique("status");
    let cfg = common::TestEnv::named(&name).config();
    common::load_fixtures(&cfg, &common::fixture_dir("edge-cases")).await;
    let sp = cfg.status_prefix.clone();

    let client = redis::Client::open(s.redis.url()).unwrap();
    let mut pubsub = client.get_async_pubsub().await.unwrap();
    pubsub.psubscribe(format!("{sp}progress:*")).await.unwrap();
    let summary = rebuild(&cfg, &RebuildOptions::full(), &Progress::hidden()).await.unwrap();

    let mut conn = common::redis_conn(&s.redis.url()).await;
    let completed: Vec<String> =
        redis::cmd("SMEMBERS").arg(format!("{sp}jobs:completed")).query_async(&mut conn).await.unwrap();
    assert_eq!(completed.len(), 1);
    let run_id = &completed[0];
    assert!(run_id.len() == 16 && run_id.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()));
    let active: Vec<String> =
        redis::cmd("SMEMBERS").arg(format!("{sp}jobs:active")).query_async(&mut conn).await.unwrap();
    assert!(active.is_empty());

    let job: HashMap<String, String> =
        redis::cmd("HGETALL").arg(format!("{sp}job:{run_id}")).query_async(&mut conn).await.unwrap();
    let mut fields: Vec<&str> = job.keys().map(String::as_str).collect();
    fields.sort();
    assert_eq!(
        fields,
        vec![
            "current_builder",
            "error_count",
            "finished_at",
            "keys_deleted",
            "keys_written",
            "last_error",
            "progress_current",
            "progress_total",
            "rejected",
            "run_id",
            "started_at",
            "status",
            "trigger",
            "updated_at"
        ]
    );
    assert_eq!(job["status"], "completed");
    assert_eq!(job["trigger"], "manual");
    assert_eq!(job["run_id"], *run_id);
    assert_eq!(job["keys_written"], summary.written_total().to_string());
    assert_eq!(job["rejected"], "11");
    assert_eq!(job["error_count"], "0");
    let started: u64 = job["started_at"].parse().unwrap();
    let finished: u64 = job["finished_at"].parse().unwrap();
    assert!(finished >= started && started > 1_700_000_000);
    let ttl: i64 = redis::cmd("TTL").arg(format!("{sp}job:{run_id}")).query_async(&mut conn).await.unwrap();
    assert!((86_000..=86_400).contains(&ttl), "{ttl}");

    let builder: HashMap<String, String> = redis::cmd("HGETALL")
        .arg(format!("{sp}job:{run_id}:builder:reading videos"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(builder["status"], "completed");
    assert_eq!(builder["current"], "16");
    for field in ["total", "started_at", "updated_at"] {
        assert!(builder.contains_key(field), "builder lacks {field}");
    }
    let total: u64 = redis::cmd("GET").arg(format!("{sp}stats:total_jobs")).query_async(&mut conn).await.unwrap();
    assert_eq!(total, 1);

    let mut kinds = Vec::new();
    let mut messages = pubsub.on_message();
    while let Ok(Some(msg)) = tokio::time::timeout(Duration::from_secs(2), messages.next()).await {
        assert_eq!(msg.get_channel_name(), format!("{sp}progress:{run_id}"));
        let v: serde_json::Value = serde_json::from_str(&msg.get_payload::<String>().unwrap()).unwrap();
        assert!(v["timestamp"].is_u64() && v["data"]["message"].is_string() && v["data"]["current"].is_u64());
        kinds.push(v["type"].as_str().unwrap().to_string());
        if kinds.last().map(String::as_str) == Some("complete") {
            break;
        }
    }
    assert_eq!(kinds.first().map(String::as_str), Some("info"));
    assert!(kinds.iter().any(|k| k == "progress"));
    assert_eq!(kinds.last().map(String::as_str), Some("complete"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_one_instance_rebuilds_and_a_lost_lease_stops_the_writes() {
    let s = common::shared();
    let name = common::unique("lease");
    let cfg = common::TestEnv::named(&name).home_limit(None).with(|raw| raw.lease_seconds = Some(1)).config();
    let lock = common::env::status_keys(&cfg).rebuild_lock();
    let mut conn = common::redis_conn(&s.redis.url()).await;

    // Held by someone else: refused, nothing written.
    common::load_fixtures(&cfg, &common::fixture_dir("edge-cases")).await;
    let _: () = redis::cmd("SET").arg(&lock).arg("other").arg("PX").arg(60_000).query_async(&mut conn).await.unwrap();
    let err = rebuild(&cfg, &RebuildOptions::full(), &Progress::hidden()).await.unwrap_err();
    assert!(matches!(err, RunError::Lease(_)), "{err}");
    assert!(err.to_string().contains("another instance holds the writer lease"), "{err}");
    assert!(err.to_string().contains("other"), "the holder is named: {err}");
    assert!(common::dump(&s.redis.url(), &cfg.prefix).await.is_empty());
    let _: () = redis::cmd("DEL").arg(&lock).query_async(&mut conn).await.unwrap();

    // Released after a run.
    rebuild(&cfg, &RebuildOptions::full(), &Progress::hidden()).await.unwrap();
    let exists: bool = redis::cmd("EXISTS").arg(&lock).query_async(&mut conn).await.unwrap();
    assert!(!exists, "lease not released");

    // Taken over mid-run: the run stops and is marked failed.
    let source = cachewright::source::Source::connect(&cfg.mongo()).await.unwrap();
    let shape = cachewright::dev::generate::Shape { channels: 5, categories: 50, tags: 200, videos: 40_000 };
    cachewright::dev::generate::generate(source.database(), &cfg.collections, shape, 4, |_| {}).await.unwrap();
    let run = {
        let cfg = cfg.clone();
        tokio::spawn(async move { rebuild(&cfg, &RebuildOptions::full(), &Progress::hidden()).await })
    };
    common::wait_for_every("the rebuild to take the lease", Duration::from_secs(5), Duration::from_millis(2), || {
        let (mut conn, lock) = (conn.clone(), lock.clone());
        async move { redis::cmd("GET").arg(&lock).query_async::<Option<String>>(&mut conn).await.unwrap().map(drop) }
    })
    .await;
    let _: () = redis::cmd("SET").arg(&lock).arg("thief").arg("PX").arg(60_000).query_async(&mut conn).await.unwrap();
    let err = run.await.unwrap().unwrap_err();
    assert!(err.to_string().contains("no longer holds the writer lease"), "{err}");
    let holder: String = redis::cmd("GET").arg(&lock).query_async(&mut conn).await.unwrap();
    assert_eq!(holder, "thief", "the loser must not release the new holder's lease");
    // The loser's own status writes are fenced off; the next holder marks
    // its run failed.
    let _: () = redis::cmd("DEL").arg(&lock).query_async(&mut conn).await.unwrap();
    rebuild(&cfg, &RebuildOptions::full(), &Progress::hidden()).await.unwrap();
    let failed: Vec<String> =
        redis::cmd("SMEMBERS").arg(common::env::status_keys(&cfg).jobs("failed")).query_async(&mut conn).await.unwrap();
    // The refused run never became a job; the one that lost its lease failed.
    assert_eq!(failed.len(), 1, "{failed:?}");
    let job: HashMap<String, String> =
        redis::cmd("HGETALL").arg(common::env::status_keys(&cfg).job(&failed[0])).query_async(&mut conn).await.unwrap();
    assert_eq!(job["status"], "failed");
    assert_eq!(job["error_count"], "1");
    assert!(job["last_error"].contains("abandoned"), "{:?}", job["last_error"]);
}

/// A progress message carrying terminal escapes is printed escaped by
/// `status --follow`: it cannot retitle or clear the operator's terminal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_follow_prints_escape_sequences_harmlessly() {
    use std::io::{BufRead, BufReader};
    let s = common::shared();
    let name = common::unique("follow");
    let cfg = common::TestEnv::named(&name).config();
    let status_prefix = cfg.status_prefix.clone();
    let mut child = common::cachewright(&cfg)
        .args(["status", "--follow"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("start status --follow");
    let conn = common::redis_conn(&s.redis.url()).await;
    let channel = format!("{status_prefix}progress:0123456789abcdef");
    let payload = "{\"stage\":\"\u{1b}]0;pwned\u{7}\u{1b}[2Jvideos\"}";
    // The channel is this test's own: PUBLISH counts only our follower, so
    // once it says 1 the message has been delivered.
    common::wait_for("status --follow to receive a message", Duration::from_secs(30), || {
        let (mut conn, channel) = (conn.clone(), channel.clone());
        async move {
            let receivers: i64 =
                redis::cmd("PUBLISH").arg(&channel).arg(payload).query_async(&mut conn).await.unwrap_or(0);
            receivers > 0
        }
    })
    .await;
    let stdout = child.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).map(|_| line)
    })
    .await
    .unwrap()
    .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let line = line.trim_end_matches('\n');
    assert!(!line.chars().any(char::is_control), "control characters reached the terminal: {line:?}");
    assert!(line.contains("\\u{1b}]0;pwned\\u{7}\\u{1b}[2Jvideos"), "{line}");
}
