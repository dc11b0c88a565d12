//! The watcher against real servers: random changes applied through change
//! streams must leave Redis exactly as a fresh full rebuild would (TTLs
//! aside), across crashes, server restarts and lost resume tokens.

mod common;

use cachewright::config::Config;
use cachewright::dev::generate::Rng;
use cachewright::progress::Progress;
use cachewright::rebuild::{RebuildOptions, rebuild};
use common::Setup;
use common::watcher::{start, start_streaming};
use mongodb::bson::{Bson, DateTime, Document, doc};
use std::time::Duration;

/// The watcher tests run one at a time: several watchers opening change
/// streams at once on one SecantusDB have been seen to stall it.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A watcher test's settings: data keys under `<prefix>:`, home sections
/// of 5 (ties and cut-offs are common in the generated data).
fn watch_env(name: &str, prefix: &str) -> common::TestEnv {
    common::TestEnv::named(name).prefix(prefix).home_limit(Some(5))
}

struct Data {
    db: mongodb::Database,
    rng: Rng,
    marker: u32,
}

const CATS: u64 = 14;
const TAGS: u64 = 40;

impl Data {
    fn cat(&mut self) -> Bson {
        Bson::String(format!("c{}", self.rng.below(CATS + 2)))
    }
    fn tag(&mut self) -> Bson {
        Bson::String(format!("t{}", self.rng.below(TAGS + 3)))
    }
    fn video_doc(&mut self) -> Document {
        let n_cats = self.rng.below(4);
        let cats: Vec<Bson> = (0..n_cats).map(|_| self.cat()).collect();
        let n_tags = self.rng.below(5);
        let tags: Vec<Bson> = (0..n_tags).map(|_| self.tag()).collect();
        let mut d = doc! { "title": format!("v{}", self.rng.below(1000)) };
        if self.rng.chance(0.15) {
            d.insert("categoryId", self.cat());
        } else {
            d.insert("categoryIds", cats);
        }
        d.insert("tagIds", tags);
        d.insert("listStatus", if self.rng.chance(0.85) { 1 } else { 0 });
        // Few distinct times, so ties in the lists are common.
        d.insert("addedTime", DateTime::from_millis(1_700_000_000_000 + self.rng.below(6) as i64 * 60_000));
        d
    }

    async fn seed(&mut self) {
        for name in ["Channel", "Category", "Tag", "VideoMedia"] {
            self.db.collection::<Document>(name).drop().await.unwrap();
        }
        let cats: Vec<Document> = (0..CATS)
            .map(|i| doc! {"_id": format!("c{i}"), "name": format!("cat {}", i % 5), "seq": (i % 3) as i32, "status": if i % 5 == 4 { 0 } else { 1 }})
            .collect();
        self.db.collection::<Document>("Category").insert_many(cats).await.unwrap();
        let mut tags = Vec::new();
        for i in 0..TAGS {
            let cat = self.cat();
            tags.push(doc! {"_id": format!("t{i}"), "name": format!("Tag {}", i % 7), "seq": (i % 4) as i32, "categoryId": cat, "status": if i % 9 == 8 { 0 } else { 1 }});
        }
        self.db.collection::<Document>("Tag").insert_many(tags).await.unwrap();
        let mut channels = Vec::new();
        for i in 0..4 {
            let refs: Vec<Bson> = (0..5).map(|_| Bson::Document(doc! {"id": self.cat()})).collect();
            let tag_refs: Vec<Bson> = (0..3).map(|_| Bson::Document(doc! {"id": self.tag()})).collect();
            channels.push(doc! {"_id": format!("ch{i}"), "name": format!("channel {i}"), "landingUrl": "u", "categories": refs, "tags": tag_refs});
        }
        self.db.collection::<Document>("Channel").insert_many(channels).await.unwrap();
        let videos: Vec<Document> = (0..150)
            .map(|i| {
                let mut d = self.video_doc();
                d.insert("_id", format!("v{i}"));
                d
            })
            .collect();
        self.db.collection::<Document>("VideoMedia").insert_many(videos).await.unwrap();
    }

    /// `n` random changes, one after another.
    async fn changes(&mut self, n: usize) {
        for _ in 0..n {
            self.change().await;
        }
    }

    /// One random insert, update, replace or delete in any collection.
    async fn change(&mut self) {
        let videos = self.db.collection::<Document>("VideoMedia");
        let v = format!("v{}", self.rng.below(170));
        match self.rng.below(15) {
            0..=3 => {
                let d = self.video_doc();
                videos.replace_one(doc! {"_id": &v}, d).upsert(true).await.unwrap();
            }
            4 => {
                videos.delete_one(doc! {"_id": &v}).await.unwrap();
            }
            5 | 6 => {
                let cats: Vec<Bson> = (0..self.rng.below(4)).map(|_| self.cat()).collect();
                let update = if self.rng.chance(0.2) {
                    doc! {"$set": {"categoryId": self.cat()}, "$unset": {"categoryIds": ""}}
                } else {
                    doc! {"$set": {"categoryIds": cats}, "$unset": {"categoryId": ""}}
                };
                videos.update_one(doc! {"_id": &v}, update).await.unwrap();
            }
            7 => {
                let status = if self.rng.chance(0.5) { 1 } else { 0 };
                let time = DateTime::from_millis(1_700_000_000_000 + self.rng.below(6) as i64 * 60_000);
                videos
                    .update_one(doc! {"_id": &v}, doc! {"$set": {"listStatus": status, "addedTime": time}})
                    .await
                    .unwrap();
            }
            8 => {
                let tags: Vec<Bson> = (0..self.rng.below(5)).map(|_| self.tag()).collect();
                videos.update_one(doc! {"_id": &v}, doc! {"$set": {"tagIds": tags}}).await.unwrap();
            }
            9 => {
                let c = format!("c{}", self.rng.below(CATS + 1));
                let update = match self.rng.below(3) {
                    0 => doc! {"$set": {"status": if self.rng.chance(0.5) { 1 } else { 0 }}},
                    1 => doc! {"$set": {"name": format!("renamed {}", self.rng.below(9))}},
                    _ => doc! {"$set": {"seq": self.rng.below(4) as i32}},
                };
                let categories = self.db.collection::<Document>("Category");
                if self.rng.chance(0.1) {
                    categories.delete_one(doc! {"_id": &c}).await.unwrap();
                } else {
                    let mut base = doc! {"name": "new", "seq": 1, "status": 1};
                    base.extend(update.get_document("$set").unwrap().clone());
                    categories.update_one(doc! {"_id": &c}, doc! {"$set": base}).upsert(true).await.unwrap();
                }
            }
            10 | 11 => {
                let t = format!("t{}", self.rng.below(TAGS + 1));
                let cat = self.cat();
                let update = match self.rng.below(3) {
                    0 => doc! {"$set": {"status": if self.rng.chance(0.6) { 1 } else { 0 }}},
                    1 => doc! {"$set": {"categoryId": cat}},
                    _ => doc! {"$set": {"name": format!("Renamed {}", self.rng.below(9))}},
                };
                let tags = self.db.collection::<Document>("Tag");
                if self.rng.chance(0.1) {
                    tags.delete_one(doc! {"_id": &t}).await.unwrap();
                } else {
                    let mut base = doc! {"name": "new tag", "seq": 2, "status": 1, "categoryId": "c1"};
                    base.extend(update.get_document("$set").unwrap().clone());
                    tags.update_one(doc! {"_id": &t}, doc! {"$set": base}).upsert(true).await.unwrap();
                }
            }
            14 => {
                // A bad document: no title. Rejected and skipped, as a
                // rebuild rejects it; its keys go away.
                let cats: Vec<Bson> = (0..2).map(|_| self.cat()).collect();
                videos
                    .replace_one(doc! {"_id": &v}, doc! {"listStatus": 1, "categoryIds": cats})
                    .upsert(true)
                    .await
                    .unwrap();
            }
            _ => {
                let ch = format!("ch{}", self.rng.below(5));
                let refs: Vec<Bson> = (0..self.rng.below(6)).map(|_| Bson::Document(doc! {"id": self.cat()})).collect();
                let tag_refs: Vec<Bson> =
                    (0..self.rng.below(4)).map(|_| Bson::Document(doc! {"id": self.tag()})).collect();
                self.db
                    .collection::<Document>("Channel")
                    .update_one(
                        doc! {"_id": &ch},
                        doc! {"$set": {"name": format!("channel {}", self.rng.below(9)), "landingUrl": "u", "categories": refs, "tags": tag_refs}},
                    )
                    .upsert(true)
                    .await
                    .unwrap();
            }
        }
    }

    /// [`Data::settle`] once the watcher streams, again until no rebuild
    /// began meanwhile. After a fault the watcher may notice that Redis
    /// changed only when the markers arrive; its rebuild then writes the
    /// markers too, and they would show before the rebuild's sweep ran.
    async fn settle_streaming(&mut self, watcher: &common::watcher::Watcher, redis: &str, prefix: &str) {
        use std::sync::atomic::Ordering::Relaxed;
        loop {
            common::wait_for("the watcher streaming", Duration::from_secs(60), || async {
                watcher.metrics.is_streaming()
            })
            .await;
            let rebuilds = watcher.metrics.rebuilds.load(Relaxed);
            self.settle(redis, prefix).await;
            if watcher.metrics.is_streaming() && watcher.metrics.rebuilds.load(Relaxed) == rebuilds {
                return;
            }
        }
    }

    /// Writes a marker into every collection and waits until the watcher
    /// applied all four: each stream is ordered, so everything before them
    /// is applied too.
    async fn settle(&mut self, redis: &str, prefix: &str) {
        self.write_markers().await;
        self.markers_applied(redis, prefix, Duration::from_secs(30), None).await
    }

    /// [`Self::settle`] with its own bound: after a MongoDB restart the
    /// driver's server selection alone may wait 30 s before the watcher's
    /// reconnection backoff starts, and a slow machine's restart takes
    /// longer still.
    ///
    /// The watcher is watched too: one that ended says how at once, and
    /// one that gives up says what its counters show.
    async fn settle_within(&mut self, watcher: &common::watcher::Watcher, redis: &str, prefix: &str, bound: Duration) {
        self.write_markers().await;
        self.markers_applied(redis, prefix, bound, Some(watcher)).await
    }

    /// One new marker document in every collection.
    async fn write_markers(&mut self) {
        self.marker += 1;
        let (cat, tag, ch, v) = marker_ids(self.marker);
        self.db
            .collection::<Document>("Category")
            .insert_one(doc! {"_id": &cat, "name": "marker", "seq": 9, "status": 1})
            .await
            .unwrap();
        self.db
            .collection::<Document>("Tag")
            .insert_one(doc! {"_id": &tag, "name": "marker", "seq": 9, "status": 1, "categoryId": &cat})
            .await
            .unwrap();
        self.db
            .collection::<Document>("Channel")
            .insert_one(doc! {"_id": &ch, "name": "marker", "landingUrl": "m"})
            .await
            .unwrap();
        self.db
            .collection::<Document>("VideoMedia")
            .insert_one(doc! {"_id": &v, "title": "marker", "categoryIds": [&cat], "tagIds": [&tag], "listStatus": 1})
            .await
            .unwrap();
    }

    /// Waits until the latest markers' keys exist.
    async fn markers_applied(
        &self,
        redis: &str,
        prefix: &str,
        bound: Duration,
        watcher: Option<&common::watcher::Watcher>,
    ) {
        let (cat, tag, ch, v) = marker_ids(self.marker);
        let wanted = [
            format!("{prefix}:category:by-id:{cat}"),
            format!("{prefix}:video:tag:list:{cat}:{tag}"),
            format!("{prefix}:channel:by-id:{ch}"),
            format!("{prefix}:video:detail:{v}"),
        ];
        let mut conn = common::redis_conn(redis).await;
        // One EXISTS per key: on a cluster the keys live in different slots.
        let mut exists = redis::pipe();
        for key in &wanted {
            exists.cmd("EXISTS").arg(key);
        }
        let applied = common::wait_for("the markers", Duration::MAX, || {
            let (exists, mut conn, n) = (&exists, conn.clone(), wanted.len());
            if let Some(ended) = watcher.and_then(|w| w.ended()) {
                panic!("the watcher ended before it applied the markers: {ended}");
            }
            async move { exists.query_async::<Vec<usize>>(&mut conn).await.unwrap().iter().sum::<usize>() == n }
        });
        if tokio::time::timeout(bound, applied).await.is_ok() {
            return;
        }
        let mut missing = Vec::new();
        for key in &wanted {
            let n: usize = redis::cmd("EXISTS").arg(key).query_async(&mut conn).await.unwrap();
            if n == 0 {
                missing.push(key.clone());
            }
        }
        let report = watcher.map(|w| w.report()).unwrap_or_default();
        panic!("the watcher did not apply the markers within {bound:?}: missing {missing:?}; watcher: {report}");
    }
}

/// The ids of the `m`th markers: category, tag, channel, video.
fn marker_ids(m: u32) -> (String, String, String, String) {
    (format!("mc{m}"), format!("mt{m}"), format!("mch{m}"), format!("mv{m}"))
}

/// Rebuilds into a second prefix and compares every key (TTLs aside).
async fn assert_same_as_rebuild(mongo: &str, redis: &str, name: &str, prefix: &str, seed: u64) {
    let fresh_prefix = format!("{prefix}f");
    let fresh = watch_env(name, &fresh_prefix).mongo(mongo).redis(redis).config();
    rebuild(&fresh, &RebuildOptions::full(), &Progress::hidden()).await.expect("reference rebuild");
    let watched = common::render_dump(&common::dump(redis, &format!("{prefix}:")).await, &format!("{prefix}:"));
    let expected =
        common::render_dump(&common::dump(redis, &format!("{fresh_prefix}:")).await, &format!("{fresh_prefix}:"));
    // The watched prefix is a prefix of the fresh one's; drop those keys.
    let watched: String = watched.split_inclusive('\n').collect::<Vec<_>>().join("");
    if watched != expected {
        let diff = similar::TextDiff::from_lines(&expected, &watched);
        panic!(
            "seed {seed}: watched keys differ from a fresh rebuild (- rebuild, + watcher):\n{}",
            diff.unified_diff().context_radius(1)
        );
    }
    // Remove the reference so later comparisons start clean.
    let mut conn = common::redis_conn(redis).await;
    let mut pipe = redis::pipe();
    for key in common::dump(redis, &format!("{fresh_prefix}:")).await.into_keys() {
        pipe.cmd("DEL").arg(key).ignore();
    }
    let _: () = pipe.query_async(&mut conn).await.unwrap();
}

async fn data(cfg: &Config, seed: u64) -> Data {
    let source = cachewright::source::Source::connect(&cfg.mongo()).await.unwrap();
    Data { db: source.database().clone(), rng: Rng::new(seed), marker: 0 }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_changes_through_the_watcher_equal_a_full_rebuild() {
    random_changes_equal_a_full_rebuild(Setup::OneNode, 1..=20).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_changes_through_the_watcher_on_a_cluster_equal_a_full_rebuild() {
    random_changes_equal_a_full_rebuild(Setup::Cluster, 101..=108).await;
}

async fn random_changes_equal_a_full_rebuild(setup: Setup, seeds: std::ops::RangeInclusive<u64>) {
    let _serial = SERIAL.lock().await;
    let s = common::shared();
    let url = setup.redis_url();
    for seed in seeds {
        let name = common::unique("watchdiff");
        let prefix = format!("w{name}");
        let mut cfg = watch_env(&name, &prefix).redis(&url).config();
        // Two seeds in three load the watcher's state over `_id` ranges
        // (the judge below reads in natural order).
        cfg.read_cursors = [1, 2, 3][seed as usize % 3];
        let mut d = data(&cfg, seed).await;
        d.seed().await;
        if cfg.read_cursors > 1 {
            // ObjectId ids (the driver's) for the ranges to cut.
            let extra: Vec<Document> = (0..60).map(|_| d.video_doc()).collect();
            d.db.collection::<Document>("VideoMedia").insert_many(extra).await.unwrap();
            let source = cachewright::source::Source::connect(&cfg.mongo()).await.unwrap();
            let plan = source.plan_video_read("VideoMedia", cfg.read_cursors).await.unwrap();
            assert!(matches!(plan, cachewright::source::ranges::VideoRead::Ranges(_)), "seed {seed}: {plan:?}");
        }
        // Streaming before the first change, so the changes arrive as
        // events (not folded into the start-up rebuild).
        let watcher = start_streaming(&cfg).await;
        d.changes(120).await;
        d.settle(&url, &prefix).await;
        let metrics = watcher.stop().await;
        assert!(metrics.total_applied() >= 40, "seed {seed}: {} events", metrics.total_applied());
        // Applying and planning those events took CPU, and it was counted.
        assert!(metrics.state_cpu_us.load(std::sync::atomic::Ordering::Relaxed) > 0, "seed {seed}: no state CPU");
        assert_same_as_rebuild(&s.mongo.uri(), &url, &name, &prefix, seed).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watcher_on_a_cluster_misses_nothing_while_thousands_of_slots_move() {
    let _serial = SERIAL.lock().await;
    let s = common::shared();
    let url = Setup::Cluster.redis_url();
    let name = common::unique("watchreshard");
    let prefix = format!("w{name}");
    let cfg = watch_env(&name, &prefix).redis(&url).config();
    let mut d = data(&cfg, 77).await;
    d.seed().await;
    let watcher = start_streaming(&cfg).await;
    // Changes keep coming for as long as the slots move, and at least 200.
    let mut reshard = common::start_resharding(1, 2, 4000);
    let mut changes = 0;
    while changes < 200 || reshard.try_wait().expect("reshard runs").is_none() {
        d.change().await;
        changes += 1;
    }
    common::finish_resharding(reshard);
    d.settle(&url, &prefix).await;
    let metrics = watcher.stop().await;
    assert!(metrics.total_applied() >= 100, "{} events", metrics.total_applied());
    assert_same_as_rebuild(&s.mongo.uri(), &url, &name, &prefix, 77).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_watcher_resumes_and_misses_nothing() {
    let _serial = SERIAL.lock().await;
    let s = common::shared();
    let name = common::unique("watchcrash");
    let prefix = format!("w{name}");
    let cfg = watch_env(&name, &prefix).config();
    let mut d = data(&cfg, 42).await;
    d.seed().await;
    let watcher = start_streaming(&cfg).await;
    d.changes(40).await;
    d.settle(&s.redis.url(), &prefix).await;
    // Killed in the middle of a stream of changes.
    d.changes(20).await;
    // Every stream has saved a token by now (idle ones within a second).
    let mut conn = common::redis_conn(&s.redis.url()).await;
    let keys: Vec<String> = ["Channel", "Category", "Tag", "VideoMedia"]
        .iter()
        .map(|c| common::env::status_keys(&cfg).cdc_resume(c))
        .collect();
    common::wait_for("every stream to save a token", Duration::from_secs(10), || {
        let (mut conn, keys) = (conn.clone(), keys.clone());
        async move { redis::cmd("EXISTS").arg(keys).query_async::<usize>(&mut conn).await.unwrap() == 4 }
    })
    .await;
    watcher.kill().await;
    d.changes(40).await;
    let watcher = start(&cfg);
    d.settle(&s.redis.url(), &prefix).await;
    let health: String =
        redis::cmd("GET").arg(common::env::status_keys(&cfg).health()).query_async(&mut conn).await.unwrap();
    let health: serde_json::Value = serde_json::from_str(&health).unwrap();
    assert_eq!(health["streaming"], true);
    assert!(health["events_applied"]["VideoMedia"].as_u64().unwrap() > 0);
    let ttl: i64 = redis::cmd("TTL").arg(common::env::status_keys(&cfg).health()).query_async(&mut conn).await.unwrap();
    assert!((1..=60).contains(&ttl));
    let metrics = watcher.stop().await;
    assert_eq!(metrics.rebuilds.load(std::sync::atomic::Ordering::Relaxed), 0, "resumed without a rebuild");
    assert_same_as_rebuild(&s.mongo.uri(), &s.redis.url(), &name, &prefix, 42).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unusable_resume_token_leads_to_a_rebuild_then_streaming() {
    let _serial = SERIAL.lock().await;
    let s = common::shared();
    let name = common::unique("watchlost");
    let prefix = format!("w{name}");
    let cfg = watch_env(&name, &prefix).config();
    let mut d = data(&cfg, 7).await;
    d.seed().await;
    let watcher = start(&cfg);
    d.settle(&s.redis.url(), &prefix).await;
    watcher.stop().await;
    let mut conn = common::redis_conn(&s.redis.url()).await;
    let _: () = redis::cmd("SET")
        .arg(common::env::status_keys(&cfg).cdc_resume("VideoMedia"))
        .arg(r#"{"_data":"00DEADBEEF"}"#)
        .query_async(&mut conn)
        .await
        .unwrap();
    d.changes(30).await;
    let watcher = start(&cfg);
    d.settle(&s.redis.url(), &prefix).await;
    d.changes(30).await;
    d.settle(&s.redis.url(), &prefix).await;
    let metrics = watcher.stop().await;
    assert_eq!(metrics.rebuilds.load(std::sync::atomic::Ordering::Relaxed), 1);
    assert_same_as_rebuild(&s.mongo.uri(), &s.redis.url(), &name, &prefix, 7).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watcher_survives_a_mongodb_restart() {
    let _serial = SERIAL.lock().await;
    let redis = &common::shared().redis;
    let mut mongo = common::servers::Mongo::start();
    let name = common::unique("watchrestart");
    let prefix = format!("w{name}");
    let cfg = watch_env(&name, &prefix).mongo(&mongo.uri()).redis(&redis.url()).config();
    let mut d = data(&cfg, 9).await;
    d.seed().await;
    let watcher = start(&cfg);
    d.changes(30).await;
    d.settle(&redis.url(), &prefix).await;
    mongo.restart();
    let mut d = data(&cfg, 10).await;
    d.marker = 100;
    d.changes(30).await;
    d.settle_within(&watcher, &redis.url(), &prefix, Duration::from_secs(150)).await;
    // A stream that fails before its first resume token makes the watcher
    // rebuild, and a rebuild writes the markers' keys before its sweep
    // removes what was deleted: the cache is only whole once the watcher
    // streams again with no rebuild under way (a CI run stopped it
    // between the two and found the deleted videos' keys).
    d.settle_streaming(&watcher, &redis.url(), &prefix).await;
    watcher.stop().await;
    assert_same_as_rebuild(&mongo.uri(), &redis.url(), &name, &prefix, 9).await;
}

/// A MongoDB that stops answering without closing its connections (a
/// paused process, a network that drops packets) holds the streams'
/// reads: the watcher notices, and its reopening while MongoDB stays
/// silent is retried from the saved tokens, never taken for a server
/// refusing a token (which would rebuild everything). Once MongoDB
/// answers again, what changed meanwhile is applied and nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_mongodb_is_reopened_from_the_tokens_without_a_rebuild() {
    use std::sync::atomic::Ordering::Relaxed;
    let _serial = SERIAL.lock().await;
    let s = common::shared();
    let proxy = common::proxy::Proxy::start(s.mongo.port).await;
    let name = common::unique("watchstall");
    let prefix = format!("w{name}");
    let cfg = watch_env(&name, &prefix).mongo(&proxy.mongo_uri()).config();
    // The test's own writes go straight to MongoDB: only the watcher's
    // connections are stalled.
    let mut d = data(&watch_env(&name, &prefix).config(), 13).await;
    d.seed().await;
    let watcher = start_streaming(&cfg).await;
    d.changes(20).await;
    d.settle(&s.redis.url(), &prefix).await;
    proxy.stall();
    d.changes(20).await;
    // The streams fail, and so does at least one reopening while the
    // stall lasts.
    common::wait_for("two stream failures while MongoDB is stalled", Duration::from_secs(120), || {
        assert!(watcher.ended().is_none(), "the watcher ended: {}", watcher.report());
        std::future::ready(watcher.metrics.stream_errors.load(Relaxed) >= 2)
    })
    .await;
    proxy.heal();
    d.settle_within(&watcher, &s.redis.url(), &prefix, Duration::from_secs(120)).await;
    let metrics = watcher.stop().await;
    assert_eq!(metrics.rebuilds.load(Relaxed), 1, "only the first start rebuilt");
    assert_same_as_rebuild(&s.mongo.uri(), &s.redis.url(), &name, &prefix, 13).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watcher_rebuilds_after_redis_loses_its_keys() {
    let _serial = SERIAL.lock().await;
    let mongo = &common::shared().mongo;
    let mut redis = common::servers::Redis::start();
    let name = common::unique("watchredis");
    let prefix = format!("w{name}");
    let cfg = watch_env(&name, &prefix).mongo(&mongo.uri()).redis(&redis.url()).config();
    let mut d = data(&cfg, 11).await;
    d.seed().await;
    let watcher = start_streaming(&cfg).await;
    d.changes(20).await;
    d.settle(&redis.url(), &prefix).await;
    redis.restart();
    // No change follows: the idle watcher still notices the new server
    // and rebuilds, rather than leaving the cache empty until the next
    // change (each stream reports its token every second, and every
    // batch, an empty one too, first asks which servers Redis runs on).
    let rebuilds = || watcher.metrics.rebuilds.load(std::sync::atomic::Ordering::Relaxed);
    common::wait_for("the idle watcher to rebuild into the restarted Redis", Duration::from_secs(60), || async {
        rebuilds() == 2 && watcher.metrics.is_streaming()
    })
    .await;
    common::assert_exact_at(&redis.url(), &cfg).await;
    d.changes(20).await;
    d.settle_streaming(&watcher, &redis.url(), &prefix).await;
    let metrics = watcher.stop().await;
    assert_eq!(
        metrics.rebuilds.load(std::sync::atomic::Ordering::Relaxed),
        2,
        "initial rebuild and one after the restart"
    );
    assert_same_as_rebuild(&mongo.uri(), &redis.url(), &name, &prefix, 11).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_to_redis_longer_than_the_retries_loses_nothing() {
    let _serial = SERIAL.lock().await;
    let s = common::shared();
    let proxy = common::proxy::Proxy::start(s.redis.port).await;
    let name = common::unique("watchcut");
    let prefix = format!("w{name}");
    let cfg = watch_env(&name, &prefix).redis(&proxy.redis_url()).config();
    let mut d = data(&cfg, 7).await;
    d.seed().await;
    let watcher = start_streaming(&cfg).await;
    d.changes(30).await;
    d.settle(&s.redis.url(), &prefix).await;

    // Redis keeps running with its data; the watcher's connections drop
    // and new ones are refused until a batch has failed for good.
    proxy.cut(true);
    d.changes(30).await;
    let failed = || watcher.metrics.failed_batches.load(std::sync::atomic::Ordering::Relaxed);
    common::wait_for("a batch to fail during the cut (the fault injected)", Duration::from_secs(30), || async {
        failed() > 0
    })
    .await;
    d.changes(10).await;
    proxy.heal();
    d.changes(30).await;
    d.settle(&s.redis.url(), &prefix).await;
    watcher.stop().await;
    assert_same_as_rebuild(&s.mongo.uri(), &s.redis.url(), &name, &prefix, 7).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deletes_while_the_watcher_is_killed_are_removed_after_it_restarts() {
    let _serial = SERIAL.lock().await;
    let s = common::shared();
    let name = common::unique("watchdel");
    let prefix = format!("w{name}");
    let cfg = watch_env(&name, &prefix).config();
    let mut d = data(&cfg, 9).await;
    d.seed().await;
    // A key under the prefix whose name is not UTF-8: skipped, never
    // touched, and it breaks nothing.
    let mut conn = common::redis_conn(&s.redis.url()).await;
    let mut bad = format!("{prefix}:video:list:home:").into_bytes();
    bad.extend_from_slice(&[0xff, 0xfe]);
    let _: () = redis::cmd("SET").arg(&bad).arg("?").query_async(&mut conn).await.unwrap();
    let mut child = common::watcher::spawn_process(&cfg);
    d.changes(20).await;
    d.settle(&s.redis.url(), &prefix).await;
    common::watcher::process_streaming(&cfg, child.id()).await;
    let _ = std::process::Command::new("kill").args(["-9", &child.id().to_string()]).status();
    let _ = child.wait();

    // While it is down: a channel, a category, a tag and videos go.
    let db = &d.db;
    db.collection::<Document>("Channel").delete_one(doc! {"_id": "ch0"}).await.unwrap();
    db.collection::<Document>("Category").delete_one(doc! {"_id": "c1"}).await.unwrap();
    db.collection::<Document>("Tag").delete_many(doc! {"categoryId": "c2"}).await.unwrap();
    db.collection::<Document>("VideoMedia").delete_many(doc! {"categoryIds": "c3"}).await.unwrap();
    d.changes(10).await;
    let mut child = common::watcher::spawn_process(&cfg);
    common::watcher::process_streaming(&cfg, child.id()).await;
    d.settle(&s.redis.url(), &prefix).await;
    let _ = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let _ = child.wait();
    let home = format!("{prefix}:video:list:home:ch0:latest");
    let dump = common::dump(&s.redis.url(), &format!("{prefix}:")).await;
    assert!(!dump.contains_key(&home), "the deleted channel's home section stayed");
    let kept: bool = redis::cmd("EXISTS").arg(&bad).query_async(&mut conn).await.unwrap();
    assert!(kept, "a key no family can own is left alone");
    assert_same_as_rebuild(&s.mongo.uri(), &s.redis.url(), &name, &prefix, 9).await;
}

/// A `cachewright watch` process killed while a batch of its own is on
/// the wire: the proxy holds the transaction that writes a changed
/// video's detail, so the `kill -9` lands after the batch was sent and
/// before its reply, every time. A new process takes over, and only then
/// does the held transaction reach Redis: Redis refuses it (`EXEC`
/// answers nil, since the take-over raised the epoch the connection
/// watches), and the successor's catch-up leaves the cache equal to a
/// fresh rebuild.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_killed_with_a_batch_on_the_wire_lands_nothing_late() {
    let _serial = SERIAL.lock().await;
    let s = common::shared();
    let name = common::unique("watchwire");
    let prefix = format!("w{name}");
    let direct = watch_env(&name, &prefix).config();
    let mut d = data(&direct, 11).await;
    d.seed().await;
    let proxy = common::proxy::Proxy::start(s.redis.port).await;
    let proxied = Config { redis_url: proxy.redis_url(), ..direct.clone() };
    let mut child = common::watcher::spawn_process(&proxied);
    common::watcher::process_streaming(&direct, child.id()).await;

    let videos = d.db.collection::<Document>("VideoMedia");
    let video = videos.find_one(doc! {}).await.unwrap().expect("the data set has videos");
    let id = video.get("_id").cloned().expect("a video has an _id");
    // The new title travels only in the write of the video's detail (the
    // watcher's reads of the key before it name the key, not the title).
    let title = format!("held on the wire {name}");
    proxy.hold_on(title.as_bytes());
    videos.update_one(doc! {"_id": id}, doc! {"$set": {"title": &title}}).await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), proxy.wait_held()).await.expect("the batch's write was held");
    let _ = std::process::Command::new("kill").args(["-9", &child.id().to_string()]).status();
    let _ = child.wait();

    d.changes(10).await;
    let mut child = common::watcher::spawn_process(&proxied);
    common::watcher::process_streaming(&direct, child.id()).await;
    proxy.release_held();
    // `MULTI`'s `+OK`, a `+QUEUED` a command, then `EXEC`'s answer: the
    // only array among them (nil when refused).
    let exec = |replies: &[u8]| {
        let replies = String::from_utf8_lossy(replies).into_owned();
        replies.split("\r\n").find(|line| line.starts_with('*')).map(str::to_string)
    };
    common::wait_for("the held transaction's answer", Duration::from_secs(10), || {
        let answered = exec(&proxy.held_replies()).is_some();
        async move { answered }
    })
    .await;
    let replies = proxy.held_replies();
    assert_eq!(
        exec(&replies).as_deref(),
        Some("*-1"),
        "the dead process's transaction landed after the take-over: {:?}",
        String::from_utf8_lossy(&replies)
    );

    d.settle(&s.redis.url(), &prefix).await;
    let _ = std::process::Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    assert!(child.wait().unwrap().success(), "the successor stops cleanly on SIGTERM");
    assert_same_as_rebuild(&s.mongo.uri(), &s.redis.url(), &name, &prefix, 11).await;
}

/// The data keys each `MULTI`/`EXEC` of a MONITOR log wrote, per
/// transaction, for keys under `prefix`. Commands are grouped by the
/// client that sent them, between its `MULTI` and its `EXEC`.
fn transactions(lines: &[String], prefix: &str) -> Vec<std::collections::BTreeSet<String>> {
    let mut open: std::collections::HashMap<String, std::collections::BTreeSet<String>> = Default::default();
    let mut done = Vec::new();
    for line in lines {
        // `<time> [<db> <client>] "<COMMAND>" "<key>" …`
        let Some((client, rest)) = line.split_once(" [").and_then(|(_, r)| r.split_once("] ")) else { continue };
        let mut quoted = rest.split('"').skip(1).step_by(2);
        let command = quoted.next().unwrap_or_default().to_ascii_uppercase();
        match command.as_str() {
            "MULTI" => {
                open.insert(client.to_string(), Default::default());
            }
            "EXEC" => done.extend(open.remove(client)),
            _ => {
                if let (Some(keys), Some(key)) = (open.get_mut(client), quoted.next())
                    && key.starts_with(prefix)
                {
                    keys.insert(key.to_string());
                }
            }
        }
    }
    done
}

/// A backlog drained at once goes out in transactions bounded like the
/// rebuild's (here 4 keys each), the videos' own keys after what indexes
/// them; collections too big for one transaction (here above a budget of
/// 6,000) go through a stage renamed onto the key; and the cache still
/// equals a full rebuild.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_goes_out_in_short_transactions_and_equals_a_full_rebuild() {
    let _serial = SERIAL.lock().await;
    let s = common::shared();
    // A Redis of its own: MONITOR sees this test's commands only.
    let redis = common::servers::Redis::start();
    let name = common::unique("watchbacklog");
    let prefix = format!("w{name}");
    let mut cfg = watch_env(&name, &prefix).redis(&redis.url()).config();
    cfg.write_batch_ops = 4;
    cfg.write_batch_cost = 6_000;
    let mut d = data(&cfg, 31).await;
    d.seed().await;
    let watcher = start_streaming(&cfg).await;
    d.settle(&redis.url(), &prefix).await;
    watcher.stop().await;
    // The backlog: changes made while the watcher is stopped, replayed
    // from its tokens when it starts again.
    d.changes(150).await;
    let monitor = common::servers::Monitor::start(&redis);
    let watcher = start(&cfg);
    d.settle(&redis.url(), &prefix).await;
    let metrics = watcher.stop().await;
    let lines = monitor.stop();
    assert_eq!(metrics.rebuilds.load(std::sync::atomic::Ordering::Relaxed), 0, "resumed from the tokens");
    let written = transactions(&lines, &format!("{prefix}:"));
    let largest = written.iter().map(|keys| keys.len()).max().unwrap_or(0);
    assert!(largest <= 4, "a transaction wrote {largest} keys: {:?}", written.iter().max_by_key(|k| k.len()));
    let batches = metrics.batches.load(std::sync::atomic::Ordering::Relaxed);
    assert!(written.len() > 2 * batches as usize, "{} data transactions for {batches} batches", written.len());
    let stage = format!("\"{}stage:", cfg.status_prefix);
    let renames = lines.iter().filter(|l| l.contains("\"RENAME\"") && l.contains(&stage)).count();
    assert!(renames > 0, "no collection of the backlog went through a stage");
    assert_same_as_rebuild(&s.mongo.uri(), &redis.url(), &name, &prefix, 31).await;
    assert_eq!(common::count_keys(&redis.url(), &format!("{}stage:*", cfg.status_prefix)).await, 0);
}

/// Issue 21's first case: on a cluster, a category of 9,000 active
/// videos is renamed, turned off and on again. The rename rewrites its
/// catalogue keys only; the flips rewrite its members' categories. The
/// pending record names the category, never its videos, so no script
/// carries more than Lua can unpack; the tokens move past each change
/// and the cache equals a fresh rebuild. `RESTORE` is allowed, but a
/// cluster keeps patching the members' sets in its flip block.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_category_of_9000_videos_renamed_and_flipped_on_a_cluster_follows() {
    big_category_follows(Setup::Cluster, true).await;
}

/// The same on one node, where a flip's members travel as blocks of one
/// write script inside the transaction, and a member's set drifted
/// behind the watcher's back refuses the whole block
/// (`CACHEWRIGHT_RESTORE=false`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_category_of_9000_videos_renamed_and_flipped_on_one_node_follows() {
    big_category_follows(Setup::OneNode, false).await;
}

/// The same where the writer may `RESTORE` (the default user): each
/// flip writes its 9,000 members' sets whole, one `RESTORE` each, and a
/// set drifted behind the watcher's back is simply replaced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_category_of_9000_videos_flipped_where_restore_is_allowed_writes_its_members_sets_whole() {
    big_category_follows(Setup::OneNode, true).await;
}

/// How a flip's members' `video:categories` are written.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Sets {
    /// Patched behind their size guards: on a cluster, or with
    /// `CACHEWRIGHT_RESTORE=false`.
    Patched,
    /// Replaced whole by `RESTORE`, inside transactions on one node.
    Restored,
}

async fn big_category_follows(setup: Setup, restore: bool) {
    let sets = match (setup, restore) {
        (Setup::OneNode, true) => Sets::Restored,
        _ => Sets::Patched,
    };
    let _serial = SERIAL.lock().await;
    let s = common::shared();
    let url = setup.redis_url();
    let name = common::unique("watchbigcat");
    let prefix = format!("w{name}");
    let mut cfg = watch_env(&name, &prefix).redis(&url).config();
    cfg.redis_restore = restore;
    let mut d = data(&cfg, 21).await;
    d.seed().await;
    let categories = d.db.collection::<Document>("Category");
    categories.insert_one(doc! {"_id": "big", "name": "Big", "seq": 1, "status": 1}).await.unwrap();
    let videos: Vec<Document> = (0..9_000)
        .map(|i| doc! {"_id": format!("b{i}"), "title": "b", "categoryIds": ["big", "c1"], "listStatus": 1, "addedTime": DateTime::from_millis(1_700_000_000_000 + i)})
        .collect();
    d.db.collection::<Document>("VideoMedia").insert_many(videos).await.unwrap();
    let watcher = start_streaming(&cfg).await;
    d.settle(&url, &prefix).await;
    let token_key = format!("cw-{prefix}:cdc:resume:Category");
    let mut conn = common::redis_conn(&url).await;
    let before: Option<String> = redis::cmd("GET").arg(&token_key).query_async(&mut conn).await.unwrap();

    categories.update_one(doc! {"_id": "big"}, doc! {"$set": {"name": "Renamed"}}).await.unwrap();
    let by_id = format!("{prefix}:category:by-id:big");
    common::wait_for("the rename reached category:by-id", Duration::from_secs(60), || {
        let (url, by_id) = (url.clone(), by_id.clone());
        async move {
            let mut conn = common::redis_conn(&url).await;
            let value: Option<String> = redis::cmd("GET").arg(&by_id).query_async(&mut conn).await.unwrap();
            value.is_some_and(|v| v.contains("\"Renamed\""))
        }
    })
    .await;
    // On a cluster the tokens are saved right after the batch's writes,
    // not with them: wait for them too.
    common::wait_for("the Category token moved past the rename", Duration::from_secs(30), || {
        let (url, token_key, before) = (url.clone(), token_key.clone(), before.clone());
        async move {
            let mut conn = common::redis_conn(&url).await;
            let after: Option<String> = redis::cmd("GET").arg(&token_key).query_async(&mut conn).await.unwrap();
            after.is_some() && after != before
        }
    })
    .await;

    // Each flip patches the 9,000 members' `video:categories` in place
    // (`SREM big`, then `SADD big`). The markers' keys may land before
    // their batch has saved its tokens and counted its patches (three
    // CI runs read 0 there): the count is read once that batch ended.
    use std::sync::atomic::Ordering::Relaxed;
    let m = &watcher.metrics;
    let rebuilds = m.rebuilds.load(Relaxed);
    for status in [0, 1] {
        let patched = m.patched_keys.load(Relaxed);
        let restored = common::command_calls(&url, "restore").await;
        categories.update_one(doc! {"_id": "big"}, doc! {"$set": {"status": status}}).await.unwrap();
        d.settle(&url, &prefix).await;
        watcher.end_of_round().await;
        let n = m.patched_keys.load(Relaxed) - patched;
        let whole = common::command_calls(&url, "restore").await - restored;
        let heartbeat = m.heartbeat();
        match sets {
            // (Other tests' rebuilds may `RESTORE` on this Redis meanwhile.)
            Sets::Patched => {
                assert!(n >= 9_000, "{setup:?}: {n} keys patched by the flip to {status}; the watcher: {heartbeat}");
            }
            // Off, each member keeps `c1`: its set is written whole too.
            Sets::Restored => {
                assert!(whole >= 9_000, "{setup:?}: {whole} sets restored by the flip to {status}: {heartbeat}");
                assert!(n < 9_000, "{setup:?}: {n} keys patched by the flip to {status}: {heartbeat}");
            }
        }
    }
    assert_eq!(m.failed_batches.load(Relaxed), 0, "no batch failed");
    assert_eq!(m.rebuilds.load(Relaxed), rebuilds, "no rebuild");
    assert_same_as_rebuild(&s.mongo.uri(), &url, &name, &prefix, 21).await;

    // A member's set gains a stray id behind the watcher's back. Patched,
    // the next flip's patch of it is refused by its size guard, the batch
    // is taken back and replayed with the key replaced whole; restored,
    // the flip replaces the set and nothing is refused.
    let stray_key = format!("{prefix}:video:categories:b5");
    let _: usize = redis::cmd("SADD").arg(&stray_key).arg("stray").query_async(&mut conn).await.unwrap();
    categories.update_one(doc! {"_id": "big"}, doc! {"$set": {"status": 0}}).await.unwrap();
    d.settle(&url, &prefix).await;
    let metrics = watcher.stop().await;
    let failed = metrics.failed_batches.load(Relaxed);
    match sets {
        Sets::Patched => assert!(failed >= 1, "{setup:?}: the drifted set's patch was refused"),
        Sets::Restored => assert_eq!(failed, 0, "{setup:?}: the drifted set was replaced"),
    }
    assert_same_as_rebuild(&s.mongo.uri(), &url, &name, &prefix, 22).await;
}

/// Issue 21's backlog case: on the 3-master cluster, 3,000 changes of the
/// platform mix (uploads, deletes, category moves, status flips,
/// `addedTime` and tag changes, catalogue edits) made while the watcher
/// was stopped are applied from its tokens. The cache equals a fresh
/// rebuild, no batch failed, and MONITOR on every master shows no
/// command near Lua's unpack limit and no script beyond a bound that
/// follows the write budget, not the backlog.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_platform_backlog_on_a_cluster_stays_within_the_budget_and_equals_a_full_rebuild() {
    use cachewright::dev::change_mix::{Changes, Mix};
    let _serial = SERIAL.lock().await;
    let s = common::shared();
    let url = Setup::Cluster.redis_url();
    let name = common::unique("watchclbacklog");
    let prefix = format!("w{name}");
    let mut cfg = watch_env(&name, &prefix).redis(&url).config();
    cfg.write_batch_cost = 20_000;
    let mut d = data(&cfg, 41).await;
    d.seed().await;
    let videos = d.db.collection::<Document>("VideoMedia");
    let extra: Vec<Document> = (0..2_000)
        .map(|i| doc! {"_id": format!("p{i}"), "title": "p", "categoryIds": [format!("c{}", i % 4), format!("c{}", 5 + i % 3)], "tagIds": [format!("t{}", i % 6)], "listStatus": 1, "addedTime": DateTime::from_millis(1_700_000_000_000 + i)})
        .collect();
    videos.insert_many(extra).await.unwrap();
    let watcher = start_streaming(&cfg).await;
    d.settle(&url, &prefix).await;
    watcher.stop().await;

    let ids: Vec<Bson> = (0..2_000).map(|i| Bson::String(format!("p{i}"))).collect();
    let mut changes = Changes::new(&d.db, &cfg.collections, Mix::Platform, Some(22), ids).await.unwrap();
    for seq in 0..3_000 {
        changes.next(seq).send().await.unwrap();
    }
    let monitors: Vec<_> = {
        let cluster = common::shared_cluster().cluster.lock().unwrap();
        cluster.nodes.iter().map(common::servers::Monitor::start).collect()
    };
    let watcher = start(&cfg);
    d.settle(&url, &prefix).await;
    let metrics = watcher.stop().await;
    let lines: Vec<String> = monitors.into_iter().flat_map(|m| m.stop()).collect();
    assert_eq!(metrics.rebuilds.load(std::sync::atomic::Ordering::Relaxed), 0, "resumed from the tokens");
    assert_eq!(metrics.failed_batches.load(std::sync::atomic::Ordering::Relaxed), 0, "no batch failed");
    // This test's commands: its data and status keys both name `prefix`.
    let ours: Vec<&String> = lines.iter().filter(|l| l.contains(&prefix)).collect();
    assert!(ours.len() > 100, "MONITOR saw the backlog's writes ({} lines)", ours.len());
    // `<time> [<db> <client>] "<COMMAND>" "<arg>" …`: quoted arguments.
    let args = |line: &str| line.split_once("] ").map_or(0, |(_, rest)| rest.split("\" \"").count());
    let widest = ours.iter().map(|l| args(l)).max().unwrap_or(0);
    assert!(widest < 7_999, "a command carried {widest} arguments, past what Lua can unpack");
    // A script carries one unit: a quarter of `write_batch_cost`, or one
    // value above it alone (a detail here is well under 4 KB).
    let bound = cfg.write_batch_cost / cachewright::sink::cluster::SCRIPT_BUDGET_DIVISOR + 4_096;
    let scripts: Vec<&&String> = ours.iter().filter(|l| l.contains("\"EVAL")).collect();
    assert!(!scripts.is_empty(), "the cluster's writes go out as scripts");
    for line in scripts {
        // The arguments after the script body (its first argument).
        let carried = line.split_once("] ").map(|(_, r)| r.split("\" \"").skip(2).map(str::len).sum::<usize>());
        let carried = carried.unwrap_or(0);
        assert!(carried <= 2 * bound, "a script carried {carried} bytes of arguments (bound {bound}): {line:.300}");
    }
    assert_same_as_rebuild(&s.mongo.uri(), &url, &name, &prefix, 41).await;
}

/// A set patch on real Redis, one node and the cluster: `SADD` of the
/// members a video joins and `SREM` of those it leaves land behind the
/// size guard with the key's TTL; an `SADD` of a member already there or
/// an `SREM` of one missing is refused as drift, and so is a key of
/// another size. One member flipped in many sets (a category turned
/// active or inactive) travels as one block of the write script, guarded
/// the same way. A list's items are removed from either end, guarded
/// alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_patches_are_guarded_on_one_node_and_on_the_cluster() {
    use cachewright::plan::Change;
    use cachewright::plan::patch::{Edit, Patch};
    use cachewright::registry::FamilyId;
    for setup in [Setup::OneNode, Setup::Cluster] {
        let name = common::unique("setpatch");
        let cfg = watch_env(&name, &format!("w{name}")).redis(&setup.redis_url()).config();
        let sink = cachewright::sink::Sink::connect(&cfg.redis()).await.unwrap();
        let key = cachewright::keys::Keys::new(format!("w{name}:")).key(FamilyId::VideoCategories, &["v1"]);
        let mut conn = common::redis_conn(&setup.redis_url()).await;
        let _: usize = redis::cmd("SADD").arg(&key.text).arg("a").arg("b").query_async(&mut conn).await.unwrap();
        let patch = |before, edits| vec![Change::Patch(Patch::new(key.clone(), before, edits, 0))];
        let members = |conn: &mut cachewright::sink::RedisConn| {
            let key = key.text.clone();
            let mut conn = conn.clone();
            async move {
                let mut m: Vec<String> = redis::cmd("SMEMBERS").arg(&key).query_async(&mut conn).await.unwrap();
                m.sort();
                m
            }
        };

        sink.apply_changes(&patch(2, vec![Edit::SAdd("c".into()), Edit::SRem("a".into())])).await.unwrap();
        assert_eq!(members(&mut conn).await, ["b", "c"], "{setup:?}");
        let ttl: i64 = redis::cmd("TTL").arg(&key.text).query_async(&mut conn).await.unwrap();
        assert!(ttl > 0, "{setup:?}: the patched key has its TTL ({ttl})");
        for (before, edit) in [(2, Edit::SAdd("b".into())), (2, Edit::SRem("z".into())), (3, Edit::SAdd("d".into()))] {
            let err = sink.apply_changes(&patch(before, vec![edit.clone()])).await.unwrap_err();
            assert!(err.is_drift(), "{setup:?}: {edit:?} from {before} members: {err}");
        }
        assert_eq!(members(&mut conn).await, ["b", "c"], "{setup:?}: a refused patch changed nothing");

        // One member flipped in many sets goes as one block of the write
        // script (`FLIPS`): every key's guard is checked before any key
        // changes, then each key gets its edit and its TTL.
        let keys: Vec<_> = (1..=4)
            .map(|i| {
                cachewright::keys::Keys::new(format!("w{name}:")).key(FamilyId::VideoCategories, &[&format!("f{i}")])
            })
            .collect();
        for (i, key) in keys.iter().enumerate() {
            let members: Vec<String> = (0..=i).map(|m| format!("m{m}")).collect();
            let _: usize = redis::cmd("SADD").arg(&key.text).arg(&members).query_async(&mut conn).await.unwrap();
        }
        let flips = |sizes: [usize; 4], edit: Edit| -> Vec<Change> {
            keys.iter()
                .zip(sizes)
                .map(|(k, n)| Change::Patch(Patch::new(k.clone(), n, vec![edit.clone()], 0)))
                .collect()
        };
        let cards = |conn: &cachewright::sink::RedisConn| {
            let (keys, mut conn) = (keys.clone(), conn.clone());
            async move {
                let mut out = Vec::new();
                for key in &keys {
                    let n: usize = redis::cmd("SCARD").arg(&key.text).query_async(&mut conn).await.unwrap();
                    out.push(n);
                }
                out
            }
        };
        sink.apply_changes(&flips([1, 2, 3, 4], Edit::SAdd("new".into()))).await.unwrap();
        assert_eq!(cards(&conn).await, [2, 3, 4, 5], "{setup:?}");
        sink.apply_changes(&flips([2, 3, 4, 5], Edit::SRem("m0".into()))).await.unwrap();
        assert_eq!(cards(&conn).await, [1, 2, 3, 4], "{setup:?}");
        for key in &keys {
            let ttl: i64 = redis::cmd("TTL").arg(&key.text).query_async(&mut conn).await.unwrap();
            assert!(ttl > 0, "{setup:?}: a flipped key has its TTL ({ttl})");
            let has: bool = redis::cmd("SISMEMBER").arg(&key.text).arg("new").query_async(&mut conn).await.unwrap();
            assert!(has, "{setup:?}: {}", key.text);
        }
        // A block with one key of another size is refused: on one node
        // whole (one script); on the cluster that key's slot refuses,
        // since each slot is its own atomic unit there.
        let err = sink.apply_changes(&flips([1, 2, 3, 5], Edit::SRem("new".into()))).await.unwrap_err();
        assert!(err.is_drift(), "{setup:?}: a block with one key of another size: {err}");
        let after = cards(&conn).await;
        match setup {
            Setup::OneNode => assert_eq!(after, [1, 2, 3, 4], "a refused block changed no key"),
            Setup::Cluster => assert_eq!(after[3], 4, "the drifted key's slot refused its edit"),
        }
        let err = sink.apply_changes(&flips([1, 2, 3, 4], Edit::SRem("m1".into()))).await.unwrap_err();
        assert!(err.is_drift(), "{setup:?}: the first set never held m1: {err}");

        // A list's items go from either end (`LREM key 1` from the head,
        // `LREM key -1` from the tail), each guarded: a missing item is
        // drift (here the first edit, so nothing ran before it).
        let list = cachewright::keys::Keys::new(format!("w{name}:")).key(FamilyId::VideoCategoryList, &["c1"]);
        let _: usize =
            redis::cmd("RPUSH").arg(&list.text).arg(&["a", "b", "c", "d", "e"]).query_async(&mut conn).await.unwrap();
        let list_patch = |before, edits| vec![Change::Patch(Patch::new(list.clone(), before, edits, 0))];
        let items = |conn: &cachewright::sink::RedisConn| {
            let (key, mut conn) = (list.text.clone(), conn.clone());
            async move { redis::cmd("LRANGE").arg(&key).arg(0).arg(-1).query_async::<Vec<String>>(&mut conn).await.unwrap() }
        };
        sink.apply_changes(&list_patch(5, vec![Edit::LRemLast("d".into()), Edit::LRem("b".into())])).await.unwrap();
        assert_eq!(items(&conn).await, ["a", "c", "e"], "{setup:?}");
        let ttl: i64 = redis::cmd("TTL").arg(&list.text).query_async(&mut conn).await.unwrap();
        assert!(ttl > 0, "{setup:?}: the patched list has its TTL ({ttl})");
        let err = sink
            .apply_changes(&list_patch(3, vec![Edit::LRemLast("z".into()), Edit::LRem("a".into())]))
            .await
            .unwrap_err();
        assert!(err.is_drift(), "{setup:?}: the list never held z: {err}");
        assert_eq!(items(&conn).await, ["a", "c", "e"], "{setup:?}: a refused list patch changed nothing");
    }
}

/// Patches, on one node and on the cluster: once the watcher wrote a
/// category's keys, later uploads into it change them in place (counted
/// on `patched_keys`) and the cache equals a fresh rebuild. A burst of
/// uploads then moves more members than one atomic unit carries: the
/// patches go in steps (counted on `patch_steps`), each guarded by the
/// size the one before left, and the cache equals a fresh rebuild. Then
/// the category's list loses a member behind the watcher's back (an eviction,
/// a stray client): the next patch's size guard refuses it, the batch is
/// taken back and replayed with the key replaced whole, and the cache
/// equals a fresh rebuild again. A channel's home section, patched from
/// what it listed, goes the same way when it loses a member behind the
/// watcher's back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_patch_known_keys_and_a_drifted_key_is_replaced_whole() {
    for setup in [Setup::OneNode, Setup::Cluster] {
        patches_and_drift(setup).await;
    }
}

async fn patches_and_drift(setup: Setup) {
    let _serial = SERIAL.lock().await;
    let s = common::shared();
    let url = setup.redis_url();
    let name = common::unique("watchpatch");
    let prefix = format!("w{name}");
    let mut cfg = watch_env(&name, &prefix).redis(&url).config();
    // An atomic unit of 6,000 (a cluster's script gets a quarter): a
    // sorted-set edit costs about 1,200 and a step's key 2,000, so a batch
    // that moves more than three members of a category patches it in steps.
    cfg.write_batch_cost = match setup {
        Setup::OneNode => 6_000,
        Setup::Cluster => 24_000,
    };
    let mut d = data(&cfg, 51).await;
    d.seed().await;
    d.db.collection::<Document>("Category")
        .insert_one(doc! {"_id": "pc", "name": "Patched", "seq": 1, "status": 1})
        .await
        .unwrap();
    d.db.collection::<Document>("Tag")
        .insert_one(doc! {"_id": "pt", "name": "Patched", "seq": 1, "status": 1, "categoryId": "pc"})
        .await
        .unwrap();
    // A channel that reads only that category: its home section lists
    // the newest five of its videos (the tests' home limit).
    d.db.collection::<Document>("Channel")
        .insert_one(doc! {"_id": "pch", "name": "Patched", "landingUrl": "p", "categories": [{"id": "pc"}]})
        .await
        .unwrap();
    let videos = d.db.collection::<Document>("VideoMedia");
    let upload = |i: i64| doc! {"_id": format!("p{i}"), "title": "p", "categoryIds": ["pc"], "tagIds": ["pt"], "listStatus": 1, "addedTime": DateTime::from_millis(1_700_000_000_000 + i * 1000)};
    videos.insert_many((0..60).map(upload)).await.unwrap();
    let watcher = start_streaming(&cfg).await;
    d.settle(&url, &prefix).await;
    let detail_of = |id: &str| format!("{prefix}:video:detail:{id}");
    let applied = |key: String| {
        let url = url.clone();
        async move {
            common::wait_for("the upload was applied", Duration::from_secs(60), || {
                let (url, key) = (url.clone(), key.clone());
                async move {
                    let mut conn = common::redis_conn(&url).await;
                    redis::cmd("EXISTS").arg(&key).query_async::<usize>(&mut conn).await.unwrap() == 1
                }
            })
            .await
        }
    };
    // Once caught up, the watcher counts the index keys whose size is the
    // state's as known: every upload (new, old and in between) is a patch
    // of the category's index and list and the tag's list, and its own
    // `video:categories` is a patch of the (empty) key it read. The
    // second is also a patch of the channel's home section (one in, the
    // oldest of five out): the first batch merged it (nothing listed yet
    // since the load), and the older uploads leave it as it is.
    let patched = || watcher.metrics.patched_keys.load(std::sync::atomic::Ordering::Relaxed);
    for (i, id) in [(100, "p100"), (101, "p101"), (-5, "p-5"), (30, "p30b")].into_iter().enumerate() {
        let mut doc = upload(id.0);
        doc.insert("_id", id.1);
        videos.insert_one(doc).await.unwrap();
        applied(detail_of(id.1)).await;
        // The count moves just after the batch's last write lands. Its
        // fourth patch is the upload's own `video:categories`.
        let wanted = [4, 9, 13, 17][i];
        common::wait_for(&format!("upload {i} patched {wanted} keys"), Duration::from_secs(10), || async move {
            patched() >= wanted
        })
        .await;
    }
    videos.delete_one(doc! {"_id": "p7"}).await.unwrap();
    videos
        .update_one(doc! {"_id": "p8"}, doc! {"$set": {"addedTime": DateTime::from_millis(1_800_000_000_000i64)}})
        .await
        .unwrap();
    d.settle(&url, &prefix).await;
    assert_eq!(watcher.metrics.failed_batches.load(std::sync::atomic::Ordering::Relaxed), 0);
    assert_same_as_rebuild(&s.mongo.uri(), &url, &name, &prefix, 51).await;

    // A burst: forty uploads between the members, in one command. A batch
    // carrying four or more of them patches in steps; the forty events
    // reach the watcher together (one command, one reply of the stream),
    // so at least one batch does.
    let steps = || watcher.metrics.patch_steps.load(std::sync::atomic::Ordering::Relaxed);
    let mut burst: Vec<Document> = (0..40).map(|i| upload(i * 3 + 1)).collect();
    burst.iter_mut().enumerate().for_each(|(i, doc)| drop(doc.insert("_id", format!("b{i}"))));
    videos.insert_many(burst).await.unwrap();
    applied(detail_of("b39")).await;
    d.settle(&url, &prefix).await;
    watcher.end_of_round().await;
    assert!(steps() > 0, "the burst's patches went in steps");
    assert_eq!(watcher.metrics.failed_batches.load(std::sync::atomic::Ordering::Relaxed), 0);
    assert_same_as_rebuild(&s.mongo.uri(), &url, &name, &prefix, 53).await;

    // The drift: the list loses its last member behind the watcher's back.
    let list = format!("{prefix}:video:category:list:pc");
    let mut conn = common::redis_conn(&url).await;
    let _: Option<String> = redis::cmd("RPOP").arg(&list).query_async(&mut conn).await.unwrap();
    videos.insert_one(upload(200)).await.unwrap();
    applied(detail_of("p200")).await;
    d.settle(&url, &prefix).await;
    let failed = || watcher.metrics.failed_batches.load(std::sync::atomic::Ordering::Relaxed);
    assert!(failed() >= 1, "the patch over the drifted list was refused");
    assert_same_as_rebuild(&s.mongo.uri(), &url, &name, &prefix, 52).await;

    // The same for the home section: once it is patched again, it loses
    // its oldest member behind the watcher's back. The next upload's patch
    // is refused, and the batch's replay writes the section whole.
    let home = format!("{prefix}:video:list:home:pch:latest");
    for (i, at) in [(0, 300), (1, 301)] {
        let before = patched();
        let mut doc = upload(at);
        doc.insert("_id", format!("h{i}"));
        videos.insert_one(doc).await.unwrap();
        applied(detail_of(&format!("h{i}"))).await;
        common::wait_for("the upload's batch landed", Duration::from_secs(10), || async move { patched() > before })
            .await;
    }
    let was = failed();
    let _: Vec<String> = redis::cmd("ZPOPMIN").arg(&home).query_async(&mut conn).await.unwrap();
    videos.insert_one(upload(400)).await.unwrap();
    applied(detail_of("p400")).await;
    d.settle(&url, &prefix).await;
    let metrics = watcher.stop().await;
    assert!(
        metrics.failed_batches.load(std::sync::atomic::Ordering::Relaxed) > was,
        "the patch over the drifted home section was refused"
    );
    assert_same_as_rebuild(&s.mongo.uri(), &url, &name, &prefix, 54).await;
}

/// A watcher streaming seeded data into a fresh 3-master cluster with a
/// replica each, settled.
struct ReplicatedWatch {
    cluster: common::servers::RedisCluster,
    url: String,
    name: String,
    prefix: String,
    d: Data,
    watcher: common::watcher::Watcher,
}

impl ReplicatedWatch {
    async fn start(name: &str, seed: u64) -> ReplicatedWatch {
        let cluster = tokio::task::block_in_place(common::servers::RedisCluster::start_with_replicas);
        let url = cluster.url();
        let name = common::unique(name);
        let prefix = format!("w{name}");
        let cfg = watch_env(&name, &prefix).redis(&url).config();
        let mut d = data(&cfg, seed).await;
        d.seed().await;
        let watcher = start_streaming(&cfg).await;
        d.settle(&url, &prefix).await;
        ReplicatedWatch { cluster, url, name, prefix, d, watcher }
    }
}

/// Issue 22's manual fail-over: on a 6-node cluster (3 masters with a
/// replica each), an operator runs `CLUSTER FAILOVER` on every replica,
/// one after the other, while changes keep arriving and the watcher
/// applies them. Each promotion shows as a new master `run_id`, so the
/// watcher redoes a rebuild and reloads; redirections and `READONLY` in
/// between are followed. Afterwards the cache equals a fresh rebuild.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fail_over_of_every_master_while_watching_leaves_the_cache_exact() {
    let _serial = SERIAL.lock().await;
    let s = common::shared();
    let ReplicatedWatch { cluster, url, name, prefix, mut d, watcher } =
        ReplicatedWatch::start("watchfailover", 61).await;

    // The three replicas, once each is in sync with its master.
    let replicas = tokio::task::block_in_place(|| cluster.synced_replicas(3));

    // Changes keep coming while every master fails over in turn; each
    // fail-over must see some arrive.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let changes = {
        let (stop, sent) = (stop.clone(), sent.clone());
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                d.change().await;
                sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            d
        })
    };
    let sent_so_far = || sent.load(std::sync::atomic::Ordering::Relaxed);
    for (port, _) in replicas {
        let before = sent_so_far();
        tokio::task::block_in_place(|| {
            cluster.promote(port, None);
            cluster.wait_ok();
        });
        // Changes go on across the fail-over: more arrive once it is over.
        let at_least = before + 1;
        common::wait_for("a change sent across the fail-over", Duration::from_secs(30), || async move {
            sent_so_far() > at_least
        })
        .await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut d = changes.await.unwrap();
    d.settle_streaming(&watcher, &url, &prefix).await;
    let metrics = watcher.stop().await;
    assert!(
        metrics.rebuilds.load(std::sync::atomic::Ordering::Relaxed) >= 1,
        "a promotion shows as a new run_id and the watcher redid a rebuild"
    );
    assert_same_as_rebuild(&s.mongo.uri(), &url, &name, &prefix, 61).await;
}

/// The lost write made certain on a cluster: a replica is cut off its
/// master (which goes on alone), the watcher's changes land on that
/// master until it holds a key its replica lacks, then the master is
/// paused, its replica takes over without it (`TAKEOVER`), and the old
/// master comes back as a replica of the new one and drops what it held.
/// The replaced master shows as a new `run_id`, so the watcher rebuilds;
/// afterwards the cache equals a fresh rebuild.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_master_replaced_with_writes_its_replica_never_got_is_followed_by_a_rebuild() {
    use std::sync::atomic::Ordering::Relaxed;
    let _serial = SERIAL.lock().await;
    let s = common::shared();
    let ReplicatedWatch { cluster, url, name, prefix, mut d, watcher } = ReplicatedWatch::start("watchlost", 62).await;

    let (replica, master) = tokio::task::block_in_place(|| cluster.synced_replicas(1))[0];
    tokio::task::block_in_place(|| cluster.detach_replica(replica, master));
    let pattern = format!("{prefix}:*");
    for round in 1.. {
        d.changes(20).await;
        d.settle(&url, &prefix).await;
        let (on_master, on_replica) = (cluster.keys_on(master, &pattern), cluster.keys_on(replica, &pattern));
        if on_master.difference(&on_replica).next().is_some() {
            break;
        }
        assert!(round < 10, "after {round} rounds of changes the master on {master} held no key its replica lacks");
    }
    let rebuilds = watcher.metrics.rebuilds.load(Relaxed);
    let old = cluster.nodes.iter().position(|n| n.port == master).unwrap();
    tokio::task::block_in_place(|| {
        common::signal(cluster.nodes[old].pid(), "-STOP");
        cluster.promote(replica, Some("TAKEOVER"));
        common::signal(cluster.nodes[old].pid(), "-CONT");
        cluster.wait_ok();
    });
    common::wait_for("the old master to come back as a replica", Duration::from_secs(60), || async {
        cluster.replication(master).contains("role:slave")
    })
    .await;
    d.changes(20).await;
    d.settle_streaming(&watcher, &url, &prefix).await;
    let metrics = watcher.stop().await;
    assert!(metrics.rebuilds.load(Relaxed) > rebuilds, "the replaced master shows as a new run_id: a rebuild");
    assert_same_as_rebuild(&s.mongo.uri(), &url, &name, &prefix, 62).await;
}

/// Issue 22's uncovered slot: a 3-master cluster without replicas and
/// with `cluster-require-full-coverage no`, one master stalled (SIGSTOP)
/// until the cluster flags it failed, so its slots have no master. New
/// videos keep arriving: those whose keys live on the other masters reach
/// Redis, the rest wait as deferred keys, and the watcher names the
/// uncovered slots (what `/health/ready` reports). Once the master runs
/// again (SIGCONT, with its data and `run_id`) the deferred keys are
/// written, without a rebuild, and the cache equals a fresh rebuild.
/// Then the same master is killed: the same holds while it is down, and
/// when it comes back empty (another `run_id`) the watcher rebuilds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncovered_slot_holds_back_only_its_own_keys() {
    use std::sync::atomic::Ordering::Relaxed;
    let _serial = SERIAL.lock().await;
    let s = common::shared();
    let base = common::unique("uncovered");
    let (mut down, cfg) =
        common::degraded::start(|i, url| watch_env(&format!("{base}{i}"), &format!("u{base}{i}")).redis(url).config())
            .await;
    let url = down.cluster.url();
    let (name, prefix) = (cfg.mongodb_db.clone(), cfg.prefix.trim_end_matches(':').to_string());
    let plain = common::redis_conn(&url).await;
    let mut d = data(&cfg, 71).await;
    d.seed().await;
    let watcher = start_streaming(&cfg).await;
    d.settle(&url, &prefix).await;
    let rebuilds = watcher.metrics.rebuilds.load(Relaxed);

    // The master stalls; the others flag it failed after the node timeout.
    common::signal(down.pid(), "-STOP");
    let videos = d.db.collection::<Document>("VideoMedia");
    let uploads = uploads_while_uncovered(&down, &videos, &plain, &prefix, 0..40);
    let held_back = uploads.await;
    common::wait_for("the held-back uploads are deferred", Duration::from_secs(30), || async {
        watcher.metrics.deferred_keys.load(Relaxed) >= held_back as u64
    })
    .await;
    let problem = watcher.metrics.coverage_problem().expect("the watcher reports the uncovered slots");
    assert!(problem.contains(&down.named()), "{problem}");
    assert!(watcher.metrics.is_streaming(), "the watcher goes on streaming");

    // The master runs again with its data: the deferred keys are written.
    common::signal(down.pid(), "-CONT");
    tokio::task::block_in_place(|| down.cluster.wait_ok());
    common::wait_for("the deferred keys are written", Duration::from_secs(60), || async {
        watcher.metrics.coverage_problem().is_none()
    })
    .await;
    d.settle_streaming(&watcher, &url, &prefix).await;
    assert_eq!(watcher.metrics.rebuilds.load(Relaxed), rebuilds, "the master kept its data: no rebuild");
    assert_same_as_rebuild(&s.mongo.uri(), &url, &name, &prefix, 71).await;

    // Killed now: while it is down the same holds; it comes back empty,
    // with another run_id, and the watcher rebuilds.
    common::signal(down.pid(), "-KILL");
    let uploads = uploads_while_uncovered(&down, &videos, &plain, &prefix, 40..80);
    let held_back = uploads.await;
    common::wait_for("the held-back uploads are deferred", Duration::from_secs(30), || async {
        watcher.metrics.deferred_keys.load(Relaxed) >= held_back as u64
    })
    .await;
    tokio::task::block_in_place(|| down.cluster.restart(down.node));
    common::wait_for("the watcher rebuilds after the restart", Duration::from_secs(60), || async {
        watcher.metrics.rebuilds.load(Relaxed) > rebuilds
    })
    .await;
    d.settle_streaming(&watcher, &url, &prefix).await;
    let metrics = watcher.stop().await;
    assert_eq!(metrics.deferred_keys.load(Relaxed), 0, "the rebuild wrote every key");
    assert_same_as_rebuild(&s.mongo.uri(), &url, &name, &prefix, 71).await;
}

/// Waits until the cluster flags the stopped master failed, uploads
/// videos `up{n}` for `n` in `range`, and waits until those whose detail
/// lives on the other masters are in Redis; gives how many live on the
/// stopped one.
async fn uploads_while_uncovered(
    down: &common::degraded::Degradable,
    videos: &mongodb::Collection<Document>,
    plain: &cachewright::sink::RedisConn,
    prefix: &str,
    range: std::ops::Range<usize>,
) -> usize {
    down.wait_flagged_failed().await;
    let ids: Vec<String> = range.map(|i| format!("up{i}")).collect();
    for id in &ids {
        let upload = doc! {"_id": id, "title": "uploaded while degraded", "categoryIds": ["c1"], "tagIds": ["t1"], "listStatus": 1};
        videos.insert_one(upload).await.unwrap();
    }
    let detail = |id: &str| format!("{prefix}:video:detail:{id}");
    let (held_back, reachable): (Vec<&String>, Vec<&String>) = ids.iter().partition(|id| down.on_stopped(&detail(id)));
    assert!(!held_back.is_empty() && !reachable.is_empty(), "the uploads span the stopped master and the others");
    common::wait_for("the uploads on covered slots reach Redis", Duration::from_secs(90), || {
        let (mut conn, keys) = (plain.clone(), reachable.iter().map(|id| detail(id)).collect::<Vec<_>>());
        async move {
            let mut found = 0;
            for key in &keys {
                found += redis::cmd("EXISTS").arg(key).query_async::<u64>(&mut conn).await.unwrap_or(0);
            }
            found == keys.len() as u64
        }
    })
    .await;
    held_back.len()
}
