//! Server restarts in the middle of a rebuild: the run recovers and the
//! cache ends exactly as a clean rebuild would leave it.

mod common;

use cachewright::plan::FamilySet;
use cachewright::progress::Progress;
use cachewright::rebuild::{RebuildOptions, plan_ctx, plan_in_memory, rebuild_with_retries};
use std::time::Duration;

async fn dbsize(url: &str) -> u64 {
    let mut conn = common::redis_conn(url).await;
    redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap_or(0)
}

/// Waits until the rebuild has written some keys, so a restart lands mid-run.
async fn wait_for_writes(url: &str) {
    for _ in 0..2000 {
        if dbsize(url).await > 500 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    panic!("the rebuild never started writing");
}

async fn expected_render(cfg: &cachewright::config::Config) -> String {
    let source = cachewright::source::Source::connect(cfg).await.unwrap();
    let c = &cfg.collections;
    let raw = source.read_four(cfg).await.unwrap();
    let run = plan_in_memory(&plan_ctx(cfg, FamilySet::all()), c, &raw[0], &raw[1], &raw[2], &raw[3]);
    let with_prefix = common::render::render_ops(&run.ops);
    with_prefix.replace(&cfg.prefix, "app:")
}

async fn generate(cfg: &cachewright::config::Config, videos: usize) {
    let source = cachewright::source::Source::connect(cfg).await.unwrap();
    let shape = cachewright::generate::Shape { channels: 10, categories: 100, tags: 400, videos };
    cachewright::generate::generate(source.database(), &cfg.collections, shape, 3, |_| {}).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_mid_run_is_detected_and_the_run_redone() {
    let mongo = &common::shared().mongo;
    let mut redis = common::servers::Redis::start();
    let name = common::unique("redisrestart");
    let cfg = common::config(&mongo.uri(), &redis.url(), &name);
    generate(&cfg, 30_000).await;

    let opts = RebuildOptions::full();
    let run = {
        let cfg = cfg.clone();
        tokio::spawn(async move { rebuild_with_retries(&cfg, &opts, &Progress::hidden(), 3).await })
    };
    wait_for_writes(&redis.url()).await;
    redis.restart();
    let summary = run.await.unwrap().expect("rebuild recovers from a Redis restart");
    assert!(summary.written_total() > 0);

    let dump = common::dump(&redis.url(), &cfg.prefix).await;
    assert_eq!(common::render_dump(&dump, &cfg.prefix), expected_render(&cfg).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mongodb_restart_mid_run_is_survived() {
    let redis = &common::shared().redis;
    let mut mongo = common::servers::Mongo::start();
    let name = common::unique("mongorestart");
    let cfg = common::config(&mongo.uri(), &redis.url(), &name);
    generate(&cfg, 30_000).await;

    let opts = RebuildOptions::full();
    let run = {
        let cfg = cfg.clone();
        tokio::spawn(async move { rebuild_with_retries(&cfg, &opts, &Progress::hidden(), 4).await })
    };
    // Writes start while videos are still being read.
    for _ in 0..2000 {
        let n = common::dump(&redis.url(), &cfg.prefix).await.len();
        if n > 500 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    mongo.restart();
    run.await.unwrap().expect("rebuild recovers from a MongoDB restart");
    let dump = common::dump(&redis.url(), &cfg.prefix).await;
    assert_eq!(common::render_dump(&dump, &cfg.prefix), expected_render(&cfg).await);
}
