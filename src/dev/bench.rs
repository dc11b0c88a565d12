//! Measurements for `scripts/bench.sh`: (a) reading the four collections
//! with the driver and no processing, (b) writing the rebuild's final keys
//! with pipelining and no reading or planning, and the planning CPU between
//! them. The full rebuild itself is timed by the script.

use crate::config::Config;
use crate::plan::FamilySet;
use crate::plan::plan_in_memory;
use crate::rebuild::{Batcher, plan_ctx};
use crate::sink::{Sink, run_writer};
use crate::source::Source;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Instant;

#[derive(Debug, Serialize)]
pub struct BenchReport {
    pub documents: u64,
    pub read_seconds: f64,
    pub plan_cpu_seconds: f64,
    pub plan_wall_seconds: f64,
    pub ops: u64,
    pub write_seconds: f64,
    pub keys_per_family: BTreeMap<String, u64>,
}

/// Writes the final state as plain commands (RESP), one file per master
/// (`host_port.resp`; a single Redis is one master), for the physical
/// write limit: `redis-cli --pipe` of each file, all in parallel.
async fn write_resp(cfg: &Config, sink: &Sink, ops: &[crate::plan::Op], dir: &std::path::Path) -> super::DevResult<()> {
    use std::io::Write;
    std::fs::create_dir_all(dir)?;
    let mut files: BTreeMap<String, std::io::BufWriter<std::fs::File>> = BTreeMap::new();
    for op in ops {
        let slot = crate::sink::cluster::slot(op.key.text.as_bytes());
        let owner = &sink.topology().owner(slot).ok_or("slot not covered")?;
        if !files.contains_key(owner) {
            let path = dir.join(format!("{}.resp", owner.replace(':', "_")));
            files.insert(owner.clone(), std::io::BufWriter::new(std::fs::File::create(path)?));
        }
        let file = files.get_mut(owner).ok_or("file")?;
        let commands =
            crate::sink::build_commands(std::slice::from_ref(op), &cfg.ttl, cfg.ttl_jitter, rand::random::<f64>);
        file.write_all(&commands.get_packed_pipeline())?;
    }
    for (_, mut file) in files {
        file.flush()?;
    }
    Ok(())
}

pub async fn run(cfg: &Config, resp_dir: Option<&std::path::Path>) -> super::DevResult<BenchReport> {
    let source = Source::connect(&cfg.mongo()).await?;
    // The rebuild's own way of writing, so that (b) is its write alone.
    let sink = Sink::connect_writer(&cfg.redis()).await?;

    // (a) Read only: the same driver, cursors and batch size, in parallel.
    let started = Instant::now();
    let [channels, categories, tags, videos] = source.read_four(&cfg.mongo()).await?;
    let read_seconds = started.elapsed().as_secs_f64();
    let documents = (channels.len() + categories.len() + tags.len() + videos.len()) as u64;

    // Planning alone, for its CPU cost.
    let cpu_before = crate::usage::cpu_time();
    let plan_started = Instant::now();
    let ctx = plan_ctx(cfg, FamilySet::all());
    let names = cfg.collections.clone();
    let ops =
        tokio::task::spawn_blocking(move || plan_in_memory(&ctx, &names, &channels, &categories, &tags, &videos).ops)
            .await?;
    let plan_wall_seconds = plan_started.elapsed().as_secs_f64();
    let plan_cpu_seconds = (crate::usage::cpu_time() - cpu_before).as_secs_f64();

    if let Some(dir) = resp_dir {
        write_resp(cfg, &sink, &ops, dir).await?;
    }

    // (b) Write only: replay the final ops through the same sink.
    let mut keys_per_family = BTreeMap::new();
    for op in &ops {
        *keys_per_family.entry(op.key.family.name().to_string()).or_default() += 1;
    }
    let started = Instant::now();
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let budget = sink.tx_budget();
    let writer =
        tokio::spawn(run_writer(Some(sink), rx, cfg.write_concurrency, None, crate::plan::FamilySet::of([]), |_| {}));
    let mut batcher = Batcher::new(tx, budget);
    let n_ops = ops.len() as u64;
    batcher.send(ops).await;
    batcher.flush().await;
    drop(batcher);
    writer.await??;
    let write_seconds = started.elapsed().as_secs_f64();
    Ok(BenchReport {
        documents,
        read_seconds,
        plan_cpu_seconds,
        plan_wall_seconds,
        ops: n_ops,
        write_seconds,
        keys_per_family,
    })
}
