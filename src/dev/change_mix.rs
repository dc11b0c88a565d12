//! The changes the watcher benchmark makes: titles only (the quiet path),
//! or a video platform's ordinary day, which is mostly uploads, category
//! moves, status flips and deletes, with a few catalogue edits.

use super::generate::Rng;
use mongodb::bson::{Bson, DateTime, Document, doc};
use mongodb::{Collection, Database};

/// Which changes the benchmark makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mix {
    /// `$set` of `title` on existing videos: no index moves.
    Title,
    /// Per 100 changes: 35 uploads, 12 deletes (of this run's uploads;
    /// a title change while there are none), 15 category moves, 15 status flips, 8 `addedTime` changes,
    /// 13 tag changes, and 2 catalogue edits (category renames, category
    /// (de)activations, tag renames).
    Platform,
    /// The platform mix with its 2 catalogue edits per 100 made title
    /// changes: every change then reaches the same number of keys at any
    /// catalogue size (a category (de)activation reaches all its members,
    /// which grow with the catalogue), so its cost per change at 58K and
    /// at 2M compares the same batch.
    Videos,
}

/// One change to make: which collection and what, and the written id of
/// the video it changes (none for catalogue edits).
pub struct Change {
    pub video: Option<String>,
    op: Op,
}

enum Op {
    Insert(Collection<Document>, Document),
    Update(Collection<Document>, Bson, Document),
    Delete(Collection<Document>, Bson),
}

impl Change {
    pub async fn send(self) -> mongodb::error::Result<()> {
        match self.op {
            Op::Insert(coll, d) => coll.insert_one(d).await.map(drop),
            Op::Update(coll, id, update) => coll.update_one(doc! { "_id": id }, update).await.map(drop),
            Op::Delete(coll, id) => coll.delete_one(doc! { "_id": id }).await.map(drop),
        }
    }
}

/// Makes the changes of a mix over a generated data set.
pub struct Changes {
    mix: Mix,
    rng: Rng,
    nonce: u128,
    /// What picks the changes.
    pub seed: u64,
    videos: Collection<Document>,
    categories: Collection<Document>,
    tags: Collection<Document>,
    /// Existing video ids, as stored.
    ids: Vec<Bson>,
    category_ids: Vec<Bson>,
    tag_ids: Vec<Bson>,
    /// This run's uploads not deleted yet: deletes take these first, so
    /// the data set keeps its size.
    uploads: Vec<String>,
}

/// A video's `_id` as the cache writes it.
pub fn written(id: &Bson) -> String {
    match id {
        Bson::ObjectId(o) => o.to_hex(),
        other => other.as_str().unwrap_or_default().to_string(),
    }
}

impl Changes {
    pub async fn new(
        db: &Database,
        names: &crate::config::Collections,
        mix: Mix,
        seed: Option<u64>,
        ids: Vec<Bson>,
    ) -> mongodb::error::Result<Changes> {
        use futures::TryStreamExt;
        let id_list = |name: &str| {
            let coll = db.collection::<Document>(name);
            async move {
                let docs: Vec<Document> =
                    coll.find(doc! {}).projection(doc! { "_id": 1 }).limit(5_000).await?.try_collect().await?;
                Ok::<_, mongodb::error::Error>(
                    docs.into_iter().filter_map(|d| d.get("_id").cloned()).collect::<Vec<_>>(),
                )
            }
        };
        let nonce =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
        // The nonce keeps values new; the seed alone picks the changes
        // (the nonce's when none is given).
        let seed = seed.unwrap_or(nonce as u64);
        Ok(Changes {
            mix,
            rng: Rng::new(seed),
            seed,
            nonce,
            videos: db.collection(&names.video),
            categories: db.collection(&names.category),
            tags: db.collection(&names.tag),
            ids,
            category_ids: id_list(&names.category).await?,
            tag_ids: id_list(&names.tag).await?,
            uploads: Vec::new(),
        })
    }

    fn some_categories(&mut self) -> Vec<Bson> {
        let n = 1 + self.rng.below(2);
        (0..n).filter(|_| !self.category_ids.is_empty()).map(|_| self.rng.pick(&self.category_ids).clone()).collect()
    }

    fn some_tags(&mut self) -> Vec<Bson> {
        let n = self.rng.below(4);
        (0..n).filter(|_| !self.tag_ids.is_empty()).map(|_| self.rng.pick(&self.tag_ids).clone()).collect()
    }

    fn update(&self, id: Bson, set: Document) -> Change {
        Change { video: Some(written(&id)), op: Op::Update(self.videos.clone(), id, doc! { "$set": set }) }
    }

    /// The `seq`-th change of this run.
    pub fn next(&mut self, seq: u64) -> Change {
        let id = self.ids[(seq as usize).wrapping_mul(7919) % self.ids.len()].clone();
        let tag = format!("bench {}-{seq}", self.nonce);
        if self.mix == Mix::Title {
            return self.update(id, doc! { "title": tag });
        }
        let now = DateTime::now();
        match self.rng.below(100) {
            0..35 => {
                let new_id = format!("up{}x{seq}", self.nonce);
                self.uploads.push(new_id.clone());
                let d = doc! {
                    "_id": &new_id, "title": tag, "categoryIds": self.some_categories(),
                    "tagIds": self.some_tags(), "listStatus": 1, "addedTime": now,
                };
                Change { video: Some(new_id), op: Op::Insert(self.videos.clone(), d) }
            }
            35..47 if !self.uploads.is_empty() => {
                let n = self.uploads.len() as u64;
                let gone = Bson::String(self.uploads.swap_remove(self.rng.below(n) as usize));
                Change { video: Some(written(&gone)), op: Op::Delete(self.videos.clone(), gone) }
            }
            35..47 => self.update(id, doc! { "title": tag }),
            47..62 => {
                let cats = self.some_categories();
                self.update(id, doc! { "categoryIds": cats, "title": tag })
            }
            62..77 => {
                let status = if self.rng.chance(0.5) { 1 } else { 0 };
                self.update(id, doc! { "listStatus": status, "title": tag })
            }
            77..85 => self.update(id, doc! { "addedTime": now, "title": tag }),
            85..98 => {
                let tags = self.some_tags();
                self.update(id, doc! { "tagIds": tags, "title": tag })
            }
            _ if self.mix == Mix::Videos || self.category_ids.is_empty() || self.tag_ids.is_empty() => {
                self.update(id, doc! { "title": tag })
            }
            roll => {
                let (coll, ids) = match roll % 2 {
                    0 => (self.categories.clone(), &self.category_ids),
                    _ => (self.tags.clone(), &self.tag_ids),
                };
                let target = self.rng.pick(ids).clone();
                // Half of the category edits turn it off or on.
                // Every edit renames, so none is a no-op MongoDB would not
                // report.
                let mut set = doc! { "name": format!("renamed {tag}") };
                if roll % 2 == 0 && self.rng.chance(0.5) {
                    set.insert("status", if self.rng.chance(0.5) { 1 } else { 0 });
                }
                Change { video: None, op: Op::Update(coll, target, doc! { "$set": set }) }
            }
        }
    }
}
