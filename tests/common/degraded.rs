//! A replica-less Redis Cluster with `cluster-require-full-coverage no`,
//! one of whose masters a test stops, so its slots have no master: the
//! cluster, which master to stop, and waiting until the cluster agrees it
//! failed.

use super::servers::RedisCluster;
use cachewright::config::Config;
use std::time::Duration;

/// The cluster and the master chosen to stop.
pub struct Degradable {
    pub cluster: RedisCluster,
    /// The stopped master's index in `cluster.nodes`.
    pub node: usize,
    /// Its slots (`start`, `end`) and address.
    pub slots: (u16, u16),
    pub addr: String,
}

/// The writer's control keys under `cfg`'s status prefix: the lease and
/// its epoch, the watcher's pending and deferred records, its resume
/// tokens and the heartbeat. Without them no writer can go on at all.
pub fn control_keys(cfg: &Config) -> Vec<String> {
    let k = super::env::status_keys(cfg);
    let c = &cfg.collections;
    let mut keys = vec![k.rebuild_lock(), k.epoch(), k.cdc_pending(), k.cdc_deferred(), k.health()];
    keys.extend([&c.channel, &c.category, &c.tag, &c.video].iter().map(|name| k.cdc_resume(name)));
    keys
}

/// Starts the cluster, and picks the first of `configs(0, url)`,
/// `configs(1, url)`, … (`url` the cluster's) whose control keys all live
/// off one master: that master is the one to stop. Gives the
/// configuration too.
pub async fn start(configs: impl Fn(usize, &str) -> Config) -> (Degradable, Config) {
    let cluster = tokio::task::block_in_place(|| {
        RedisCluster::start_with(vec!["--cluster-require-full-coverage".into(), "no".into()])
    });
    let mut plain = super::redis_conn(&cluster.url()).await;
    let reply: redis::Value = redis::cmd("CLUSTER").arg("SLOTS").query_async(&mut plain).await.unwrap();
    let ranges = cachewright::sink::cluster::slot_ranges(&reply, "127.0.0.1").unwrap();
    let owner = |key: &str| {
        let slot = cachewright::sink::cluster::slot(key.as_bytes());
        ranges.iter().find(|(a, b, _)| (*a..=*b).contains(&slot)).unwrap().2.clone()
    };
    let (cfg, (start, end, addr)) = (0..)
        .find_map(|i| {
            let cfg = configs(i, &cluster.url());
            let used: Vec<String> = control_keys(&cfg).iter().map(|k| owner(k)).collect();
            let free = ranges.iter().find(|(_, _, m)| !used.contains(m))?.clone();
            Some((cfg, free))
        })
        .unwrap();
    let node = cluster.nodes.iter().position(|n| format!("127.0.0.1:{}", n.port) == addr).unwrap();
    (Degradable { cluster, node, slots: (start, end), addr }, cfg)
}

impl Degradable {
    pub fn pid(&self) -> u32 {
        self.cluster.nodes[self.node].pid()
    }

    /// Whether `key` lives on the master to stop.
    pub fn on_stopped(&self, key: &str) -> bool {
        (self.slots.0..=self.slots.1).contains(&cachewright::sink::cluster::slot(key.as_bytes()))
    }

    /// What the watcher's readiness says of the stopped master's slots.
    pub fn named(&self) -> String {
        format!("slots {}-{} have no live master", self.slots.0, self.slots.1)
    }

    /// Waits until another master flags the stopped one failed.
    pub async fn wait_flagged_failed(&self) {
        let other = self.cluster.nodes[(self.node + 1) % self.cluster.nodes.len()].port;
        super::wait_for("the cluster flags the stopped master failed", Duration::from_secs(60), || async {
            let args = ["-p".into(), other.to_string(), "CLUSTER".into(), "NODES".into()];
            let out = tokio::task::block_in_place(|| self.cluster.cli(&args));
            String::from_utf8_lossy(&out.stdout).lines().any(|l| {
                l.contains(&self.addr) && l.split_whitespace().nth(2).is_some_and(|f| f.split(',').any(|f| f == "fail"))
            })
        })
        .await;
    }
}
