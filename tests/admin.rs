//! Migration-day tools against real servers: migrate, verify, purge.

mod common;

use cachewright::admin::{migrate, purge, verify};
use cachewright::plan::FamilySet;
use cachewright::progress::Progress;
use cachewright::rebuild::{RebuildOptions, rebuild};
use common::Setup;
use futures::TryStreamExt;
use mongodb::bson::{Bson, Document, doc, oid::ObjectId};
use std::process::Command;

fn all() -> RebuildOptions {
    RebuildOptions::full()
}

/// Legacy, mixed and already-migrated videos, plus categories and tags
/// that still carry `channelId`.
async fn load_mixed(cfg: &cachewright::config::Config, legacy_videos: usize) {
    let source = cachewright::source::Source::connect(&cfg.mongo()).await.unwrap();
    let db = source.database();
    let c = &cfg.collections;
    for name in [&c.channel, &c.category, &c.tag, &c.video] {
        db.collection::<Document>(name).drop().await.unwrap();
    }
    db.collection::<Document>(&c.category)
        .insert_many([
            doc! {"_id": "c1", "name": "One", "seq": 1, "status": 1, "channelId": "ch1"},
            doc! {"_id": "c2", "name": "Two", "seq": 2, "status": 1},
        ])
        .await
        .unwrap();
    db.collection::<Document>(&c.tag)
        .insert_many([doc! {"_id": "t1", "name": "tag", "seq": 1, "status": 1, "categoryId": "c1", "channelId": "ch1"}])
        .await
        .unwrap();
    db.collection::<Document>(&c.channel)
        .insert_many([doc! {"_id": "ch1", "name": "Ch", "landingUrl": "u", "categories": [{"id": "c1"}, {"id": "c2"}]}])
        .await
        .unwrap();
    let oid = ObjectId::parse_str("65a1b2c3d4e5f6a7b8c9d0e1").unwrap();
    let mut videos = vec![
        doc! {"_id": "mixed", "title": "m", "categoryId": "c1", "categoryIds": ["c2"], "listStatus": 1},
        doc! {"_id": "dup", "title": "d", "categoryId": "c1", "categoryIds": ["c1"], "listStatus": 1},
        doc! {"_id": "done", "title": "x", "categoryIds": ["c2"], "listStatus": 1},
        doc! {"_id": "nullish", "title": "n", "categoryId": Bson::Null, "listStatus": 1},
        doc! {"_id": "oid", "title": "o", "categoryId": oid, "categoryIds": ["65a1b2c3d4e5f6a7b8c9d0e1"], "listStatus": 1},
        doc! {"_id": "scalar", "title": "s", "categoryIds": "c2", "listStatus": 1},
    ];
    for i in 0..legacy_videos {
        videos.push(doc! {"_id": format!("v{i:05}"), "title": "t", "categoryId": if i % 2 == 0 { "c1" } else { "c2" }, "listStatus": 1});
    }
    db.collection::<Document>(&c.video).insert_many(videos).await.unwrap();
}

async fn videos(cfg: &cachewright::config::Config) -> Vec<Document> {
    let source = cachewright::source::Source::connect(&cfg.mongo()).await.unwrap();
    let coll = source.database().collection::<Document>(&cfg.collections.video);
    let mut docs: Vec<Document> = coll.find(doc! {}).await.unwrap().try_collect().await.unwrap();
    docs.sort_by_key(|d| format!("{:?}", d.get("_id")));
    docs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_folds_legacy_ids_once_and_resumes_after_a_kill() {
    let s = common::shared();
    let name = common::unique("migrate");
    let cfg = common::TestEnv::named(&name).config();
    load_mixed(&cfg, 3000).await;
    let source = cachewright::source::Source::connect(&cfg.mongo()).await.unwrap();
    let db = source.database();

    let dry = migrate::migrate(db, &cfg.collections, 100, true, &Progress::hidden()).await.unwrap();
    assert_eq!(dry[0].matched, 3005);
    assert_eq!(dry[0].changed, 0);
    assert_eq!(dry[1].matched, 1);
    assert_eq!(videos(&cfg).await.iter().filter(|d| d.contains_key("categoryId")).count(), 3004, "dry run wrote");

    // Kill a migration halfway (small batches), then finish it.
    let mut child = Command::new(env!("CARGO_BIN_EXE_cachewright"))
        .args(["migrate", "--batch", "20"])
        .env("MONGODB_URI", s.mongo.uri())
        .env("MONGODB_DB", &name)
        .env("REDIS_URL", s.redis.url())
        .env("CACHEWRIGHT_PREFIX", &cfg.prefix)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let (every, within) = (std::time::Duration::from_millis(5), std::time::Duration::from_secs(20));
    common::wait_for_every("the migration to be under way", within, every, || async {
        (videos(&cfg).await.iter().filter(|d| d.contains_key("categoryId")).count() < 2900).then_some(())
    })
    .await;
    child.kill().unwrap();
    let _ = child.wait();
    let left = videos(&cfg).await.iter().filter(|d| d.contains_key("categoryId")).count();
    assert!(left > 0, "the migration finished before it could be killed");

    let done = migrate::migrate(db, &cfg.collections, 100, false, &Progress::hidden()).await.unwrap();
    // The scalar `categoryIds` has no `categoryId`, so it is not in `left`.
    let scalar_left = videos(&cfg).await.iter().filter(|d| d.get_str("categoryIds").is_ok()).count();
    assert_eq!(done[0].changed as usize, left + scalar_left);
    let docs = videos(&cfg).await;
    assert!(docs.iter().all(|d| !d.contains_key("categoryId")));
    let by_id = |id: &str| docs.iter().find(|d| d.get_str("_id") == Ok(id)).unwrap().clone();
    assert_eq!(by_id("mixed").get_array("categoryIds").unwrap(), &vec![Bson::from("c2"), Bson::from("c1")]);
    assert_eq!(by_id("dup").get_array("categoryIds").unwrap(), &vec![Bson::from("c1")]);
    assert_eq!(by_id("oid").get_array("categoryIds").unwrap().len(), 1);
    assert!(!by_id("nullish").contains_key("categoryIds"));
    assert_eq!(by_id("scalar").get_array("categoryIds").unwrap(), &vec![Bson::from("c2")]);
    assert_eq!(by_id("v00001").get_array("categoryIds").unwrap(), &vec![Bson::from("c2")]);

    // A second run changes nothing.
    let again = migrate::migrate(db, &cfg.collections, 100, false, &Progress::hidden()).await.unwrap();
    assert!(again.iter().all(|r| r.matched == 0 && r.changed == 0), "{again:?}");
    assert_eq!(videos(&cfg).await, docs);
    let cats: Vec<Document> =
        db.collection::<Document>("Category").find(doc! {}).await.unwrap().try_collect().await.unwrap();
    assert!(cats.iter().all(|c| !c.contains_key("channelId")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_is_clean_after_a_rebuild_and_catches_each_kind_of_drift() {
    verify_catches_each_kind_of_drift(Setup::OneNode).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_on_a_cluster_is_clean_after_a_rebuild_and_catches_each_kind_of_drift() {
    verify_catches_each_kind_of_drift(Setup::Cluster).await;
}

async fn verify_catches_each_kind_of_drift(setup: Setup) {
    let url = setup.redis_url();
    let name = common::unique("verify");
    let cfg = common::TestEnv::named(&name).redis(&url).config();
    common::load_fixtures(&cfg, &common::fixture_dir("edge-cases")).await;
    rebuild(&cfg, &all(), &Progress::hidden()).await.unwrap();
    let clean = verify::verify(&cfg, verify::VerifyOptions::all(FamilySet::all()), &Progress::hidden()).await.unwrap();
    assert!(clean.ok(), "{}", clean.render());

    // `memory` counts every key of each family and measures a draw of two.
    let keys = cachewright::keys::Keys::new(&cfg.prefix);
    let mut counted = std::collections::BTreeMap::<String, u64>::new();
    for key in common::dump(&url, &cfg.prefix).await.keys() {
        if let Some(family) = keys.classify(key) {
            *counted.entry(family.name().to_string()).or_default() += 1;
        }
    }
    let sink = cachewright::sink::Sink::connect(&cfg.redis()).await.unwrap();
    let memory = cachewright::admin::memory::measure(&sink, &keys, 2).await.unwrap();
    for f in &memory.families {
        assert_eq!(f.keys, counted.get(&f.family).copied().unwrap_or(0), "{}", memory.render());
        assert_eq!(f.sampled, f.keys.min(2), "{}", memory.render());
        assert!(f.keys == 0 || f.avg_bytes > 0, "{}", memory.render());
    }

    let p = &cfg.prefix;
    let mut conn = common::redis_conn(&url).await;
    let detail: String = redis::cmd("GET").arg(format!("{p}video:detail:v2")).query_async(&mut conn).await.unwrap();
    let _: () = redis::pipe()
        .cmd("DEL")
        .arg(format!("{p}category:by-id:c1"))
        .cmd("SET")
        .arg(format!("{p}video:detail:v2"))
        .arg(detail.replace("Legacy", "Edited"))
        .arg("EX")
        .arg(100)
        .cmd("SADD")
        .arg(format!("{p}video:categories:v1"))
        .arg("c9")
        .cmd("PERSIST")
        .arg(format!("{p}tag:all"))
        .cmd("SET")
        .arg(format!("{p}video:detail:orphan"))
        .arg("{}")
        .cmd("DEL")
        .arg(format!("{p}tag:list:c1"))
        .cmd("SET")
        .arg(format!("{p}tag:list:c1"))
        .arg("not a list")
        .query_async(&mut conn)
        .await
        .unwrap();
    let drift = verify::verify(&cfg, verify::VerifyOptions::all(FamilySet::all()), &Progress::hidden()).await.unwrap();
    assert!(!drift.ok());
    let family = |n: &str| drift.families.iter().find(|f| f.family == n).unwrap().clone();
    assert_eq!(family("category:by-id").missing, 1);
    assert_eq!(family("video:detail").wrong_value, 1);
    assert_eq!(family("video:detail").extra, 1);
    assert_eq!(family("video:categories").wrong_value, 1);
    assert_eq!(family("tag:all").no_ttl, 1);
    assert_eq!(family("tag:list").wrong_type, 1);
    let text = drift.render();
    assert!(text.contains("wrong value") && text.contains("Edited"), "{text}");

    // A draw as large as every family finds the same; a draw of one key
    // per family compares one key of each (extras are judged by name,
    // all of them).
    let opts = |sample| verify::VerifyOptions { families: FamilySet::all(), show: 3, sample: Some(sample) };
    let whole = verify::verify(&cfg, opts(1_000_000), &Progress::hidden()).await.unwrap();
    assert_eq!(whole.render(), text, "a draw of every key is the full check");
    let one = verify::verify(&cfg, opts(1), &Progress::hidden()).await.unwrap();
    for f in &one.families {
        let full = drift.families.iter().find(|d| d.family == f.family).unwrap();
        assert_eq!(f.checked, full.checked.min(1), "{}", one.render());
        assert_eq!(f.extra, full.extra, "{}", one.render());
    }

    let only = verify::verify(
        &cfg,
        verify::VerifyOptions::all(cachewright::cli::parse_only(&["channel".into()]).unwrap()),
        &Progress::hidden(),
    )
    .await
    .unwrap();
    assert!(only.ok(), "{}", only.render());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_deletes_only_registered_keys_under_the_old_prefix() {
    purge_deletes_only_registered_keys(Setup::OneNode).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_on_a_cluster_deletes_only_registered_keys_under_the_old_prefix() {
    purge_deletes_only_registered_keys(Setup::Cluster).await;
}

async fn purge_deletes_only_registered_keys(setup: Setup) {
    let url = setup.redis_url();
    let name = common::unique("purge");
    let old = common::TestEnv::named(&name).redis(&url).config();
    common::load_fixtures(&old, &common::fixture_dir("edge-cases")).await;
    rebuild(&old, &all(), &Progress::hidden()).await.unwrap();
    // The new layout lives under a prefix nested in the old one.
    let new = common::TestEnv::named(&name)
        .redis(&url)
        .with(|raw| raw.prefix = Some(format!("{}v2:", old.prefix)))
        .status_prefix("cw-purge-test:")
        .config();
    rebuild(&new, &all(), &Progress::hidden()).await.unwrap();
    let mut conn = common::redis_conn(&url).await;
    let unregistered = format!("{}session:abc", old.prefix);
    let _: () = redis::cmd("SET").arg(&unregistered).arg("1").query_async(&mut conn).await.unwrap();
    let before_new = common::dump(&url, &new.prefix).await;
    let old_count = common::dump(&url, &old.prefix).await.len() - before_new.len() - 1;

    let sink = cachewright::sink::Sink::connect(&old.redis()).await.unwrap();
    let dry = purge::purge(&sink, &old.prefix, true, &Progress::hidden()).await.unwrap();
    assert_eq!(dry.values().sum::<u64>() as usize, old_count);
    let counts = purge::purge(&sink, &old.prefix, false, &Progress::hidden()).await.unwrap();
    assert_eq!(counts.values().sum::<u64>() as usize, old_count);

    let left = common::dump(&url, &old.prefix).await;
    assert_eq!(left.len(), before_new.len() + 1, "only the new prefix and the unregistered key remain");
    assert!(left.contains_key(&unregistered));
    // Same keys and contents (TTLs tick on, so they are left out).
    let contents = |d: &std::collections::BTreeMap<String, (common::render::Content, i64)>| {
        d.iter().map(|(k, (c, _))| (k.clone(), c.clone())).collect::<Vec<_>>()
    };
    assert_eq!(contents(&common::dump(&url, &new.prefix).await), contents(&before_new));

    // The CLI refuses to purge the active prefix.
    let out = Command::new(env!("CARGO_BIN_EXE_cachewright"))
        .args(["purge", "--prefix", &new.prefix])
        .env("CACHEWRIGHT_PREFIX", &new.prefix)
        .env("REDIS_URL", &url)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("active data prefix"));
}
