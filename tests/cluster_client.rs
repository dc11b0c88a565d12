//! cachewright's router through a paused master, its replica's forced
//! fail-over, its return and a master restart, on a real 6-node cluster,
//! with the `redis` crate's own cluster client (`cluster-async`) measured
//! beside it in the same phases. Each phase asserts what the router
//! guarantees; the crate's figures are printed (`--nocapture`), and
//! `scripts/cluster-client-check.sh` gives the crate 60 s a phase instead
//! of the suite's 15 s. ARCHITECTURE.md ("Redis Cluster") records what it
//! found and why the router stays.

mod common;

use std::time::{Duration, Instant};

/// How long one request may take before the phase counts it as stuck.
const PATIENCE: Duration = Duration::from_secs(30);

/// A key whose slot `master` serves.
fn key_on(slots: &[(u16, u16, String)], master: &str, tag: &str) -> String {
    (0..100_000)
        .map(|i| format!("{tag}:{i}"))
        .find(|k| {
            let slot = cachewright::sink::cluster::slot(k.as_bytes());
            slots.iter().any(|(lo, hi, m)| (*lo..=*hi).contains(&slot) && m == master)
        })
        .expect("a key for every master")
}

/// Sends one `SET` and gives how long it took, or the error / stall.
async fn timed_set<C: redis::aio::ConnectionLike>(conn: &mut C, key: &str) -> Result<Duration, String> {
    let started = Instant::now();
    let mut cmd = redis::cmd("SET");
    cmd.arg(key).arg("v");
    let sent = cmd.query_async::<()>(conn);
    match tokio::time::timeout(PATIENCE, sent).await {
        Ok(Ok(())) => Ok(started.elapsed()),
        Ok(Err(err)) => Err(format!("error after {:.1} s: {err}", started.elapsed().as_secs_f64())),
        Err(_) => Err(format!("no answer within {} s", PATIENCE.as_secs())),
    }
}

/// Retries `SET` until it lands: how long that took in all, with the
/// attempts' errors.
async fn until_set<C: redis::aio::ConnectionLike>(conn: &mut C, key: &str, limit: Duration) -> Until {
    let started = Instant::now();
    let (mut failures, mut last) = (0, String::new());
    while started.elapsed() < limit {
        match timed_set(conn, key).await {
            Ok(_) => return Until { took: Some(started.elapsed()), failures, last },
            Err(err) => {
                failures += 1;
                last = err;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
    Until { took: None, failures, last }
}

/// How retrying a request until it landed went.
struct Until {
    took: Option<Duration>,
    failures: usize,
    /// The last failure's text.
    last: String,
}

fn show(what: &str, router: &Result<Duration, String>, krate: &Result<Duration, String>) {
    let cell = |r: &Result<Duration, String>| match r {
        Ok(d) => format!("{:.3} s", d.as_secs_f64()),
        Err(e) => e.clone(),
    };
    println!("| {what} | {} | {} |", cell(router), cell(krate));
}

fn show_until(what: &str, router: &Until, krate: &Until) {
    let cell = |u: &Until| {
        let last = if u.failures > 0 { format!("; last: {}", u.last) } else { String::new() };
        match u.took {
            Some(d) => format!("{:.1} s ({} failed attempts{last})", d.as_secs_f64(), u.failures),
            None => format!("never ({} failed attempts{last})", u.failures),
        }
    };
    println!("| {what} | {} | {} |", cell(router), cell(krate));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_router_through_a_paused_master_and_its_fail_over_beside_the_crates_cluster_client() {
    let cluster = tokio::task::block_in_place(common::servers::RedisCluster::start_with_replicas);
    let cfg = common::TestEnv::new("clusterclient").redis(&cluster.url()).config();
    let sink = cachewright::sink::Sink::connect(&cfg.redis()).await.unwrap();
    let mut router = sink.connection();
    let client = redis::cluster::ClusterClient::builder(vec![cluster.url()])
        .connection_timeout(Duration::from_secs(1))
        .response_timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut krate = client.get_async_connection().await.unwrap();

    let (replica, master_port) = tokio::task::block_in_place(|| cluster.synced_replicas(1))[0];
    let master = cluster.nodes.iter().position(|m| m.port == master_port).unwrap();
    let mut plain = common::redis_conn(&cluster.url()).await;
    let reply: redis::Value = redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut plain).await.unwrap();
    let slots = cachewright::sink::cluster::slot_ranges(&reply, "127.0.0.1").unwrap();
    let paused_addr = format!("127.0.0.1:{master_port}");
    let other_addr = slots.iter().map(|(_, _, m)| m.clone()).find(|m| *m != paused_addr).unwrap();
    let on_paused = key_on(&slots, &paused_addr, "paused");
    let on_other = key_on(&slots, &other_addr, "other");
    let lock = std::fs::read_to_string(common::root().join("Cargo.lock")).unwrap();
    let version = lock
        .split("[[package]]")
        .find(|p| p.contains("name = \"redis\"\n"))
        .and_then(|p| p.lines().find_map(|l| l.strip_prefix("version = ")).map(|v| v.trim_matches('"').to_string()));
    println!("redis crate {}, 3 masters with a replica each", version.unwrap_or_default());
    println!("| phase | cachewright's router | redis::cluster_async |");
    println!("|---|---|---|");
    show("healthy: SET on a master", &timed_set(&mut router, &on_other).await, &timed_set(&mut krate, &on_other).await);

    // One master paused (SIGSTOP): the other masters' keys must not wait.
    common::signal(cluster.nodes[master].pid(), "-STOP");
    let (router_other, krate_other) = (timed_set(&mut router, &on_other).await, timed_set(&mut krate, &on_other).await);
    show("master paused: SET on another master", &router_other, &krate_other);
    assert!(router_other.is_ok_and(|d| d < Duration::from_secs(5)), "the router serves the healthy masters at once");

    // Its replica takes over by force while it is still paused.
    tokio::task::block_in_place(|| cluster.promote(replica, Some("FORCE")));
    let limit = Duration::from_secs(60);
    // How long the crate may take to land a write, a phase.
    let patience = std::env::var("CLUSTER_CLIENT_CRATE_PATIENCE_SECS").ok().and_then(|s| s.parse().ok());
    let krate_limit = Duration::from_secs(patience.unwrap_or(15));
    let router_moved = until_set(&mut router, &on_paused, limit).await;
    let krate_moved = until_set(&mut krate, &on_paused, krate_limit).await;
    show_until("after the forced fail-over: SET on the moved slots until it lands", &router_moved, &krate_moved);
    assert!(router_moved.took.is_some(), "the router reaches the promoted replica");
    let (router_other, krate_other) = (timed_set(&mut router, &on_other).await, timed_set(&mut krate, &on_other).await);
    show("after the fail-over, old master still paused: SET on another master", &router_other, &krate_other);

    // The old master wakes up and rejoins as a replica.
    common::signal(cluster.nodes[master].pid(), "-CONT");
    tokio::task::block_in_place(|| cluster.wait_ok());
    let router_back = until_set(&mut router, &on_paused, limit).await;
    let krate_back = until_set(&mut krate, &on_paused, krate_limit).await;
    show_until("old master back as a replica: SET on the moved slots", &router_back, &krate_back);
    let (router_other, krate_other) = (timed_set(&mut router, &on_other).await, timed_set(&mut krate, &on_other).await);
    show("old master back: SET on another master", &router_other, &krate_other);
    assert!(router_back.took.is_some() && router_other.is_ok(), "the router serves every slot again");

    // A master restarted (its process killed and started again, with its
    // data): the case that made the router replace the crate's client.
    // The master of the other keys, untouched by the fail-over above.
    let restarted = cluster.nodes.iter().position(|n| format!("127.0.0.1:{}", n.port) == other_addr).unwrap();
    {
        let on_restarted = on_other.clone();
        let mut cluster = cluster;
        tokio::task::block_in_place(|| cluster.restart(restarted));
        let router_restart = until_set(&mut router, &on_restarted, limit).await;
        let krate_restart = until_set(&mut krate, &on_restarted, krate_limit).await;
        show_until("a master restarted: SET on its slots until it lands", &router_restart, &krate_restart);
        show(
            "after the restart: SET on the fail-over's slots",
            &timed_set(&mut router, &on_paused).await,
            &timed_set(&mut krate, &on_paused).await,
        );
        assert!(router_restart.took.is_some(), "the router reaches the restarted master");
    }
}
