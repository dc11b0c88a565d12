//! cachewright as a least-privileged Redis user: the rule `cachewright
//! acl` prints is enough for rebuild, verify, watch and serve, and a
//! command missing a permission fails before its first write, naming what
//! to grant. Real servers.

mod common;

use cachewright::config::Config;
use common::servers::Redis;
use std::time::Duration;

const PASSWORD: &str = "acl-test-pw";

/// `--user cw …`: the documented rule for these prefixes, minus the items
/// in `without`.
fn user_args(prefix: &str, status_prefix: &str, without: &[&str]) -> Vec<String> {
    let rule = cachewright::sink::acl::rule("cw", PASSWORD, prefix, status_prefix);
    let items = rule.strip_prefix("ACL SETUSER cw ").expect("an ACL SETUSER line");
    let mut args = vec!["--user".to_string(), "cw".to_string()];
    args.extend(items.split(' ').filter(|i| !without.contains(i)).map(str::to_string));
    args
}

/// A Redis whose user `cw` has exactly the documented rule for these
/// prefixes, minus the items in `without`; the default user stays open for
/// the test's own inspection.
fn redis_with_user(prefix: &str, status_prefix: &str, without: &[&str]) -> Redis {
    Redis::start_with(user_args(prefix, status_prefix, without))
}

fn config_as_user(redis: &Redis, name: &str) -> Config {
    config_at_port(redis.port, name)
}

fn config_at_port(port: u16, name: &str) -> Config {
    common::TestEnv::named(name).redis(&format!("redis://cw:{PASSWORD}@127.0.0.1:{port}")).config()
}

fn cli(cfg: &Config, args: &[&str]) -> std::process::Output {
    common::cachewright(cfg)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("run cachewright")
}

async fn cache_equals_a_fresh_rebuild(redis: &Redis, cfg: &Config) -> bool {
    cache_at_port_equals_a_fresh_rebuild(redis.port, cfg).await
}

async fn cache_at_port_equals_a_fresh_rebuild(port: u16, cfg: &Config) -> bool {
    let admin = format!("redis://127.0.0.1:{port}");
    common::render_dump(&common::dump(&admin, &cfg.prefix).await, &cfg.prefix) == common::expected_render(cfg).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rebuild_verify_watch_and_serve_run_as_the_least_privileged_user() {
    let name = common::unique("acl");
    let redis = redis_with_user(&format!("{name}:"), &format!("cw-{name}:"), &[]);
    let cfg = config_as_user(&redis, &name);
    common::load_fixtures(&cfg, &common::fixture_dir("edge-cases")).await;

    let out = cli(&cfg, &["rebuild"]);
    assert_eq!(out.status.code(), Some(0), "rebuild: {}", String::from_utf8_lossy(&out.stderr));
    let out = cli(&cfg, &["verify"]);
    assert_eq!(out.status.code(), Some(0), "verify: {}", String::from_utf8_lossy(&out.stderr));
    assert!(cache_equals_a_fresh_rebuild(&redis, &cfg).await);

    // The watcher applies a change under the same user.
    let watcher = common::watcher::start_streaming(&cfg).await;
    let source = cachewright::source::Source::connect(&cfg.mongo()).await.unwrap();
    let tags = source.database().collection::<mongodb::bson::Document>("Tag");
    // An active tag of an active category: the watcher rewrites data
    // keys for it (a tag without `seq` and `categoryId` would be
    // rejected and write none).
    let tag = mongodb::bson::doc! {
        "_id": mongodb::bson::oid::ObjectId::new(), "name": "acl-tag", "seq": 1, "categoryId": "c1", "status": 1,
    };
    tags.insert_one(tag).await.unwrap();
    common::wait_for("the watcher to apply the new tag", Duration::from_secs(30), || async {
        cache_equals_a_fresh_rebuild(&redis, &cfg).await
    })
    .await;
    watcher.stop().await;

    // serve leads, streams and answers ready under the same user.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let daily = "[[schedule]]\nname = \"daily\"\ncron = \"0 0 3 * * *\"\njob = \"rebuild\"\n";
    let long = Config {
        ttl: cachewright::config::TierSeconds { count: 864_000, index: 864_000, detail: 864_000, catalog: 864_000 },
        ..cfg.clone()
    };
    let opts = common::serve_options(daily);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        cachewright::serve::run(&long, opts, listener, async {
            let _ = stopped.await;
        })
        .await
    });
    common::wait_for("serve to be ready as the ACL user", Duration::from_secs(30), || async {
        common::http_get(addr, "/health/ready").await.0 == 200
    })
    .await;
    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(60), server).await.expect("serve stops").unwrap().expect("clean stop");
    assert!(cache_equals_a_fresh_rebuild(&redis, &cfg).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_permission_stops_a_command_before_its_first_write() {
    let name = common::unique("aclmiss");
    let (prefix, status) = (format!("{name}:"), format!("cw-{name}:"));
    let admin_dump = |redis: &Redis| {
        let admin = format!("redis://127.0.0.1:{}", redis.port);
        let (prefix, status) = (prefix.clone(), status.clone());
        async move { (common::dump(&admin, &prefix).await.len(), common::dump(&admin, &status).await.len()) }
    };
    for (without, named) in [
        (vec!["+zadd"], "ZADD"),
        (vec!["+unlink"], "UNLINK"),
        (vec!["+evalsha", "+eval"], "EVAL"),
        (vec![&*format!("~cw-{name}:*")], "HSET"),
    ] {
        let redis = redis_with_user(&format!("{name}:"), &format!("cw-{name}:"), &without);
        let cfg = config_as_user(&redis, &name);
        common::load_fixtures(&cfg, &common::fixture_dir("edge-cases")).await;
        let out = cli(&cfg, &["rebuild"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{without:?}: {err}");
        assert!(err.contains("lacks permissions") && err.contains(named), "{without:?}: {err}");
        assert!(err.contains("cachewright acl") && !err.contains(PASSWORD), "{err}");
        assert_eq!(admin_dump(&redis).await, (0, 0), "{without:?}: nothing may be written");
        let watch = cachewright::watch::run(
            &cfg,
            &cachewright::watch::WatchOptions::default(),
            Default::default(),
            std::future::pending(),
        )
        .await
        .expect_err("watch refuses to start");
        assert!(watch.to_string().contains("lacks permissions"), "{watch}");
        assert_eq!(admin_dump(&redis).await, (0, 0), "{without:?}: the watcher wrote nothing");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_least_privileged_user_rebuilds_and_verifies_on_a_cluster() {
    let name = common::unique("aclcluster");
    let cluster =
        common::servers::RedisCluster::start_with(user_args(&format!("{name}:"), &format!("cw-{name}:"), &[]));
    let cfg = config_at_port(cluster.nodes[2].port, &name);
    common::load_fixtures(&cfg, &common::fixture_dir("edge-cases")).await;
    for command in ["rebuild", "verify", "memory"] {
        let out = cli(&cfg, &[command]);
        assert!(out.status.success(), "{command} as cw on a cluster: {}", String::from_utf8_lossy(&out.stderr));
    }
    assert!(cache_at_port_equals_a_fresh_rebuild(cluster.nodes[0].port, &cfg).await);
}

/// A dry run writes nothing, so the read permissions are enough for it;
/// the real run under the same user stops before its first write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dry_run_needs_only_the_read_permissions() {
    use cachewright::sink::{Access, acl::commands};
    let name = common::unique("acldry");
    let read = commands(Access::Read);
    let writes: Vec<String> =
        commands(Access::Write).into_iter().filter(|c| !read.contains(c)).map(|c| format!("+{c}")).collect();
    let without: Vec<&str> = writes.iter().map(String::as_str).collect();
    let redis = redis_with_user(&format!("{name}:"), &format!("cw-{name}:"), &without);
    let cfg = config_as_user(&redis, &name);
    common::load_fixtures(&cfg, &common::fixture_dir("edge-cases")).await;

    let out = cli(&cfg, &["rebuild", "--dry-run"]);
    assert_eq!(out.status.code(), Some(0), "dry run: {}", String::from_utf8_lossy(&out.stderr));
    let out = cli(&cfg, &["rebuild"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("lacks permissions") && err.contains("SET"), "{err}");
    let admin = format!("redis://127.0.0.1:{}", redis.port);
    assert!(common::dump(&admin, &cfg.prefix).await.is_empty(), "nothing may be written");
}

/// Under `maxmemory-policy allkeys-lru` Redis may evict the lease, the
/// epoch and the watcher's records, which carry no TTL: a writer refuses
/// to start, saying why and what to change, and writes nothing. The
/// override lets it through, and the rebuild is exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_eviction_policy_that_may_evict_any_key_is_refused_unless_allowed() {
    let name = common::unique("evict");
    let redis = Redis::start_with(["--maxmemory-policy", "allkeys-lru"].map(String::from).to_vec());
    let cfg = common::TestEnv::named(&name).redis(&redis.url()).config();
    common::load_fixtures(&cfg, &common::fixture_dir("edge-cases")).await;
    let run = |allow: Option<&str>| {
        let mut cmd = common::cachewright(&cfg);
        cmd.arg("rebuild").stderr(std::process::Stdio::piped());
        if let Some(allow) = allow {
            cmd.env("CACHEWRIGHT_ALLOW_EVICTION", allow);
        }
        cmd.output().expect("run cachewright")
    };

    for allow in [None, Some("false")] {
        let out = run(allow);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains("maxmemory-policy allkeys-lru") && err.contains("CACHEWRIGHT_ALLOW_EVICTION=true"),
            "{err}"
        );
        assert!(common::dump(&redis.url(), &cfg.prefix).await.is_empty(), "nothing may be written");
        assert!(common::dump(&redis.url(), &cfg.status_prefix).await.is_empty(), "no control record either");
    }
    // Reading is not refused: verify runs and reports the empty cache.
    let out = common::cachewright(&cfg)
        .arg("verify")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("run cachewright");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stdout.contains("missing") && !stderr.contains("maxmemory"), "{stdout}{stderr}");

    let out = run(Some("true"));
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(cache_equals_a_fresh_rebuild(&redis, &cfg).await);
}

/// `RESTORE` is optional: the documented rule does not grant it, and the
/// collections are then written with `UNLINK`, adds and `EXPIRE`; a user
/// granted it gets one `RESTORE` a collection. Either way the cache is
/// the one a fresh rebuild writes, and every key has its TTL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_is_used_when_granted_and_the_commands_otherwise() {
    let name = common::unique("acl-restore");
    let redis = redis_with_user(&format!("{name}:"), &format!("cw-{name}:"), &[]);
    let cfg = config_as_user(&redis, &name);
    common::load_fixtures(&cfg, &common::fixture_dir("edge-cases")).await;
    let admin_url = format!("redis://127.0.0.1:{}", redis.port);
    let mut admin = common::redis_conn(&admin_url).await;

    for granted in [false, true] {
        if granted {
            let _: () =
                redis::cmd("ACL").arg("SETUSER").arg("cw").arg("+restore").query_async(&mut admin).await.unwrap();
        }
        let _: () = redis::cmd("CONFIG").arg("RESETSTAT").query_async(&mut admin).await.unwrap();
        let out = cli(&cfg, &["rebuild"]);
        assert_eq!(out.status.code(), Some(0), "rebuild: {}", String::from_utf8_lossy(&out.stderr));
        let restores = common::command_calls(&admin_url, "restore").await;
        match granted {
            true => assert!(restores > 0, "a user granted RESTORE writes collections with it"),
            false => assert_eq!(restores, 0, "the documented rule does not grant RESTORE"),
        }
        assert!(cache_equals_a_fresh_rebuild(&redis, &cfg).await, "granted RESTORE: {granted}");
        let keys: Vec<String> = redis::cmd("KEYS").arg(format!("{name}:*")).query_async(&mut admin).await.unwrap();
        assert!(!keys.is_empty());
        for key in keys {
            let ttl: i64 = redis::cmd("TTL").arg(&key).query_async(&mut admin).await.unwrap();
            assert!(ttl > 0, "{key} has no TTL (granted RESTORE: {granted})");
        }
    }
}
