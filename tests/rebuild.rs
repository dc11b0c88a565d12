//! Full rebuilds against real servers: a Redis and a SecantusDB started by
//! the harness on free ports, each test with its own database and prefix.

mod common;

use cachewright::progress::Progress;
use cachewright::rebuild::{RebuildOptions, rebuild};
use cachewright::registry::{FamilyId, Registry};
use common::Setup;
use common::render::Content;

fn all() -> RebuildOptions {
    RebuildOptions::full()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edge_cases_land_in_redis_exactly_as_the_golden_file_says() {
    edge_cases_land_exactly(&Setup::OneNode.redis_url(), None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edge_cases_land_on_a_cluster_exactly_as_the_golden_file_says() {
    edge_cases_land_exactly(&Setup::Cluster.redis_url(), None).await;
}

/// With a unit budget this small every collection of more than one
/// element is written in steps through a stage key; the result must be
/// the same, byte for byte, and no stage may be left behind. A private
/// Redis, so its command counts are this test's alone (the cluster's
/// other tests here write no key big enough to be staged).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edge_cases_written_in_steps_land_exactly_as_the_golden_file_says() {
    let redis = common::servers::Redis::start();
    edge_cases_land_exactly(&redis.url(), Some(2_500)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edge_cases_written_in_steps_on_a_cluster_land_exactly_as_the_golden_file_says() {
    edge_cases_land_exactly(&Setup::Cluster.redis_url(), Some(5_000)).await;
}

async fn edge_cases_land_exactly(url: &str, unit_cost: Option<usize>) {
    let url = url.to_string();
    let name = common::unique("golden");
    let mut cfg = common::TestEnv::named(&name).redis(&url).config();
    let renames_before = common::command_calls(&url, "rename").await;
    if let Some(cost) = unit_cost {
        cfg.write_batch_cost = cost;
    }
    common::load_fixtures(&cfg, &common::fixture_dir("edge-cases")).await;
    let summary = rebuild(&cfg, &all(), &Progress::hidden()).await.expect("rebuild");
    assert_eq!(summary.rejected_total(), 11);

    let dump = common::dump(&url, &cfg.prefix).await;
    let expected = std::fs::read_to_string(common::fixture_dir("edge-cases").join("expected-keys.txt")).unwrap();
    let actual = common::render_dump(&dump, &cfg.prefix);
    if expected != actual {
        let diff = similar::TextDiff::from_lines(&expected, &actual);
        panic!("redis differs from expected-keys.txt:\n{}", diff.unified_diff().context_radius(2));
    }
    // Every key carries its tier's TTL plus at most 10% jitter.
    for (key, (_, ttl)) in &dump {
        let family = cachewright::keys::Keys::new(cfg.prefix.clone()).classify(key).expect("registered");
        let base = cfg.ttl.get(Registry::get().family(family).tier) as i64;
        assert!(*ttl >= base - 5 && *ttl <= base + base / 10, "{key}: ttl {ttl}, tier {base}");
    }
    assert_eq!(common::count_keys(&url, &format!("{}stage:*", cfg.status_prefix)).await, 0, "a stage left behind");
    if unit_cost.is_some() {
        let renames = common::command_calls(&url, "rename").await - renames_before;
        assert!(renames >= 10, "only {renames} keys were written in steps");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_deletes_stale_family_keys_and_nothing_else() {
    sweep_deletes_only_stale_keys(Setup::OneNode).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sweep_on_a_cluster_deletes_stale_family_keys_and_nothing_else() {
    sweep_deletes_only_stale_keys(Setup::Cluster).await;
}

async fn sweep_deletes_only_stale_keys(setup: Setup) {
    let url = setup.redis_url();
    let name = common::unique("sweep");
    let cfg = common::TestEnv::named(&name).redis(&url).config();
    common::load_fixtures(&cfg, &common::fixture_dir("edge-cases")).await;
    let p = &cfg.prefix;
    let mut conn = common::redis_conn(&url).await;
    // A cache to sweep (into an empty one, the planted keys alone would be
    // all its keys, and the sweep guard would refuse to delete them).
    rebuild(&cfg, &all(), &Progress::hidden()).await.expect("first rebuild");
    let planted = [
        (format!("{p}video:detail:gone"), true),
        (format!("{p}video:list:home:ch1:retired"), true),
        (format!("{p}category:video:count:c4"), true),
        (format!("{p}session:x"), false),
        (format!("{p}video:detail:a:b"), false),
        (format!("{p}video:detail:bad!id"), false),
        (format!("{p}v2:channel:all"), false),
        (format!("other:{p}video:detail:v1"), false),
    ];
    for (key, _) in &planted {
        let _: () = redis::cmd("SET").arg(key).arg("stale").query_async(&mut conn).await.unwrap();
    }
    let summary = rebuild(&cfg, &all(), &Progress::hidden()).await.expect("rebuild");
    assert_eq!(summary.deleted_total(), 3);
    assert_eq!(summary.deleted.get(&FamilyId::VideoDetail), Some(&1));
    for (key, swept) in &planted {
        let exists: bool = redis::cmd("EXISTS").arg(key).query_async(&mut conn).await.unwrap();
        assert_eq!(exists, !swept, "{key}");
    }

    // Deactivating a category removes its keys on the next rebuild.
    let source = cachewright::source::Source::connect(&cfg.mongo()).await.unwrap();
    let categories = source.database().collection::<mongodb::bson::Document>("Category");
    categories
        .update_one(mongodb::bson::doc! {"_id": "c2"}, mongodb::bson::doc! {"$set": {"status": 0}})
        .await
        .unwrap();
    rebuild(&cfg, &all(), &Progress::hidden()).await.expect("rebuild");
    let dump = common::dump(&url, p).await;
    for key in dump.keys() {
        let rest = key.strip_prefix(p.as_str()).unwrap();
        assert!(!rest.ends_with(":c2") && !rest.contains(":c2:"), "stale key {key}");
    }
    let Some((Content::Set(cats), _)) = dump.get(&format!("{p}video:categories:v1")) else { panic!("v1 categories") };
    assert_eq!(cats, &vec!["c1".to_string()]);
}

/// A rebuild into a keyspace that holds no key of its families has
/// nothing to sweep: it scans nothing beyond its one-call probe, writes
/// exactly what a rebuild writes, and leaves other keys under the prefix
/// alone. Once a key of its families exists, the sweep scans again; and
/// a keyspace too big for the probe's few calls is swept as usual. A
/// private Redis, so that its keys and `SCAN` calls are this test's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_into_a_keyspace_without_its_families_skips_the_sweep_and_no_other() {
    use cachewright::rebuild::Sweep;
    let redis = common::servers::Redis::start();
    let url = redis.url();
    let cfg = common::TestEnv::named(&common::unique("skip")).redis(&url).config();
    common::load_fixtures(&cfg, &common::fixture_dir("edge-cases")).await;
    let p = &cfg.prefix;
    let mut conn = common::redis_conn(&url).await;
    let others = [format!("{p}session:x"), format!("{p}v2:channel:all"), format!("other:{p}video:detail:v1")];
    for key in &others {
        let _: () = redis::cmd("SET").arg(key).arg("not ours").query_async(&mut conn).await.unwrap();
    }
    let scans_before = common::command_calls(&url, "scan").await;
    let summary = rebuild(&cfg, &all(), &Progress::hidden()).await.expect("rebuild into an empty keyspace");
    assert_eq!(summary.sweep, Sweep::Skipped);
    assert_eq!(common::command_calls(&url, "scan").await - scans_before, 1, "only the probe scans");
    let expected = std::fs::read_to_string(common::fixture_dir("edge-cases").join("expected-keys.txt")).unwrap();
    let mut dump = common::dump(&url, p).await;
    for key in &others {
        dump.remove(key);
    }
    assert_eq!(common::render_dump(&dump, p), expected);
    for key in &others {
        let exists: bool = redis::cmd("EXISTS").arg(key).query_async(&mut conn).await.unwrap();
        assert!(exists, "{key} was touched");
    }

    // One stale key of a family: the sweep scans and deletes it.
    let stale = format!("{p}video:detail:gone");
    let _: () = redis::cmd("SET").arg(&stale).arg("stale").query_async(&mut conn).await.unwrap();
    let summary = rebuild(&cfg, &all(), &Progress::hidden()).await.expect("warm rebuild");
    assert!(matches!(summary.sweep, Sweep::Scanned(n) if n > 0), "{:?}", summary.sweep);
    assert_eq!(summary.deleted.get(&FamilyId::VideoDetail), Some(&1));
    let exists: bool = redis::cmd("EXISTS").arg(&stale).query_async(&mut conn).await.unwrap();
    assert!(!exists, "the stale key survived");

    // A keyspace of many other keys (more buckets than the probe's few
    // calls cover) and none of the families: not known empty, so swept.
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
    let mut fill = redis::pipe();
    for i in 0..60_000 {
        fill.cmd("SET").arg(format!("other:{i}")).arg(i).ignore();
    }
    let _: () = fill.query_async(&mut conn).await.unwrap();
    let summary = rebuild(&cfg, &all(), &Progress::hidden()).await.expect("rebuild beside many other keys");
    assert!(matches!(summary.sweep, Sweep::Scanned(_)), "{:?}", summary.sweep);
    assert_eq!(common::render_dump(&common::dump(&url, p).await, p), expected);
}

/// A sweep names at most its cap of stale keys per pass: with far more
/// stale keys than that it still deletes every one (pass after pass), and
/// the guard judges the whole count before the first deletion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sweep_above_its_cap_deletes_every_stale_key_and_the_guard_counts_them_all() {
    let s = common::shared();
    let url = s.redis.url();
    let name = common::unique("sweepcap");
    let mut cfg = common::TestEnv::named(&name).redis(&url).config();
    common::load_fixtures(&cfg, &common::fixture_dir("edge-cases")).await;
    let p = cfg.prefix.clone();
    let mut conn = common::redis_conn(&url).await;
    let capped = RebuildOptions { sweep_cap: 3, ..all() };
    let first = rebuild(&cfg, &capped, &Progress::hidden()).await.expect("first rebuild");
    let plant = |n: usize| -> Vec<String> {
        (0..n)
            .flat_map(|i| {
                [
                    format!("{p}video:detail:gone{i}"),
                    format!("{p}video:categories:gone{i}"),
                    format!("{p}tag:list:x{i}"),
                ]
            })
            .collect()
    };
    let set_all = |keys: Vec<String>| {
        let mut conn = conn.clone();
        async move {
            for key in &keys {
                let _: () = redis::cmd("SET").arg(key).arg("stale").query_async(&mut conn).await.unwrap();
            }
        }
    };

    // 30 stale keys (of three families, two of them per video) and a cap
    // of 3: ten passes, every key gone, the cache as a fresh rebuild left it.
    set_all(plant(10)).await;
    let summary = rebuild(&cfg, &capped, &Progress::hidden()).await.expect("rebuild");
    assert_eq!(summary.deleted_total(), 30);
    assert_eq!(summary.deleted.get(&FamilyId::VideoDetail), Some(&10));
    assert_eq!(summary.deleted.get(&FamilyId::VideoCategories), Some(&10));
    common::assert_exact_at(&url, &cfg).await;

    // More stale keys than the share allows, though a pass names only 3 of
    // them: the guard refuses, and nothing is deleted.
    let many = plant(first.written_total() as usize);
    set_all(many.clone()).await;
    cfg.sweep_max_share = 0.5;
    let err = rebuild(&cfg, &capped, &Progress::hidden()).await.expect_err("a mass delete must be refused");
    assert!(matches!(err, cachewright::rebuild::RunError::Guard(_)), "{err}");
    let left: usize = redis::cmd("EXISTS").arg(&many).query_async(&mut conn).await.unwrap();
    assert_eq!(left, many.len(), "the guard let some stale keys be deleted");
}

/// A few stale keys in a keyspace the run then fills are a small share
/// of what the families hold once it has written, so the guard lets the
/// sweep delete them, whenever the scan beside the writes happens to run.
/// The scan's own count once decided: seeing none of the run's keys yet,
/// it counted the stale keys alone as the existing ones (4 of 4) and
/// refused. That happened to 2 of 8 hostile data sets of a few hundred
/// keys (`scripts/contract_check.py`); these rounds did not catch the
/// race without the fix (18 of 18 passed), so they hold the verdict, not
/// the timing. Each round plants the keys afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_few_stale_keys_beside_a_new_keyspace_are_swept_whatever_the_scan_saw() {
    let s = common::shared();
    let cfg = common::TestEnv::new("fewstale").config();
    common::load_fixtures(&cfg, &common::fixture_dir("edge-cases")).await;
    let mut conn = common::redis_conn(&s.redis.url()).await;
    let stale: Vec<String> = ["video:detail:gone", "video:categories:gone", "tag:list:gone", "tag:search:zz"]
        .iter()
        .map(|k| format!("{}{k}", cfg.prefix))
        .collect();
    for round in 0..6 {
        let existing = common::dump(&s.redis.url(), &cfg.prefix).await;
        // `DEL` wants at least one key and the first round has none yet:
        // `none`, outside the prefix and written by nothing, pads it.
        let _: () = redis::cmd("DEL")
            .arg(existing.keys().collect::<Vec<_>>())
            .arg("none")
            .query_async(&mut conn)
            .await
            .unwrap();
        for key in &stale {
            let _: () = redis::cmd("SET").arg(key).arg("stale").query_async(&mut conn).await.unwrap();
        }
        let summary = rebuild(&cfg, &all(), &Progress::hidden())
            .await
            .unwrap_or_else(|err| panic!("round {round}: 4 stale keys beside a whole keyspace were refused: {err}"));
        assert_eq!(summary.deleted_total(), 4, "round {round}");
        common::assert_exact_at(&s.redis.url(), &cfg).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_and_dry_run_touch_what_they_say() {
    let s = common::shared();
    let name = common::unique("only");
    let cfg = common::TestEnv::named(&name).config();
    common::load_fixtures(&cfg, &common::fixture_dir("edge-cases")).await;

    let dry = RebuildOptions::full().dry_run();
    let summary = rebuild(&cfg, &dry, &Progress::hidden()).await.expect("dry run");
    assert!(summary.written_total() > 100);
    assert!(common::dump(&s.redis.url(), &cfg.prefix).await.is_empty(), "dry run wrote keys");

    let tags = cachewright::cli::parse_only(&["tag".into()]).unwrap();
    let mut conn = common::redis_conn(&s.redis.url()).await;
    let stale_detail = format!("{}video:detail:old", cfg.prefix);
    let _: () = redis::cmd("SET").arg(&stale_detail).arg("x").query_async(&mut conn).await.unwrap();
    rebuild(&cfg, &RebuildOptions::only(tags), &Progress::hidden()).await.expect("rebuild");
    let dump = common::dump(&s.redis.url(), &cfg.prefix).await;
    let keys = cachewright::keys::Keys::new(cfg.prefix.clone());
    for key in dump.keys().filter(|k| **k != stale_detail) {
        let family = keys.classify(key).unwrap();
        assert!(tags.contains(family), "{key} written by --only tag");
    }
    assert!(dump.contains_key(&stale_detail), "--only tag swept a video key");
    assert!(dump.contains_key(&format!("{}tag:all", cfg.prefix)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_never_see_a_collection_key_missing_or_partial() {
    let s = common::shared();
    let name = common::unique("atomic");
    let cfg = common::TestEnv::named(&name).config();
    let source = cachewright::source::Source::connect(&cfg.mongo()).await.unwrap();
    let shape = cachewright::dev::generate::Shape { channels: 3, categories: 4, tags: 20, videos: 3000 };
    cachewright::dev::generate::generate(source.database(), &cfg.collections, shape, 5, |_| {}).await.unwrap();
    rebuild(&cfg, &all(), &Progress::hidden()).await.expect("first rebuild");

    // The biggest category list: a reader polls it during more rebuilds.
    let dump = common::dump(&s.redis.url(), &cfg.prefix).await;
    let (list_key, expected) = dump
        .iter()
        .filter_map(|(k, (c, _))| match c {
            Content::List(items) if k.contains("video:category:list:") => Some((k.clone(), items.len())),
            _ => None,
        })
        .max_by_key(|(_, n)| *n)
        .expect("a category list");
    assert!(expected > 300);
    let zset_key = list_key.replace("video:category:list:", "video:category:index:") + ":videos";
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (url, stop) = (s.redis.url(), stop.clone());
        tokio::spawn(async move {
            let mut conn = common::redis_conn(&url).await;
            let mut reads = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let (len, card): (usize, usize) = redis::pipe()
                    .cmd("LLEN")
                    .arg(&list_key)
                    .cmd("ZCARD")
                    .arg(&zset_key)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                assert_eq!(len, expected, "list seen partial or missing");
                assert_eq!(card, expected, "zset seen partial or missing");
                reads += 1;
            }
            reads
        })
    };
    for _ in 0..3 {
        rebuild(&cfg, &all(), &Progress::hidden()).await.expect("rebuild");
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let reads = reader.await.expect("reader saw only whole keys");
    assert!(reads > 10, "reader ran {reads} times");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_rebuild_writes_what_the_in_memory_planner_plans() {
    let (cfg, _) = generated("stream", 1, 9).await;
    rebuild(&cfg, &all(), &Progress::hidden()).await.expect("rebuild");
    assert_redis_is_the_planners(&cfg).await;
}

/// Reading the videos over `_id` ranges matches every document exactly
/// once and writes what one cursor in natural order would; a string
/// `_id` that writes the same id as an ObjectId keeps the read in
/// natural order, so the first of the two stays the one kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuild_read_over_id_ranges_writes_what_the_planner_plans() {
    use cachewright::source::ranges::VideoRead;
    use mongodb::bson::{Document, doc};
    let (cfg, source) = generated("ranges", 4, 11).await;
    let videos = source.database().collection::<Document>(&cfg.collections.video);
    // Ids that are not ObjectIds: a usable string and an unusable number.
    let extra = [doc! { "_id": "clip-7", "title": "a", "listStatus": 1 }, doc! { "_id": 42, "title": "b" }];
    videos.insert_many(extra).await.unwrap();
    let total = videos.count_documents(doc! {}).await.unwrap();

    let plan = source.plan_video_read(&cfg.collections.video, 4).await.unwrap();
    let VideoRead::Ranges(ranges) = &plan else { panic!("expected ranges, got {plan:?}") };
    assert_eq!(ranges.len(), 4, "four ObjectId ranges");
    assert_eq!(plan.cursors(), 5, "four ObjectId ranges and one for every other id");
    let filters = ranges.iter().cloned().chain([cachewright::source::ranges::others_filter()]);
    let mut seen = std::collections::HashSet::new();
    for filter in filters {
        let matched = videos.count_documents(filter.clone()).await.unwrap();
        assert!(matched > 0, "{filter} matches nothing");
        let ids: Vec<_> = videos.distinct("_id", filter.clone()).await.unwrap();
        for id in ids {
            assert!(seen.insert(id.to_string()), "{id} matched by two ranges");
        }
    }
    assert_eq!(seen.len() as u64, total, "the ranges miss a document");

    rebuild(&cfg, &all(), &Progress::hidden()).await.expect("rebuild");
    assert_redis_is_the_planners(&cfg).await;

    // The twin of an existing ObjectId, as a string: natural order again.
    let first = videos.find_one(doc! { "_id": { "$type": "objectId" } }).await.unwrap().unwrap();
    let twin = first.get_object_id("_id").unwrap().to_hex();
    videos.insert_one(doc! { "_id": &twin, "title": "twin", "listStatus": 1 }).await.unwrap();
    let plan = source.plan_video_read(&cfg.collections.video, 4).await.unwrap();
    assert!(matches!(plan, VideoRead::Natural(_)), "{plan:?}");
    let summary = rebuild(&cfg, &all(), &Progress::hidden()).await.expect("rebuild");
    let (_, report) = summary.collections.iter().find(|(name, _)| name == &cfg.collections.video).unwrap();
    let repeats = &report.rejected[&cachewright::model::report::Reason::DuplicateId];
    assert_eq!(repeats.samples, vec![twin.clone()], "the string twin, read second, is the one rejected");
    assert_redis_is_the_planners(&cfg).await;
}

/// A generated data set of 6,000 videos in a database of its own, and
/// settings that read it with `cursors` cursors.
async fn generated(
    label: &str,
    cursors: usize,
    seed: u64,
) -> (cachewright::config::Config, cachewright::source::Source) {
    let mut cfg = common::TestEnv::named(&common::unique(label)).config();
    cfg.read_cursors = cursors;
    let source = cachewright::source::Source::connect(&cfg.mongo()).await.unwrap();
    let shape = cachewright::dev::generate::Shape { channels: 5, categories: 40, tags: 200, videos: 6000 };
    cachewright::dev::generate::generate(source.database(), &cfg.collections, shape, seed, |_| {}).await.unwrap();
    (cfg, source)
}

/// The cache under `cfg.prefix` is what the in-memory planner makes of
/// the collections as they are now.
async fn assert_redis_is_the_planners(cfg: &cachewright::config::Config) {
    let s = common::shared();
    let ops = common::planned_ops(cfg).await;
    let dump = common::dump(&s.redis.url(), &cfg.prefix).await;
    let expected = common::render::render_ops(&ops).replace(&format!("\n{}", cfg.prefix), "\napp:");
    let expected = expected.strip_prefix(cfg.prefix.as_str()).map(|r| format!("app:{r}")).unwrap_or(expected);
    assert_eq!(dump.len(), ops.len());
    assert!(common::render_dump(&dump, &cfg.prefix) == expected, "the rebuild differs from the planner");
    // Home sections hold at most the configured 3 newest.
    for (key, (content, _)) in &dump {
        if key.contains("video:list:home:") {
            let Content::Zset(m) = content else { panic!("{key} not a zset") };
            assert!(m.len() <= 3 && !m.is_empty(), "{key} has {}", m.len());
        }
    }
}

/// A stage lost between steps (deleted here by a saboteur, as a Redis
/// restart or fail-over would lose it) is never renamed onto its key:
/// a reader sees the key whole at every moment, old or new, and the
/// write starts over on a new stage until it lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_stage_is_never_renamed_onto_its_key() {
    let redis = common::servers::Redis::start();
    lost_stages_are_never_renamed(&redis.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_stage_on_a_cluster_is_never_renamed_onto_its_key() {
    lost_stages_are_never_renamed(&Setup::Cluster.redis_url()).await;
}

async fn lost_stages_are_never_renamed(url: &str) {
    use cachewright::plan::{Op, Value};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let name = common::unique("stage");
    let mut cfg = common::TestEnv::named(&name).redis(url).config();
    cfg.write_batch_cost = 20_000;
    let sink = cachewright::sink::Sink::connect(&cfg.redis()).await.expect("redis reachable");
    let key = cachewright::keys::Keys::new(cfg.prefix.clone()).key(FamilyId::VideoCategoryList, &["c1"]);
    let value = |tag: &str| Value::List((0..3000).map(|i| format!("{tag}{i:04}")).collect::<Vec<_>>());
    let (old, new) = (value("old"), value("new"));
    let op = |value: &Value| Op { key: key.clone(), value: value.clone() };
    sink.write(&[op(&old)]).await.expect("first write");

    // Every stage of the key lives in the key's slot, on one node.
    let slot = cachewright::sink::cluster::slot(key.text.as_bytes());
    let nodes = common::node_urls(url).await;
    let stop = Arc::new(AtomicBool::new(false));
    let lost = Arc::new(AtomicUsize::new(0));
    let pattern = format!("{}stage:*", cfg.status_prefix);
    let saboteur = {
        let (stop, lost, nodes, pattern) = (stop.clone(), lost.clone(), nodes.clone(), pattern.clone());
        tokio::spawn(async move {
            let mut conns = Vec::new();
            for node in &nodes {
                conns.push(common::plain_conn(node).await);
            }
            while !stop.load(Ordering::Relaxed) && lost.load(Ordering::Relaxed) < 3 {
                for conn in &mut conns {
                    let stages: Vec<String> = if nodes.len() > 1 {
                        let keys: Vec<String> = redis::cmd("CLUSTER")
                            .arg("GETKEYSINSLOT")
                            .arg(slot)
                            .arg(100)
                            .query_async(conn)
                            .await
                            .unwrap_or_default();
                        keys.into_iter().filter(|k| k.starts_with(&pattern[..pattern.len() - 1])).collect()
                    } else {
                        redis::cmd("KEYS").arg(&pattern).query_async(conn).await.unwrap()
                    };
                    for stage in stages {
                        let gone: usize = redis::cmd("UNLINK").arg(&stage).query_async(conn).await.unwrap_or(0);
                        lost.fetch_add(gone, Ordering::Relaxed);
                    }
                }
                tokio::task::yield_now().await;
            }
        })
    };
    let reader = {
        let (stop, url, text) = (stop.clone(), url.to_string(), key.text.clone());
        let whole = [common::render::Content::from_value(&old), common::render::Content::from_value(&new)];
        tokio::spawn(async move {
            let mut conn = common::redis_conn(&url).await;
            let mut reads = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let items: Vec<String> =
                    redis::cmd("LRANGE").arg(&text).arg(0).arg(-1).query_async(&mut conn).await.unwrap();
                assert!(
                    whole.contains(&common::render::Content::List(items.clone())),
                    "a reader saw {} items, not a whole value",
                    items.len()
                );
                reads += 1;
            }
            reads
        })
    };
    // Writes alternate between two values until the saboteur has taken
    // three stages; the last write must land whole.
    let mut writes = 0;
    while lost.load(Ordering::Relaxed) < 3 {
        assert!(writes < 500, "the saboteur caught no stage in {writes} writes");
        let next = if writes % 2 == 0 { &new } else { &old };
        match sink.write(&[op(next)]).await {
            Ok(()) | Err(cachewright::sink::SinkError::StageLost { .. }) => {}
            Err(err) => panic!("write failed: {err}"),
        }
        writes += 1;
    }
    saboteur.await.expect("saboteur");
    sink.write(&[op(&new)]).await.expect("a write after the saboteur stopped");
    stop.store(true, Ordering::Relaxed);
    let reads = reader.await.expect("the reader saw only whole values");
    assert!(reads > 0);
    let mut conn = common::redis_conn(url).await;
    let items: Vec<String> = redis::cmd("LRANGE").arg(&key.text).arg(0).arg(-1).query_async(&mut conn).await.unwrap();
    assert_eq!(common::render::Content::List(items), common::render::Content::from_value(&new));
    assert_eq!(common::count_keys(url, &pattern).await, 0, "a stage left behind");
}

/// The same fault, placed exactly: the proxy holds the rename as it is
/// sent, the test deletes the filled stage behind it, then lets the
/// rename through. It finds no stage, the key keeps its old value whole,
/// and the write starts over on a new stage and lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_lost_just_before_its_rename_leaves_the_key_whole_and_the_write_starts_over() {
    stage_sabotaged_before_its_rename("UNLINK").await;
}

/// A stage cut short between the fill's size read-back and the rename,
/// as a fail-over to a replica the whole fill had not reached does: the
/// test pops the stage's last element while the proxy holds the rename.
/// The size check runs in the rename's own atomic step, so the short
/// stage is never renamed: the key stays old and whole, and the write
/// starts over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stage_trimmed_just_before_its_rename_leaves_the_key_whole_and_the_write_starts_over() {
    stage_sabotaged_before_its_rename("RPOP").await;
}

/// Holds a staged write's rename, applies `sabotage` (a command taking
/// the stage's name) to the filled stage, and checks the key.
async fn stage_sabotaged_before_its_rename(sabotage: &str) {
    use cachewright::plan::{Op, Value};
    let redis = common::servers::Redis::start();
    let proxy = common::proxy::Proxy::start(redis.port).await;
    let name = common::unique("stagecut");
    let mut cfg = common::TestEnv::named(&name).redis(&proxy.redis_url()).config();
    cfg.write_batch_cost = 20_000;
    let sink = cachewright::sink::Sink::connect(&cfg.redis()).await.expect("redis reachable through the proxy");
    let key = cachewright::keys::Keys::new(cfg.prefix.clone()).key(FamilyId::VideoCategoryList, &["c1"]);
    let value = |tag: &str| (0..3000).map(|i| format!("{tag}{i:04}")).collect::<Vec<String>>();
    let (old, new) = (value("old"), value("new"));
    sink.write(&[Op { key: key.clone(), value: Value::List(old.clone()) }]).await.expect("first write");

    let renames_before = common::command_calls(&redis.url(), "rename").await;
    proxy.stall_on(b"RENAME");
    let write = {
        let (sink, op) = (sink.clone(), Op { key: key.clone(), value: Value::List(new.clone()) });
        tokio::spawn(async move { sink.write(&[op]).await })
    };
    proxy.wait_stalled().await;
    let mut direct = common::redis_conn(&redis.url()).await;
    let pattern = format!("{}stage:*", cfg.status_prefix);
    let stages: Vec<String> = redis::cmd("KEYS").arg(&pattern).query_async(&mut direct).await.unwrap();
    assert_eq!(stages.len(), 1, "the filled stage waits for its rename: {stages:?}");
    let filled: usize = redis::cmd("LLEN").arg(&stages[0]).query_async(&mut direct).await.unwrap();
    assert_eq!(filled, new.len());
    let items: Vec<String> = redis::cmd("LRANGE").arg(&key.text).arg(0).arg(-1).query_async(&mut direct).await.unwrap();
    assert_eq!(items, old, "the key is old and whole while its rename waits");
    let ttl: i64 = redis::cmd("TTL").arg(&stages[0]).query_async(&mut direct).await.unwrap();
    assert!(ttl > 0, "a stage lives with a TTL: {ttl}");
    let _: redis::Value = redis::cmd(sabotage).arg(&stages[0]).query_async(&mut direct).await.unwrap();
    proxy.resume();

    write.await.unwrap().expect("the write starts over on a new stage and lands");
    let renames = common::command_calls(&redis.url(), "rename").await - renames_before;
    assert_eq!(renames, 1, "only the whole stage was renamed");
    let items: Vec<String> = redis::cmd("LRANGE").arg(&key.text).arg(0).arg(-1).query_async(&mut direct).await.unwrap();
    assert_eq!(items, new);
    assert_eq!(common::count_keys(&redis.url(), &pattern).await, 0, "a stage left behind");
}
