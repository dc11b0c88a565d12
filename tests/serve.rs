//! `serve` against real servers: HTTP endpoints, one rebuild per fire
//! among replicas, and a clean stop on SIGTERM in the middle of a rebuild.

mod common;

use cachewright::config::Config;
use cachewright::keys::status::StatusKeys;
use cachewright::serve::ServeOptions;
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A `serve` test's settings: status keys under `status`, the contract's
/// home sections, and a 2 s lease, so take-overs happen within a test.
fn serve_env(name: &str, status: &str) -> common::TestEnv {
    common::TestEnv::named(name).status_prefix(status).home_limit(None).with(|raw| raw.lease_seconds = Some(2))
}

type Served = (tokio::sync::oneshot::Sender<()>, tokio::task::JoinHandle<Result<(), cachewright::serve::ServeError>>);

/// Runs `serve` in this process until the returned sender fires.
fn serve_here(cfg: &Config, schedules: &str, watch: bool, listener: tokio::net::TcpListener) -> Served {
    serve_here_at(cfg, schedules, watch, listener, cachewright::serve::clock::system())
}

/// [`serve_here`] with its schedules on `clock`.
fn serve_here_at(
    cfg: &Config,
    schedules: &str,
    watch: bool,
    listener: tokio::net::TcpListener,
    clock: std::sync::Arc<dyn cachewright::serve::clock::Clock>,
) -> Served {
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let cfg = cfg.clone();
    let opts = ServeOptions { watch, clock, ..common::serve_options(schedules) };
    let handle = tokio::spawn(async move {
        cachewright::serve::run(&cfg, opts, listener, async {
            let _ = stopped.await;
        })
        .await
    });
    (stop, handle)
}

/// Starts the `cachewright serve` binary without a watcher.
fn serve_process(cfg: &Config, schedules_dir: &std::path::Path) -> std::process::Child {
    common::cachewright(cfg)
        .args(["serve", "--no-watch", "--http", "127.0.0.1:0", "--schedules"])
        .arg(schedules_dir)
        .spawn()
        .expect("start cachewright serve")
}

use common::http_get as get;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_endpoints_answer_and_health_fails_when_redis_is_down() {
    let mongo = &common::shared().mongo;
    let mut redis = common::servers::Redis::start();
    let name = common::unique("servehttp");
    let cfg = serve_env(&name, "cw-http:").mongo(&mongo.uri()).redis(&redis.url()).long_ttls().config();
    common::load_fixtures(&cfg, &common::fixture_dir("edge-cases")).await;
    // A daily rebuild, and a video refresh every two seconds so the scrape
    // holds job figures (the fixtures' rejected documents among them).
    let schedules = "[[schedule]]\nname = \"daily\"\ncron = \"0 0 3 * * *\"\njob = \"rebuild\"\n\
        [[schedule]]\nname = \"videos\"\ncron = \"*/2 * * * * *\"\njob = \"refresh\"\nfamilies = [\"video\"]\n";
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, server) = serve_here(&cfg, schedules, true, listener);
    // The watcher starts with a rebuild; wait for its job to be recorded.
    let mut conn = common::redis_conn(&redis.url()).await;
    let completed = common::env::status_keys(&cfg).jobs("completed");
    common::wait_for("the watcher's start-up job to be recorded", Duration::from_secs(10), || {
        let (mut conn, completed) = (conn.clone(), completed.clone());
        async move {
            let n: usize = redis::cmd("SCARD").arg(&completed).query_async(&mut conn).await.unwrap();
            n > 0
        }
    })
    .await;
    // Ready once the leader's watcher streams (`/health` is the alias).
    common::wait_for("/health to answer 200", Duration::from_secs(10), || async {
        get(addr, "/health").await.0 == 200
    })
    .await;
    let (status, body) = get(addr, "/health").await;
    assert_eq!(status, 200, "{body}");
    let health: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        health,
        serde_json::json!({"status": "ok", "mongodb": "ok", "redis": "ok", "role": "leader", "problems": []})
    );
    assert_eq!(get(addr, "/health/ready").await.0, 200);
    let (status, body) = get(addr, "/health/live").await;
    assert_eq!(status, 200, "{body}");
    common::wait_for("a scheduled job to complete", Duration::from_secs(30), || async {
        let body = get(addr, "/metrics").await.1;
        body.lines().any(|l| {
            l.starts_with("cachewright_job_runs_total{trigger=\"cron\",outcome=\"completed\"}") && !l.ends_with(" 0")
        })
    })
    .await;
    let (status, body) = get(addr, "/metrics").await;
    assert_eq!(status, 200);
    let rejected = "cachewright_rejected_documents_total{collection=\"VideoMedia\",reason=\"missing title\"}";
    assert!(body.contains(rejected), "{body}");
    for line in [
        "cachewright_job_runs_total{trigger=\"cron\",outcome=\"failed\"} 0",
        "cachewright_errors_total{edge=\"redis\"} 0",
        "cachewright_leader 1",
        "cachewright_dependency_up{dependency=\"redis\"} 1",
    ] {
        assert!(body.lines().any(|l| l == line), "/metrics lacks {line:?}:\n{body}");
    }
    common::ops::check_metrics_text(&body);
    common::ops::assert_ops_metrics_exported(&body);
    let (status, body) = get(addr, "/status").await;
    assert_eq!(status, 200);
    let status_json: serde_json::Value = serde_json::from_str(&body).unwrap();
    let triggers: Vec<&str> =
        status_json["runs"].as_array().unwrap().iter().filter_map(|r| r["trigger"].as_str()).collect();
    assert!(triggers.contains(&"change-stream") && triggers.contains(&"cron"), "{triggers:?}");
    assert_eq!(status_json["current"]["service"], "cachewright serve");
    assert_eq!(get(addr, "/nope").await.0, 404);
    let heartbeat: String =
        redis::cmd("GET").arg(common::env::status_keys(&cfg).health()).query_async(&mut conn).await.unwrap();
    assert!(heartbeat.contains("cachewright serve"));

    redis.stop();
    let (status, body) = get(addr, "/health/ready").await;
    assert_eq!(status, 503, "{body}");
    // Liveness does not depend on Redis: restarting the process would not help.
    assert_eq!(get(addr, "/health/live").await.0, 200);
    let health: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(health["mongodb"], "ok");
    assert_ne!(health["redis"], "ok");
    redis.restart();
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(60), server).await.expect("serve stops").unwrap().expect("clean stop");
}

/// 2,000 clients that connect and send nothing, or half a request, hold
/// no slot a readiness probe needs: each probe answers within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_connections_do_not_delay_readiness() {
    let name = common::unique("servehalf");
    let cfg = serve_env(&name, &format!("cw-{name}:")).long_ttls().config();
    common::load_fixtures(&cfg, &common::fixture_dir("edge-cases")).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let daily = "[[schedule]]\nname = \"daily\"\ncron = \"0 0 3 * * *\"\njob = \"rebuild\"\n";
    let (stop, server) = serve_here(&cfg, daily, false, listener);
    common::wait_for("serve to answer /health/ready", Duration::from_secs(30), || async {
        get(addr, "/health/ready").await.0 == 200
    })
    .await;
    let mut idle = Vec::new();
    for i in 0..2000 {
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
        if i % 2 == 1 {
            stream.write_all(b"GET /health/ready HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        }
        idle.push(stream);
    }
    for _ in 0..5 {
        let started = std::time::Instant::now();
        let (status, body) = tokio::time::timeout(Duration::from_secs(5), get(addr, "/health/ready"))
            .await
            .expect("a readiness probe is answered despite 2,000 idle connections");
        assert_eq!(status, 200, "{body}");
        // Well inside the 5 s header timeout: no idle connection had to
        // time out to make room (the bound leaves a loaded CI machine slack).
        assert!(started.elapsed() < Duration::from_millis(2500), "probe took {:?}", started.elapsed());
    }
    // The server closed the idle connections it evicted.
    let mut closed = 0;
    for stream in &mut idle[..100] {
        let mut buf = [0u8; 64];
        if let Ok(Ok(0)) = tokio::time::timeout(Duration::from_millis(200), stream.read(&mut buf)).await {
            closed += 1;
        }
    }
    assert!(closed > 0, "the oldest idle connections were evicted");
    drop(idle);
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(60), server).await.expect("serve stops").unwrap().expect("clean stop");
}

/// Two instances on one schedule, their clock moved by the test from
/// fire to fire: each fire runs exactly one job (the leader's), and the
/// other instance runs none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_run_exactly_one_rebuild_per_fire() {
    use cachewright::serve::clock::ManualClock;
    // A Redis of its own: the test counts the commands it receives.
    let redis = common::servers::Redis::start();
    let name = common::unique("servetwo");
    let status = format!("cw-{name}:");
    let cfg = serve_env(&name, &status).redis(&redis.url()).config();
    common::load_fixtures(&cfg, &common::fixture_dir("edge-cases")).await;
    // What one writer's start-up costs in `DISCARD`s (its permission
    // check queues a `MULTI` of probes and discards it), measured rather
    // than assumed, so the wait below counts both instances' start-ups
    // and not only the first one's.
    let before = common::command_calls(&redis.url(), "discard").await;
    drop(cachewright::sink::Sink::connect_for(&cfg.redis(), cachewright::sink::Access::Write).await.unwrap());
    let per_start = common::command_calls(&redis.url(), "discard").await - before;
    assert!(per_start >= 1, "a writer's start-up checks its permissions");
    let text = "[[schedule]]\nname = \"often\"\ncron = \"*/2 * * * * *\"\njob = \"rebuild\"\n";
    let start = chrono::DateTime::parse_from_rfc3339("2026-06-01T00:00:00Z").unwrap().to_utc();
    let clock = std::sync::Arc::new(ManualClock::new(start));
    let mut servers = Vec::new();
    let mut stops = Vec::new();
    for _ in 0..2 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (stop, server) = serve_here_at(&cfg, text, false, listener, clock.clone());
        servers.push(server);
        stops.push(stop);
    }
    let keys = cachewright::keys::status::StatusKeys::new(status.clone());
    let mut conn = common::redis_conn(&redis.url()).await;
    let completed = || {
        let mut conn = conn.clone();
        let key = keys.jobs("completed");
        async move { redis::cmd("SCARD").arg(key).query_async::<usize>(&mut conn).await.unwrap() }
    };
    // One instance leads (its schedules start from the clock's time).
    let lock = keys.rebuild_lock();
    common::wait_for("a leader", Duration::from_secs(30), || {
        let (mut conn, lock) = (conn.clone(), lock.clone());
        async move { redis::cmd("EXISTS").arg(lock).query_async::<bool>(&mut conn).await.unwrap() }
    })
    .await;
    // The start-up probes run once as each instance starts; the leader's
    // jobs reuse its connections.
    common::wait_for("both instances to check their permissions", Duration::from_secs(30), || async {
        common::command_calls(&redis.url(), "discard").await >= before + 3 * per_start
    })
    .await;
    let checks = common::command_calls(&redis.url(), "discard").await;
    for fire in 1..=3 {
        clock.set(start + chrono::Duration::seconds(2 * fire));
        common::wait_for(&format!("the job of fire {fire}"), Duration::from_secs(60), || async {
            completed().await >= fire as usize
        })
        .await;
    }
    assert_eq!(
        common::command_calls(&redis.url(), "discard").await,
        checks,
        "a job connects again and checks permissions again"
    );
    for stop in stops {
        let _ = stop.send(());
    }
    for server in servers {
        server.await.unwrap().expect("clean stop");
    }
    let ids: Vec<String> = redis::cmd("SMEMBERS").arg(keys.jobs("completed")).query_async(&mut conn).await.unwrap();
    assert_eq!(ids.len(), 3, "one job per fire, from one instance: {ids:?}");
    for id in &ids {
        let job: HashMap<String, String> =
            redis::cmd("HGETALL").arg(keys.job(id)).query_async(&mut conn).await.unwrap();
        assert_eq!(job["trigger"], "cron");
    }
    let failed: usize = redis::cmd("SCARD").arg(keys.jobs("failed")).query_async(&mut conn).await.unwrap();
    assert_eq!(failed, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_rebuild_stops_cleanly() {
    let s = common::shared();
    let name = common::unique("serveterm");
    let status = format!("cw-{name}:");
    let cfg = serve_env(&name, &status).config();
    let source = cachewright::source::Source::connect(&cfg.mongo()).await.unwrap();
    let shape = cachewright::dev::generate::Shape { channels: 5, categories: 50, tags: 200, videos: 60_000 };
    cachewright::dev::generate::generate(source.database(), &cfg.collections, shape, 2, |_| {}).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("s.toml"),
        "[[schedule]]\nname = \"often\"\ncron = \"*/3 * * * * *\"\njob = \"rebuild\"\n",
    )
    .unwrap();
    let mut child = serve_process(&cfg, dir.path());
    let mut conn = common::redis_conn(&s.redis.url()).await;
    let active = common::env::status_keys(&cfg).jobs("active");
    let run_id = common::wait_for_some("a scheduled rebuild to start", Duration::from_secs(10), || {
        let (mut conn, active) = (conn.clone(), active.clone());
        async move {
            let ids: Vec<String> = redis::cmd("SMEMBERS").arg(&active).query_async(&mut conn).await.unwrap();
            ids.into_iter().next()
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let _ = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let code = common::wait_exit(&mut child, "serve to exit after SIGTERM", Duration::from_secs(30)).await;
    assert_eq!(code, Some(0), "serve did not exit 0");
    let lock: Option<String> =
        redis::cmd("GET").arg(common::env::status_keys(&cfg).rebuild_lock()).query_async(&mut conn).await.unwrap();
    assert_eq!(lock, None, "lease not released");
    let job: HashMap<String, String> =
        redis::cmd("HGETALL").arg(common::env::status_keys(&cfg).job(&run_id)).query_async(&mut conn).await.unwrap();
    if job["status"] == "failed" {
        assert_eq!(job["last_error"], "shutdown");
        let failed: Vec<String> = redis::cmd("SMEMBERS")
            .arg(common::env::status_keys(&cfg).jobs("failed"))
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(failed, vec![run_id.clone()]);
    } else {
        // It finished its last batch before the signal landed.
        assert_eq!(job["status"], "completed");
    }
    // Whatever was written is whole: every category list matches its index.
    let dump = common::dump(&s.redis.url(), &cfg.prefix).await;
    let list_head = format!("{}video:category:list:", cfg.prefix);
    for (key, (content, _)) in &dump {
        let (Some(cat), common::render::Content::List(ids)) = (key.strip_prefix(&list_head), content) else { continue };
        let index = dump.get(&format!("{}video:category:index:{cat}:videos", cfg.prefix));
        if let Some((common::render::Content::Zset(members), _)) = index {
            assert_eq!(ids.len(), members.len(), "{key}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lease_is_taken_over_after_its_holder_is_killed() {
    let s = common::shared();
    let name = common::unique("servekill");
    let status = format!("cw-{name}:");
    let cfg = serve_env(&name, &status).config();
    let source = cachewright::source::Source::connect(&cfg.mongo()).await.unwrap();
    let shape = cachewright::dev::generate::Shape { channels: 5, categories: 50, tags: 200, videos: 60_000 };
    cachewright::dev::generate::generate(source.database(), &cfg.collections, shape, 3, |_| {}).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let text = "[[schedule]]\nname = \"often\"\ncron = \"*/2 * * * * *\"\njob = \"rebuild\"\n";
    std::fs::write(dir.path().join("s.toml"), text).unwrap();
    let mut holder = serve_process(&cfg, dir.path());
    let lock = common::env::status_keys(&cfg).rebuild_lock();
    let conn = common::redis_conn(&s.redis.url()).await;
    common::wait_for("the first instance to take the lease", Duration::from_secs(10), || {
        let (mut conn, lock) = (conn.clone(), lock.clone());
        async move { redis::cmd("GET").arg(&lock).query_async::<Option<String>>(&mut conn).await.unwrap().is_some() }
    })
    .await;
    holder.kill().unwrap();
    let _ = holder.wait();
    let killed_at = cachewright::status::unix_now();

    // A second instance takes over once the lease expires.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let (stop, server) = serve_here(&cfg, text, false, listener);
    let status = common::env::status_keys(&cfg);
    common::wait_for("a rebuild completed after the holder was killed", Duration::from_secs(30), || {
        let (mut conn, status) = (conn.clone(), status.clone());
        async move {
            let ids: Vec<String> =
                redis::cmd("SMEMBERS").arg(status.jobs("completed")).query_async(&mut conn).await.unwrap();
            for id in ids {
                let started: Option<u64> =
                    redis::cmd("HGET").arg(status.job(&id)).arg("started_at").query_async(&mut conn).await.unwrap();
                if started.is_some_and(|t| t >= killed_at) {
                    return true;
                }
            }
            false
        }
    })
    .await;
    let _ = stop.send(());
    server.await.unwrap().expect("clean stop");
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Starts `cachewright serve` (with its watcher) on a port found free,
/// and again on another when that port was taken before it could bind
/// (by a server another test started, or as an outgoing connection's
/// source port): it then exits at once. Gives the process and its port.
async fn serve_on_free_port(cfg: &Config, schedules_dir: &std::path::Path) -> (std::process::Child, u16) {
    for _ in 0..5 {
        let port = free_port();
        let mut child = common::cachewright(cfg)
            .args(["serve", "--window-ms", "50", "--http", &format!("127.0.0.1:{port}"), "--schedules"])
            .arg(schedules_dir)
            .spawn()
            .expect("start cachewright serve");
        if tokio::task::block_in_place(|| common::servers::came_up(&mut child, port)) {
            return (child, port);
        }
    }
    panic!("serve exited at start on five ports found free in a row")
}

/// The pid inside a writer-lease holder token (`host/pid-N/…`).
fn holder_pid(token: &str) -> Option<u32> {
    token.split('/').find_map(|p| p.strip_prefix("pid-")).and_then(|p| p.parse().ok())
}

async fn lock_holder(url: &str, status: &str) -> Option<u32> {
    let mut conn = common::redis_conn(url).await;
    let v: Option<String> =
        redis::cmd("GET").arg(StatusKeys::new(status).rebuild_lock()).query_async(&mut conn).await.unwrap();
    v.as_deref().and_then(holder_pid)
}

/// Waits until the cache equals a fresh full rebuild of MongoDB.
async fn wait_converged(url: &str, cfg: &Config) {
    let converged = common::wait_for("the cache to equal a fresh rebuild", Duration::MAX, || async {
        let expected = common::expected_render(cfg).await;
        common::render_dump(&common::dump(url, &cfg.prefix).await, &cfg.prefix) == expected
    });
    // After 30 s the difference says what is missing.
    if tokio::time::timeout(Duration::from_secs(30), converged).await.is_err() {
        common::assert_exact_at(url, cfg).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_leader_is_replaced_within_a_lease_ttl_and_returns_as_a_follower() {
    let s = common::shared();
    let name = common::unique("failover");
    let status = format!("cw-{name}:");
    let cfg = serve_env(&name, &status).long_ttls().config();
    common::load_fixtures(&cfg, &common::fixture_dir("edge-cases")).await;
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("s.toml"),
        "[[schedule]]\nname = \"daily\"\ncron = \"0 0 3 * * *\"\njob = \"rebuild\"\n",
    )
    .unwrap();
    let (mut children, mut ports) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        let (child, port) = serve_on_free_port(&cfg, dir.path()).await;
        children.push(child);
        ports.push(port);
    }
    let addr = |i: usize| std::net::SocketAddr::from(([127, 0, 0, 1], ports[i]));
    let url = s.redis.url();
    let leader_pid =
        common::wait_for_some("an instance to lead", Duration::from_secs(30), || lock_holder(&url, &status)).await;
    let leader = children.iter().position(|c| c.id() == leader_pid).expect("one serve leads");
    let follower = 1 - leader;
    // The leader's watcher streams (its start-up rebuild done).
    common::wait_for("the leader to become ready", Duration::from_secs(30), || async {
        tokio::net::TcpStream::connect(addr(leader)).await.is_ok() && get(addr(leader), "/health/ready").await.0 == 200
    })
    .await;
    let (_, body) = get(addr(follower), "/health/ready").await;
    assert!(body.contains("\"role\":\"follower\""), "{body}");

    // Freeze the leader: the follower takes over within a lease TTL (plus
    // its polling interval).
    common::signal(children[leader].id(), "-STOP");
    let stopped = std::time::Instant::now();
    let took = common::wait_for_some("the follower took over", Duration::from_secs(20), || async {
        (lock_holder(&s.redis.url(), &status).await == Some(children[follower].id())).then(|| stopped.elapsed())
    })
    .await;
    let ttl = Duration::from_secs(cfg.lease_seconds);
    assert!(took <= ttl + ttl / 3 + Duration::from_millis(500), "take-over took {took:?} with a {ttl:?} lease");

    // The new leader's watcher applies changes.
    let source = cachewright::source::Source::connect(&cfg.mongo()).await.unwrap();
    let videos = source.database().collection::<mongodb::bson::Document>("VideoMedia");
    videos
        .update_one(mongodb::bson::doc! {"_id": "v1"}, mongodb::bson::doc! {"$set": {"title": "after failover"}})
        .await
        .unwrap();
    wait_converged(&s.redis.url(), &cfg).await;

    // The old leader wakes up: it finds its lease gone, writes nothing, and
    // follows.
    common::signal(children[leader].id(), "-CONT");
    common::wait_for("the old leader to step down", Duration::from_secs(15), || async {
        get(addr(leader), "/health/ready").await.1.contains("\"role\":\"follower\"")
    })
    .await;
    assert_eq!(lock_holder(&s.redis.url(), &status).await, Some(children[follower].id()));
    videos
        .update_one(mongodb::bson::doc! {"_id": "v2"}, mongodb::bson::doc! {"$set": {"title": "after wake-up"}})
        .await
        .unwrap();
    wait_converged(&s.redis.url(), &cfg).await;

    for child in &children {
        common::signal(child.id(), "-TERM");
    }
    for child in &mut children {
        let code = common::wait_exit(child, "serve to stop", Duration::from_secs(40)).await;
        assert_eq!(code, Some(0), "serve did not stop cleanly");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_watcher_shows_in_health_and_is_restarted() {
    let mongo = &common::shared().mongo;
    let redis = common::servers::Redis::start();
    let name = common::unique("servewfail");
    let mut cfg = serve_env(&name, "cw-wfail:").mongo(&mongo.uri()).redis(&redis.url()).long_ttls().config();
    // The lease outlives the fault; only the watcher is under test.
    cfg.lease_seconds = 60;
    common::load_fixtures(&cfg, &common::fixture_dir("edge-cases")).await;
    let daily = "[[schedule]]\nname = \"daily\"\ncron = \"0 0 3 * * *\"\njob = \"rebuild\"\n";
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, server) = serve_here(&cfg, daily, true, listener);
    let wait_health = |want: u16| async move {
        common::wait_for_some(&format!("/health to answer {want}"), Duration::from_secs(15), || async {
            let (code, body) = get(addr, "/health").await;
            (code == want).then_some(body)
        })
        .await
    };
    wait_health(200).await;
    // `/health` answers 200 while the watcher still starts (its first
    // rebuild and load): the fault must find it streaming.
    let status_of = || async move {
        let (_, status) = get(addr, "/status").await;
        serde_json::from_str::<serde_json::Value>(&status).unwrap()
    };
    common::wait_for("the watcher to stream", Duration::from_secs(30), || async {
        status_of().await["current"]["watcher"]["streaming"] == serde_json::Value::Bool(true)
    })
    .await;

    // Redis refuses writes (out of memory): the next change fails the
    // watcher's batch, and the watcher with it.
    let mut conn = common::redis_conn(&redis.url()).await;
    let _: () =
        redis::cmd("CONFIG").arg("SET").arg("maxmemory-policy").arg("noeviction").query_async(&mut conn).await.unwrap();
    let _: () = redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg("1").query_async(&mut conn).await.unwrap();
    let source = cachewright::source::Source::connect(&cfg.mongo()).await.unwrap();
    let videos = source.database().collection::<mongodb::bson::Document>("VideoMedia");
    videos
        .update_one(mongodb::bson::doc! {"_id": "v1"}, mongodb::bson::doc! {"$set": {"title": "while failing"}})
        .await
        .unwrap();
    let body = wait_health(503).await;
    assert!(body.contains("watcher"), "{body}");
    common::wait_for("the watcher's OOM error in /status", Duration::from_secs(30), || async {
        status_of().await["current"]["watcher"]["last_error"].as_str().is_some_and(|e| e.contains("OOM"))
    })
    .await;
    assert!(!server.is_finished(), "serve must keep running when its watcher fails");

    // Redis recovers: the watcher is restarted, replays the change, and
    // the cache converges.
    let _: () = redis::cmd("CONFIG").arg("SET").arg("maxmemory").arg("0").query_async(&mut conn).await.unwrap();
    wait_health(200).await;
    wait_converged(&redis.url(), &cfg).await;
    let (_, metrics) = get(addr, "/metrics").await;
    assert!(metrics.contains("cachewright_changestream_streaming 1"), "{metrics}");
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(60), server).await.expect("serve stops").unwrap().expect("clean stop");
}

/// A scheduled job fires while the watcher's write is stuck on its way
/// (the proxy holds that one Redis connection). `serve` stops the watcher
/// (dropping the batch in flight, or aborting the watcher after the
/// grace) and raises its epoch before the job starts. When the held
/// transaction reaches Redis after the job, Redis refuses it (a null
/// `EXEC`): the stopped watcher writes nothing after the job started. The
/// restarted watcher then brings the cache to a fresh rebuild's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_write_still_on_its_way_when_a_job_starts_is_refused() {
    let mongo = &common::shared().mongo;
    let redis = common::servers::Redis::start();
    let proxy = common::proxy::Proxy::start(redis.port).await;
    let name = common::unique("handover");
    let status = format!("cw-{name}:");
    let cfg = serve_env(&name, &status).mongo(&mongo.uri()).redis(&proxy.redis_url()).long_ttls().config();
    common::generate(&cfg, 300, 41).await;
    // A job every 6 s that writes no video detail, so the held write is
    // the watcher's; a daily rebuild covers the other families' TTLs. The
    // schedules run on a clock the test moves: the job fires once the
    // write is held, not before.
    let schedules = "[[schedule]]\nname = \"tags\"\ncron = \"*/6 * * * * *\"\njob = \"refresh\"\nfamilies = [\"tag\"]\n\
        [[schedule]]\nname = \"daily\"\ncron = \"0 0 3 * * *\"\njob = \"rebuild\"\n";
    let start = chrono::DateTime::parse_from_rfc3339("2026-06-01T00:00:00Z").unwrap().to_utc();
    let clock = std::sync::Arc::new(cachewright::serve::clock::ManualClock::new(start));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = {
        let cfg = cfg.clone();
        let opts =
            ServeOptions { grace: Duration::from_secs(1), clock: clock.clone(), ..common::serve_options(schedules) };
        tokio::spawn(async move {
            cachewright::serve::run(&cfg, opts, listener, async {
                let _ = stopped.await;
            })
            .await
        })
    };
    let ready = common::wait_for("the watcher to stream", Duration::from_secs(60), || async {
        get(addr, "/health/ready").await.0 == 200
    });
    let mut server = server;
    tokio::select! {
        stopped = &mut server => panic!("serve stopped before it was ready: {stopped:?}"),
        () = ready => {}
    }
    let epoch_key = cachewright::keys::status::StatusKeys::new(status.clone()).epoch();
    let epoch_of = || async {
        let mut conn = common::redis_conn(&redis.url()).await;
        let epoch: Option<u64> = redis::cmd("GET").arg(&epoch_key).query_async(&mut conn).await.unwrap();
        epoch.unwrap_or(0)
    };
    let epoch = epoch_of().await;

    let title = format!("held-title-{name}");
    proxy.hold_on(title.as_bytes());
    let source = cachewright::source::Source::connect(&cfg.mongo()).await.unwrap();
    let videos = source.database().collection::<mongodb::bson::Document>("VideoMedia");
    videos.update_one(mongodb::bson::doc! {}, mongodb::bson::doc! {"$set": {"title": &title}}).await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), proxy.wait_held()).await.expect("the watcher's write is held");
    clock.set(start + chrono::Duration::seconds(6));

    common::wait_for("serve to stop the watcher and raise its epoch", Duration::from_secs(30), || async {
        epoch_of().await > epoch
    })
    .await;
    let completed = |body: &str| {
        body.lines()
            .find(|l| l.starts_with("cachewright_job_runs_total{trigger=\"cron\",outcome=\"completed\"}"))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let before = completed(&get(addr, "/metrics").await.1);
    common::wait_for("the job after the abort to complete", Duration::from_secs(30), || async {
        completed(&get(addr, "/metrics").await.1) > before
    })
    .await;

    proxy.release_held();
    // The held frame ends with `WATCH epoch` and `GET epoch`: its last
    // reply is the epoch, a bulk string of digits.
    common::wait_for("Redis to answer the held transaction", Duration::from_secs(10), || async {
        let replies = String::from_utf8_lossy(&proxy.held_replies()).to_string();
        let lines: Vec<&str> = replies.trim_end_matches("\r\n").rsplit("\r\n").take(2).collect();
        replies.ends_with("\r\n")
            && matches!(lines.as_slice(), [digits, len] if len.starts_with('$') && digits.bytes().all(|b| b.is_ascii_digit()))
    })
    .await;
    let replies = String::from_utf8_lossy(&proxy.held_replies()).to_string();
    assert!(replies.contains("*-1\r\n"), "the stalled watcher's transaction ran after the job started: {replies:?}");

    common::wait_for("the restarted watcher to catch up", Duration::from_secs(60), || async {
        let direct = Config { redis_url: redis.url(), ..cfg.clone() };
        common::render_dump(&common::dump(&redis.url(), &cfg.prefix).await, &cfg.prefix)
            == common::expected_render(&direct).await
    })
    .await;
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(60), server).await.expect("serve stops").unwrap().expect("clean stop");
}

/// The counters `/metrics` gives for one drift family, by key family.
async fn drift_counts(addr: std::net::SocketAddr, metric: &str) -> BTreeMap<String, u64> {
    let (_, text) = get(addr, "/metrics").await;
    let head = format!("cachewright_drift_{metric}_total{{family=\"");
    text.lines()
        .filter_map(|l| l.strip_prefix(&head))
        .filter_map(|l| l.split_once("\"} "))
        .map(|(family, n)| (family.to_string(), n.parse().unwrap()))
        .collect()
}

/// The leader's drift check: keys changed behind cachewright's back (a
/// detail overwritten, a member removed from an index, one added to a
/// video's categories, a catalogue key deleted, another's TTL removed,
/// a key written for a category that does not exist)
/// are each reported once by family in `/metrics` and rewritten, and the
/// cache equals a fresh rebuild; a stream of live changes (titles and
/// category moves, the detail payloads and indexes they touch) checked
/// meanwhile is never reported as drift.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn drifted_keys_are_reported_and_repaired_and_live_changes_are_not_drift() {
    let mongo = &common::shared().mongo;
    let redis = common::servers::Redis::start();
    let name = common::unique("servedrift");
    let mut cfg = serve_env(&name, "cw-drift:").mongo(&mongo.uri()).redis(&redis.url()).long_ttls().config();
    cfg.lease_seconds = 60;
    // A thousand keys a second: the fixture's few hundred keys are all
    // seen within a few rounds.
    cfg.drift_sample_per_minute = 60_000;
    common::load_fixtures(&cfg, &common::fixture_dir("edge-cases")).await;
    let daily = "[[schedule]]\nname = \"daily\"\ncron = \"0 0 3 * * *\"\njob = \"rebuild\"\n";
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, server) = serve_here(&cfg, daily, true, listener);
    let total = |m: BTreeMap<String, u64>| m.values().sum::<u64>();
    common::wait_for("the drift check to compare keys", Duration::from_secs(60), || async {
        total(drift_counts(addr, "checked").await) > 0
    })
    .await;

    // Live changes, each applied by the watcher while the check runs.
    let source = cachewright::source::Source::connect(&cfg.mongo()).await.unwrap();
    let videos = source.database().collection::<mongodb::bson::Document>("VideoMedia");
    let checked_before = total(drift_counts(addr, "checked").await);
    for round in 0..40 {
        let id = ["v1", "v3", "v8", "v13", "v15", "v16"][round % 6];
        let cats = if round % 2 == 0 { vec!["c2", "c3"] } else { vec!["c1"] };
        let set = mongodb::bson::doc! {"$set": {"title": format!("live {round}"), "categoryIds": cats}};
        videos.update_one(mongodb::bson::doc! {"_id": id}, set).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_converged(&redis.url(), &cfg).await;
    // A detail that differed during the changes is looked at again
    // `CONFIRM` later: wait past it, with more rounds checked.
    let settled = total(drift_counts(addr, "checked").await);
    common::wait_for("more rounds of the drift check", Duration::from_secs(60), || async {
        total(drift_counts(addr, "checked").await) > settled + 1_000
    })
    .await;
    assert!(settled > checked_before, "the check ran during the live changes");
    let found = drift_counts(addr, "found").await;
    assert_eq!(total(found.clone()), 0, "live changes are not drift: {found:?}");

    // Another writer changes keys behind cachewright's back.
    let p = &cfg.prefix;
    let mut conn = common::redis_conn(&redis.url()).await;
    let index = format!("{p}video:category:index:c1:videos");
    let member: Vec<String> = redis::cmd("ZRANGE").arg(&index).arg(0).arg(0).query_async(&mut conn).await.unwrap();
    assert_eq!(member.len(), 1, "c1 indexes videos");
    let _: () = redis::pipe()
        .cmd("SET")
        .arg(format!("{p}video:detail:v3"))
        .arg("{\"id\":\"v3\",\"title\":\"not from MongoDB\"}")
        .arg("EX")
        .arg(100_000)
        .cmd("ZREM")
        .arg(&index)
        .arg(&member[0])
        .cmd("SADD")
        .arg(format!("{p}video:categories:v8"))
        .arg("c7")
        .cmd("DEL")
        .arg(format!("{p}category:all"))
        .cmd("PERSIST")
        .arg(format!("{p}tag:all"))
        .cmd("SET")
        .arg(format!("{p}category:by-id:nosuch"))
        .arg("{}")
        .arg("EX")
        .arg(100_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    let drifted =
        ["video:detail", "video:category:index", "video:categories", "category:all", "tag:all", "category:by-id"];
    common::wait_for("every drifted key to be found", Duration::from_secs(60), || async {
        let found = drift_counts(addr, "found").await;
        drifted.iter().all(|f| found.get(*f).copied().unwrap_or(0) > 0)
    })
    .await;
    wait_converged(&redis.url(), &cfg).await;
    let found = drift_counts(addr, "found").await;
    for (family, n) in &found {
        let want = u64::from(drifted.contains(&family.as_str()));
        assert_eq!(*n, want, "{family}: each drifted key once, nothing else: {found:?}");
    }
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(60), server).await.expect("serve stops").unwrap().expect("clean stop");
}

/// Issue 22's readiness on a degraded cluster: `serve` leads and watches
/// a replica-less cluster with `cluster-require-full-coverage no`; one
/// master is stopped until the cluster flags it failed and an upload
/// whose detail lives there arrives. `/health/ready` then answers 503 and
/// names the slots; once the master runs again and the held-back key is
/// written, it answers 200 and the key is in Redis.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_names_the_slots_no_master_covers() {
    let base = common::unique("servedown");
    let (down, cfg) = common::degraded::start(|i, url| {
        let name = format!("{base}{i}");
        serve_env(&name, &format!("cw-{name}:")).redis(url).long_ttls().config()
    })
    .await;
    common::generate(&cfg, 300, 81).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let daily = "[[schedule]]\nname = \"daily\"\ncron = \"0 0 3 * * *\"\njob = \"rebuild\"\n";
    let (stop, server) = serve_here(&cfg, daily, true, listener);
    // Ready answers 200 while the watcher still starts: wait until it streams.
    common::wait_for("serve's watcher to stream", Duration::from_secs(60), || async {
        let (_, status) = get(addr, "/status").await;
        serde_json::from_str::<serde_json::Value>(&status).unwrap()["current"]["watcher"]["streaming"] == true
    })
    .await;
    let epoch = || async {
        let (_, metrics) = get(addr, "/metrics").await;
        metrics.lines().find(|l| l.starts_with("cachewright_leader_epoch ")).map(str::to_string)
    };
    let led_under = epoch().await.expect("the leader's epoch in /metrics");

    common::signal(down.pid(), "-STOP");
    down.wait_flagged_failed().await;
    // An upload whose detail lives on the stopped master.
    let id = (0..).map(|i| format!("down{i}")).find(|id| down.on_stopped(&format!("{}video:detail:{id}", cfg.prefix)));
    let id = id.unwrap();
    let source = cachewright::source::Source::connect(&cfg.mongo()).await.unwrap();
    let upload = mongodb::bson::doc! {"_id": &id, "title": "held back", "listStatus": 1};
    source.database().collection::<mongodb::bson::Document>(&cfg.collections.video).insert_one(upload).await.unwrap();
    // The first batch after the stall learns of it when a request to the
    // stalled master times out; then the upload's detail waits (with its
    // other keys that hash to the stopped master: one or two, by name).
    common::wait_for("readiness to name the uncovered slots and the upload", Duration::from_secs(60), || async {
        let (code, body) = get(addr, "/health/ready").await;
        let named = format!("{}: ", down.named());
        let waiting = body.split_once(&named).and_then(|(_, rest)| rest.split_once(" keys wait for them"));
        code == 503 && waiting.is_some_and(|(n, _)| n.parse::<usize>().is_ok_and(|n| n >= 1))
    })
    .await;

    common::signal(down.pid(), "-CONT");
    tokio::task::block_in_place(|| down.cluster.wait_ok());
    common::wait_for("readiness once the slots are covered again", Duration::from_secs(60), || async {
        get(addr, "/health/ready").await.0 == 200
    })
    .await;
    let mut conn = common::redis_conn(&cfg.redis_url).await;
    let detail: Option<String> =
        redis::cmd("GET").arg(format!("{}video:detail:{id}", cfg.prefix)).query_async(&mut conn).await.unwrap();
    assert!(detail.is_some_and(|d| d.contains("held back")), "the held-back detail was written");
    assert_eq!(epoch().await.as_ref(), Some(&led_under), "the leader kept its lease throughout");
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(60), server).await.expect("serve stops").unwrap().expect("clean stop");
}
