//! The rebuild and the watcher held to an independent reading of the
//! contract. `scripts/contract_check.py` generates hostile documents (ids
//! that repeat or collide with an ObjectId's hex, every BSON type in every
//! field, legacy `categoryId`, whitespace and control characters in names,
//! dates a JavaScript `Date` cannot hold), plants keys under the prefix
//! that belong to no family (they must survive untouched) and stale keys of
//! every kind of family (the rebuild must delete them), and computes every
//! data key from what MongoDB holds, with its own BSON walk, payloads and
//! orders, and reads the job status keys (section 3) for their types,
//! fields and TTLs. It shares no code with cachewright, so unlike the
//! golden and property tests it cannot share a misreading of the
//! contract with it. It needs python3 with `pymongo` and `redis`, which
//! scripts/test.sh installs; without them this test fails rather than
//! skips.

mod common;

use cachewright::config::Config;
use cachewright::progress::Progress;
use cachewright::rebuild::{RebuildOptions, rebuild};
use common::Setup;
use std::process::{Command, Output};
use std::time::Duration;

/// Runs the checker with `args` against `cfg`'s MongoDB and Redis. It
/// blocks for up to a second or so, so the runtime's other tasks (the
/// watcher) move off this thread meanwhile.
fn checker(cfg: &Config, args: &[&str]) -> Output {
    tokio::task::block_in_place(|| run_checker(cfg, args))
}

fn run_checker(cfg: &Config, args: &[&str]) -> Output {
    let home_limit = cfg.home_limit.map(|n| n.to_string()).unwrap_or_default();
    let out = Command::new("python3")
        .arg(common::root().join("scripts/contract_check.py"))
        .args(args)
        .env("MONGODB_URI", &cfg.mongodb_uri)
        .env("MONGODB_DB", &cfg.mongodb_db)
        .env("REDIS_URL", &cfg.redis_url)
        .env("CACHEWRIGHT_PREFIX", &cfg.prefix)
        .env("CACHEWRIGHT_STATUS_PREFIX", &cfg.status_prefix)
        .env("CACHEWRIGHT_HOME_LIMIT", home_limit)
        .output()
        .expect("python3 runs (scripts/test.sh installs pymongo and redis for it)");
    let err = String::from_utf8_lossy(&out.stderr);
    // Exit 1 is a difference found; anything else is the checker failing.
    assert!(matches!(out.status.code(), Some(0 | 1)), "contract_check.py {args:?} failed: {err}");
    out
}

/// The checker's verdict: `None` when Redis holds exactly the contract's
/// keys, else its list of differences.
fn differences(cfg: &Config) -> Option<String> {
    let out = checker(cfg, &["check"]);
    (!out.status.success()).then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Waits until the watcher has brought Redis to what the checker
/// computes, or fails with the differences left and `watcher`'s account
/// of itself.
async fn agrees_eventually(cfg: &Config, mut watcher: impl FnMut() -> String, what: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let Some(diff) = differences(cfg) else { return };
        assert!(
            tokio::time::Instant::now() < deadline,
            "{what}: the cache still differs from the independent reading of the contract\n{diff}\nwatcher: {}",
            watcher()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Each seed's data set is rebuilt and checked, then changed twice under
/// a watcher, then changed around a crash and a restart, each time until
/// the watcher has applied it. The first crash drops the in-process
/// watcher's task; the second is a `kill -9` of a `cachewright watch`
/// process as soon as a round of changes is made, wherever it is in
/// applying them, so its connections die with whatever they held.
async fn agrees_through_rebuild_changes_and_a_crash(setup: Setup, seeds: &[u64]) {
    common::logs();
    for &seed in seeds {
        // Home sections of 5 videos, so that their cut falls inside ties.
        let cfg = common::TestEnv::new("indep").on(setup).home_limit(Some(5)).config();
        let seed_text = seed.to_string();
        checker(&cfg, &["generate", "--seed", &seed_text, "--videos", "400"]);
        rebuild(&cfg, &RebuildOptions::full(), &Progress::hidden()).await.expect("the rebuild runs");
        if let Some(diff) = differences(&cfg) {
            panic!("seed {seed}: the rebuild differs from the independent reading of the contract\n{diff}");
        }

        let watcher = common::watcher::start_streaming(&cfg).await;
        for round in 1..=2u64 {
            let changes_seed = (seed * 10 + round).to_string();
            checker(&cfg, &["mutate", "--seed", &changes_seed, "--changes", "150"]);
            agrees_eventually(&cfg, || watcher.report(), &format!("seed {seed}, round {round}")).await;
        }

        // A crash with changes behind it, more while it is down, a restart.
        let changes_seed = (seed * 10 + 5).to_string();
        checker(&cfg, &["mutate", "--seed", &changes_seed, "--changes", "40"]);
        watcher.kill().await;
        let changes_seed = (seed * 10 + 6).to_string();
        checker(&cfg, &["mutate", "--seed", &changes_seed, "--changes", "40"]);
        let watcher = common::watcher::start_streaming(&cfg).await;
        agrees_eventually(&cfg, || watcher.report(), &format!("seed {seed}, after a crash and a restart")).await;
        watcher.stop().await;

        // The process itself killed once the changes are made.
        let mut child = common::watcher::spawn_process(&cfg);
        common::watcher::process_streaming(&cfg, child.id()).await;
        let changes_seed = (seed * 10 + 7).to_string();
        checker(&cfg, &["mutate", "--seed", &changes_seed, "--changes", "150"]);
        common::signal(child.id(), "-KILL");
        let _ = child.wait();
        let changes_seed = (seed * 10 + 8).to_string();
        checker(&cfg, &["mutate", "--seed", &changes_seed, "--changes", "40"]);
        let mut child = common::watcher::spawn_process(&cfg);
        common::watcher::process_streaming(&cfg, child.id()).await;
        let pid = child.id();
        let account = || format!("process {pid}, exited: {:?}", child.try_wait().ok().flatten());
        agrees_eventually(&cfg, account, &format!("seed {seed}, after a kill -9 and a restart")).await;
        common::signal(pid, "-TERM");
        let code = common::wait_exit(&mut child, "the watcher to stop on SIGTERM", Duration::from_secs(30)).await;
        assert_eq!(code, Some(0), "the restarted watcher stops cleanly");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rebuild_and_the_watcher_agree_with_an_independent_reading_of_the_contract() {
    // Seeds 2 and 3 each sort a Decimal128 seq of 1.0000000000000000000000000000001
    // among seqs of 1: rounded to a double, it once sorted as 1.
    agrees_through_rebuild_changes_and_a_crash(Setup::OneNode, &[2, 3]).await;
}

/// The same on a 3-master cluster, where every write runs in a script.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_the_rebuild_and_the_watcher_agree_with_an_independent_reading_of_the_contract() {
    agrees_through_rebuild_changes_and_a_crash(Setup::Cluster, &[4]).await;
}
