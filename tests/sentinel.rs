//! Redis behind Sentinel: one master, one replica and three sentinels.
//! An operator's `SENTINEL FAILOVER` during a rebuild and while the
//! watcher applies changes (with the master running, and paused through
//! it), and a master that dies with writes its replica never got; each
//! ends by comparing the cache on the new master with a fresh full
//! rebuild.

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

/// A data set of 10,000 videos, written in small transactions so that a
/// rebuild of it spans a fault.
async fn rebuild_config(set: &SentinelSet, name: &str, seed: u64) -> Config {
    let mut cfg = sentinel_config(set, &common::unique(name));
    cfg.write_batch_ops = 100;
    common::generate(&cfg, 10_000, seed).await;
    cfg
}

/// Starts a rebuild (with retries) and waits until the master holds part
/// of it; returns the run and the master's port.
async fn rebuild_until_mid_way(
    set: &SentinelSet,
    cfg: &Config,
) -> (tokio::task::JoinHandle<Result<cachewright::rebuild::RunSummary, cachewright::rebuild::RunError>>, u16) {
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
    (run, old)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_fail_over_mid_rebuild_is_followed_and_the_cache_is_exact() {
    let _serial = SERIAL.lock().await;
    let set = tokio::task::block_in_place(SentinelSet::start);
    let cfg = rebuild_config(&set, "sentrebuild", 51).await;
    let (run, old) = rebuild_until_mid_way(&set, &cfg).await;
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

/// A master that dies mid-rebuild with writes its replica never got: the
/// replica is cut off before the run (without `min-replicas-to-write` the
/// master goes on alone), so whatever the run wrote before the master is
/// killed is lost with it, certainly. The run's writes to the dead
/// master fail, and the run is redone on the promoted replica (whose
/// other `run_id` would have the run redone too, had no write failed);
/// the cache ends exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_that_dies_mid_rebuild_with_writes_its_replica_lacks_has_the_run_redone() {
    let _serial = SERIAL.lock().await;
    let set = tokio::task::block_in_place(SentinelSet::start_unguarded);
    let cfg = rebuild_config(&set, "sentlostrebuild", 52).await;
    tokio::task::block_in_place(|| set.detach_replica());
    let (run, old) = rebuild_until_mid_way(&set, &cfg).await;
    let new = tokio::task::block_in_place(|| {
        common::signal(set.master.pid(), "-KILL");
        set.wait_promoted(old)
    });
    assert_eq!(new, set.replica.port);
    let summary = run.await.unwrap().expect("the rebuild is redone on the new master");
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
    let (cfg, watcher, tags, old) = watching_the_first_changes(&set, "sentwatch").await;

    // Changes keep coming while the master fails over.
    let during = {
        let tags = tags.clone();
        tokio::spawn(async move {
            for i in 5..40 {
                tags.insert(i).await;
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
    assert_ne!(new, old);
    during.await.unwrap();
    for i in 40..45 {
        tags.insert(i).await;
    }
    wait_exact_on(new, &cfg, "the watcher to follow the new master").await;
    watcher.stop().await;
    assert_exact_on(new, &cfg).await;
}

/// The lost write made certain. Without `min-replicas-to-write`, the
/// master goes on taking writes after its replica is cut off; the watcher
/// applies changes there (acknowledged: the old master's cache holds
/// them), then the master dies and the replica, which never got them, is
/// promoted. The watcher's tokens saved with those writes are lost too,
/// so only its check of the servers' `run_id` at the next batch (a new
/// server: rebuild, then stream from a cluster time) brings the cache
/// back; the test holds that it does, and that it is exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_acknowledged_by_a_master_that_dies_before_its_replica_has_them_are_restored() {
    let _serial = SERIAL.lock().await;
    let set = tokio::task::block_in_place(SentinelSet::start_unguarded);
    let (cfg, watcher, tags, old) = watching_the_first_changes(&set, "sentlost").await;
    wait_exact_on(set.replica.port, &cfg, "the replica to have them too").await;

    tokio::task::block_in_place(|| set.detach_replica());
    for i in 5..10 {
        tags.insert(i).await;
    }
    wait_exact_on(old, &cfg, "the old master to take the changes its replica cannot get").await;
    let on_replica = render_on(set.replica.port, &cfg).await;
    assert!(on_replica != common::expected_render(&cfg).await, "the replica lacks what the old master acknowledged");

    let new = tokio::task::block_in_place(|| {
        common::signal(set.master.pid(), "-KILL");
        set.wait_promoted(old)
    });
    assert_eq!(new, set.replica.port);
    for i in 10..12 {
        tags.insert(i).await;
    }
    wait_exact_on(new, &cfg, "the watcher to restore the lost changes on the new master").await;
    let metrics = watcher.stop().await;
    assert!(
        metrics.rebuilds.load(std::sync::atomic::Ordering::Relaxed) >= 2,
        "the watcher rebuilt on finding a new server (the first rebuild is its start)"
    );
    assert_exact_on(new, &cfg).await;
}

/// The edge-case fixtures, a watcher streaming them, and five tags
/// inserted and applied on the master (whose port comes back).
async fn watching_the_first_changes(set: &SentinelSet, name: &str) -> (Config, common::watcher::Watcher, Tags, u16) {
    let cfg = sentinel_config(set, &common::unique(name));
    common::load_fixtures(&cfg, &common::fixture_dir("edge-cases")).await;
    let watcher = common::watcher::start_streaming(&cfg).await;
    let tags = Tags::connect(&cfg).await;
    for i in 0..5 {
        tags.insert(i).await;
    }
    let old = set.master_port();
    wait_exact_on(old, &cfg, "the watcher to apply the first changes").await;
    (cfg, watcher, tags, old)
}

/// Inserts numbered test tags: each an active tag of an active category,
/// under a name of its own prefix, so each insert writes search keys no
/// later one rewrites, and a batch lost with an old master stays missing
/// unless the watcher notices the fail-over.
#[derive(Clone)]
struct Tags(mongodb::Collection<mongodb::bson::Document>);

impl Tags {
    async fn connect(cfg: &Config) -> Tags {
        let source = cachewright::source::Source::connect(&cfg.mongo()).await.unwrap();
        Tags(source.database().collection("Tag"))
    }

    /// Inserts the `i`th tag and waits for MongoDB's answer.
    async fn insert(&self, i: usize) {
        let tag = mongodb::bson::doc! {
            "_id": format!("sentinel-tag-{i}"), "name": format!("{i:02}x sentinel"),
            "seq": i as i32, "categoryId": "c1", "status": 1,
        };
        self.0.insert_one(tag).await.unwrap();
    }
}

/// The cache on the node at `port`, rendered as the tests compare it.
async fn render_on(port: u16, cfg: &Config) -> String {
    common::render_dump(&common::dump(&format!("redis://127.0.0.1:{port}"), &cfg.prefix).await, &cfg.prefix)
}

/// Waits until the cache on the node at `port` is what MongoDB says.
async fn wait_exact_on(port: u16, cfg: &Config, what: &str) {
    common::wait_for(what, Duration::from_secs(60), || async {
        render_on(port, cfg).await == common::expected_render(cfg).await
    })
    .await;
}
