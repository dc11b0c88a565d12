//! The watcher's in-memory model of the sources: raw catalogue documents,
//! and one small tuple per video. Change events update it; planning then
//! re-derives exactly the keys the change can touch, with the same
//! decoders and planners a full rebuild uses, so an applied change leaves
//! those keys as a rebuild from the new state would.

use crate::config::Collections;
use crate::model::catalog::Catalog;
use crate::model::decode::doc_id;
use crate::model::report::RefReport;
use crate::model::video::{VideoDoc, decode_video};
use crate::plan::category::Derived;
use crate::plan::order::newest_first;
use crate::plan::{self, Change, FamilySet, Op, PlanCtx, Value};
use crate::rebuild::decode_catalog;
use crate::registry::FamilyId;
use indexmap::IndexMap;
use mongodb::bson::{Bson, RawDocument, RawDocumentBuf};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

/// A document's identity: its `_id` as BSON (an ObjectId and a string of
/// the same hex are different documents that write the same id).
pub type IdKey = String;

pub fn id_key(id: &Bson) -> IdKey {
    format!("{id:?}")
}

pub fn raw_id_key(doc: &RawDocument) -> Option<IdKey> {
    let raw = doc.get("_id").ok().flatten()?;
    let bson: Bson = raw.to_raw_bson().try_into().ok()?;
    Some(id_key(&bson))
}

/// The four watched collections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Coll {
    Channel,
    Category,
    Tag,
    Video,
}

impl Coll {
    pub const ALL: [Coll; 4] = [Coll::Channel, Coll::Category, Coll::Tag, Coll::Video];

    pub fn name(self, names: &Collections) -> &str {
        match self {
            Coll::Channel => &names.channel,
            Coll::Category => &names.category,
            Coll::Tag => &names.tag,
            Coll::Video => &names.video,
        }
    }
}

/// One document's new state.
#[derive(Debug, Clone)]
pub enum Event {
    Upsert { coll: Coll, key: IdKey, raw_id: Bson, doc: RawDocumentBuf },
    Remove { coll: Coll, key: IdKey, raw_id: Bson },
}

#[derive(Debug, Clone)]
struct VideoState {
    raw_id: Bson,
    /// The written id, when usable.
    written: Option<String>,
    /// The decoded video; `None` when the document is rejected.
    doc: Option<VideoDoc>,
}

/// What a batch of events touched.
#[derive(Debug, Default)]
pub struct Touched {
    pub catalog: bool,
    /// Written video ids whose effective document may have changed.
    pub videos: BTreeSet<String>,
    /// Active categories those videos had before the batch (per the model).
    /// Per touched video (written id): the active categories it had before
    /// the batch, per the model; the engine adds what Redis lists.
    pub old_categories: BTreeMap<String, BTreeSet<String>>,
    /// Written ids of the catalogue documents the batch touched. Their
    /// dependent keys are recomputed whole, whatever the model believed
    /// before (after a restart it may already hold the new state).
    pub categories: BTreeSet<String>,
    pub tags: BTreeSet<String>,
    pub channels: BTreeSet<String>,
    /// Per touched video: what the index families saw of it before.
    before: BTreeMap<String, Option<IndexView>>,
}

/// What the index families read of a video.
type IndexView = (i64, Vec<String>, Vec<String>);

pub struct Model {
    names: Collections,
    catalog_docs: [IndexMap<IdKey, RawDocumentBuf>; 3],
    catalog: Catalog,
    videos: IndexMap<IdKey, VideoState>,
    by_written: HashMap<String, Vec<IdKey>>,
    /// Digests of the catalogue keys as last written; `None` entries mean
    /// "exists, contents unknown" (after a restart).
    catalog_written: HashMap<String, Option<u128>>,
    /// Videos whose index entries this process wrote itself, so the model
    /// is known to match Redis for them; only for these may an update that
    /// leaves the index view unchanged skip the index families.
    verified: HashSet<String>,
    /// Documents rejected while streaming.
    pub rejected: u64,
    /// The Redis `run_id` the model's writes went to; a restarted Redis
    /// without persistence has lost them.
    pub redis_run_id: String,
}

fn digest(value: &Value) -> u128 {
    crate::sink::digest(&format!("{value:?}"))
}

fn catalog_families() -> FamilySet {
    FamilySet::of(FamilyId::ALL.iter().copied().filter(|f| !f.needs_videos()))
}

impl Model {
    /// Builds the model from whole collections, in cursor order.
    pub fn load(
        names: &Collections,
        channels: Vec<RawDocumentBuf>,
        categories: Vec<RawDocumentBuf>,
        tags: Vec<RawDocumentBuf>,
        videos: Vec<RawDocumentBuf>,
    ) -> Model {
        let index = |docs: Vec<RawDocumentBuf>| -> IndexMap<IdKey, RawDocumentBuf> {
            docs.into_iter().filter_map(|d| raw_id_key(&d).map(|k| (k, d))).collect()
        };
        let catalog_docs = [index(channels), index(categories), index(tags)];
        let mut model = Model {
            names: names.clone(),
            catalog: Catalog::default(),
            catalog_docs,
            videos: IndexMap::new(),
            by_written: HashMap::new(),
            catalog_written: HashMap::new(),
            verified: HashSet::new(),
            rejected: 0,
            redis_run_id: String::new(),
        };
        model.catalog = model.decode_catalog();
        for doc in videos {
            if let (Some(key), Ok(Some(raw_id))) = (raw_id_key(&doc), doc.get("_id")) {
                let raw_id: Bson = raw_id.to_raw_bson().try_into().unwrap_or(Bson::Null);
                model.put_video(key, raw_id, &doc, false);
            }
        }
        model
    }

    fn decode_catalog(&self) -> Catalog {
        let docs = |i: usize| -> Vec<RawDocumentBuf> { self.catalog_docs[i].values().cloned().collect() };
        decode_catalog(&self.names, &docs(0), &docs(1), &docs(2)).0
    }

    pub fn video_collection(&self) -> &str {
        &self.names.video
    }

    pub fn video_count(&self) -> usize {
        self.videos.len()
    }

    /// Records catalogue keys found in Redis whose contents are unknown.
    pub fn catalog_keys_exist(&mut self, keys: impl IntoIterator<Item = String>) {
        self.catalog_written = keys.into_iter().map(|k| (k, None)).collect();
    }

    fn put_video(&mut self, key: IdKey, raw_id: Bson, doc: &RawDocument, want_detail: bool) {
        let id = doc_id(doc);
        let written = id.as_ref().ok().cloned();
        let decoded = match id.and_then(|id| decode_video(doc, id, &mut RefReport::default(), want_detail)) {
            Ok(video) => Some(video),
            Err(rejection) => {
                // Counted and skipped, as a rebuild does; its keys go away.
                if want_detail {
                    tracing::warn!(id = %rejection.id, reason = %rejection.reason, "video document rejected");
                    self.rejected += 1;
                }
                None
            }
        };
        if let Some(old) = self.videos.get(&key).filter(|old| old.written != written) {
            self.unlink_written(&key, old.written.clone());
        }
        // `_id` never changes, so a known key keeps its place in its group;
        // a new key is appended to the model and to its group alike.
        self.videos.insert(key.clone(), VideoState { raw_id, written: written.clone(), doc: decoded });
        if let Some(w) = written {
            let list = self.by_written.entry(w).or_default();
            if !list.contains(&key) {
                list.push(key);
            }
        }
    }

    fn unlink_written(&mut self, key: &IdKey, written: Option<String>) {
        let Some(w) = written else { return };
        if let Some(list) = self.by_written.get_mut(&w) {
            list.retain(|k| k != key);
            if list.is_empty() {
                self.by_written.remove(&w);
            }
        }
    }

    /// The video that owns a written id: the first document carrying it,
    /// when that document is valid and active.
    fn effective(&self, written: &str) -> Option<&VideoDoc> {
        let first = self.by_written.get(written)?.first()?;
        self.videos.get(first)?.doc.as_ref().filter(|d| d.active)
    }

    /// The owner of a written id whose detail must be fetched again from
    /// MongoDB (it was loaded without one): its raw `_id`.
    pub fn needs_detail(&self, written: &str) -> Option<Bson> {
        let first = self.by_written.get(written)?.first()?;
        let state = self.videos.get(first)?;
        state.doc.as_ref().filter(|d| d.active && d.detail.is_none()).map(|_| state.raw_id.clone())
    }

    fn active_categories_of(&self, video: &VideoDoc) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for c in &video.category_ids {
            if self.catalog.active_category(c).is_some() && !out.contains(c) {
                out.push(c.clone());
            }
        }
        out
    }

    /// Applies one event to the model.
    pub fn apply(&mut self, event: Event, touched: &mut Touched) {
        match event {
            Event::Upsert { coll: Coll::Video, key, raw_id, doc } => {
                // The event names the id even when the model has not seen
                // the document (it may already be gone from the model).
                if let Some(w) = crate::model::id::written_id(&raw_id) {
                    if !touched.before.contains_key(&w) {
                        touched.before.insert(w.clone(), self.index_view(&w));
                    }
                    touched.videos.insert(w);
                }
                self.touch_video_key(&key, touched);
                self.put_video(key.clone(), raw_id, &doc, true);
                self.touch_video_key(&key, touched);
            }
            Event::Remove { coll: Coll::Video, key, raw_id } => {
                if let Some(w) = crate::model::id::written_id(&raw_id) {
                    if !touched.before.contains_key(&w) {
                        touched.before.insert(w.clone(), self.index_view(&w));
                    }
                    touched.videos.insert(w);
                }
                self.touch_video_key(&key, touched);
                if let Some(old) = self.videos.shift_remove(&key) {
                    self.unlink_written(&key, old.written);
                }
            }
            Event::Upsert { coll, key, doc, .. } => {
                Self::touch_catalog(coll, &doc, touched);
                self.catalog_docs[coll as usize].insert(key, doc);
            }
            Event::Remove { coll, key, raw_id } => {
                if let Some(old) = self.catalog_docs[coll as usize].shift_remove(&key) {
                    Self::touch_catalog(coll, &old, touched);
                }
                let id = crate::model::id::written_id(&raw_id);
                match coll {
                    Coll::Channel => touched.channels.extend(id),
                    Coll::Category => touched.categories.extend(id),
                    Coll::Tag => touched.tags.extend(id),
                    Coll::Video => {}
                }
                touched.catalog = true;
            }
        }
    }

    fn touch_catalog(coll: Coll, doc: &RawDocument, touched: &mut Touched) {
        touched.catalog = true;
        if let Ok(id) = doc_id(doc) {
            match coll {
                Coll::Channel => touched.channels.insert(id),
                Coll::Category => touched.categories.insert(id),
                Coll::Tag => touched.tags.insert(id),
                Coll::Video => false,
            };
        }
    }

    fn index_view(&self, written: &str) -> Option<IndexView> {
        self.effective(written).map(|v| (v.added_ms, v.category_ids.clone(), v.tag_ids.clone()))
    }

    fn touch_video_key(&self, key: &IdKey, touched: &mut Touched) {
        let Some(w) = self.videos.get(key).and_then(|s| s.written.clone()) else { return };
        if !touched.before.contains_key(&w) {
            touched.before.insert(w.clone(), self.index_view(&w));
        }
        if let Some(video) = self.effective(&w) {
            touched.old_categories.entry(w.clone()).or_default().extend(self.active_categories_of(video));
        }
        touched.videos.insert(w);
    }

    /// Plans the changes that bring every key the batch can touch to what
    /// a full rebuild from the new state would write. `redis_categories`
    /// adds the categories Redis lists for the touched videos (their old
    /// membership as last written, which matters after a restart).
    ///
    /// `tag_lists` are the `(category, tag)` pairs of the `video:tag:list`
    /// keys Redis holds for the touched categories and tags, so that stale
    /// ones are deleted even when the model no longer knows them.
    pub fn plan(
        &mut self,
        touched: &Touched,
        redis_categories: &BTreeMap<String, BTreeSet<String>>,
        redis_details: &HashMap<String, String>,
        tag_lists: &[(String, String)],
        ctx: &PlanCtx,
    ) -> Vec<Change> {
        let mut changes = Vec::new();
        let old_catalog = if touched.catalog {
            let new = self.decode_catalog();
            Some(std::mem::replace(&mut self.catalog, new))
        } else {
            None
        };
        let catalog = &self.catalog;
        let derived = Derived::new(catalog, &mut RefReport::default());

        // What changed in the catalogue that index families depend on.
        let mut changed_categories: BTreeSet<String> = BTreeSet::new();
        let mut changed_tags: BTreeMap<String, (Option<String>, Option<String>)> = BTreeMap::new();
        let mut changed_channels: BTreeSet<String> = BTreeSet::new();
        if let Some(old) = &old_catalog {
            let ids: BTreeSet<&String> = old.categories.iter().chain(&catalog.categories).map(|c| &c.id).collect();
            for id in ids {
                if old.active_category(id).is_some() != catalog.active_category(id).is_some() {
                    changed_categories.insert(id.clone());
                }
            }
            let live_tag = |c: &Catalog, id: &str| c.active_tag(id).map(|t| t.category_id.clone());
            let ids: BTreeSet<&String> = old.tags.iter().chain(&catalog.tags).map(|t| &t.id).collect();
            for id in ids {
                let (before, after) = (live_tag(old, id), live_tag(catalog, id));
                if before != after {
                    changed_tags.insert(id.clone(), (before, after));
                }
            }
            let refs = |c: &Catalog| -> HashMap<String, Vec<String>> {
                c.channels
                    .iter()
                    .map(|ch| (ch.id.clone(), ch.categories.iter().map(|r| r.id.clone()).collect()))
                    .collect()
            };
            let (before, after) = (refs(old), refs(catalog));
            for id in before.keys().chain(after.keys()) {
                if before.get(id) != after.get(id) {
                    changed_channels.insert(id.clone());
                }
            }
            self.plan_catalog_diff(ctx, &mut changes);
        }
        changed_categories.extend(touched.categories.iter().cloned());
        changed_channels.extend(touched.channels.iter().cloned());
        for t in &touched.tags {
            let before = old_catalog.as_ref().and_then(|c| c.active_tag(t)).map(|tag| tag.category_id.clone());
            changed_tags.entry(t.clone()).or_insert((before, None));
        }
        let catalog = &self.catalog;

        // Categories whose video keys may change, and what else that needs.
        // Videos whose index view changed (or may have: not verified).
        // An update that leaves it alone (a new title, say) costs only
        // its detail.
        // The detail Redis holds shows the index view it was written with,
        // which stays true across restarts of this process.
        let moved: BTreeSet<&String> = touched
            .videos
            .iter()
            .filter(|w| {
                let unchanged_here =
                    self.verified.contains(*w) && touched.before.get(*w).cloned().flatten() == self.index_view(w);
                let new_detail = self.effective(w).and_then(|v| v.detail.as_deref());
                let unchanged_in_redis =
                    index_fields(redis_details.get(*w).map(String::as_str)) == index_fields(new_detail);
                !(unchanged_here || unchanged_in_redis)
            })
            .collect();
        // Each moved video's old and new categories: the index deltas.
        let mut old_of: BTreeMap<&String, BTreeSet<String>> = BTreeMap::new();
        for (w, cats) in touched.old_categories.iter().chain(redis_categories) {
            if moved.contains(w) {
                old_of.entry(w).or_default().extend(cats.iter().cloned());
            }
        }
        let mut affected: BTreeSet<String> = old_of.values().flatten().cloned().collect();
        affected.extend(changed_categories.iter().cloned());
        for w in &moved {
            if let Some(v) = self.effective(w) {
                affected.extend(self.active_categories_of(v));
            }
        }
        for (before, after) in changed_tags.values() {
            affected.extend(before.iter().chain(after).cloned());
        }
        let channel_cats = |ch: &crate::model::decode::Channel| -> Vec<String> {
            let mut cats: Vec<String> = ch
                .categories
                .iter()
                .filter(|r| catalog.active_category(&r.id).is_some())
                .map(|r| r.id.clone())
                .collect();
            cats.sort();
            cats.dedup();
            cats
        };
        let home_channels: Vec<&crate::model::decode::Channel> = catalog
            .channels
            .iter()
            // Any referenced category counts, active or not: one that just
            // went inactive leaves the channel's home sections too.
            .filter(|ch| changed_channels.contains(&ch.id) || ch.categories.iter().any(|r| affected.contains(&r.id)))
            .collect();
        let mut needed: HashSet<String> = affected.iter().cloned().collect();
        for ch in &home_channels {
            needed.extend(channel_cats(ch));
        }
        let mut needed_tags: HashSet<String> = HashSet::new();
        for c in &affected {
            if let Some(i) = catalog.active_category_index(c) {
                needed_tags.extend(derived.tags_of[i].iter().map(|&t| catalog.tags[t].id.clone()));
            }
        }
        needed_tags.extend(changed_tags.keys().cloned());

        // One pass over every video: members of the needed categories and
        // tags, and the videos whose category set a status flip changes.
        let mut members: HashMap<String, Vec<(i64, String)>> = HashMap::new();
        let mut tag_members: HashMap<String, Vec<(i64, String)>> = HashMap::new();
        let mut recategorised: BTreeSet<String> = BTreeSet::new();
        let pass_needed = !needed.is_empty() || !needed_tags.is_empty() || !changed_categories.is_empty();
        for (w, keys) in self.by_written.iter().filter(|_| pass_needed) {
            let Some(v) =
                keys.first().and_then(|k| self.videos.get(k)).and_then(|s| s.doc.as_ref()).filter(|d| d.active)
            else {
                continue;
            };
            if v.category_ids.iter().any(|c| changed_categories.contains(c)) {
                recategorised.insert(w.clone());
            }
            let cats = self.active_categories_of(v);
            for c in cats.iter().filter(|c| needed.contains(*c)) {
                members.entry(c.clone()).or_default().push((v.added_ms, w.clone()));
            }
            let mut seen = HashSet::new();
            for t in &v.tag_ids {
                if !needed_tags.contains(t) || !seen.insert(t) {
                    continue;
                }
                let listed = catalog.active_tag(t).is_some_and(|tag| {
                    catalog.active_category(&tag.category_id).is_some() && cats.contains(&tag.category_id)
                });
                if listed {
                    tag_members.entry(t.clone()).or_default().push((v.added_ms, w.clone()));
                }
            }
        }
        let sort = |list: &mut Vec<(i64, String)>| list.sort_by(|a, b| newest_first((a.0, &a.1), (b.0, &b.1)));
        members.values_mut().for_each(sort);
        tag_members.values_mut().for_each(sort);

        let keys = &ctx.keys;
        let put = |changes: &mut Vec<Change>, family: FamilyId, args: &[&str], value: Value| {
            if !ctx.families.contains(family) {
                return;
            }
            let key = keys.key(family, args);
            let empty = match &value {
                Value::String(_) => false,
                Value::Set(m) | Value::List(m) => m.is_empty(),
                Value::Zset(m) => m.is_empty(),
            };
            changes.push(if empty { Change::Delete(key) } else { Change::Put(Op { key, value }) });
        };

        // Per video: its detail and category set.
        for w in touched.videos.iter().chain(recategorised.iter()) {
            let video = self.effective(w);
            let quiet = !moved.contains(w) && !recategorised.contains(w);
            if touched.videos.contains(w) {
                match video.and_then(|v| v.detail.clone()) {
                    Some(detail) => put(&mut changes, FamilyId::VideoDetail, &[w], Value::String(detail)),
                    None if ctx.families.contains(FamilyId::VideoDetail) => {
                        changes.push(Change::Delete(keys.key(FamilyId::VideoDetail, &[w])))
                    }
                    None => {}
                }
            }
            if !quiet {
                let cats = video.map(|v| self.active_categories_of(v)).unwrap_or_default();
                put(&mut changes, FamilyId::VideoCategories, &[w], Value::Set(cats));
            }
        }

        // Zset deltas: touched videos now in a category are (re)scored
        // there; those that were in it and are not any more leave it.
        let mut delta_add: HashMap<String, Vec<(i64, String)>> = HashMap::new();
        let mut delta_remove: HashMap<String, Vec<String>> = HashMap::new();
        for w in &moved {
            let video = self.effective(w);
            let now: Vec<String> = video.map(|v| self.active_categories_of(v)).unwrap_or_default();
            if let Some(v) = video {
                for c in &now {
                    delta_add.entry(c.clone()).or_default().push((v.added_ms, (*w).clone()));
                }
            }
            for c in old_of.get(w).into_iter().flatten().filter(|c| !now.contains(c)) {
                delta_remove.entry(c.clone()).or_default().push((*w).clone());
            }
        }

        // Per affected category: count, index (a delta when only videos
        // moved), list, and the lists of its tags.
        for c in &affected {
            if catalog.active_category(c).is_none() {
                for family in [FamilyId::CategoryVideoCount, FamilyId::VideoCategoryIndex, FamilyId::VideoCategoryList]
                {
                    if ctx.families.contains(family) {
                        changes.push(Change::Delete(keys.key(family, &[c])));
                    }
                }
                continue;
            }
            let list = members.get(c).cloned().unwrap_or_default();
            put(&mut changes, FamilyId::CategoryVideoCount, &[c], Value::String(list.len().to_string()));
            if list.is_empty() || changed_categories.contains(c) {
                put(&mut changes, FamilyId::VideoCategoryIndex, &[c], Value::Zset(list.clone()));
            } else if ctx.families.contains(FamilyId::VideoCategoryIndex) {
                let add = delta_add.remove(c).unwrap_or_default();
                let remove = delta_remove.remove(c).unwrap_or_default();
                changes.push(Change::ZsetDelta { key: keys.key(FamilyId::VideoCategoryIndex, &[c]), add, remove });
            }
            put(
                &mut changes,
                FamilyId::VideoCategoryList,
                &[c],
                Value::List(list.into_iter().map(|(_, id)| id).collect()),
            );
        }
        let mut tag_keys: BTreeMap<(String, String), bool> = BTreeMap::new();
        for t in &needed_tags {
            if let Some(tag) = catalog.active_tag(t).filter(|tag| catalog.active_category(&tag.category_id).is_some()) {
                tag_keys.insert((tag.category_id.clone(), t.clone()), true);
            }
        }
        for (t, (before, _)) in &changed_tags {
            if let Some(c) = before {
                tag_keys.entry((c.clone(), t.clone())).or_insert(false);
            }
        }
        for c in affected.iter().filter(|c| catalog.active_category(c).is_none()) {
            for tag in catalog.tags.iter().filter(|tag| &tag.category_id == c) {
                tag_keys.entry((c.clone(), tag.id.clone())).or_insert(false);
            }
            if let Some(old) = &old_catalog {
                for tag in old.tags.iter().filter(|tag| &tag.category_id == c) {
                    tag_keys.entry((c.clone(), tag.id.clone())).or_insert(false);
                }
            }
        }
        for (c, t) in tag_lists {
            if changed_categories.contains(c) || changed_tags.contains_key(t) {
                tag_keys.entry((c.clone(), t.clone())).or_insert(false);
            }
        }
        for ((c, t), live) in tag_keys {
            let ids = if live {
                tag_members.get(&t).map(|m| m.iter().map(|(_, id)| id.clone()).collect()).unwrap_or_default()
            } else {
                vec![]
            };
            if id_ok(&c) {
                put(&mut changes, FamilyId::VideoTagList, &[&c, &t], Value::List(ids));
            }
        }

        // Home sections of the channels those categories feed.
        for ch in home_channels {
            let cats = channel_cats(ch);
            let mut union: Vec<(i64, String)> = Vec::new();
            for section in &ctx.home_sections {
                union.clear();
                for c in &cats {
                    union.extend(members.get(c).into_iter().flatten().take(section.limit).cloned());
                }
                union.sort_by(|a, b| newest_first((a.0, &a.1), (b.0, &b.1)));
                union.dedup_by(|a, b| a.1 == b.1);
                union.truncate(section.limit);
                put(&mut changes, FamilyId::VideoListHome, &[&ch.id, &section.name], Value::Zset(union.clone()));
            }
        }
        if let Some(old) = &old_catalog {
            // Channels that vanished take their home sections along.
            for ch in old.channels.iter().filter(|ch| !catalog.channels.iter().any(|n| n.id == ch.id)) {
                for section in &ctx.home_sections {
                    if ctx.families.contains(FamilyId::VideoListHome) {
                        changes.push(Change::Delete(keys.key(FamilyId::VideoListHome, &[&ch.id, &section.name])));
                    }
                }
            }
        }
        self.verified.extend(touched.videos.iter().cloned());
        // Details planned now are not kept.
        for w in &touched.videos {
            let first = self.by_written.get(w).and_then(|ks| ks.first()).cloned();
            if let Some(doc) = first.and_then(|k| self.videos.get_mut(&k)).and_then(|s| s.doc.as_mut()) {
                doc.detail = None;
            }
        }
        changes
    }

    /// Re-plans the catalogue families and writes what differs from the
    /// last written state, deleting what is gone.
    fn plan_catalog_diff(&mut self, ctx: &PlanCtx, changes: &mut Vec<Change>) {
        let families = FamilySet::of(catalog_families().iter().filter(|f| ctx.families.contains(*f)));
        let ctx = PlanCtx { families, ..ctx.clone() };
        let (ops, _) = plan::plan_catalog(&self.catalog, &ctx);
        let mut next: HashMap<String, Option<u128>> = HashMap::with_capacity(ops.len());
        for op in ops {
            let d = digest(&op.value);
            if self.catalog_written.get(&op.key.text) != Some(&Some(d)) {
                next.insert(op.key.text.clone(), Some(d));
                changes.push(Change::Put(op));
            } else {
                next.insert(op.key.text, Some(d));
            }
        }
        for key in self.catalog_written.keys() {
            let gone = (!next.contains_key(key)).then(|| ctx.keys.classify(key)).flatten();
            if let Some(family) = gone {
                changes.push(Change::Delete(crate::keys::Key { family, text: key.clone() }));
            }
        }
        self.catalog_written = next;
    }
}

/// The fields of a detail payload the index families depend on.
fn index_fields(detail: Option<&str>) -> Option<[serde_json::Value; 3]> {
    let Some(detail) = detail else { return Some(Default::default()) };
    let v: serde_json::Value = serde_json::from_str(detail).ok()?;
    Some([v["categoryIds"].clone(), v["tagIds"].clone(), v["addedTime"].clone()])
}

fn id_ok(id: &str) -> bool {
    crate::model::id::is_usable_id(id)
}
