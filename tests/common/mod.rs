//! Shared test harness: real servers, per-test databases and prefixes,
//! fixture loading and Redis dumps.
#![allow(dead_code)]

pub mod degraded;
pub mod env;
pub mod ops;
pub mod proxy;
pub mod render;
pub mod servers;
pub mod watcher;

use cachewright::config::{Config, RawConfig};
pub use env::TestEnv;
use render::Content;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn fixture_dir(name: &str) -> PathBuf {
    root().join("fixtures").join(name)
}

/// Servers shared by the tests of one test binary; each test isolates
/// itself with its own database and key prefix.
pub struct Shared {
    pub redis: servers::Redis,
    pub mongo: servers::Mongo,
}

/// Logs to the test output when `TEST_LOG` is set (e.g. `TEST_LOG=debug`).
pub fn logs() {
    if let Ok(filter) = std::env::var("TEST_LOG") {
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
    }
}

pub fn shared() -> &'static Shared {
    logs();
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| Shared { redis: servers::Redis::start(), mongo: servers::Mongo::start() })
}

/// A three-master Redis Cluster and a MongoDB shared by the cluster
/// tests of one test binary.
pub struct SharedCluster {
    pub cluster: std::sync::Mutex<servers::RedisCluster>,
    pub url: String,
}

pub fn shared_cluster() -> &'static SharedCluster {
    logs();
    static CLUSTER: OnceLock<SharedCluster> = OnceLock::new();
    CLUSTER.get_or_init(|| {
        let cluster = servers::RedisCluster::start();
        SharedCluster { url: cluster.url(), cluster: std::sync::Mutex::new(cluster) }
    })
}

/// Where a shared-assertion test runs: one Redis, or the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setup {
    OneNode,
    Cluster,
}

impl Setup {
    /// The Redis URL of this setup's shared server.
    pub fn redis_url(self) -> String {
        match self {
            Setup::OneNode => shared().redis.url(),
            Setup::Cluster => shared_cluster().url.clone(),
        }
    }
}

/// `serve`'s options as the tests run it: `schedules` (a schedule file's
/// text), the watcher on with a 50 ms window, the default HTTP limits,
/// grace and clock. A test changes what it needs with `..`.
pub fn serve_options(schedules: &str) -> cachewright::serve::ServeOptions {
    cachewright::serve::ServeOptions {
        schedules: cachewright::serve::schedule::parse(schedules).expect("the test's schedules parse"),
        watch: true,
        window: std::time::Duration::from_millis(50),
        http: Default::default(),
        grace: cachewright::serve::SHUTDOWN_GRACE,
        clock: cachewright::serve::clock::system(),
    }
}

/// A unique name for this test's database and prefix.
pub fn unique(tag: &str) -> String {
    static N: AtomicUsize = AtomicUsize::new(0);
    format!("{tag}{}x{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// The golden tests' planner settings: default prefix, home limit 3.
pub fn golden_config() -> Config {
    Config::from_raw(RawConfig { home_limit: Some(3), ..RawConfig::default() }).expect("valid")
}

pub async fn load_fixtures(cfg: &Config, dir: &Path) {
    let c = &cfg.collections;
    let sets = cachewright::dev::fixtures::read_dir(dir, &[&c.channel, &c.category, &c.tag, &c.video])
        .expect("fixtures parse");
    let source = cachewright::source::Source::connect(&cfg.mongo()).await.expect("mongo reachable");
    cachewright::dev::fixtures::load(source.database(), &sets).await.expect("fixtures load");
}

/// The masters' `host:port` when `url` is a cluster node, else `None`.
pub async fn cluster_masters(url: &str) -> Option<Vec<String>> {
    let mut conn = plain_conn(url).await;
    let info: String = redis::cmd("INFO").arg("cluster").query_async(&mut conn).await.expect("info");
    if !info.contains("cluster_enabled:1") {
        return None;
    }
    let reply: redis::Value = redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut conn).await.expect("cluster slots");
    let layout = cachewright::sink::cluster::parse_slots(&reply).expect("a CLUSTER SLOTS reply");
    let masters = layout.masters;
    Some(masters)
}

/// The URL of every master when `url` is a cluster node, else `url`.
pub async fn node_urls(url: &str) -> Vec<String> {
    match cluster_masters(url).await {
        Some(masters) => masters.into_iter().map(|m| format!("redis://{m}")).collect(),
        None => vec![url.to_string()],
    }
}

/// A connection to one Redis or, when `url` is a cluster node, to the
/// whole cluster (commands routed by key).
pub async fn redis_conn(url: &str) -> cachewright::sink::RedisConn {
    if cluster_masters(url).await.is_some() {
        return cachewright::sink::RedisConn::cluster(url).await.expect("cluster reachable");
    }
    let client = redis::Client::open(url).expect("url");
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(PROBE_CONNECT))
        .set_response_timeout(Some(PROBE_REPLY));
    let manager =
        redis::aio::ConnectionManager::new_with_config(client.clone(), config).await.expect("redis reachable");
    cachewright::sink::RedisConn::single(manager, client)
}

/// The test's own connections wait longer than the driver's defaults (1 s
/// to connect, 500 ms a reply): those suit a service, but a probe on a
/// loaded 2-core CI machine, beside servers and parallel tests, must
/// wait for its answer rather than fail on the machine's luck.
const PROBE_CONNECT: std::time::Duration = std::time::Duration::from_secs(10);
const PROBE_REPLY: std::time::Duration = std::time::Duration::from_secs(30);

/// A plain connection to one node, for the test's own reads.
pub async fn plain_conn(url: &str) -> redis::aio::MultiplexedConnection {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(PROBE_CONNECT))
        .set_response_timeout(Some(PROBE_REPLY));
    let client = redis::Client::open(url).expect("url");
    client.get_multiplexed_async_connection_with_config(&config).await.expect("redis reachable")
}

/// Every key under `prefix`, with contents and TTL (seconds, -1 = none),
/// read from every master of a cluster.
pub async fn dump(url: &str, prefix: &str) -> BTreeMap<String, (Content, i64)> {
    let nodes = node_urls(url).await;
    let mut out = BTreeMap::new();
    for node in nodes {
        out.append(&mut dump_node(&node, prefix).await);
    }
    out
}

async fn dump_node(url: &str, prefix: &str) -> BTreeMap<String, (Content, i64)> {
    let mut conn = plain_conn(url).await;
    let mut keys: Vec<String> = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut conn)
            .await
            .expect("scan");
        // Keys that are not UTF-8 belong to no family; they are left out.
        keys.extend(batch.into_iter().filter_map(|k| String::from_utf8(k).ok()));
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    let mut out = BTreeMap::new();
    for key in keys {
        let kind: String = redis::cmd("TYPE").arg(&key).query_async(&mut conn).await.expect("type");
        let content = match kind.as_str() {
            "string" => Content::String(redis::cmd("GET").arg(&key).query_async(&mut conn).await.expect("get")),
            "set" => Content::Set(render::sorted(
                redis::cmd("SMEMBERS").arg(&key).query_async(&mut conn).await.expect("smembers"),
            )),
            "list" => Content::List(
                redis::cmd("LRANGE").arg(&key).arg(0).arg(-1).query_async(&mut conn).await.expect("lrange"),
            ),
            "zset" => {
                let members: Vec<(String, f64)> = redis::cmd("ZRANGE")
                    .arg(&key)
                    .arg(0)
                    .arg(-1)
                    .arg("WITHSCORES")
                    .query_async(&mut conn)
                    .await
                    .expect("zrange");
                Content::zset(members.into_iter().map(|(m, s)| (s, m)).collect())
            }
            other => panic!("unexpected type {other} for {key}"),
        };
        let ttl: i64 = redis::cmd("TTL").arg(&key).query_async(&mut conn).await.expect("ttl");
        out.insert(key, (content, ttl));
    }
    out
}

/// The dump rendered like a golden file, with `prefix` replaced by `app:`.
pub fn render_dump(dump: &BTreeMap<String, (Content, i64)>, prefix: &str) -> String {
    render::render(
        dump.iter().map(|(k, (c, _))| (format!("app:{}", k.strip_prefix(prefix).unwrap_or(k)), c.clone())).collect(),
    )
}

/// What the in-memory planner makes of MongoDB's current state: every
/// key a fresh full rebuild writes.
pub async fn planned_ops(cfg: &Config) -> Vec<cachewright::plan::Op> {
    use cachewright::plan::plan_in_memory;
    use cachewright::rebuild::plan_ctx;
    let source = cachewright::source::Source::connect(&cfg.mongo()).await.expect("mongo reachable");
    // The judge reads in natural order, however many cursors the run used.
    let natural = cachewright::config::MongoSettings { read_cursors: 1, ..cfg.mongo() };
    let raw = source.read_four(&natural).await.expect("read the collections");
    let ctx = plan_ctx(cfg, cachewright::plan::FamilySet::all());
    plan_in_memory(&ctx, &cfg.collections, &raw[0], &raw[1], &raw[2], &raw[3]).ops
}

/// What a fresh full rebuild of MongoDB's current state writes, rendered
/// like [`render_dump`].
pub async fn expected_render(cfg: &Config) -> String {
    render::render_ops(&planned_ops(cfg).await).replace(&cfg.prefix, "app:")
}

/// Panics with a diff unless the cache under `cfg`'s prefix at `url`
/// (every master of a cluster) equals a fresh full rebuild.
pub async fn assert_exact_at(url: &str, cfg: &Config) {
    let actual = render_dump(&dump(url, &cfg.prefix).await, &cfg.prefix);
    let expected = expected_render(cfg).await;
    if actual != expected {
        let diff = similar::TextDiff::from_lines(&expected, &actual);
        panic!(
            "the cache differs from a fresh rebuild (- rebuild, + cache):\n{}",
            diff.unified_diff().context_radius(1)
        );
    }
}

/// A database and prefix of this test's own, loaded with the edge-case
/// fixtures and rebuilt once into Redis.
pub async fn edge_case_cache(tag: &str) -> Config {
    let cfg = TestEnv::new(tag).config();
    load_fixtures(&cfg, &fixture_dir("edge-cases")).await;
    cachewright::rebuild::rebuild(
        &cfg,
        &cachewright::rebuild::RebuildOptions::full(),
        &cachewright::progress::Progress::hidden(),
    )
    .await
    .expect("first rebuild");
    cfg
}

/// Waits until `check` holds, polling every 20 ms; panics with `what`
/// after `timeout`.
pub async fn wait_for<F, Fut>(what: &str, timeout: std::time::Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    wait_for_some(what, timeout, || {
        let holds = check();
        async move { holds.await.then_some(()) }
    })
    .await
}

/// Waits until `check` gives a value and returns it, polling every
/// 20 ms; panics with `what` after `timeout`.
pub async fn wait_for_some<T, F, Fut>(what: &str, timeout: std::time::Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    wait_for_every(what, timeout, std::time::Duration::from_millis(20), check).await
}

/// [`wait_for_some`] polling every `every`: for a moment that passes
/// quickly (a run to catch in its middle).
pub async fn wait_for_every<T, F, Fut>(
    what: &str,
    timeout: std::time::Duration,
    every: std::time::Duration,
    mut check: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    // `Duration::MAX`: no deadline (the caller bounds the wait itself).
    let deadline = std::time::Instant::now().checked_add(timeout);
    loop {
        if let Some(value) = check().await {
            return value;
        }
        let late = deadline.is_some_and(|d| std::time::Instant::now() >= d);
        assert!(!late, "timed out after {timeout:?} waiting for {what}");
        tokio::time::sleep(every).await;
    }
}

/// A full rebuild, started again while another writer still holds the
/// lease (for up to a minute): a take-over after the holder stalled.
pub async fn rebuild_once_the_lease_is_free(
    cfg: &Config,
) -> Result<cachewright::rebuild::RunSummary, cachewright::rebuild::RunError> {
    use cachewright::rebuild::{RebuildOptions, RunError, rebuild};
    wait_for_some("the lease to be free for a second rebuild", std::time::Duration::from_secs(60), || async {
        match rebuild(cfg, &RebuildOptions::full(), &cachewright::progress::Progress::hidden()).await {
            Err(RunError::Lease(_)) => None,
            other => Some(other),
        }
    })
    .await
}

/// Waits until `child` exits and gives its exit code (`None` when a
/// signal ended it); panics with `what` after `timeout`.
pub async fn wait_exit(child: &mut std::process::Child, what: &str, timeout: std::time::Duration) -> Option<i32> {
    wait_for_some(what, timeout, || {
        let exited = child.try_wait().expect("the child can be waited on");
        async move { exited.map(|status| status.code()) }
    })
    .await
}

/// One HTTP GET: the status code and the body.
pub async fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stream, format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut text = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut stream, &mut text).await.unwrap();
    let status = text.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

/// The `cachewright` binary set up for `cfg`: its servers, database,
/// prefixes, home limit, lease and TTLs in the environment, and no config
/// file or log filter from the caller's environment. Output is discarded
/// unless the caller asks for it.
pub fn cachewright(cfg: &Config) -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_cachewright"));
    cmd.env_remove("CACHEWRIGHT_CONFIG")
        .env_remove("RUST_LOG")
        .env("MONGODB_URI", &cfg.mongodb_uri)
        .env("MONGODB_DB", &cfg.mongodb_db)
        .env("REDIS_URL", &cfg.redis_url)
        .env("CACHEWRIGHT_PREFIX", &cfg.prefix)
        .env("CACHEWRIGHT_STATUS_PREFIX", &cfg.status_prefix)
        .env("CACHEWRIGHT_LEASE_SECONDS", cfg.lease_seconds.to_string())
        .env("CACHEWRIGHT_TTL_COUNT", cfg.ttl.count.to_string())
        .env("CACHEWRIGHT_TTL_INDEX", cfg.ttl.index.to_string())
        .env("CACHEWRIGHT_TTL_DETAIL", cfg.ttl.detail.to_string())
        .env("CACHEWRIGHT_TTL_CATALOG", cfg.ttl.catalog.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    if let Some(limit) = cfg.home_limit {
        cmd.env("CACHEWRIGHT_HOME_LIMIT", limit.to_string());
    }
    cmd
}

/// Generates a catalogue of `videos` videos (10 channels, 100
/// categories, 400 tags) into `cfg`'s database.
pub async fn generate(cfg: &Config, videos: usize, seed: u64) {
    let source = cachewright::source::Source::connect(&cfg.mongo()).await.expect("mongo reachable");
    let shape = cachewright::dev::generate::Shape { channels: 10, categories: 100, tags: 400, videos };
    cachewright::dev::generate::generate(source.database(), &cfg.collections, shape, seed, |_| {})
        .await
        .expect("generate");
}

/// Sends `sig` (such as `-STOP`) to process `pid`.
pub fn signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill").args([sig, &pid.to_string()]).status().expect("kill runs");
    assert!(status.success(), "kill {sig} {pid} failed");
}

/// How many times the servers behind `url` ran `command` (every master of
/// a cluster), from `INFO commandstats`.
pub async fn command_calls(url: &str, command: &str) -> u64 {
    let nodes = node_urls(url).await;
    let mut calls = 0;
    for node in nodes {
        let mut conn = redis_conn(&node).await;
        let info: String = redis::cmd("INFO").arg("commandstats").query_async(&mut conn).await.expect("info");
        let line = info.lines().find(|l| l.starts_with(&format!("cmdstat_{command}:")));
        calls += line
            .and_then(|l| l.split([':', ',']).find_map(|f| f.strip_prefix("calls=")))
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0);
    }
    calls
}

/// How many keys match `pattern`, over every master of a cluster.
pub async fn count_keys(url: &str, pattern: &str) -> usize {
    let nodes = node_urls(url).await;
    let mut count = 0;
    for node in nodes {
        let mut conn = plain_conn(&node).await;
        let mut cursor: u64 = 0;
        loop {
            let (next, batch): (u64, Vec<Vec<u8>>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(5000)
                .query_async(&mut conn)
                .await
                .expect("scan");
            count += batch.len();
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    count
}

/// Starts moving `slots` slots from master `from` to master `to`, and
/// returns once the first slot is on its way.
/// Blocks its thread: call it from a multi-threaded runtime (it steps
/// off the worker with `block_in_place`).
pub fn start_resharding(from: usize, to: usize, slots: usize) -> std::process::Child {
    tokio::task::block_in_place(|| start_resharding_blocking(from, to, slots))
}

fn start_resharding_blocking(from: usize, to: usize, slots: usize) -> std::process::Child {
    let mut child = shared_cluster().cluster.lock().unwrap().reshard(from, to, slots);
    let stdout = child.stdout.take().expect("reshard stdout");
    let (moving_tx, moving_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut told = false;
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout)).map_while(Result::ok) {
            if !told && line.starts_with("Moving slot") {
                let _ = moving_tx.send(());
                told = true;
            }
        }
    });
    moving_rx.recv_timeout(std::time::Duration::from_secs(60)).expect("redis-cli started moving slots");
    child
}

pub fn finish_resharding(mut child: std::process::Child) {
    let status = tokio::task::block_in_place(|| child.wait()).expect("reshard ends");
    assert!(status.success(), "redis-cli --cluster reshard failed");
    tokio::task::block_in_place(|| shared_cluster().cluster.lock().unwrap().wait_ok());
}
