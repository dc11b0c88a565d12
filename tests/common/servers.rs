//! Real servers for integration tests: redis-server and secantusd-rs,
//! started on free loopback ports. A server that cannot start fails the
//! test with a message saying how to install it; nothing is skipped.

use std::io::{BufRead, BufReader};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("no free loopback port")
}

/// Waits until `child` listens on `port`; false if it exited first or
/// never listened within 30 s (it is then killed). A port found free a
/// moment ago may have been taken since (by a server another test
/// started, or as the source port of an outgoing connection), and a
/// server that cannot bind exits at once.
pub fn came_up(child: &mut Child, port: u16) -> bool {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        // Something listens: it is the child unless the child exited
        // (the listener then holds the port it could not bind).
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return !matches!(child.try_wait(), Ok(Some(_)));
        }
        if let Ok(Some(_)) = child.try_wait() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    false
}

/// How many times a server is started before a test gives up on it.
const ATTEMPTS: usize = 5;

fn log_tail(path: &std::path::Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(10)..].join("\n")
}

/// Kills `pid` when this test process goes away, even on a panic or
/// SIGKILL, so no server outlives its tests.
fn watchdog(pid: u32) {
    let me = std::process::id();
    let _ = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "while kill -0 {me} 2>/dev/null && kill -0 {pid} 2>/dev/null; do sleep 0.5; done; kill -9 {pid} 2>/dev/null"
        ))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
}

fn binary(name: &str, env_var: &str, install: &str) -> PathBuf {
    if let Some(path) = std::env::var_os(env_var) {
        return PathBuf::from(path);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let home_cargo = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo/bin"));
    for dir in std::env::split_paths(&path).chain(home_cargo) {
        let candidate = dir.join(name);
        if candidate.is_file() {
            return candidate;
        }
    }
    panic!("{name} is not installed: {install} (or run scripts/test.sh, which installs it)");
}

pub struct Redis {
    pub port: u16,
    child: Option<Child>,
    /// Arguments beyond ports and persistence (ACL users, cluster mode).
    extra: Vec<String>,
    /// Speaks TLS only on `port`, with these files.
    tls: Option<TlsFiles>,
    /// A cluster node's bus port, kept across restarts (the other nodes
    /// know it): it would default to port + 10000, which may be taken or
    /// past 65535.
    bus_port: Option<u16>,
    /// Its own working directory: a replica (or a master serving one)
    /// writes an RDB file there, which a server started later in a
    /// shared directory would load (stale keys, and `LOADING` at start).
    /// Its log goes there too.
    dir: tempfile::TempDir,
}

/// A TLS server's certificate and key, and the CA it trusts for client
/// certificates (which it then requires).
#[derive(Clone)]
struct TlsFiles {
    cert: PathBuf,
    key: PathBuf,
    ca: PathBuf,
}

impl Redis {
    pub fn start() -> Redis {
        Redis::start_with(Vec::new())
    }

    /// A Redis with extra arguments, such as `--user` rules.
    pub fn start_with(extra: Vec<String>) -> Redis {
        Redis::start_as(extra, None, false)
    }

    /// A Redis that speaks TLS only, on its port, with the given
    /// server certificate, key and the CA it trusts for client
    /// certificates (which it then requires).
    pub fn start_tls(cert: &std::path::Path, key: &std::path::Path, ca: &std::path::Path) -> Redis {
        let files = TlsFiles { cert: cert.to_path_buf(), key: key.to_path_buf(), ca: ca.to_path_buf() };
        Redis::start_as(Vec::new(), Some(files), false)
    }

    fn start_as(extra: Vec<String>, tls: Option<TlsFiles>, cluster: bool) -> Redis {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut redis = Redis { port: 0, child: None, extra, tls, bus_port: cluster.then_some(0), dir };
        redis.launch(true);
        redis
    }

    /// Starts the server; with `new_ports`, on ports chosen afresh for
    /// each attempt, else on the ones it had.
    fn launch(&mut self, new_ports: bool) {
        let bin = binary("redis-server", "REDIS_SERVER_BIN", "apt-get install -y redis-server");
        let log = self.dir.path().join("redis.log");
        for _ in 0..ATTEMPTS {
            if new_ports {
                self.port = free_port();
                if let Some(bus) = &mut self.bus_port {
                    *bus = loop {
                        let candidate = free_port();
                        if candidate != self.port {
                            break candidate;
                        }
                    };
                }
            }
            let port = self.port.to_string();
            let plain = if self.tls.is_some() { "0" } else { port.as_str() };
            let mut command = Command::new(&bin);
            command
                .args(["--port", plain, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(self.dir.path())
                .arg("--logfile")
                .arg(&log);
            if let Some(tls) = &self.tls {
                command
                    .args(["--tls-port", &port, "--tls-auth-clients", "yes", "--tls-cert-file"])
                    .arg(&tls.cert)
                    .arg("--tls-key-file")
                    .arg(&tls.key)
                    .arg("--tls-ca-cert-file")
                    .arg(&tls.ca);
            }
            if let Some(bus) = self.bus_port {
                command.args(["--cluster-port", &bus.to_string()]);
            }
            let mut child = command
                .args(&self.extra)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("redis-server failed to start");
            watchdog(child.id());
            if came_up(&mut child, self.port) {
                self.child = Some(child);
                return;
            }
            // On its old port (a restart), give the old socket a moment.
            std::thread::sleep(Duration::from_millis(200));
        }
        panic!(
            "redis-server did not listen on 127.0.0.1:{} after {ATTEMPTS} attempts; its log ends:\n{}",
            self.port,
            log_tail(&log)
        );
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).expect("redis-server runs")
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "rediss" } else { "redis" };
        format!("{scheme}://127.0.0.1:{}", self.port)
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    pub fn restart(&mut self) {
        self.stop();
        self.launch(false);
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `redis-cli MONITOR` on a (non-TLS) Redis: every command the server
/// runs, in order, with the client that sent it.
pub struct Monitor {
    child: Child,
    lines: std::thread::JoinHandle<Vec<String>>,
}

impl Monitor {
    /// Starts monitoring and returns once the server confirmed it.
    pub fn start(redis: &Redis) -> Monitor {
        let bin = binary("redis-cli", "REDIS_CLI_BIN", "apt-get install -y redis-tools");
        let mut child = Command::new(bin)
            .args(["-p", &redis.port.to_string(), "MONITOR"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-cli MONITOR runs");
        watchdog(child.id());
        let mut out = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut first = String::new();
        out.read_line(&mut first).expect("redis-cli MONITOR answers");
        assert_eq!(first.trim(), "OK", "MONITOR refused: {first}");
        let lines = std::thread::spawn(move || out.lines().map_while(Result::ok).collect());
        Monitor { child, lines }
    }

    /// Stops monitoring and returns the lines seen, one per command.
    pub fn stop(mut self) -> Vec<String> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.lines.join().expect("the MONITOR reader ends with its pipe")
    }
}

pub struct Mongo {
    pub port: u16,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Mongo {
    pub fn start() -> Mongo {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut mongo = Mongo { port: 0, dir, child: None };
        mongo.launch();
        mongo
    }

    fn launch(&mut self) {
        let bin = binary(
            "secantusd-rs",
            "SECANTUSD_BIN",
            "cargo install secantus-mdb --version 0.5.3-beta.196 --ignore-rust-version --locked",
        );
        let mut child = Command::new(bin)
            .args(["--port", &self.port.to_string(), "--storage-path"])
            .arg(self.dir.path().join("data"))
            // The default oplog cap (100,000 entries) would prune history a
            // resuming watcher still needs; SecantusDB then resumes silently
            // past the gap instead of reporting ChangeStreamHistoryLost.
            .args([
                "--cache-size",
                "256M",
                "--log-file-max",
                "8MB",
                "--log-level",
                "WARNING",
                "--oplog-max-entries",
                "20000000",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("secantusd-rs failed to start");
        watchdog(child.id());
        if self.port == 0 {
            let stdout = child.stdout.take().expect("stdout");
            let mut line = String::new();
            BufReader::new(stdout).read_line(&mut line).expect("read secantusd-rs banner");
            self.port = line
                .trim()
                .rsplit(':')
                .next()
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("secantusd-rs did not say its port: {line:?}"));
        }
        assert!(came_up(&mut child, self.port), "secantusd-rs did not listen on 127.0.0.1:{} within 30s", self.port);
        self.child = Some(child);
    }

    pub fn uri(&self) -> String {
        format!("mongodb://127.0.0.1:{}/?directConnection=true", self.port)
    }

    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops gracefully (SIGTERM, as an orchestrator does) and starts
    /// again on the same port and storage.
    pub fn restart(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        self.launch();
    }
}

impl Drop for Mongo {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A real Redis Cluster of three masters (no replicas) on free loopback
/// ports, built with `redis-cli --cluster create`. Each node keeps its
/// `nodes.conf` in a directory of its own, so a restarted node rejoins
/// with its identity and slots (and, keeping no data, empty).
pub struct RedisCluster {
    pub nodes: Vec<Redis>,
    /// What `redis-cli` needs to reach the nodes (TLS files).
    cli_args: Vec<String>,
}

/// The files of a TLS cluster: each node's certificate and key, the CA
/// it trusts, and a client certificate and key for `redis-cli`.
pub struct ClusterTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

fn redis_cli(cli_args: &[String], args: &[String]) -> std::process::Output {
    let bin = binary("redis-cli", "REDIS_CLI_BIN", "apt-get install -y redis-tools");
    Command::new(bin).args(cli_args).args(args).stdin(Stdio::null()).output().expect("redis-cli runs")
}

impl RedisCluster {
    pub fn start() -> RedisCluster {
        RedisCluster::start_with(Vec::new())
    }

    /// A cluster whose every node gets `extra` arguments too (such as a
    /// `--user` rule).
    pub fn start_with(extra: Vec<String>) -> RedisCluster {
        RedisCluster::launch(extra, None, 0)
    }

    /// A cluster that speaks TLS only, clients and cluster bus alike.
    pub fn start_tls(tls: &ClusterTls) -> RedisCluster {
        RedisCluster::launch(vec!["--tls-cluster".into(), "yes".into()], Some(tls), 0)
    }

    /// Three masters with a replica each (six nodes), for fail-overs.
    pub fn start_with_replicas() -> RedisCluster {
        RedisCluster::launch(Vec::new(), None, 1)
    }

    fn launch(extra: Vec<String>, tls: Option<&ClusterTls>, replicas: usize) -> RedisCluster {
        let mut args: Vec<String> = vec![
            "--cluster-enabled".into(),
            "yes".into(),
            // In the node's own directory, so a restarted node rejoins.
            "--cluster-config-file".into(),
            "nodes.conf".into(),
            "--cluster-node-timeout".into(),
            "2000".into(),
        ];
        args.extend(extra);
        let files = tls.map(|tls| TlsFiles { cert: tls.cert.clone(), key: tls.key.clone(), ca: tls.ca.clone() });
        let nodes: Vec<Redis> =
            (0..3 * (1 + replicas)).map(|_| Redis::start_as(args.clone(), files.clone(), true)).collect();
        let path = |p: &PathBuf| p.display().to_string();
        let cli_args = match tls {
            None => Vec::new(),
            Some(tls) => vec![
                "--tls".into(),
                "--cacert".into(),
                path(&tls.ca),
                "--cert".into(),
                path(&tls.client_cert),
                "--key".into(),
                path(&tls.client_key),
            ],
        };
        let mut args = vec!["--cluster".to_string(), "create".to_string()];
        args.extend(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)));
        args.extend(["--cluster-replicas".into(), replicas.to_string(), "--cluster-yes".into()]);
        let out = redis_cli(&cli_args, &args);
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let cluster = RedisCluster { nodes, cli_args };
        cluster.wait_ok();
        cluster
    }

    /// Runs `redis-cli` against this cluster's nodes.
    pub fn cli(&self, args: &[String]) -> std::process::Output {
        redis_cli(&self.cli_args, args)
    }

    /// `INFO replication` of the node on `port`.
    pub fn replication(&self, port: u16) -> String {
        let out = self.cli(&["-p".into(), port.to_string(), "INFO".into(), "replication".into()]);
        String::from_utf8_lossy(&out.stdout).replace('\r', "")
    }

    /// Cuts the replica on `replica` off its master on `master` for good
    /// (see [`cut_off_replica`]).
    pub fn detach_replica(&self, replica: u16, master: u16) {
        let cli = |port: u16, args: &[&str]| {
            let mut all = vec!["-p".to_string(), port.to_string()];
            all.extend(args.iter().map(|a| a.to_string()));
            String::from_utf8_lossy(&self.cli(&all).stdout).replace('\r', "")
        };
        cut_off_replica(&cli, replica, master);
    }

    /// The names of the keys matching `pattern` on the node at `port`
    /// alone (a replica's too: `SCAN` names no key).
    pub fn keys_on(&self, port: u16, pattern: &str) -> std::collections::BTreeSet<String> {
        let out = self.cli(&["-p".into(), port.to_string(), "--scan".into(), "--pattern".into(), pattern.into()]);
        String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
    }

    /// Waits until at least `n` replicas have their link to their master
    /// up; gives each one's port and its master's port.
    pub fn synced_replicas(&self, n: usize) -> Vec<(u16, u16)> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let synced: Vec<(u16, u16)> = self
                .nodes
                .iter()
                .filter_map(|node| {
                    let info = self.replication(node.port);
                    let master = info.lines().find_map(|l| l.strip_prefix("master_port:"))?.parse().ok()?;
                    (info.contains("role:slave") && info.contains("master_link_status:up"))
                        .then_some((node.port, master))
                })
                .collect();
            if synced.len() >= n {
                return synced;
            }
            assert!(Instant::now() < deadline, "{n} replica(s) did not get in sync within 60 s: {synced:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Sends `CLUSTER FAILOVER` (with `mode`: `FORCE`, or none) to the
    /// replica on `port` and waits until it reports itself a master.
    pub fn promote(&self, port: u16, mode: Option<&str>) {
        let mut args: Vec<String> = vec!["-p".into(), port.to_string(), "CLUSTER".into(), "FAILOVER".into()];
        args.extend(mode.map(String::from));
        let out = self.cli(&args);
        assert!(String::from_utf8_lossy(&out.stdout).contains("OK"), "{out:?}");
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.replication(port).contains("role:master") {
            assert!(Instant::now() < deadline, "the replica on {port} did not take over within 60 s");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `redis://` URL of the first node: a seed, as users give it.
    pub fn url(&self) -> String {
        self.nodes[0].url()
    }

    pub fn node_id(&self, i: usize) -> String {
        let out = self.cli(&["-p".into(), self.nodes[i].port.to_string(), "CLUSTER".into(), "MYID".into()]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Waits until every node reports `cluster_state:ok` and all agree on
    /// the slot map.
    pub fn wait_ok(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let states: Vec<String> = self
                .nodes
                .iter()
                .map(|n| {
                    let info = self.cli(&["-p".into(), n.port.to_string(), "CLUSTER".into(), "INFO".into()]);
                    String::from_utf8_lossy(&info.stdout).to_string()
                })
                .collect();
            let ok = states.iter().all(|s| s.contains("cluster_state:ok") && s.contains("cluster_slots_ok:16384"));
            let out = self.cli(&["--cluster".into(), "check".into(), format!("127.0.0.1:{}", self.nodes[0].port)]);
            let agreed =
                String::from_utf8_lossy(&out.stdout).contains("[OK] All nodes agree about slots configuration");
            if ok && agreed {
                return;
            }
            assert!(Instant::now() < deadline, "the Redis Cluster did not become ok within 60 s: {states:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Starts `redis-cli --cluster reshard`, moving `slots` slots from
    /// node `from` to node `to`; the caller waits on the child.
    pub fn reshard(&self, from: usize, to: usize, slots: usize) -> Child {
        let bin = binary("redis-cli", "REDIS_CLI_BIN", "apt-get install -y redis-tools");
        Command::new(bin)
            .args(&self.cli_args)
            .args(["--cluster", "reshard", &format!("127.0.0.1:{}", self.nodes[0].port)])
            .args(["--cluster-from", &self.node_id(from), "--cluster-to", &self.node_id(to)])
            .args(["--cluster-slots", &slots.to_string(), "--cluster-yes"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("redis-cli --cluster reshard starts")
    }

    /// Restarts node `i` on its port; it comes back empty and rejoins.
    pub fn restart(&mut self, i: usize) {
        self.nodes[i].restart();
        self.wait_ok();
    }
}

/// Cuts the replica on `replica` off its master on `master` for good: its
/// link is closed and each attempt to open it again fails (it now
/// authenticates with a password the master does not have), so the
/// master goes on alone and nothing it takes from now on reaches the
/// replica. `cli` runs a command on a port and gives its output.
fn cut_off_replica(cli: &dyn Fn(u16, &[&str]) -> String, replica: u16, master: u16) {
    let set = cli(replica, &["CONFIG", "SET", "masterauth", "not-the-masters"]);
    assert!(set.contains("OK"), "CONFIG SET masterauth: {set}");
    cli(master, &["CLIENT", "KILL", "TYPE", "replica"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cli(master, &["INFO", "replication"]).contains("connected_slaves:0") {
        assert!(Instant::now() < deadline, "the replica was still connected after 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A master, one replica and three sentinels watching them under the
/// name `mymaster`, for fail-overs an operator causes.
pub struct SentinelSet {
    pub master: Redis,
    pub replica: Redis,
    pub sentinel_ports: Vec<u16>,
    sentinels: Vec<Child>,
    _dir: tempfile::TempDir,
}

impl SentinelSet {
    pub fn start() -> SentinelSet {
        SentinelSet::start_with(true)
    }

    /// The set without `min-replicas-to-write`: its master takes writes
    /// with no replica connected, the deployment an operator's lost
    /// writes come from.
    pub fn start_unguarded() -> SentinelSet {
        SentinelSet::start_with(false)
    }

    fn start_with(guarded: bool) -> SentinelSet {
        // As the deployment guide asks: a master that has lost its
        // replica (an old master after a fail-over, before the sentinels
        // demote it) refuses writes, which would otherwise be lost.
        let safe = || match guarded {
            true => ["--min-replicas-to-write", "1", "--min-replicas-max-lag", "10"].map(String::from).to_vec(),
            false => Vec::new(),
        };
        let master = Redis::start_with(safe());
        let mut replica_args = vec!["--replicaof".into(), "127.0.0.1".into(), master.port.to_string()];
        replica_args.extend(safe());
        let replica = Redis::start_with(replica_args);
        let dir = tempfile::tempdir().expect("temp dir");
        let bin = binary("redis-server", "REDIS_SERVER_BIN", "apt-get install -y redis-server");
        let mut sentinels = Vec::new();
        let mut sentinel_ports = Vec::new();
        for i in 0..3 {
            // Sentinel rewrites its configuration file: one each.
            let conf = dir.path().join(format!("sentinel{i}.conf"));
            let log = dir.path().join(format!("sentinel{i}.log"));
            let mut started = None;
            for _ in 0..ATTEMPTS {
                let port = free_port();
                std::fs::write(
                    &conf,
                    format!(
                        "port {port}\nbind 127.0.0.1\ndir {dir}\nlogfile {log}\n\
                         sentinel monitor mymaster 127.0.0.1 {master} 2\n\
                         sentinel down-after-milliseconds mymaster 2000\n\
                         sentinel failover-timeout mymaster 10000\n\
                         sentinel parallel-syncs mymaster 1\n",
                        dir = dir.path().display(),
                        log = log.display(),
                        master = master.port
                    ),
                )
                .expect("write sentinel.conf");
                let mut child = Command::new(&bin)
                    .arg(&conf)
                    .arg("--sentinel")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("redis-server --sentinel failed to start");
                watchdog(child.id());
                if came_up(&mut child, port) {
                    started = Some((child, port));
                    break;
                }
            }
            let (child, port) = started.unwrap_or_else(|| {
                panic!("redis sentinel did not listen after {ATTEMPTS} attempts; its log ends:\n{}", log_tail(&log))
            });
            sentinels.push(child);
            sentinel_ports.push(port);
        }
        let set = SentinelSet { master, replica, sentinel_ports, sentinels, _dir: dir };
        set.wait_ready();
        set
    }

    /// `REDIS_SENTINELS` for this set.
    pub fn sentinels(&self) -> Vec<String> {
        self.sentinel_ports.iter().map(|p| format!("127.0.0.1:{p}")).collect()
    }

    fn sentinel_cli(&self, port: u16, args: &[&str]) -> String {
        let bin = binary("redis-cli", "REDIS_CLI_BIN", "apt-get install -y redis-tools");
        let out = Command::new(bin).args(["-p", &port.to_string()]).args(args).output().expect("redis-cli runs");
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// Waits until the replica is in sync and every sentinel knows it and
    /// the other sentinels (a fail-over needs both).
    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = self.sentinel_ports.iter().all(|&p| {
                let replicas = self.sentinel_cli(p, &["SENTINEL", "replicas", "mymaster"]);
                let sentinels = self.sentinel_cli(p, &["SENTINEL", "sentinels", "mymaster"]);
                replicas.contains(&self.replica.port.to_string())
                    && sentinels.matches("127.0.0.1").count() >= 2
                    && !replicas.contains("s_down")
            });
            let synced =
                self.sentinel_cli(self.replica.port, &["INFO", "replication"]).contains("master_link_status:up");
            if ready && synced {
                return;
            }
            assert!(Instant::now() < deadline, "the sentinels did not become ready within 60 s");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The port of the node the sentinels name as master now.
    pub fn master_port(&self) -> u16 {
        let out = self.sentinel_cli(self.sentinel_ports[0], &["SENTINEL", "get-master-addr-by-name", "mymaster"]);
        out.lines().nth(1).and_then(|p| p.trim().parse().ok()).expect("a master address")
    }

    /// `SENTINEL FAILOVER`, then waits until the other node is master,
    /// says so itself, and the sentinels agree.
    pub fn fail_over(&self) -> u16 {
        let before = self.master_port();
        let out = self.sentinel_cli(self.sentinel_ports[0], &["SENTINEL", "FAILOVER", "mymaster"]);
        assert!(out.contains("OK"), "SENTINEL FAILOVER: {out}");
        self.wait_promoted(before)
    }

    /// Cuts the replica off its master for good (see [`cut_off_replica`]).
    pub fn detach_replica(&self) {
        cut_off_replica(&|port, args| self.sentinel_cli(port, args), self.replica.port, self.master.port);
    }

    /// Waits until the sentinels name another master than `before`, and
    /// that node says it is master.
    pub fn wait_promoted(&self, before: u16) -> u16 {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let now = self.master_port();
            if now != before && self.sentinel_cli(now, &["ROLE"]).starts_with("master") {
                return now;
            }
            assert!(Instant::now() < deadline, "the fail-over did not complete within 60 s");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for SentinelSet {
    fn drop(&mut self) {
        for child in &mut self.sentinels {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
