//! Server restarts in the middle of a rebuild: the run recovers and the
//! cache ends exactly as a clean rebuild would leave it.

mod common;

use cachewright::progress::Progress;
use cachewright::rebuild::{RebuildOptions, rebuild, rebuild_with_retries};
use common::proxy::Proxy;
use std::time::Duration;

/// Starts a rebuild whose Redis traffic goes through `proxy`, and waits
/// until the proxy has stalled it on its first video detail: the video
/// cursor is then open (details come from documents it returned) and,
/// with the writer held and small batches, it cannot run dry.
async fn rebuild_stalled_on_first_detail(
    cfg: &cachewright::config::Config,
    proxy: &Proxy,
) -> tokio::task::JoinHandle<Result<cachewright::rebuild::RunSummary, cachewright::rebuild::RunError>> {
    proxy.stall_on(b"video:detail:");
    let run = {
        let cfg = cfg.clone();
        tokio::spawn(async move { rebuild_with_retries(&cfg, &RebuildOptions::full(), &Progress::hidden(), 4).await })
    };
    tokio::time::timeout(Duration::from_secs(120), proxy.wait_stalled()).await.expect("the rebuild reached its videos");
    run
}

/// A run's settings for these tests: Redis through the proxy, small write
/// batches (so the stalled writer holds the reader well before the end of
/// the cursor), and a lease long enough to outlast the stall.
fn stalled_config(mongo_uri: &str, proxy: &Proxy, name: &str) -> cachewright::config::Config {
    let mut cfg = common::TestEnv::named(name).mongo(mongo_uri).redis(&proxy.redis_url()).config();
    cfg.write_batch_ops = 100;
    cfg.lease_seconds = 120;
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_mid_run_is_detected_and_the_run_redone() {
    let mongo = &common::shared().mongo;
    let mut redis = common::servers::Redis::start();
    let proxy = Proxy::start(redis.port).await;
    let name = common::unique("redisrestart");
    let cfg = stalled_config(&mongo.uri(), &proxy, &name);
    common::generate(&cfg, 30_000, 3).await;

    let run = rebuild_stalled_on_first_detail(&cfg, &proxy).await;
    // Redis loses everything written so far; the run goes on against the
    // fresh server once the proxy lets traffic through again.
    redis.restart();
    proxy.resume();
    let summary = run.await.unwrap().expect("rebuild recovers from a Redis restart");
    assert!(summary.written_total() > 0);

    let dump = common::dump(&redis.url(), &cfg.prefix).await;
    assert_eq!(common::render_dump(&dump, &cfg.prefix), common::expected_render(&cfg).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mongodb_restart_while_a_cursor_is_open_is_survived() {
    let redis = &common::shared().redis;
    let mut mongo = common::servers::Mongo::start();
    let proxy = Proxy::start(redis.port).await;
    let name = common::unique("mongorestart");
    let cfg = stalled_config(&mongo.uri(), &proxy, &name);
    common::generate(&cfg, 30_000, 3).await;

    let run = rebuild_stalled_on_first_detail(&cfg, &proxy).await;
    // The server holding the open cursor restarts: the next getMore finds
    // no cursor (CursorNotFound) or no connection, and the run is redone.
    mongo.restart();
    proxy.resume();
    run.await.unwrap().expect("rebuild recovers from a MongoDB restart");
    let dump = common::dump(&redis.url(), &cfg.prefix).await;
    assert_eq!(common::render_dump(&dump, &cfg.prefix), common::expected_render(&cfg).await);
}

/// A video read split over `_id` ranges loses a connection mid-read: a
/// proxy in front of MongoDB holds the first `getMore` of any range
/// cursor and then cuts every connection (the server keeps its data and
/// its cursors). That run fails with an error a retry may pass, and the
/// run done again leaves the cache exactly as a fresh rebuild would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_cut_under_range_cursors_is_survived() {
    use cachewright::source::ranges::VideoRead;
    let s = common::shared();
    let mongo_proxy = Proxy::start(s.mongo.port).await;
    let name = common::unique("rangecut");
    let mut cfg = common::TestEnv::named(&name).mongo(&mongo_proxy.mongo_uri()).config();
    cfg.read_cursors = 3;
    // Each range holds thousands of videos, more than one batch; the
    // catalogue's collections fit in their first batch, so the first
    // `getMore` on the wire is a range cursor's.
    cfg.read_batch_size = 500;
    common::generate(&cfg, 12_000, 5).await;
    let source = cachewright::source::Source::connect(&cfg.mongo()).await.expect("mongo reachable");
    let plan = source.plan_video_read(&cfg.collections.video, cfg.read_cursors).await.expect("plan the read");
    assert!(matches!(plan, VideoRead::Ranges(_)), "the generated ids allow ranges: {plan:?}");
    drop(source);

    mongo_proxy.stall_on(b"getMore");
    let run = {
        let cfg = cfg.clone();
        tokio::spawn(
            async move { cachewright::rebuild::rebuild(&cfg, &RebuildOptions::full(), &Progress::hidden()).await },
        )
    };
    tokio::time::timeout(Duration::from_secs(120), mongo_proxy.wait_stalled())
        .await
        .expect("a range cursor asked for more");
    mongo_proxy.cut(false);
    mongo_proxy.heal();
    let err = run.await.unwrap().expect_err("the cut getMore fails the run");
    assert!(err.is_retriable(), "a lost connection is worth another run: {err}");

    rebuild_with_retries(&cfg, &RebuildOptions::full(), &Progress::hidden(), 4).await.expect("the run done again");
    common::assert_exact_at(&s.redis.url(), &cfg).await;
}

/// MongoDB stops answering mid-read without closing the connection (a
/// paused server, a network dropping packets): a proxy in front of it
/// holds the first `getMore` and everything after it. The driver has no
/// socket timeout, so without a bound of its own the run would wait, and
/// keep renewing its lease, forever. It fails instead once the read goes
/// unanswered for `CACHEWRIGHT_MONGODB_TIMEOUT_SECONDS`, with an error
/// that names the stall and that a retry may pass; once MongoDB answers
/// again, the run done again leaves the cache exactly as a fresh rebuild.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_mongodb_fails_the_read_in_bounded_time() {
    use cachewright::source::SourceError;
    let s = common::shared();
    let mongo_proxy = Proxy::start(s.mongo.port).await;
    let name = common::unique("mongostall");
    let mut cfg = common::TestEnv::named(&name).mongo(&mongo_proxy.mongo_uri()).config();
    cfg.read_batch_size = 500;
    cfg.mongodb_timeout_seconds = 2;
    common::generate(&cfg, 6_000, 9).await;

    mongo_proxy.stall_on(b"getMore");
    let started = std::time::Instant::now();
    let err =
        rebuild(&cfg, &RebuildOptions::full(), &Progress::hidden()).await.expect_err("a stalled read fails the run");
    assert!(mongo_proxy.is_stalled(), "the run ended while MongoDB was still stalled");
    assert!(
        matches!(&err, cachewright::rebuild::RunError::Source(SourceError::Stalled { seconds: 2, .. })),
        "the error names the stall: {err}"
    );
    assert!(err.is_retriable(), "a stalled connection is worth another run: {err}");
    assert!(err.to_string().contains("CACHEWRIGHT_MONGODB_TIMEOUT_SECONDS"), "it says what to do: {err}");
    // Bounded by the read timeout, not by the stall: well under a minute.
    assert!(started.elapsed() < Duration::from_secs(60), "took {:?}", started.elapsed());

    mongo_proxy.heal();
    rebuild_with_retries(&cfg, &RebuildOptions::full(), &Progress::hidden(), 4).await.expect("the run done again");
    common::assert_exact_at(&s.redis.url(), &cfg).await;
}
