//! One writer at a time, checked by Redis: a stalled rebuilder that lost
//! its lease lands nothing; the sweep guard keeps a misconfigured or
//! emptied source from wiping the cache; a dropped lease is released;
//! keys that are not UTF-8 break nothing.

mod common;

use cachewright::config::Config;
use cachewright::plan::FamilySet;
use cachewright::progress::Progress;
use cachewright::rebuild::{RebuildOptions, RunError, rebuild};
use cachewright::sink::{Lease, SinkError};
use common::proxy::Proxy;
use mongodb::bson::{Document, doc};
use std::process::Command;
use std::time::Duration;

async fn get(url: &str, key: &str) -> Option<String> {
    let mut conn = common::redis_conn(url).await;
    redis::cmd("GET").arg(key).query_async(&mut conn).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuilder_stalled_past_its_lease_lands_nothing_after_a_takeover() {
    let s = common::shared();
    let proxy = Proxy::start(s.redis.port).await;
    let name = common::unique("fence");
    let direct = {
        let mut cfg = common::TestEnv::named(&name).config();
        cfg.lease_seconds = 2;
        cfg
    };
    let stalled = Config { redis_url: proxy.redis_url(), write_batch_ops: 100, ..direct.clone() };
    common::generate(&direct, 20_000, 11).await;

    // The first rebuilder stalls on its first video detail, mid-run, with
    // batches already sent and held by the network.
    proxy.stall_on(b"video:detail:");
    let first = {
        let cfg = stalled.clone();
        tokio::spawn(async move { rebuild(&cfg, &RebuildOptions::full(), &Progress::hidden()).await })
    };
    tokio::time::timeout(Duration::from_secs(120), proxy.wait_stalled()).await.expect("first rebuilder stalled");
    let lock = common::env::status_keys(&direct).rebuild_lock();
    let epoch_key = common::env::status_keys(&direct).epoch();
    let first_epoch: u64 = get(&s.redis.url(), &epoch_key).await.unwrap().parse().unwrap();

    // MongoDB changes while it is stalled: a channel goes, videos change.
    let source = cachewright::source::Source::connect(&direct.mongo()).await.unwrap();
    let db = source.database();
    let channel: Document = db.collection::<Document>("Channel").find_one(doc! {}).await.unwrap().unwrap();
    db.collection::<Document>("Channel").delete_one(doc! {"_id": channel.get("_id").unwrap()}).await.unwrap();
    db.collection::<Document>("VideoMedia").update_many(doc! {}, doc! {"$set": {"title": "changed"}}).await.unwrap();

    // Its lease expires; a second instance takes over and finishes.
    common::wait_for("the stalled lease expired", Duration::from_secs(30), || async {
        get(&s.redis.url(), &lock).await.is_none()
    })
    .await;
    common::rebuild_once_the_lease_is_free(&direct).await.expect("the second rebuilder finishes");
    let second_epoch: u64 = get(&s.redis.url(), &epoch_key).await.unwrap().parse().unwrap();
    assert!(second_epoch > first_epoch, "a take-over raises the epoch");
    let after_second = common::dump(&s.redis.url(), &direct.prefix).await;

    // The stall ends: the held batches arrive after the take-over and are
    // refused; the first run stops without sweeping and fails.
    proxy.resume();
    let err = tokio::time::timeout(Duration::from_secs(120), first).await.expect("first ends").unwrap().unwrap_err();
    assert!(
        matches!(err, RunError::Sink(SinkError::Fenced { .. } | SinkError::LeaseLost)),
        "the stalled rebuilder must stop on its lost lease: {err}"
    );
    assert_eq!(get(&s.redis.url(), &lock).await, None, "the loser never takes the lease back");
    let after_first = common::dump(&s.redis.url(), &direct.prefix).await;
    assert_eq!(
        common::render_dump(&after_first, &direct.prefix),
        common::render_dump(&after_second, &direct.prefix),
        "the stalled rebuilder wrote or swept after the take-over"
    );
    assert_eq!(common::render_dump(&after_first, &direct.prefix), common::expected_render(&direct).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_never_takes_back_an_expired_lease() {
    let s = common::shared();
    let proxy = Proxy::start(s.redis.port).await;
    let name = common::unique("renew");
    let cfg = common::TestEnv::named(&name).redis(&proxy.redis_url()).config();
    let keys = cachewright::keys::status::StatusKeys::new(cfg.status_prefix.clone());
    let sink = cachewright::sink::Sink::connect(&cfg.redis()).await.unwrap();
    let lease = Lease::acquire(sink.connection(), &keys, Duration::from_secs(1)).await.unwrap();
    let fence = lease.fence();
    assert!(fence.is_valid());
    proxy.stall();
    let lock = keys.rebuild_lock();
    common::wait_for("the lease expired in Redis", Duration::from_secs(10), || async {
        get(&s.redis.url(), &lock).await.is_none()
    })
    .await;
    // By its own clock the holder knows it is out, even before it hears.
    common::wait_for("the holder counts its lease lost", Duration::from_secs(10), || async { !fence.is_valid() }).await;
    proxy.resume();
    // A renewal held by the stall arrives now; a PING on the same
    // multiplexed connection answers only after Redis has run it.
    sink.ping().await.expect("redis reachable again");
    assert_eq!(get(&s.redis.url(), &lock).await, None, "renewal took an expired lease back");
    drop(lease);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_rebuild_leaves_no_lease_behind() {
    let s = common::shared();
    let name = common::unique("leak");
    let cfg = common::TestEnv::named(&name).config();
    common::generate(&cfg, 20_000, 5).await;
    let lock = common::env::status_keys(&cfg).rebuild_lock();
    let run = {
        let cfg = cfg.clone();
        tokio::spawn(async move { rebuild(&cfg, &RebuildOptions::full(), &Progress::hidden()).await })
    };
    let took = common::wait_for("the run took the lease", Duration::from_secs(60), || async {
        get(&s.redis.url(), &lock).await.is_some()
    });
    let mut run = run;
    tokio::select! {
        ended = &mut run => panic!("the run ended before its lease was seen: {ended:?}"),
        () = took => {}
    }
    // Cancelled as a job is when its task is dropped (shutdown timeout,
    // a paused watcher): the lease goes with it.
    run.abort();
    let _ = run.await;
    common::wait_for("the dropped run released its lease", Duration::from_secs(10), || async {
        get(&s.redis.url(), &lock).await.is_none()
    })
    .await;
    rebuild(&cfg, &RebuildOptions::full(), &Progress::hidden()).await.expect("the next run takes the lease");
    let dump = common::dump(&s.redis.url(), &cfg.prefix).await;
    assert_eq!(common::render_dump(&dump, &cfg.prefix), common::expected_render(&cfg).await);
}

fn cli(s: &common::Shared, cfg: &Config, db: &str, extra: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_cachewright"))
        .arg("rebuild")
        .args(extra)
        .env("MONGODB_URI", s.mongo.uri())
        .env("MONGODB_DB", db)
        .env("REDIS_URL", s.redis.url())
        .env("CACHEWRIGHT_PREFIX", &cfg.prefix)
        .env("CACHEWRIGHT_STATUS_PREFIX", &cfg.status_prefix)
        .output()
        .expect("run cachewright");
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sweep_guard_keeps_the_cache_when_the_source_reads_empty() {
    let s = common::shared();
    let cfg = common::edge_case_cache("guard").await;
    let name = cfg.mongodb_db.clone();
    let before = common::dump(&s.redis.url(), &cfg.prefix).await;
    let unchanged = |label: &'static str| {
        let (url, prefix, before) = (s.redis.url(), cfg.prefix.clone(), common::render_dump(&before, &cfg.prefix));
        async move {
            let now = common::dump(&url, &prefix).await;
            assert_eq!(common::render_dump(&now, &prefix), before, "{label}: the cache changed");
        }
    };

    // A typo in the database name reads nothing at all.
    let (code, stderr) = cli(s, &cfg, &format!("{name}typo"), &[]);
    assert_eq!(code, Some(4), "{stderr}");
    assert!(stderr.contains("refusing to write") && stderr.contains("--allow-mass-delete"), "{stderr}");
    unchanged("wrong database").await;

    // An emptied collection: its families keep their keys.
    let source = cachewright::source::Source::connect(&cfg.mongo()).await.unwrap();
    source.database().collection::<Document>("Channel").delete_many(doc! {}).await.unwrap();
    let (code, stderr) = cli(s, &cfg, &name, &[]);
    assert_eq!(code, Some(4), "{stderr}");
    assert!(stderr.contains("Channel"), "{stderr}");
    unchanged("emptied Channel").await;

    // Most videos gone: a run of the video families would delete most of
    // their keys.
    common::load_fixtures(&cfg, &common::fixture_dir("edge-cases")).await;
    let videos = source.database().collection::<Document>("VideoMedia");
    videos.delete_many(doc! {"_id": {"$nin": ["v1"]}}).await.unwrap();
    let video_families = cachewright::cli::parse_only(&["video".into()]).unwrap();
    let err = rebuild(&cfg, &RebuildOptions::only(video_families), &Progress::hidden()).await.unwrap_err();
    assert!(matches!(err, RunError::Guard(_)), "{err}");
    assert!(err.to_string().contains("CACHEWRIGHT_SWEEP_MAX_SHARE"), "{err}");

    // The override does sweep.
    source.database().collection::<Document>("Channel").delete_many(doc! {}).await.unwrap();
    let (code, stderr) = cli(s, &cfg, &name, &["--allow-mass-delete"]);
    assert_eq!(code, Some(0), "{stderr}");
    let after = common::dump(&s.redis.url(), &cfg.prefix).await;
    assert!(!after.keys().any(|k| k.contains("channel:by-id:")), "channel keys stayed");
    assert_eq!(common::render_dump(&after, &cfg.prefix), common::expected_render(&cfg).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_that_are_not_utf8_break_nothing() {
    let s = common::shared();
    let cfg = common::edge_case_cache("utf8").await;
    let mut conn = common::redis_conn(&s.redis.url()).await;
    let mut bad = format!("{}video:detail:", cfg.prefix).into_bytes();
    bad.extend_from_slice(&[0xff, 0xfe, b'x']);
    let _: () = redis::cmd("SET").arg(&bad).arg("?").query_async(&mut conn).await.unwrap();

    let summary = rebuild(&cfg, &RebuildOptions::full(), &Progress::hidden()).await.expect("rebuild");
    assert_eq!(summary.not_utf8, 1);
    let report = cachewright::admin::verify::verify(
        &cfg,
        cachewright::admin::verify::VerifyOptions::all(FamilySet::all()),
        &Progress::hidden(),
    )
    .await
    .unwrap();
    assert!(report.ok(), "{}", report.render());
    let keys = cachewright::keys::Keys::new(cfg.prefix.clone());
    let sink = cachewright::sink::Sink::connect(&cfg.redis()).await.unwrap();
    let existing = sink.scan_existing(&keys, FamilySet::all()).await.unwrap();
    assert_eq!(existing.not_utf8, 1);
    let exists: bool = redis::cmd("EXISTS").arg(&bad).query_async(&mut conn).await.unwrap();
    assert!(exists, "a key no family can own is left alone");
    let dump = common::dump(&s.redis.url(), &cfg.prefix).await;
    assert_eq!(common::render_dump(&dump, &cfg.prefix), common::expected_render(&cfg).await);
}

/// A cut kills every pooled fenced connection at once. The write after it
/// must start on a new connection, not retry through the dead ones: with
/// twelve in the pool and five attempts, it used to run out of attempts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_write_after_a_cut_does_not_retry_through_dead_pooled_connections() {
    use cachewright::keys::{Keys, status::StatusKeys};
    use cachewright::plan::{Op, Value};
    use cachewright::registry::FamilyId;
    use cachewright::sink::Sink;
    let s = common::shared();
    let proxy = Proxy::start(s.redis.port).await;
    let name = common::unique("fencepool");
    let direct = common::TestEnv::named(&name).config();
    let cfg = Config { redis_url: proxy.redis_url(), ..direct.clone() };
    let keys = Keys::new(cfg.prefix.clone());
    let op = |i: usize| Op {
        key: keys.key(FamilyId::VideoDetail, &[&format!("v{i}")]),
        value: Value::String(i.to_string()),
    };
    // The lease on a direct connection: only the writes cross the proxy.
    let status = StatusKeys::new(cfg.status_prefix.clone());
    let lease =
        Lease::acquire(common::redis_conn(&s.redis.url()).await, &status, Duration::from_secs(60)).await.unwrap();
    let sink = Sink::connect(&cfg.redis()).await.unwrap().fenced(lease.fence()).await.unwrap();
    // Twelve writes polled together find fewer than twelve pooled
    // connections, so the others each open (and then pool) a watched
    // connection of their own. One CI run ended its round with only seven
    // open (the cause is not confirmed; a retriable error clears the pool,
    // which would do it), so rounds go on until twelve are open.
    let ops: Vec<Op> = (0..12).map(op).collect();
    let mut pooled = 0;
    for _ in 0..5 {
        futures::future::try_join_all(ops.iter().map(|o| sink.write(std::slice::from_ref(o)))).await.unwrap();
        pooled = proxy.connections_open();
        if pooled >= 12 {
            break;
        }
    }
    assert!(pooled >= 12, "{pooled} connections open through the proxy");

    proxy.cut(false);
    common::wait_for("the proxy closed every connection", Duration::from_secs(10), || async {
        proxy.connections_open() == 0
    })
    .await;
    let accepted = proxy.connections_accepted();
    sink.write(&[op(99)]).await.expect("the write after the cut lands on a new connection");
    assert!(proxy.connections_accepted() > accepted, "the write went out on a new connection");
    let key = keys.key(FamilyId::VideoDetail, &["v99"]).text;
    assert_eq!(get(&s.redis.url(), &key).await.as_deref(), Some("99"));
    lease.release().await;
}

/// A scan's page cut on the wire: on one node the pass runs on a
/// connection of its own, and the retry of the cut page must go out on a
/// new one (the cut one is gone) and the pass still find every key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_cut_mid_pass_starts_again_on_a_new_connection_and_finds_every_key() {
    use cachewright::keys::Keys;
    use cachewright::registry::FamilyId;
    use cachewright::sink::Sink;
    let s = common::shared();
    let proxy = Proxy::start(s.redis.port).await;
    let name = common::unique("scancut");
    let direct = common::TestEnv::named(&name).config();
    let cfg = Config { redis_url: proxy.redis_url(), ..direct.clone() };
    let keys = Keys::new(cfg.prefix.clone());
    let mut conn = common::redis_conn(&s.redis.url()).await;
    let mut pipe = redis::pipe();
    for i in 0..2500 {
        pipe.cmd("SET").arg(keys.key(FamilyId::VideoDetail, &[&format!("v{i}")]).text).arg("{}").ignore();
    }
    let _: () = pipe.query_async(&mut conn).await.unwrap();
    let sink = Sink::connect(&cfg.redis()).await.unwrap();

    proxy.hold_on(b"SCAN");
    let scan = {
        let (sink, keys) = (sink.clone(), keys.clone());
        tokio::spawn(async move { sink.scan_existing(&keys, FamilySet::all()).await })
    };
    tokio::time::timeout(Duration::from_secs(30), proxy.wait_held()).await.expect("a page was held");
    // The held page can never be answered now: a pass that ends sent it
    // again, on a connection opened after the cut.
    proxy.cut(false);
    let found = scan.await.unwrap().expect("the pass survives the cut");
    assert_eq!(found.keys.len(), 2500, "every key was found once");
    assert!(found.keys.iter().all(|(family, _)| *family == FamilyId::VideoDetail));
}

/// An acquisition whose reply was lost took the lease already; sent again
/// under the same holder token (as `acquire_waiting` and the cluster
/// router do), it finds the lease its own and answers the same epoch,
/// instead of waiting out its own lease. Another holder is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_sent_again_finds_the_lease_its_own() {
    let s = common::shared();
    let name = common::unique("reacquire");
    let cfg = common::TestEnv::named(&name).config();
    let keys = cachewright::keys::status::StatusKeys::new(cfg.status_prefix.clone());
    let conn = common::redis_conn(&s.redis.url()).await;
    let ttl = Duration::from_secs(60);
    let first = Lease::acquire_as(conn.clone(), &keys, ttl, "host/pid-1/a".into()).await.expect("free lease");
    let again = Lease::acquire_as(conn.clone(), &keys, ttl, "host/pid-1/a".into()).await.expect("its own lease");
    assert_eq!(again.fence().epoch(), first.fence().epoch(), "the epoch the first attempt set");
    let other = Lease::acquire_as(conn.clone(), &keys, ttl, "host/pid-2/b".into()).await;
    assert!(
        matches!(&other, Err(cachewright::sink::LeaseError::Held { holder, .. }) if holder == "host/pid-1/a"),
        "{:?}",
        other.as_ref().map(|_| ())
    );
    // Both handles stand for one lease: the first releases it (the
    // second's renewer then finds it gone and stops).
    std::mem::forget(again);
    first.release().await;
    assert_eq!(get(&s.redis.url(), &keys.rebuild_lock()).await, None);
}

/// An acquisition dropped while its script is on the wire (a job
/// cancelled as it starts) still takes the lease when the script lands.
/// Its guard releases it right behind, so the next run need not wait out
/// the lock's TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquisition_dropped_in_flight_leaks_no_lease() {
    use cachewright::keys::status::StatusKeys;
    let s = common::shared();
    let proxy = Proxy::start(s.redis.port).await;
    let cfg = common::TestEnv::named(&common::unique("inflight")).config();
    let keys = StatusKeys::new(cfg.status_prefix.clone());
    let ttl = Duration::from_secs(60);
    // Both scripts known to the server first, so the held request is the
    // acquisition itself and not a NOSCRIPT miss that takes nothing.
    Lease::acquire(common::redis_conn(&s.redis.url()).await, &keys, ttl).await.unwrap().release().await;
    let epoch = |url: String, key: String| async move {
        get(&url, &key).await.map(|e| e.parse::<u64>().expect("a numeric epoch")).unwrap_or(0)
    };
    let before = epoch(s.redis.url(), keys.epoch()).await;

    let conn = common::redis_conn(&proxy.redis_url()).await;
    proxy.hold_on(keys.rebuild_lock().as_bytes());
    let acquiring = {
        let keys = keys.clone();
        tokio::spawn(async move { Lease::acquire(conn, &keys, ttl).await.map(|_| ()) })
    };
    proxy.wait_held().await;
    acquiring.abort();
    assert!(acquiring.await.is_err_and(|e| e.is_cancelled()), "the acquisition was dropped before its answer");
    proxy.release_held();

    common::wait_for("the dropped acquisition's script raised the epoch", Duration::from_secs(10), || async {
        epoch(s.redis.url(), keys.epoch()).await > before
    })
    .await;
    common::wait_for("the lease it took is released", Duration::from_secs(10), || async {
        get(&s.redis.url(), &keys.rebuild_lock()).await.is_none()
    })
    .await;
}

/// A fenced writer of its own Redis, reached through a proxy: the
/// command counts on the Redis are this test's alone.
struct ProxiedWriter {
    redis: common::servers::Redis,
    proxy: Proxy,
    cfg: Config,
    lease: Lease,
    fenced: cachewright::sink::Sink,
}

async fn proxied_writer(tag: &str, lease_ttl: Duration, tweak: impl FnOnce(&mut Config)) -> ProxiedWriter {
    let redis = common::servers::Redis::start();
    let proxy = Proxy::start(redis.port).await;
    let mut cfg = common::TestEnv::new(tag).redis(&proxy.redis_url()).config();
    tweak(&mut cfg);
    let keys = cachewright::keys::status::StatusKeys::new(cfg.status_prefix.clone());
    let sink = cachewright::sink::Sink::connect(&cfg.redis()).await.unwrap();
    let lease = Lease::acquire(sink.connection(), &keys, lease_ttl).await.unwrap();
    let fenced = sink.fenced(lease.fence()).await.unwrap();
    ProxiedWriter { redis, proxy, cfg, lease, fenced }
}

/// A writer that knows it lost its lease (here: not renewed for a whole
/// TTL while the proxy stalled) does not fill a stage for a big key: the
/// fill could never be renamed. It stops with `LeaseLost`, and Redis got
/// no stage and no element.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_lost_its_lease_fills_no_stage() {
    use cachewright::plan::{Op, Value};
    use cachewright::registry::FamilyId;
    let ProxiedWriter { redis, proxy, cfg, lease, fenced } =
        proxied_writer("lostfill", Duration::from_secs(1), |cfg| cfg.write_batch_cost = 20_000).await;
    proxy.stall();
    common::wait_for("the holder counts its lease lost", Duration::from_secs(10), || async {
        !lease.fence().is_valid()
    })
    .await;
    proxy.resume();
    let before = common::command_calls(&redis.url(), "rpush").await;
    let key = cachewright::keys::Keys::new(cfg.prefix.clone()).key(FamilyId::VideoCategoryList, &["c1"]);
    let big = Op { key: key.clone(), value: Value::List((0..3000).map(|i| format!("v{i:04}")).collect()) };
    let err = fenced.write(&[big]).await.expect_err("a lost lease writes nothing");
    assert!(matches!(err, cachewright::sink::SinkError::LeaseLost), "{err}");
    assert_eq!(common::command_calls(&redis.url(), "rpush").await, before, "no element was sent");
    assert_eq!(common::count_keys(&redis.url(), &format!("{}stage:*", cfg.status_prefix)).await, 0);
    assert_eq!(get(&redis.url(), &key.text).await, None);
}

/// A write that timed out may still land later, after its own retry and
/// after newer writes, and fencing orders epochs, not the writes of one
/// epoch. So the writer raises its own epoch before it sends the write
/// again: the proxy holds one transaction past its timeout, the retry and
/// a newer write land, then the held copy is delivered, and Redis refuses
/// it (its `WATCH` saw the epoch move). The key keeps the newer value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_delivered_after_its_timeout_and_retry_is_refused() {
    use cachewright::plan::{Op, Value};
    use cachewright::registry::FamilyId;
    let ProxiedWriter { redis, proxy, cfg, lease, fenced } =
        proxied_writer("late", Duration::from_secs(60), |cfg| cfg.redis_timeout_seconds = 1).await;
    let keys = cachewright::keys::status::StatusKeys::new(cfg.status_prefix.clone());
    let epoch = lease.fence().epoch();
    let key = cachewright::keys::Keys::new(cfg.prefix.clone()).key(FamilyId::VideoDetail, &["v1"]);
    let put = |value: &str| Op { key: key.clone(), value: Value::String(value.to_string()) };
    fenced.write(&[put("{\"v\":\"warm\"}")]).await.expect("a first write arms a pooled connection");

    proxy.hold_on(b"late-copy");
    let first = {
        let (fenced, op) = (fenced.clone(), put("{\"v\":\"late-copy\"}"));
        tokio::spawn(async move { fenced.write(&[op]).await })
    };
    proxy.wait_held().await;
    first.await.unwrap().expect("the write times out, and its retry under a raised epoch lands");
    assert_eq!(lease.fence().epoch(), epoch + 1, "the writer raised its own epoch before the retry");
    assert_eq!(get(&redis.url(), &keys.epoch()).await, Some((epoch + 1).to_string()));
    fenced.write(&[put("{\"v\":\"newer\"}")]).await.expect("a newer write under the raised epoch");

    let execs = common::command_calls(&redis.url(), "exec").await;
    proxy.release_held();
    common::wait_for("the held transaction to reach Redis", Duration::from_secs(10), || async {
        common::command_calls(&redis.url(), "exec").await > execs
    })
    .await;
    assert_eq!(get(&redis.url(), &key.text).await.as_deref(), Some("{\"v\":\"newer\"}"), "the late copy landed");
    assert!(lease.fence().is_valid(), "raising its own epoch is not a take-over");
    fenced.write(&[put("{\"v\":\"after\"}")]).await.expect("the writer goes on");
    lease.release().await;
}
