//! Full rebuilds against real servers: a Redis and a SecantusDB started by
//! the harness on free ports, each test with its own database and prefix.

mod common;

use cachewright::plan::FamilySet;
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
    edge_cases_land_exactly(Setup::OneNode).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn edge_cases_land_on_a_cluster_exactly_as_the_golden_file_says() {
    edge_cases_land_exactly(Setup::Cluster).await;
}

async fn edge_cases_land_exactly(setup: Setup) {
    let s = common::shared();
    let url = setup.redis_url();
    let name = common::unique("golden");
    let cfg = common::config(&s.mongo.uri(), &url, &name);
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
    let s = common::shared();
    let url = setup.redis_url();
    let name = common::unique("sweep");
    let cfg = common::config(&s.mongo.uri(), &url, &name);
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
    let source = cachewright::source::Source::connect(&cfg).await.unwrap();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_and_dry_run_touch_what_they_say() {
    let s = common::shared();
    let name = common::unique("only");
    let cfg = common::config(&s.mongo.uri(), &s.redis.url(), &name);
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
    let cfg = common::config(&s.mongo.uri(), &s.redis.url(), &name);
    let source = cachewright::source::Source::connect(&cfg).await.unwrap();
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
    let s = common::shared();
    let name = common::unique("stream");
    let cfg = common::config(&s.mongo.uri(), &s.redis.url(), &name);
    let source = cachewright::source::Source::connect(&cfg).await.unwrap();
    let shape = cachewright::dev::generate::Shape { channels: 5, categories: 40, tags: 200, videos: 6000 };
    cachewright::dev::generate::generate(source.database(), &cfg.collections, shape, 9, |_| {}).await.unwrap();
    rebuild(&cfg, &all(), &Progress::hidden()).await.expect("rebuild");

    let c = &cfg.collections;
    let raw = source.read_four(&cfg).await.unwrap();
    let ctx = cachewright::rebuild::plan_ctx(&cfg, FamilySet::all());
    let run = cachewright::rebuild::plan_in_memory(&ctx, c, &raw[0], &raw[1], &raw[2], &raw[3]);
    let dump = common::dump(&s.redis.url(), &cfg.prefix).await;
    let expected = common::render::render_ops(&run.ops).replace(&format!("\n{}", cfg.prefix), "\napp:");
    let expected = expected.strip_prefix(cfg.prefix.as_str()).map(|r| format!("app:{r}")).unwrap_or(expected);
    assert_eq!(dump.len(), run.ops.len());
    assert!(common::render_dump(&dump, &cfg.prefix) == expected, "streamed rebuild differs from the planner");
    // Home sections hold at most the configured 3 newest.
    for (key, (content, _)) in &dump {
        if key.contains("video:list:home:") {
            let Content::Zset(m) = content else { panic!("{key} not a zset") };
            assert!(m.len() <= 3 && !m.is_empty(), "{key} has {}", m.len());
        }
    }
}
