//! Faults a Redis Cluster brings, against a real three-master cluster:
//! slots moving under a rebuild, a master restarting mid-run, a paused
//! writer waking up after a take-over, a slot's epoch copy lost, an
//! operator's fail-over of every master mid-run. Each
//! ends by comparing the cache with a fresh full rebuild.
//!
//! The shared-assertion tests (rebuild, sweep, verify, purge, watcher)
//! run on the cluster from their own files; these tests change the
//! cluster itself, so they run one at a time.

mod common;

use cachewright::plan::{Op, Value};
use cachewright::progress::Progress;
use cachewright::rebuild::{RebuildOptions, rebuild, rebuild_with_retries};
use cachewright::registry::FamilyId;
use cachewright::sink::{Lease, Sink, SinkError};
use common::Setup;
use std::time::Duration;

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn cluster_config(name: &str) -> cachewright::config::Config {
    common::TestEnv::named(name).on(Setup::Cluster).config()
}

async fn assert_exact(cfg: &cachewright::config::Config) {
    common::assert_exact_at(&cfg.redis_url, cfg).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_while_thousands_of_slots_move_leaves_the_cache_exact() {
    let _serial = SERIAL.lock().await;
    let cfg = cluster_config(&common::unique("reshard"));
    common::generate(&cfg, 8_000, 31).await;
    rebuild(&cfg, &RebuildOptions::full(), &Progress::hidden()).await.expect("first rebuild");
    // Stale keys for the sweep to find while their slots move.
    let mut conn = common::redis_conn(&cfg.redis_url).await;
    let stale: Vec<String> = (0..200).map(|i| format!("{}video:detail:gone{i}", cfg.prefix)).collect();
    let mut pipe = redis::pipe();
    for key in &stale {
        pipe.cmd("SET").arg(key).arg("{}").ignore();
    }
    let _: () = pipe.query_async(&mut conn).await.unwrap();
    let source = cachewright::source::Source::connect(&cfg.mongo()).await.unwrap();
    let videos = source.database().collection::<mongodb::bson::Document>("VideoMedia");
    videos.update_many(mongodb::bson::doc! {}, mongodb::bson::doc! {"$set": {"title": "moved"}}).await.unwrap();

    let renames_before = common::command_calls(&cfg.redis_url, "rename").await;
    let reshard = common::start_resharding(0, 1, 4000);
    let summary = rebuild(&cfg, &RebuildOptions::full(), &Progress::hidden()).await.expect("rebuild while resharding");
    assert_eq!(summary.deleted_total(), stale.len() as u64, "every stale key found once across moving slots");
    // The category indexes are above a script's budget: they went through
    // stages while the slots moved.
    let staged = common::command_calls(&cfg.redis_url, "rename").await - renames_before;
    assert!(staged > 0, "no key was written through a stage");
    common::finish_resharding(reshard);
    assert_exact(&cfg).await;
    assert_eq!(common::count_keys(&cfg.redis_url, &format!("{}video:detail:gone*", cfg.prefix)).await, 0);
}

/// Waits until a rebuild into `cfg` has written 500 video details: its
/// video cursor is open and most of its writes are still to come.
async fn wait_until_mid_run(cfg: &cachewright::config::Config) {
    let details = format!("{}video:detail:*", cfg.prefix);
    common::wait_for("the rebuild wrote video details", Duration::from_secs(120), || async {
        common::count_keys(&cfg.redis_url, &details).await >= 500
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_restart_mid_rebuild_is_detected_and_the_run_redone() {
    let _serial = SERIAL.lock().await;
    let mut cfg = cluster_config(&common::unique("masterrestart"));
    cfg.write_batch_ops = 100;
    common::generate(&cfg, 10_000, 32).await;
    let run = {
        let cfg = cfg.clone();
        tokio::spawn(async move { rebuild_with_retries(&cfg, &RebuildOptions::full(), &Progress::hidden(), 4).await })
    };
    wait_until_mid_run(&cfg).await;
    // Paused first, so the run cannot finish before the restart; then
    // killed and started again on its port, empty.
    // The restart blocks until the cluster is ok again: off the runtime's
    // workers, so the rebuild keeps being polled.
    tokio::task::block_in_place(|| {
        let mut cluster = common::shared_cluster().cluster.lock().unwrap();
        common::signal(cluster.nodes[1].pid(), "-STOP");
        cluster.restart(1);
    });
    let summary = run.await.unwrap().expect("the rebuild recovers from a master restart");
    assert!(summary.written_total() > 0);
    assert_exact(&cfg).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_rebuilder_lands_nothing_after_a_takeover() {
    let _serial = SERIAL.lock().await;
    let mut cfg = cluster_config(&common::unique("clusterfence"));
    cfg.lease_seconds = 2;
    common::generate(&cfg, 10_000, 33).await;
    let mut first = common::cachewright(&cfg)
        .args(["rebuild"])
        .env("CACHEWRIGHT_WRITE_BATCH_OPS", "100")
        .spawn()
        .expect("cachewright starts");
    wait_until_mid_run(&cfg).await;
    common::signal(first.id(), "-STOP");

    // MongoDB changes while it is paused; its lease expires; a second
    // writer takes over and finishes.
    let source = cachewright::source::Source::connect(&cfg.mongo()).await.unwrap();
    let db = source.database();
    db.collection::<mongodb::bson::Document>("VideoMedia")
        .update_many(mongodb::bson::doc! {}, mongodb::bson::doc! {"$set": {"title": "second"}})
        .await
        .unwrap();
    let lock = common::env::status_keys(&cfg).rebuild_lock();
    let mut conn = common::redis_conn(&cfg.redis_url).await;
    common::wait_for("the paused lease expired", Duration::from_secs(30), || {
        let (lock, mut conn) = (lock.clone(), conn.clone());
        async move { redis::cmd("GET").arg(&lock).query_async::<Option<String>>(&mut conn).await.unwrap().is_none() }
    })
    .await;
    common::rebuild_once_the_lease_is_free(&cfg).await.expect("the second rebuilder finishes");
    let after_second = common::render_dump(&common::dump(&cfg.redis_url, &cfg.prefix).await, &cfg.prefix);

    // The first wakes up: whatever it still sends is refused slot by slot.
    common::signal(first.id(), "-CONT");
    let status = first.wait().unwrap();
    assert!(!status.success(), "the paused rebuilder must stop on its lost lease");
    let _: () = redis::cmd("PING").query_async(&mut conn).await.unwrap();
    let after_first = common::render_dump(&common::dump(&cfg.redis_url, &cfg.prefix).await, &cfg.prefix);
    assert_eq!(after_first, after_second, "the paused rebuilder wrote or swept after the take-over");
    assert_exact(&cfg).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_epoch_copy_is_restored_by_the_current_writer_only() {
    let _serial = SERIAL.lock().await;
    let cfg = cluster_config(&common::unique("epochcopy"));
    let status = cachewright::keys::status::StatusKeys::new(cfg.status_prefix.clone());
    let keys = cachewright::keys::Keys::new(cfg.prefix.clone());
    let op = |id: &str| Op {
        key: keys.key(FamilyId::VideoDetail, &[id]),
        value: Value::String(format!("{{\"id\":\"{id}\"}}")),
    };
    let ttl = Duration::from_secs(30);

    let sink = Sink::connect(&cfg.redis()).await.unwrap();
    assert_eq!(sink.topology().name(), "cluster", "REDIS_URL points at a cluster node: detected");
    // A batch is cut into one script per master, so it carries the
    // transaction budget once per master, at a script's share.
    let factor = cachewright::sink::cluster::SCRIPT_BUDGET_DIVISOR;
    assert_eq!(sink.tx_budget().max_cost, 3 * cfg.write_batch_cost / factor);
    let lease_a = Lease::acquire(sink.connection(), &status, ttl).await.unwrap();
    let a = sink.clone().fenced(lease_a.fence()).await.unwrap();
    a.write(&[op("before")]).await.expect("the leader writes");

    // B takes over (A's lease is gone, as after an expiry).
    let mut conn = common::redis_conn(&cfg.redis_url).await;
    let _: () = redis::cmd("DEL").arg(status.rebuild_lock()).query_async(&mut conn).await.unwrap();
    let lease_b = Lease::acquire(sink.connection(), &status, ttl).await.unwrap();
    assert!(lease_b.fence().epoch() > lease_a.fence().epoch());
    let b = sink.clone().fenced(lease_b.fence()).await.unwrap();
    // Every slot's copy now holds B's epoch.
    for slot in [0u16, 4321, 16383] {
        let copy: String = redis::cmd("GET")
            .arg(cachewright::keys::status::epoch_copy_key(&cfg.status_prefix, slot))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(copy, lease_b.fence().epoch().to_string());
    }

    // The slot of `lost` forgets its copy, as a master restarted empty
    // would. The old writer cannot restore it: refused.
    let lost = op("lost");
    let slot = cachewright::sink::cluster::slot(lost.key.text.as_bytes());
    let copy_key = cachewright::keys::status::epoch_copy_key(&cfg.status_prefix, slot);
    let _: () = redis::cmd("DEL").arg(&copy_key).query_async(&mut conn).await.unwrap();
    let err = a.write(std::slice::from_ref(&lost)).await.unwrap_err();
    assert!(matches!(err, SinkError::Fenced { .. }), "{err}");
    let exists: bool = redis::cmd("EXISTS").arg(&lost.key.text).query_async(&mut conn).await.unwrap();
    assert!(!exists, "the old writer landed a write");
    // Nor anywhere else, now that it knows.
    assert!(matches!(a.write(&[op("other")]).await.unwrap_err(), SinkError::LeaseLost));

    // The current writer restores the copy and writes.
    b.write(std::slice::from_ref(&lost)).await.expect("the leader repairs the copy");
    let copy: String = redis::cmd("GET").arg(&copy_key).query_async(&mut conn).await.unwrap();
    assert_eq!(copy, lease_b.fence().epoch().to_string());
    let exists: bool = redis::cmd("EXISTS").arg(&lost.key.text).query_async(&mut conn).await.unwrap();
    assert!(exists);
    lease_b.release().await;
    drop(lease_a);
}

/// The write scripts go by hash. A master that lost them (`SCRIPT
/// FLUSH`, as a restarted master has) answers `NOSCRIPT` without running
/// anything; those calls go again by text, which stores the script there
/// for the calls after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_that_lost_the_write_scripts_is_given_them_again() {
    let _serial = SERIAL.lock().await;
    let cfg = cluster_config(&common::unique("noscript"));
    common::generate(&cfg, 8_000, 37).await;
    rebuild(&cfg, &RebuildOptions::full(), &Progress::hidden()).await.expect("first rebuild");
    let masters = common::node_urls(&cfg.redis_url).await;
    let group_sha = redis::Script::new(cachewright::sink::cluster::GROUP_SCRIPT).get_hash().to_string();
    let holds = |node: String| {
        let sha = group_sha.clone();
        async move {
            let mut conn = common::plain_conn(&node).await;
            let held: Vec<bool> = redis::cmd("SCRIPT").arg("EXISTS").arg(sha).query_async(&mut conn).await.unwrap();
            held == [true]
        }
    };
    let mut refused = 0;
    for node in &masters {
        assert!(holds(node.clone()).await, "{node} holds the group script after a rebuild");
        let mut conn = common::plain_conn(node).await;
        let _: () = redis::cmd("SCRIPT").arg("FLUSH").query_async(&mut conn).await.unwrap();
        refused += failed_calls(node, "evalsha").await;
    }
    rebuild(&cfg, &RebuildOptions::full(), &Progress::hidden()).await.expect("rebuild after the flush");
    let mut refused_after = 0;
    for node in &masters {
        assert!(holds(node.clone()).await, "{node} holds the group script again");
        refused_after += failed_calls(node, "evalsha").await;
    }
    assert!(refused_after > refused, "the masters answered NOSCRIPT to calls by hash");
    assert_exact(&cfg).await;
}

/// The calls of `command` that failed on the Redis at `url`.
async fn failed_calls(url: &str, command: &str) -> u64 {
    let mut conn = common::plain_conn(url).await;
    let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut conn).await.unwrap();
    let line = info.lines().find(|l| l.starts_with(&format!("cmdstat_{command}:")));
    line.and_then(|l| l.split([':', ',']).find_map(|f| f.strip_prefix("failed_calls=")))
        .map_or(0, |n| n.parse().unwrap())
}

/// Runs the `cachewright` binary on `cfg` with `args`: its exit code and
/// standard output.
fn run(cfg: &cachewright::config::Config, args: &[&str]) -> (Option<i32>, String) {
    let out =
        common::cachewright(cfg).args(args).stdout(std::process::Stdio::piped()).output().expect("cachewright runs");
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_command_works_on_a_cluster() {
    let _serial = SERIAL.lock().await;
    let cfg = cluster_config(&common::unique("commands"));
    common::load_fixtures(&cfg, &common::fixture_dir("edge-cases")).await;

    // migrate (dry run, then for real: it rebuilds and verifies), rebuild,
    // verify, memory, status.
    assert_eq!(run(&cfg, &["migrate", "--dry-run"]).0, Some(0));
    assert_eq!(run(&cfg, &["migrate"]).0, Some(0), "migrate rebuilds and verifies on the cluster");
    assert_eq!(run(&cfg, &["rebuild"]).0, Some(0));
    assert_exact(&cfg).await;
    let (code, verify) = run(&cfg, &["verify"]);
    assert_eq!(code, Some(0), "{verify}");
    let (code, memory) = run(&cfg, &["memory"]);
    assert_eq!(code, Some(0));
    assert!(memory.contains("video:detail"), "{memory}");
    let (code, status) = run(&cfg, &["status"]);
    assert_eq!(code, Some(0));
    assert!(status.contains("completed"), "{status}");

    // serve: leads, watches, answers ready, and its scrape reads the
    // masters' memory.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = {
        // TTLs that outlive the daily schedule's gap.
        let day = 864_000;
        let ttl = cachewright::config::TierSeconds { count: day, index: day, detail: day, catalog: day };
        let cfg = cachewright::config::Config { ttl, ..cfg.clone() };
        // A full rebuild every half hour, within every tier TTL.
        let opts =
            common::serve_options("[[schedule]]\nname = \"full\"\ncron = \"0 */30 * * * *\"\njob = \"rebuild\"\n");
        tokio::spawn(async move {
            cachewright::serve::run(&cfg, opts, listener, async {
                let _ = stopped.await;
            })
            .await
        })
    };
    let mut server = server;
    let ready = common::wait_for("serve to answer /health/ready", Duration::from_secs(60), || async {
        common::http_get(addr, "/health/ready").await.0 == 200
    });
    tokio::select! {
        ended = &mut server => panic!("serve ended before it was ready: {:?}", ended.unwrap().err()),
        () = ready => {}
    }
    let source = cachewright::source::Source::connect(&cfg.mongo()).await.unwrap();
    source
        .database()
        .collection::<mongodb::bson::Document>("Category")
        .update_one(mongodb::bson::doc! {"_id": "c1"}, mongodb::bson::doc! {"$set": {"name": "Renamed on a cluster"}})
        .await
        .unwrap();
    let key = format!("{}category:by-id:c1", cfg.prefix);
    let conn = common::redis_conn(&cfg.redis_url).await;
    common::wait_for("the watcher applied the rename", Duration::from_secs(30), || {
        let (key, mut conn) = (key.clone(), conn.clone());
        async move {
            let value: Option<String> = redis::cmd("GET").arg(&key).query_async(&mut conn).await.unwrap();
            value.is_some_and(|v| v.contains("Renamed on a cluster"))
        }
    })
    .await;
    let (code, metrics) = common::http_get(addr, "/metrics").await;
    assert_eq!(code, 200);
    let used: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("cachewright_redis_used_memory_bytes "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no used memory in the scrape:\n{metrics}"));
    assert!(used > 0.0);
    let _ = stop.send(());
    server.await.unwrap().expect("serve stops cleanly");
    assert_exact(&cfg).await;

    // purge of the whole prefix (run under another active prefix).
    let other = cachewright::config::Config { prefix: format!("{}new:", cfg.prefix), ..cfg.clone() };
    assert_eq!(run(&other, &["purge", "--prefix", &cfg.prefix]).0, Some(0));
    assert_eq!(common::count_keys(&cfg.redis_url, &format!("{}*", cfg.prefix)).await, 0);
}

/// A plain connection to one cluster node (no routing).
async fn node_conn(port: u16) -> redis::aio::MultiplexedConnection {
    common::plain_conn(&format!("redis://127.0.0.1:{port}")).await
}

/// How many `TRYAGAIN` replies the node gave since its stats were reset.
async fn tryagain_count(conn: &mut redis::aio::MultiplexedConnection) -> u64 {
    let info: String = redis::cmd("INFO").arg("errorstats").query_async(conn).await.unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("errorstat_TRYAGAIN:count="))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_into_a_migrating_slot_waits_and_never_leaves_the_key_half_replaced() {
    let _serial = SERIAL.lock().await;
    let cfg = cluster_config(&common::unique("migrating"));
    let status = cachewright::keys::status::StatusKeys::new(cfg.status_prefix.clone());
    let keys = cachewright::keys::Keys::new(cfg.prefix.clone());
    let list = |items: &[&str]| Op {
        key: keys.key(FamilyId::VideoTagList, &["c1", "t1"]),
        value: Value::List(items.iter().map(|m| m.to_string()).collect()),
    };
    let sink = Sink::connect(&cfg.redis()).await.unwrap();
    let lease = Lease::acquire(sink.connection(), &status, Duration::from_secs(60)).await.unwrap();
    let sink = sink.fenced(lease.fence()).await.unwrap();
    let before = list(&["a", "b", "c"]);
    sink.write(std::slice::from_ref(&before)).await.unwrap();

    // The slot of the key is put half-way through a move, by hand, as
    // `redis-cli --cluster reshard` does: importing on one master,
    // migrating on its owner, every key still on the owner.
    let key = before.key.text.clone();
    let slot = cachewright::sink::cluster::slot(key.as_bytes());
    let (ports, ids): (Vec<u16>, Vec<String>) = {
        let cluster = common::shared_cluster().cluster.lock().unwrap();
        (0..3).map(|i| (cluster.nodes[i].port, cluster.node_id(i))).unzip()
    };
    let mut owner = None;
    for (i, port) in ports.iter().enumerate() {
        let mut conn = node_conn(*port).await;
        if redis::cmd("EXISTS").arg(&key).query_async::<bool>(&mut conn).await.is_ok() {
            owner = Some(i);
        }
    }
    let from = owner.expect("one master serves the key");
    let to = (from + 1) % 3;
    let (mut source, mut target) = (node_conn(ports[from]).await, node_conn(ports[to]).await);
    let setslot = |state: &str, id: &str| {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SETSLOT").arg(slot).arg(state).arg(id);
        cmd
    };
    let _: () = setslot("IMPORTING", &ids[from]).query_async(&mut target).await.unwrap();
    let _: () = setslot("MIGRATING", &ids[to]).query_async(&mut source).await.unwrap();
    let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut source).await.unwrap();

    // The replace is refused while the slot moves (its probe is missing
    // on the owner), and the key keeps its old items meanwhile.
    let (writer, after) = (sink.clone(), list(&["x", "y"]));
    let write = tokio::spawn(async move { writer.write(&[after]).await });
    common::wait_for("the owner refused the write with TRYAGAIN", Duration::from_secs(30), || {
        let mut source = source.clone();
        async move { tryagain_count(&mut source).await > 0 }
    })
    .await;
    let items: Vec<String> = redis::cmd("LRANGE").arg(&key).arg(0).arg(-1).query_async(&mut source).await.unwrap();
    assert_eq!(items, ["a", "b", "c"], "the key was touched while its slot was moving");
    assert!(!write.is_finished(), "the write must wait for the slot to settle");

    // The move completes: every key of the slot (the data and the epoch
    // copy) goes over, then both masters agree on the new owner.
    let in_slot: Vec<String> =
        redis::cmd("CLUSTER").arg("GETKEYSINSLOT").arg(slot).arg(1000).query_async(&mut source).await.unwrap();
    assert!(in_slot.contains(&key));
    let _: () = redis::cmd("MIGRATE")
        .arg("127.0.0.1")
        .arg(ports[to])
        .arg("")
        .arg(0)
        .arg(5000)
        .arg("KEYS")
        .arg(&in_slot)
        .query_async(&mut source)
        .await
        .unwrap();
    let _: () = setslot("NODE", &ids[to]).query_async(&mut target).await.unwrap();
    let _: () = setslot("NODE", &ids[to]).query_async(&mut source).await.unwrap();

    tokio::time::timeout(Duration::from_secs(60), write)
        .await
        .expect("the write lands once the slot settled")
        .unwrap()
        .expect("the write succeeds");
    let items: Vec<String> = redis::cmd("LRANGE").arg(&key).arg(0).arg(-1).query_async(&mut target).await.unwrap();
    assert_eq!(items, ["x", "y"]);
    let ttl: i64 = redis::cmd("TTL").arg(&key).query_async(&mut target).await.unwrap();
    assert!(ttl > 0, "the replace keeps its TTL: {ttl}");
    lease.release().await;
    tokio::task::block_in_place(|| common::shared_cluster().cluster.lock().unwrap().wait_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fail_over_to_a_replica_mid_rebuild_is_detected_and_the_run_redone() {
    let _serial = SERIAL.lock().await;
    let cluster = tokio::task::block_in_place(common::servers::RedisCluster::start_with_replicas);
    let mut cfg = common::TestEnv::new("failover").redis(&cluster.url()).config();
    cfg.write_batch_ops = 100;
    common::generate(&cfg, 10_000, 34).await;

    // A replica in sync with its master.
    let (replica, master_port) = tokio::task::block_in_place(|| cluster.synced_replicas(1))[0];
    let master = cluster.nodes.iter().position(|m| m.port == master_port).unwrap();

    let run = {
        let cfg = cfg.clone();
        tokio::spawn(async move { rebuild_with_retries(&cfg, &RebuildOptions::full(), &Progress::hidden(), 4).await })
    };
    wait_until_mid_run(&cfg).await;
    // The master is paused, so the run cannot finish before the fail-over
    // and whatever it had not yet passed on to its replica is lost; the
    // replica takes over by force, with the other masters' votes.
    tokio::task::block_in_place(|| {
        common::signal(cluster.nodes[master].pid(), "-STOP");
        cluster.promote(replica, Some("FORCE"));
        common::signal(cluster.nodes[master].pid(), "-CONT");
        cluster.wait_ok();
    });
    let summary = run.await.unwrap().expect("the rebuild recovers from a fail-over");
    assert!(summary.written_total() > 0);
    assert!(cluster.replication(master_port).contains("role:slave"), "the old master came back as a replica");
    assert_exact(&cfg).await;
}

/// An operator's manual fail-over (`CLUSTER FAILOVER`, coordinated: each
/// replica catches up with its master before taking over) of every master
/// in turn while a rebuild runs. Once the run is writing, a proxy stalls
/// its MongoDB connections (with timeouts long enough that the driver
/// waits), so the run spans all three fail-overs whatever the machine's
/// speed, while what it read already goes on into the changing masters.
/// Each promotion changes a master's `run_id`, so the run is redone, and
/// the cache ends equal to a fresh rebuild.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_fail_over_of_every_master_mid_rebuild_leaves_the_cache_exact() {
    let _serial = SERIAL.lock().await;
    let cluster = tokio::task::block_in_place(common::servers::RedisCluster::start_with_replicas);
    let name = common::unique("manualfailover");
    let direct = common::TestEnv::named(&name).redis(&cluster.url()).config();
    // More videos than the run reads ahead of its writes (a few decode
    // batches): when the stall comes, most are still to be read.
    common::generate(&direct, 40_000, 35).await;
    let proxy = common::proxy::Proxy::start(common::shared().mongo.port).await;
    let patient = "&connectTimeoutMS=300000&serverSelectionTimeoutMS=300000&heartbeatFrequencyMS=300000";
    let mut cfg =
        common::TestEnv::named(&name).mongo(&format!("{}{patient}", proxy.mongo_uri())).redis(&cluster.url()).config();
    cfg.write_batch_ops = 100;

    let run = {
        let cfg = cfg.clone();
        tokio::spawn(async move { rebuild_with_retries(&cfg, &RebuildOptions::full(), &Progress::hidden(), 6).await })
    };
    wait_until_mid_run(&cfg).await;
    proxy.stall();
    let replicas = tokio::task::block_in_place(|| cluster.synced_replicas(3));
    for (replica, _) in &replicas {
        tokio::task::block_in_place(|| {
            cluster.promote(*replica, None);
            cluster.wait_ok();
        });
    }
    assert!(!run.is_finished(), "the run, held by its stalled MongoDB connection, spans every fail-over");
    proxy.resume();
    let summary = run.await.unwrap().expect("the rebuild follows every fail-over");
    assert!(summary.written_total() > 0);
    for (_, old_master) in &replicas {
        assert!(cluster.replication(*old_master).contains("role:slave"), "{old_master} is a replica now");
    }
    assert_exact(&cfg).await;
}

/// A cluster whose nodes announce IPv6 addresses (`CLUSTER SLOTS` and
/// `MOVED` name `::1`): every address is bracketed where it is made, so
/// the router reaches each master, and the rebuild is exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_announcing_ipv6_addresses_is_followed() {
    let _serial = SERIAL.lock().await;
    let ipv6 = ["--bind", "127.0.0.1 -::1", "--cluster-announce-ip", "::1"].map(String::from).to_vec();
    let cluster = tokio::task::block_in_place(|| common::servers::RedisCluster::start_with(ipv6));
    let masters = common::cluster_masters(&cluster.url()).await.expect("a cluster");
    assert!(masters.iter().all(|m| m.starts_with("[::1]:")), "{masters:?}");
    let cfg = common::TestEnv::new("ipv6").redis(&cluster.url()).config();
    common::load_fixtures(&cfg, &common::fixture_dir("edge-cases")).await;
    rebuild(&cfg, &RebuildOptions::full(), &Progress::hidden()).await.expect("rebuild over IPv6 addresses");
    assert_exact(&cfg).await;
    // The seed may be given as IPv6 too, with brackets.
    let port = cluster.nodes[1].port;
    let seeded = cachewright::config::Config { redis_url: format!("redis://[::1]:{port}"), ..cfg.clone() };
    let out = common::cachewright(&seeded).arg("verify").output().expect("run cachewright");
    assert_eq!(out.status.code(), Some(0), "verify through an IPv6 seed");
}

/// `REDIS_URL` names a replica that is down; the other nodes are given
/// as seeds. Every start (the connection, the permission and eviction
/// checks, the lease, the epoch copies) goes through any seed that
/// answers: `rebuild`, `verify` and `serve` start, and the cache is exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_url_down_every_command_starts_from_the_other_seeds() {
    let _serial = SERIAL.lock().await;
    let mut cluster = tokio::task::block_in_place(common::servers::RedisCluster::start_with_replicas);
    let replica_port = tokio::task::block_in_place(|| cluster.synced_replicas(1))[0].0;
    let replica = cluster.nodes.iter().position(|n| n.port == replica_port).unwrap();
    let live = cluster.nodes.iter().enumerate().find(|(i, _)| *i != replica).map(|(_, n)| n.url()).unwrap();
    let mut cfg = common::TestEnv::new("seeds").redis(&cluster.nodes[replica].url()).config();
    cfg.redis_cluster_nodes = cluster
        .nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != replica)
        .map(|(_, n)| format!("127.0.0.1:{}", n.port))
        .collect();
    common::load_fixtures(&cfg, &common::fixture_dir("edge-cases")).await;
    tokio::task::block_in_place(|| cluster.nodes[replica].stop());

    rebuild(&cfg, &RebuildOptions::full(), &Progress::hidden()).await.expect("rebuild starts from another seed");
    assert_exact(&cachewright::config::Config { redis_url: live.clone(), ..cfg.clone() }).await;

    let out = common::cachewright(&cfg)
        .arg("verify")
        .env("REDIS_CLUSTER_NODES", cfg.redis_cluster_nodes.join(","))
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("run cachewright");
    assert_eq!(out.status.code(), Some(0), "verify: {}", String::from_utf8_lossy(&out.stderr));

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let opts = common::serve_options("[[schedule]]\nname = \"daily\"\ncron = \"0 0 3 * * *\"\njob = \"rebuild\"\n");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = {
        // TTLs that outlive the daily schedule's gap.
        let day = 864_000;
        let ttl = cachewright::config::TierSeconds { count: day, index: day, detail: day, catalog: day };
        let cfg = cachewright::config::Config { ttl, ..cfg.clone() };
        tokio::spawn(async move {
            cachewright::serve::run(&cfg, opts, listener, async {
                let _ = stopped.await;
            })
            .await
        })
    };
    let ready = common::wait_for("serve to be ready through another seed", Duration::from_secs(60), || async {
        common::http_get(addr, "/health/ready").await.0 == 200
    });
    let mut server = server;
    tokio::select! {
        stopped = &mut server => panic!("serve stopped before it was ready: {stopped:?}"),
        () = ready => {}
    }
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(60), server).await.expect("serve stops").unwrap().expect("clean stop");
    assert_exact(&cachewright::config::Config { redis_url: live, ..cfg.clone() }).await;
}
