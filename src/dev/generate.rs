//! A deterministic, production-shaped data set: ~50 channels, ~2,000
//! categories, ~10,000 tags and N videos with ~50 provider fields of mixed
//! BSON types, a share of legacy `categoryId` documents and of dangling
//! references. The same seed always gives the same documents.

use mongodb::Database;
use mongodb::bson::{Binary, Bson, DateTime, Decimal128, Document, doc, oid::ObjectId, spec::BinarySubtype};

/// SplitMix64: small, fast and stable across crate versions, so a seed
/// names the same data set forever.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }

    fn object_id(&mut self) -> ObjectId {
        let a = self.next_u64().to_be_bytes();
        let b = self.next_u64().to_be_bytes();
        let mut bytes = [0u8; 12];
        bytes[..8].copy_from_slice(&a);
        bytes[8..].copy_from_slice(&b[..4]);
        ObjectId::from_bytes(bytes)
    }
}

const WORDS: &[&str] = &[
    "action",
    "anime",
    "comedy",
    "drama",
    "horror",
    "music",
    "news",
    "sport",
    "travel",
    "cooking",
    "gaming",
    "science",
    "history",
    "nature",
    "fashion",
    "动作",
    "喜剧",
    "纪录片",
    "美食",
    "旅行",
    "Über",
    "café",
    "naïve",
    "Ελλάδα",
    "東京",
    "live",
    "retro",
    "indie",
    "kids",
    "family",
];

/// Sizes of the generated data set.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub channels: usize,
    pub categories: usize,
    pub tags: usize,
    pub videos: usize,
}

/// The catalogue part of a data set, kept to draw video references from.
pub struct CatalogSet {
    pub channels: Vec<Document>,
    pub categories: Vec<Document>,
    pub tags: Vec<Document>,
    category_ids: Vec<ObjectId>,
    tags_by_category: Vec<Vec<ObjectId>>,
}

fn name(rng: &mut Rng, n: usize) -> String {
    format!("{} {} {n}", rng.pick(WORDS), rng.pick(WORDS))
}

pub fn catalog(shape: Shape, rng: &mut Rng) -> CatalogSet {
    let category_ids: Vec<ObjectId> = (0..shape.categories).map(|_| rng.object_id()).collect();
    let categories: Vec<Document> = category_ids
        .iter()
        .enumerate()
        .map(|(i, id)| {
            let mut d = doc! { "_id": *id, "name": name(rng, i) };
            match rng.below(3) {
                0 => {}
                1 => {
                    d.insert("subtitle", Bson::Null);
                }
                _ => {
                    d.insert("subtitle", format!("about {}", rng.pick(WORDS)));
                }
            }
            d.insert("seq", rng.below(100) as i32);
            d.insert("status", if rng.chance(0.9) { 1 } else { 0 });
            d.insert("channelId", rng.object_id());
            d
        })
        .collect();
    let mut tags_by_category = vec![Vec::new(); shape.categories];
    let tags: Vec<Document> = (0..shape.tags)
        .map(|i| {
            let id = rng.object_id();
            let c = rng.below(shape.categories as u64) as usize;
            // A few tags point at a category that does not exist.
            let category = if rng.chance(0.01) { rng.object_id() } else { category_ids[c] };
            tags_by_category[c].push(id);
            doc! {
                "_id": id,
                "name": name(rng, i),
                "categoryId": category,
                "seq": rng.below(50) as i64,
                "status": if rng.chance(0.95) { 1 } else { 0 },
            }
        })
        .collect();
    let channels: Vec<Document> = (0..shape.channels)
        .map(|i| {
            let refs = |rng: &mut Rng, ids: &[ObjectId], n: u64| -> Vec<Bson> {
                (0..n)
                    .map(|_| {
                        let id = *rng.pick(ids);
                        Bson::Document(doc! { "id": id, "name": format!("ref {}", rng.pick(WORDS)) })
                    })
                    .collect()
            };
            let n_cats = 20 + rng.below(40);
            let categories = refs(rng, &category_ids, n_cats);
            let all_tags: Vec<ObjectId> = tags.iter().filter_map(|t| t.get_object_id("_id").ok()).collect();
            let n_tags = rng.below(30);
            let tag_refs = refs(rng, &all_tags, n_tags);
            let mut d = doc! {
                "_id": rng.object_id(),
                "name": format!("channel {i:02} {}", rng.pick(WORDS)),
                "landingUrl": format!("https://ch{i}.example.test/"),
                "videoCdn": format!("https://v{i}.cdn.test"),
                "coverCdn": format!("https://c{i}.cdn.test"),
                "clientName": format!("client-{i}"),
                "categories": categories,
                "tags": tag_refs,
                "tagNames": [rng.pick(WORDS).to_string(), rng.pick(WORDS).to_string()],
            };
            if rng.chance(0.5) {
                d.insert("remark", "generated");
            }
            d
        })
        .collect();
    CatalogSet { channels, categories, tags, category_ids, tags_by_category }
}

/// Three years of milliseconds, ending 2026-01-01.
const SPAN_MS: u64 = 3 * 365 * 86_400_000;
const END_MS: i64 = 1_767_225_600_000;

/// One video document with ~50 provider fields (~650 bytes of JSON).
pub fn video(set: &CatalogSet, i: usize, rng: &mut Rng) -> Document {
    let n_cats = 1 + rng.below(4) as usize;
    let cat_idx: Vec<usize> = (0..n_cats).map(|_| rng.below(set.category_ids.len() as u64) as usize).collect();
    let mut cats: Vec<ObjectId> = cat_idx.iter().map(|&c| set.category_ids[c]).collect();
    if rng.chance(0.01) {
        cats.push(rng.object_id()); // dangling
    }
    let mut tag_ids: Vec<Bson> = Vec::new();
    for _ in 0..rng.below(9) {
        // Mostly tags of the video's own categories, some from elsewhere.
        let owner =
            if rng.chance(0.8) { *rng.pick(&cat_idx) } else { rng.below(set.category_ids.len() as u64) as usize };
        let pool = &set.tags_by_category[owner];
        if !pool.is_empty() {
            tag_ids.push(Bson::ObjectId(*rng.pick(pool)));
        }
    }
    let added = END_MS - rng.below(SPAN_MS) as i64;
    let mut d = doc! { "_id": rng.object_id(), "title": format!("video {i} {}", rng.pick(WORDS)) };
    if rng.chance(0.03) {
        d.insert("categoryId", cats[0]);
    } else {
        d.insert("categoryIds", cats.iter().map(|c| Bson::ObjectId(*c)).collect::<Vec<_>>());
    }
    d.insert("tagIds", tag_ids);
    d.insert("listStatus", if rng.chance(0.95) { 1 } else { 0 });
    d.insert("addedTime", DateTime::from_millis(added));
    // ~44 provider fields of mixed types, short as provider codes are.
    const CODES: &[&str] = &["hd", "sd", "4k", "en", "zh", "ja", "mp4", "hls", "v2", "ok"];
    for f in 0..8 {
        d.insert(format!("s{f}"), *rng.pick(CODES));
    }
    for f in 0..16 {
        d.insert(format!("i{f}"), rng.below(100) as i32);
    }
    for f in 0..4 {
        d.insert(format!("l{f}"), rng.below(1_000_000) as i64);
    }
    for f in 0..4 {
        d.insert(format!("d{f}"), rng.below(1000) as f64 / 4.0);
    }
    for f in 0..6 {
        d.insert(format!("b{f}"), rng.chance(0.5));
    }
    d.insert("pd", DateTime::from_millis(added + 3_600_000));
    d.insert("pn", Bson::Null);
    let dec = format!("{}.{:02}", rng.below(1000), rng.below(100));
    d.insert("pc", Bson::Decimal128(dec.parse::<Decimal128>().unwrap_or_else(|_| "0".parse().expect("0 parses"))));
    d.insert("pb", Binary { subtype: BinarySubtype::Generic, bytes: rng.next_u64().to_le_bytes().to_vec() });
    d.insert("pm", doc! { "w": rng.below(1920) as i32, "h": rng.below(1080) as i32 });
    d.insert("pl", vec![Bson::Int32(rng.below(9) as i32), Bson::String((*rng.pick(CODES)).to_string())]);
    d.insert("tagsFlat", rng.pick(WORDS).to_string());
    d
}

/// Replaces the four collections with a generated data set. Returns the
/// number of documents written per collection.
pub async fn generate(
    db: &Database,
    names: &crate::config::Collections,
    shape: Shape,
    seed: u64,
    on_videos: impl Fn(u64),
) -> mongodb::error::Result<[u64; 4]> {
    let mut rng = Rng::new(seed);
    let set = catalog(shape, &mut rng);
    for name in [&names.channel, &names.category, &names.tag, &names.video] {
        db.collection::<Document>(name).drop().await?;
    }
    db.collection::<Document>(&names.channel).insert_many(&set.channels).await?;
    if !set.categories.is_empty() {
        db.collection::<Document>(&names.category).insert_many(&set.categories).await?;
    }
    if !set.tags.is_empty() {
        db.collection::<Document>(&names.tag).insert_many(&set.tags).await?;
    }
    let videos = db.collection::<Document>(&names.video);
    let mut batch = Vec::with_capacity(1000);
    for i in 0..shape.videos {
        batch.push(video(&set, i, &mut rng));
        if batch.len() == 1000 || i + 1 == shape.videos {
            videos.insert_many(&batch).ordered(false).await?;
            on_videos(batch.len() as u64);
            batch.clear();
        }
    }
    Ok([set.channels.len() as u64, set.categories.len() as u64, set.tags.len() as u64, shape.videos as u64])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_documents() {
        let shape = Shape { channels: 3, categories: 20, tags: 50, videos: 5 };
        let a = catalog(shape, &mut Rng::new(7));
        let b = catalog(shape, &mut Rng::new(7));
        assert_eq!(a.categories, b.categories);
        assert_eq!(video(&a, 1, &mut Rng::new(3)), video(&b, 1, &mut Rng::new(3)));
        assert_ne!(catalog(shape, &mut Rng::new(8)).categories, a.categories);
    }

    #[test]
    fn videos_are_about_the_production_size() {
        let shape = Shape { channels: 3, categories: 50, tags: 200, videos: 0 };
        let mut rng = Rng::new(1);
        let set = catalog(shape, &mut rng);
        let total: usize = (0..200)
            .map(|i| {
                let d = video(&set, i, &mut rng);
                assert!(d.len() >= 48, "{} fields", d.len());
                let raw = mongodb::bson::RawDocumentBuf::from_document(&d).unwrap();
                let mut json = String::new();
                crate::model::bson_json::write_document(&mut json, &raw, &mut Default::default()).unwrap();
                json.len()
            })
            .sum();
        let avg = total / 200;
        assert!((550..850).contains(&avg), "average {avg} bytes");
    }
}
