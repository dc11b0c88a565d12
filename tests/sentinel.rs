//! Redis behind Sentinel: one master, one replica and three sentinels.
//! An operator's `SENTINEL FAILOVER` during a rebuild and while the
//! watcher applies changes (with the master running, and paused through
//! it); each ends by comparing the cache on the new master with a fresh
//! full rebuild.

mod common;

use cachewright::config::Config;
use cachewright::progress::Progress;
use cachewright::rebuild::{RebuildOptions, rebuild_with_retries};
use common::servers::SentinelSet;
use std::time::Duration;

/// Only one sentinel set at a time: fail-overs are slow enough without
/// two competing for the cores.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn sentinel_config(set: &SentinelSet, name: &str) -> Config {
    // REDIS_URL names the master at start; it gives the scheme and
    // credentials, the sentinels give the address.
    let mut cfg = common::TestEnv::named(name).redis(&set.master.url()).config();
    cfg.redis_sentinels = set.sentinels();
    cfg
}

async fn assert_exact_on(port: u16, cfg: &Config) {
    common::assert_exact_at(&format!("redis://127.0.0.1:{port}"), cfg).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_fail_over_mid_rebuild_is_followed_and_the_cache_is_exact() {
    let _serial = SERIAL.lock().await;
    let set = tokio::task::block_in_place(SentinelSet::start);
    let mut cfg = sentinel_config(&set, &common::unique("sentrebuild"));
    cfg.write_batch_ops = 100;
    common::generate(&cfg, 10_000, 51).await;

    let run = {
        let cfg = cfg.clone();
        tokio::spawn(async move { rebuild_with_retries(&cfg, &RebuildOptions::full(), &Progress::hidden(), 4).await })
    };
    let details = format!("{}video:detail:*", cfg.prefix);
    let old = set.master_port();
    common::wait_for("the rebuild to be mid-way", Duration::from_secs(120), || async {
        common::count_keys(&format!("redis://127.0.0.1:{old}"), &details).await >= 500
    })
    .await;
    // The master is paused, so the run cannot finish before the
    // fail-over: it spans it whatever the machine's speed.
    let new = tokio::task::block_in_place(|| {
        common::signal(set.master.pid(), "-STOP");
        let new = set.fail_over();
        common::signal(set.master.pid(), "-CONT");
        new
    });
    assert_ne!(new, old);
    let summary = run.await.unwrap().expect("the rebuild follows the fail-over");
    assert!(summary.written_total() > 0);
    assert_exact_on(new, &cfg).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_fail_over_while_watching_is_followed_and_the_cache_is_exact() {
    watch_through_a_fail_over(false).await;
}

/// The master is paused while changes come, failed over, then resumed.
/// A batch sent to it while paused may run there when it resumes; if it
/// is answered before Sentinel demotes the old master, the write is
/// acknowledged and then lost with that master's data, and only the
/// watcher's next batch finding another server (and rebuilding) brings
/// it back. Which of these happens depends on timing: the test holds the
/// cache exact through whichever did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_master_failed_over_while_watching_leaves_the_cache_exact() {
    watch_through_a_fail_over(true).await;
}

async fn watch_through_a_fail_over(stall: bool) {
    let _serial = SERIAL.lock().await;
    let set = tokio::task::block_in_place(SentinelSet::start);
    let cfg = sentinel_config(&set, &common::unique("sentwatch"));
    common::load_fixtures(&cfg, &common::fixture_dir("edge-cases")).await;
    let watcher = common::watcher::start_streaming(&cfg).await;
    let source = cachewright::source::Source::connect(&cfg.mongo()).await.unwrap();
    let tags = source.database().collection::<mongodb::bson::Document>("Tag");
    let change = move |i: usize| {
        let tags = tags.clone();
        async move {
            // An active tag of an active category, under a name of its
            // own prefix: each change writes search keys no later change
            // rewrites, so a batch lost with the old master stays missing
            // unless the watcher notices the fail-over.
            let tag = mongodb::bson::doc! {
                "_id": format!("sentinel-tag-{i}"), "name": format!("{i:02}x sentinel"),
                "seq": i as i32, "categoryId": "c1", "status": 1,
            };
            tags.insert_one(tag).await.unwrap();
        }
    };
    for i in 0..5 {
        change(i).await;
    }
    let old = set.master_port();
    common::wait_for("the watcher to apply the first changes", Duration::from_secs(30), || async {
        let url = format!("redis://127.0.0.1:{old}");
        common::render_dump(&common::dump(&url, &cfg.prefix).await, &cfg.prefix) == common::expected_render(&cfg).await
    })
    .await;

    // Changes keep coming while the master fails over.
    let during = {
        let change = change.clone();
        tokio::spawn(async move {
            for i in 5..40 {
                change(i).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let new = tokio::task::block_in_place(|| {
        if !stall {
            return set.fail_over();
        }
        common::signal(set.master.pid(), "-STOP");
        let new = set.fail_over();
        common::signal(set.master.pid(), "-CONT");
        new
    });
    during.await.unwrap();
    for i in 40..45 {
        change(i).await;
    }
    common::wait_for("the watcher to follow the new master", Duration::from_secs(60), || async {
        let url = format!("redis://127.0.0.1:{new}");
        common::render_dump(&common::dump(&url, &cfg.prefix).await, &cfg.prefix) == common::expected_render(&cfg).await
    })
    .await;
    watcher.stop().await;
    assert_exact_on(new, &cfg).await;
}
