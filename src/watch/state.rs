//! The watcher's state: the raw catalogue documents, a compact record per
//! video (what the index families read of it, never its payload), and
//! what the cache holds of the keys a full rebuild sweeps by scope (which
//! a later change may have to delete).
//!
//! Events change the state at once, but reversibly: [`State::apply`]
//! returns an [`Applied`] that either [`State::commit`] keeps (after the
//! batch's writes and resume tokens are in Redis) or [`State::undo`] takes
//! back, leaving the state exactly as it was, so a replayed batch plans
//! the same writes.

use super::members::{Members, Scoped};
use super::memo::{Before, CatalogMemo};
use super::model::{Coll, Event, IdKey, id_key, raw_id_key};
use super::videos::{Fields, Handle, Saved, Videos};
use crate::config::Collections;
use crate::keys::Keys;
use crate::model::catalog::Catalog;
use crate::model::compact::{Sym, Syms, Wid};
use crate::model::decode::doc_id;
use crate::model::id::{IdValue, read_id};
use crate::model::report::{RefReport, Rejection};
use crate::model::video::{VideoDoc, decode_video};
use crate::plan::category::Derived;
use crate::registry::{FamilyId, Scope};
use indexmap::IndexMap;
use mongodb::bson::{Bson, RawDocument, RawDocumentBuf};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::{BTreeSet, HashMap};

/// An effective video as planning reads it: its record, and its detail
/// payload when the current batch decoded it.
#[derive(Debug, Clone, Copy)]
pub struct Video<'s> {
    pub added_ms: i64,
    pub cats: &'s [Sym],
    pub tags: &'s [Sym],
    pub detail: Option<&'s str>,
}

/// Keys of the scoped index families and of the catalogue families that
/// the cache holds (or this process wrote): bounded by the catalogue, not
/// by the number of videos.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Existing {
    /// `category:video:count`, `video:category:index`, `video:category:list`
    /// and `video:tag:list` keys by category id.
    pub by_category: HashMap<String, BTreeSet<String>>,
    /// `video:tag:list` keys by tag id.
    pub by_tag: HashMap<String, BTreeSet<String>>,
    /// `video:list:home` keys by channel id.
    pub by_channel: HashMap<String, BTreeSet<String>>,
    /// Catalogue-family keys.
    pub catalog: std::collections::HashSet<String>,
    /// What this process knows a tracked key holds: the value the state
    /// derives for it (as of the last committed batch), of this size,
    /// and when the last write was whole, that value's digest. A load, a
    /// job or a failed batch leaves it unknown; the key is then written
    /// whole whatever its value, and only a known key is patched.
    pub held: HashMap<String, Held>,
    /// What each home section lists, as of the value whose digest is
    /// kept beside it: valid only while [`Existing::held`] still gives
    /// that digest, so whatever makes the key unknown or rewrites it
    /// (a load, a job, a failed or deferred write) retires it too.
    /// Bounded by the channels: a few hundred entries per section.
    home_lists: HashMap<String, (u128, HomeList)>,
}

/// The videos a home section lists, in its order: `addedTime` and
/// written id.
pub type HomeList = Vec<(i64, crate::model::compact::Wid)>;

/// What a tracked key is known to hold (see [`Existing::held`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Held {
    /// The digest of the value, when it was last written whole.
    pub digest: Option<u128>,
    /// Its elements (a string: none).
    pub size: usize,
}

/// The families [`Existing`] tracks: all but those scoped by video,
/// whose keys are written with their video.
pub fn tracked_families() -> crate::plan::FamilySet {
    let registry = crate::registry::Registry::get();
    crate::plan::FamilySet::of(FamilyId::ALL.iter().copied().filter(|f| registry.family(*f).scope != [Scope::Video]))
}

impl Existing {
    /// Files a key under its scope, with what it holds when known; keys
    /// of untracked families are ignored.
    pub fn insert(&mut self, keys: &Keys, key: &str, held: Option<Held>) {
        self.file(keys, key, Some(held));
    }

    pub fn remove(&mut self, keys: &Keys, key: &str) {
        self.file(keys, key, None);
    }

    /// Files (`Some(held)`) or unfiles (`None`) a key under the scopes
    /// its family declares (see [`Scope`]): a `global` key by itself, an
    /// entity-scoped one under each entity it names.
    fn file(&mut self, keys: &Keys, key: &str, add: Option<Option<Held>>) {
        let Some((family, args)) = keys.parse(key) else { return };
        let scope = &crate::registry::Registry::get().family(family).scope;
        // The registry holds `global` and `video` alone.
        if scope.as_slice() == [Scope::Video] {
            return;
        }
        match add {
            Some(Some(held)) => self.held.insert(key.to_string(), held),
            _ => self.held.remove(key),
        };
        if scope.as_slice() == [Scope::Global] {
            match add {
                Some(_) => self.catalog.insert(key.to_string()),
                None => self.catalog.remove(key),
            };
            return;
        }
        for (s, id) in scope.iter().zip(args) {
            let map = match s {
                Scope::Category => &mut self.by_category,
                Scope::Tag => &mut self.by_tag,
                Scope::Channel => &mut self.by_channel,
                Scope::Global | Scope::Video => continue,
            };
            if add.is_some() {
                map.entry(id.to_string()).or_default().insert(key.to_string());
            } else if let Some(set) = map.get_mut(id) {
                set.remove(key);
                if set.is_empty() {
                    map.remove(id);
                }
            }
        }
    }

    /// What the cache holds of `families` after a rebuild of them wrote
    /// `names` and swept every other key of theirs.
    pub fn replace(&mut self, keys: &Keys, families: crate::plan::FamilySet, names: &[String]) {
        let gone = |key: &String| keys.classify(key).is_some_and(|f| families.contains(f));
        for map in [&mut self.by_category, &mut self.by_tag, &mut self.by_channel] {
            for set in map.values_mut() {
                set.retain(|k| !gone(k));
            }
            map.retain(|_, set| !set.is_empty());
        }
        self.catalog.retain(|k| !gone(k));
        self.held.retain(|k, _| !gone(k));
        for name in names {
            self.insert(keys, name, None);
        }
    }

    /// Keeps what a home section lists, as of the value the key is known
    /// to hold now (nothing when that is unknown).
    pub fn set_home_list(&mut self, key: &str, list: HomeList) {
        match self.digest(key) {
            Some(digest) => drop(self.home_lists.insert(key.to_string(), (digest, list))),
            None => drop(self.home_lists.remove(key)),
        }
    }

    /// What a home section lists, while the key still holds that value.
    pub fn home_list(&self, key: &str) -> Option<&HomeList> {
        let (digest, list) = self.home_lists.get(key)?;
        (self.digest(key) == Some(*digest)).then_some(list)
    }

    /// The digest of a tracked key's value, when known.
    pub fn digest(&self, key: &str) -> Option<u128> {
        self.held.get(key).and_then(|h| h.digest)
    }

    /// How many elements a tracked key holds, when known to hold what
    /// the state derives for it.
    pub fn size(&self, key: &str) -> Option<usize> {
        self.held.get(key).map(|h| h.size)
    }

    /// How many keys are tracked.
    pub fn len(&self) -> usize {
        let scoped: usize = self.by_category.values().map(BTreeSet::len).sum();
        scoped + self.by_channel.values().map(BTreeSet::len).sum::<usize>() + self.catalog.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Scopes by id: categories, tags and channels whose index keys are
/// recomputed whole, videos whose `video:categories` is, and categories
/// whose members' `video:categories` are (their activation changed).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Scopes {
    pub categories: BTreeSet<String>,
    pub tags: BTreeSet<String>,
    pub channels: BTreeSet<String>,
    pub videos: BTreeSet<String>,
    pub memberships: BTreeSet<String>,
}

impl Scopes {
    pub fn is_empty(&self) -> bool {
        self.categories.is_empty()
            && self.tags.is_empty()
            && self.channels.is_empty()
            && self.videos.is_empty()
            && self.memberships.is_empty()
    }

    pub fn extend(&mut self, other: &Scopes) {
        self.categories.extend(other.categories.iter().cloned());
        self.tags.extend(other.tags.iter().cloned());
        self.channels.extend(other.channels.iter().cloned());
        self.videos.extend(other.videos.iter().cloned());
        self.memberships.extend(other.memberships.iter().cloned());
    }

    /// What `cdc:pending` keeps of these scopes: all but the videos. The
    /// record is bounded by the catalogue, never by the videos a batch
    /// touched. A video's own keys need no record: they land after every
    /// key that indexes them, and the batch is saved only with its last
    /// run, so a batch that did not land is replayed and its videos are
    /// touched again; a video whose categories changed status is found
    /// again through `memberships`. The runs of video keys before the
    /// last may land without the batch (the budget cuts them), which is
    /// why the record stays until the failed batch's documents are saved
    /// again (`State::clears_pending`).
    pub fn persisted(&self) -> Scopes {
        Scopes { videos: BTreeSet::new(), ..self.clone() }
    }

    /// As members of the `cdc:pending` set: `c:`, `t:`, `ch:` and `cm:`
    /// + id (see [`Scopes::persisted`]).
    pub fn to_members(&self) -> Vec<String> {
        let tagged = |tag: &str, ids: &BTreeSet<String>| ids.iter().map(|id| format!("{tag}:{id}")).collect::<Vec<_>>();
        [
            tagged("c", &self.categories),
            tagged("t", &self.tags),
            tagged("ch", &self.channels),
            tagged("cm", &self.memberships),
        ]
        .concat()
    }

    /// Reads `cdc:pending` (`v:` members, which earlier versions kept, are
    /// still understood).
    pub fn from_members(members: impl IntoIterator<Item = String>) -> Scopes {
        let mut scopes = Scopes::default();
        for m in members {
            let Some((tag, id)) = m.split_once(':') else { continue };
            let set = match tag {
                "c" => &mut scopes.categories,
                "t" => &mut scopes.tags,
                "ch" => &mut scopes.channels,
                "cm" => &mut scopes.memberships,
                "v" => &mut scopes.videos,
                _ => continue,
            };
            set.insert(id.to_string());
        }
        scopes
    }
}

/// What a batch's writes change in what the state knows of the cache:
/// kept by [`State::commit`], made unknown by [`State::abort`]. Planning
/// fills it; the state reads it (and never the plan).
#[derive(Debug, Default)]
pub struct Record {
    /// Tracked keys written, with what they then hold when known.
    pub written: Vec<(String, Option<Held>)>,
    /// Tracked keys deleted.
    pub deleted: Vec<String>,
    /// The scopes the batch recomputes: recorded as pending before its
    /// writes, cleared with its tokens.
    pub scopes: Scopes,
    /// Whether the batch re-planned every catalogue key (see
    /// [`State::catalog_unsure`]).
    pub whole_catalog: bool,
    /// The home sections the batch computed, with what they list.
    pub homes: Vec<(String, HomeList)>,
}

/// What the index families read of an active video: `addedTime`, and its
/// category and tag references as stored.
pub type IndexView = (i64, Box<[Sym]>, Box<[Sym]>);

/// What the index families read of a video.
fn view(v: Video<'_>) -> IndexView {
    (v.added_ms, v.cats.into(), v.tags.into())
}

pub struct State {
    pub names: Collections,
    pub catalog_docs: [IndexMap<IdKey, RawDocumentBuf>; 3],
    pub catalog: Catalog,
    /// The catalogue documents' decoded forms (see [`CatalogMemo`]).
    memo: CatalogMemo,
    /// What the catalogue's keys share (orders, payloads), for `catalog`,
    /// kept between batches: an edit computes again what it changed.
    pub derived: Derived,
    /// Whether the cache's catalogue keys may differ from what this state
    /// planned: after a load (the cache holds what some earlier process
    /// wrote) and after a failed batch that changed the catalogue. The
    /// next catalogue change then re-plans every catalogue key, not only
    /// those it reached, and deletes every other one.
    pub catalog_unsure: bool,
    /// Every video document, compactly, found by `_id` and by written
    /// id: the first document carrying a written id owns it (later ones
    /// are repeats and rejected).
    pub videos: Videos,
    /// The category and tag references the videos carry.
    pub syms: Syms,
    /// Detail payloads the current batch decoded, by document: planning
    /// writes them; committing or undoing the batch drops them (a handle
    /// stays the same document until then).
    details: FxHashMap<Handle, String>,
    pub existing: Existing,
    /// The active videos of each referenced category and tag.
    members: Members,
    /// Scopes a failed batch may have written part of: the next batch
    /// recomputes them whole. Mirrored in Redis (`cdc:pending`) so that a
    /// restart knows them too.
    pub dirty: Scopes,
    /// Documents (collection, id) a failed batch changed that no batch
    /// has saved since. The failed batch may have left keys of theirs in
    /// Redis newer than this state, a video's detail above all; the
    /// detail is what a replay after a restart reads to find the tag
    /// lists a video was indexed under. Until their events are saved
    /// again, `dirty` and `cdc:pending` keep the failed batch's scopes:
    /// a batch that only saved the events before them (the streams cut
    /// it shorter after the reopen) must not clear them.
    unsaved: BTreeSet<(Coll, String)>,
    /// Keys a batch could not write because no live master covered their
    /// slot (see [`super::deferred`]). Mirrored in Redis (`cdc:deferred`).
    pub deferred: BTreeSet<String>,
    /// After a load the documents are ahead of the streams, which replay
    /// changes the load already saw. Until every stream has passed the
    /// load, keys planned from this state may name versions the replay
    /// has not reached, so every scope written meanwhile stays dirty and
    /// is recomputed once the streams caught up.
    pub catching_up: bool,
    /// Whether the batch being applied may hold events the load already
    /// saw (it was caught up with while the load was ahead): the batch
    /// that ends the catch-up, and every one before it.
    pub replayed: bool,
}

/// A catalogue document before a change to it.
enum Prior {
    /// It was absent (the change appended it).
    Absent,
    /// It held this document, at its place.
    Replaced(RawDocumentBuf),
    /// It held this document at this position (the change removed it).
    Removed(usize, RawDocumentBuf),
}

/// What a batch did to the state, kept until it is committed or undone.
pub struct Applied {
    /// The catalogue before the batch, when the batch changed it.
    pub before: Option<Before>,
    /// How to take back each catalogue document change, in order (a copy
    /// of every catalogue document per batch cost more than the batch).
    catalog_undo: Vec<(Coll, IdKey, Prior)>,
    /// Each touched video document and written id's owners as they were
    /// before the batch's first change to them. Maps, not lists: a batch
    /// of 20,000 updates looked each one up in a list and spent seconds
    /// there.
    old_videos: HashMap<IdKey, Option<Saved>>,
    old_owners: HashMap<Wid, Vec<Handle>>,
    /// Written ids of the videos the batch touched, with the index view
    /// and the active categories each had before it.
    pub videos: std::collections::BTreeMap<String, (Option<IndexView>, Vec<String>)>,
    /// Written ids of the catalogue documents the batch touched.
    pub channels: BTreeSet<String>,
    pub categories: BTreeSet<String>,
    pub tags: BTreeSet<String>,
    /// Documents rejected while applying, with their reasons.
    pub rejected: Vec<Rejection>,
}

impl Applied {
    /// Folds in a later application to the same state (video events only),
    /// keeping the earliest "before" of everything: undoing the result
    /// undoes both.
    pub fn absorb(&mut self, later: Applied) {
        for (key, old) in later.old_videos {
            self.old_videos.entry(key).or_insert(old);
        }
        for (w, old) in later.old_owners {
            self.old_owners.entry(w).or_insert(old);
        }
        for (w, before) in later.videos {
            self.videos.entry(w).or_insert(before);
        }
        self.rejected.extend(later.rejected);
    }

    /// The documents the batch changed, by collection and id.
    fn documents(&self) -> impl Iterator<Item = (Coll, String)> + '_ {
        fn ids(coll: Coll, set: &BTreeSet<String>) -> impl Iterator<Item = (Coll, String)> + '_ {
            set.iter().map(move |id| (coll, id.clone()))
        }
        let videos = self.videos.keys().map(|w| (Coll::Video, w.clone()));
        videos
            .chain(ids(Coll::Channel, &self.channels))
            .chain(ids(Coll::Category, &self.categories))
            .chain(ids(Coll::Tag, &self.tags))
    }

    /// Whether the batch changed this document.
    fn changed(&self, (coll, id): &(Coll, String)) -> bool {
        match coll {
            Coll::Video => self.videos.contains_key(id),
            Coll::Channel => self.channels.contains(id),
            Coll::Category => self.categories.contains(id),
            Coll::Tag => self.tags.contains(id),
        }
    }
}

impl State {
    /// A state with the catalogue and no videos yet: the load files them
    /// in chunks ([`State::load_videos`]) and ends with
    /// [`State::finish_load`].
    pub fn new(
        names: &Collections,
        channels: Vec<RawDocumentBuf>,
        categories: Vec<RawDocumentBuf>,
        tags: Vec<RawDocumentBuf>,
    ) -> State {
        let index = |docs: Vec<RawDocumentBuf>| -> IndexMap<IdKey, RawDocumentBuf> {
            docs.into_iter().filter_map(|d| raw_id_key(&d).map(|k| (k, d))).collect()
        };
        let mut state = State {
            names: names.clone(),
            catalog: Catalog::default(),
            memo: CatalogMemo::default(),
            derived: Derived::default(),
            catalog_unsure: true,
            catalog_docs: [index(channels), index(categories), index(tags)],
            videos: Videos::default(),
            syms: Syms::default(),
            details: FxHashMap::default(),
            existing: Existing::default(),
            members: Members::default(),
            dirty: Scopes::default(),
            unsaved: BTreeSet::new(),
            deferred: BTreeSet::new(),
            catching_up: true,
            replayed: true,
        };
        state.catalog = state.memo.assemble(&state.catalog_docs, &Catalog::default());
        state.derived = Derived::new(&state.catalog, &mut RefReport::default());
        // The ids videos reference, nearly all: interned up front so that
        // the load looks them up in parallel.
        for c in state.catalog.categories() {
            state.syms.intern(&c.id);
        }
        for t in state.catalog.tags() {
            state.syms.intern(&t.id);
        }
        state
    }

    /// Files the next video documents of the load, in cursor order: they
    /// are decoded in parallel, then filed one by one, so the first
    /// document of a written id owns it, as in a rebuild. The raw
    /// documents are dropped here; the load never holds them all.
    pub fn load_videos(&mut self, docs: Vec<RawDocumentBuf>) {
        let decoded = State::decode_videos(&self.syms, &docs);
        drop(docs);
        self.file_videos(decoded);
    }

    /// The parallel half of [`State::load_videos`], which needs no state:
    /// the load decodes the next chunk while the previous one is filed.
    /// `syms` may be any earlier copy of the state's table (the load
    /// passes the catalogue's): a reference it lacks is interned when
    /// filed, and interning gives a text the symbol it already has.
    pub fn decode_videos<D: AsRef<RawDocument> + Sync>(syms: &Syms, docs: &[D]) -> DecodedVideos {
        use rayon::prelude::*;
        let look = |ids: Vec<Wid>| -> Vec<Result<Sym, String>> {
            ids.into_iter().map(|id| id.with_text(|text| syms.get(text)).ok_or_else(|| id.text())).collect()
        };
        let decoded = docs
            .par_iter()
            .map(|doc| {
                let doc = doc.as_ref();
                // `_id` is read once for its key, the value kept and the
                // written id; a document whose id is unusable is rejected
                // as `decode` would, and keeps no references.
                let raw = doc.get("_id").ok().flatten()?;
                let raw_id: Bson = raw.to_raw_bson().try_into().ok()?;
                let written = match read_id(raw) {
                    IdValue::Usable(id) => Some(id),
                    IdValue::Unusable(_) => None,
                };
                let wid = written.as_deref().map(Wid::new);
                let refs =
                    written.and_then(|id| decode_video(doc, id, &mut RefReport::default(), false).ok()).map(|d| {
                        LoadedRefs {
                            active: d.active,
                            added_ms: d.added_ms,
                            cats: look(d.category_ids),
                            tags: look(d.tag_ids),
                        }
                    });
                Some(DecodedVideo { key: id_key(&raw_id), raw_id, written: wid, refs })
            })
            .collect();
        DecodedVideos(decoded)
    }

    /// The serial half of [`State::load_videos`]: files decoded videos in
    /// their cursor order.
    pub fn file_videos(&mut self, decoded: DecodedVideos) {
        for video in decoded.0.into_iter().flatten() {
            let mut intern = |refs: Vec<Result<Sym, String>>| -> Vec<Sym> {
                refs.into_iter().map(|r| r.unwrap_or_else(|id| self.syms.intern(&id))).collect()
            };
            let fields = video.refs.map(|r| {
                let (cats, tags) = (intern(r.cats), intern(r.tags));
                Fields { active: r.active, added_ms: r.added_ms, cats, tags }
            });
            self.videos.put(video.key, video.raw_id, video.written, fields);
        }
        // A load is never taken back: each chunk is kept as it is filed
        // (a batch undone later must not give its handles or references
        // back), so the record of what a batch took stays a chunk long
        // instead of the whole collection (16 MiB at 2M videos, and its
        // doubling copies during the load).
        self.videos.commit();
    }

    /// Ends the load: files every effective video under its scopes.
    pub fn finish_load(&mut self) {
        // What the load filed is kept already (`file_videos` commits each
        // chunk): a batch taken back later cannot give it back.
        let effective = self.videos.owners().filter(|&h| self.videos.doc(h).is_some_and(|d| d.active));
        self.members = Members::build(&self.videos, effective);
    }

    /// The scopes' members, as planning reads them.
    pub fn members(&self) -> Scoped<'_> {
        self.members.view(&self.videos)
    }

    /// How many (scope, video) entries are filed.
    pub fn member_entries(&self) -> usize {
        self.members.len()
    }

    /// About how many bytes the per-video state holds: the video store
    /// and the scopes' members (what grows with the videos).
    pub fn video_footprint(&self) -> usize {
        self.videos.footprint() + self.members.footprint()
    }

    /// Builds the state from whole collections, in cursor order.
    pub fn load(
        names: &Collections,
        channels: Vec<RawDocumentBuf>,
        categories: Vec<RawDocumentBuf>,
        tags: Vec<RawDocumentBuf>,
        videos: Vec<RawDocumentBuf>,
    ) -> State {
        let mut state = State::new(names, channels, categories, tags);
        state.load_videos(videos);
        state.finish_load();
        state
    }

    pub fn video_count(&self) -> usize {
        self.videos.len()
    }

    /// The video that owns a written id: the first document carrying it,
    /// when that document is valid and active.
    pub fn effective(&self, written: &str) -> Option<Video<'_>> {
        self.effective_of(&Wid::new(written))
    }

    pub fn effective_of(&self, written: &Wid) -> Option<Video<'_>> {
        self.video_at(self.effective_handle(written)?)
    }

    /// The video of document `h`.
    fn video_at(&self, h: Handle) -> Option<Video<'_>> {
        let doc = self.videos.doc(h)?;
        Some(Video {
            added_ms: doc.added_ms,
            cats: doc.cats,
            tags: doc.tags,
            detail: self.details.get(&h).map(String::as_str),
        })
    }

    /// The categories [`State::effective`] gives, without looking up
    /// the detail payload (a flip reads thousands of members' categories).
    pub fn effective_categories(&self, written: &str) -> Option<&[Sym]> {
        let h = self.effective_handle(&Wid::new(written))?;
        self.videos.doc(h).map(|doc| doc.cats)
    }

    /// The document that makes a written id's video: its owner, when
    /// valid and active.
    fn effective_handle(&self, written: &Wid) -> Option<Handle> {
        let h = self.videos.owner(written.as_ref())?;
        self.videos.doc(h).is_some_and(|d| d.active).then_some(h)
    }

    /// The owner of a written id when its detail payload is not known
    /// (it was loaded without one): its raw `_id`, to read it again.
    pub fn needs_detail(&self, written: &str) -> Option<Bson> {
        let h = self.effective_handle(&Wid::new(written))?;
        (!self.details.contains_key(&h)).then(|| self.videos.raw_id(h))
    }

    /// What the drift check needs to judge a video's detail payload: the
    /// raw `_id` of the document that makes the video, to read it again,
    /// and what the state holds of it. `None` when no active document
    /// makes it (its detail should not exist).
    pub fn detail_probe(&self, written: &str) -> Option<(Bson, IndexView)> {
        let w = Wid::new(written);
        let h = self.effective_handle(&w)?;
        Some((self.videos.raw_id(h), self.view_of(&w)?))
    }

    pub fn index_view(&self, written: &str) -> Option<IndexView> {
        self.view_of(&Wid::new(written))
    }

    fn view_of(&self, written: &Wid) -> Option<IndexView> {
        self.effective_of(written).map(view)
    }

    /// A reference's text.
    pub fn name(&self, sym: Sym) -> &str {
        self.syms.name(sym)
    }

    /// The tracked keys of the patchable families whose contents are not
    /// known and that the state says should exist: each with the command
    /// that reads its size and the size the state derives for it.
    pub fn unknown_patchable(&self, keys: &Keys) -> Vec<(String, &'static str, usize)> {
        let catalog = &self.catalog;
        let mut out = Vec::new();
        // Each category's handles, sorted once for all its tags' lists.
        let mut handles: FxHashMap<Option<Sym>, Vec<Handle>> = FxHashMap::default();
        let tracked = self.existing.by_category.values().chain(self.existing.by_tag.values()).flatten();
        let mut seen = std::collections::HashSet::new();
        for key in tracked.filter(|k| !self.existing.held.contains_key(*k) && seen.insert(*k)) {
            let Some((family, args)) = keys.parse(key) else { continue };
            let derived = match (family, args.as_slice()) {
                (FamilyId::VideoCategoryIndex | FamilyId::VideoCategoryList, [cat]) => {
                    catalog.active_category(cat).map(|_| self.members().count_of_category(self.syms.get(cat)))
                }
                (FamilyId::VideoTagList, [cat, tag]) => catalog
                    .active_tag_index(tag)
                    .filter(|&t| catalog.tags()[t].category_id == *cat)
                    .and_then(|_| catalog.active_category(cat))
                    .map(|_| {
                        let owner = self.syms.get(cat);
                        let members = self.members();
                        let sorted = handles.entry(owner).or_insert_with(|| members.handles_of_category(owner));
                        members.count_of_tag_among(self.syms.get(tag), sorted)
                    }),
                _ => None,
            };
            let command = if family == FamilyId::VideoCategoryIndex { "ZCARD" } else { "LLEN" };
            if let Some(size) = derived.filter(|n| *n > 0) {
                out.push((key.clone(), command, size));
            }
        }
        out
    }

    /// Counts as known the keys of [`State::unknown_patchable`] whose size
    /// in Redis (`found`, in the same order) is the size the state
    /// derives. See the caller for why that is trusted.
    pub fn trust_sizes(&mut self, wanted: Vec<(String, &'static str, usize)>, found: &[usize]) -> usize {
        let mut trusted = 0;
        for ((key, _, size), found) in wanted.into_iter().zip(found) {
            if size == *found {
                self.existing.held.insert(key, Held { digest: None, size });
                trusted += 1;
            }
        }
        trusted
    }

    /// The video's distinct active categories, per `catalog`.
    pub fn active_categories(&self, catalog: &Catalog, video: Video<'_>) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for c in video.cats.iter().map(|&s| self.syms.name(s)) {
            if catalog.active_category(c).is_some() && !out.iter().any(|o| o == c) {
                out.push(c.to_string());
            }
        }
        out
    }

    fn put_video(&mut self, key: IdKey, raw_id: Bson, doc: Result<VideoDoc, Rejection>) {
        // The key is the `_id`, so a document's written id never changes.
        let written = written_of(&raw_id);
        let mut detail = None;
        let fields = doc.ok().map(|mut d| {
            detail = d.detail.take();
            let mut intern = |ids: Vec<Wid>| ids.iter().map(|i| i.with_text(|text| self.syms.intern(text))).collect();
            let (cats, tags) = (intern(d.category_ids), intern(d.tag_ids));
            Fields { active: d.active, added_ms: d.added_ms, cats, tags }
        });
        let h = self.videos.put(key, raw_id, written, fields);
        match detail {
            Some(detail) => self.details.insert(h, detail),
            None => self.details.remove(&h),
        };
    }

    /// Brings `derived` from the catalogue `before` to the current one:
    /// in place when the entities stand where they stood, whole otherwise
    /// (a document added, removed or rejected).
    fn rederive(&mut self, before: &Before, tags: &BTreeSet<String>, categories: &BTreeSet<String>) {
        if !before.same_places(&self.catalog) {
            self.derived = Derived::new(&self.catalog, &mut RefReport::default());
            return;
        }
        // The categories the tags left are computed again too.
        let left = tags.iter().filter_map(|id| before.tag(&self.catalog, id)).map(|t| t.category_id.clone());
        let categories: BTreeSet<String> = categories.iter().cloned().chain(left).collect();
        self.derived = std::mem::take(&mut self.derived).update(&self.catalog, tags, &categories);
    }

    /// Brings the catalogue in line with its documents after a batch
    /// changed these: edited in place when the batch only replaced
    /// documents, each keeping its id and place; assembled again
    /// otherwise.
    fn recatalog(&mut self, undo: &[(Coll, IdKey, Prior)]) -> Before {
        let changed: FxHashSet<(Coll, IdKey)> = undo.iter().map(|(coll, key, _)| (*coll, key.clone())).collect();
        let in_place = undo.iter().all(|(_, _, prior)| matches!(prior, Prior::Replaced(_)));
        if in_place && let Some(replaced) = self.memo.patch(&mut self.catalog, &self.catalog_docs, &changed) {
            return Before::Patched(replaced);
        }
        for (coll, key) in &changed {
            self.memo.forget(*coll, key);
        }
        let new = self.memo.assemble(&self.catalog_docs, &self.catalog);
        Before::Whole(Box::new(std::mem::replace(&mut self.catalog, new)))
    }

    /// Applies a batch of events, recording how to undo it.
    pub fn apply(&mut self, events: Vec<Event>) -> Applied {
        let mut applied = Applied {
            before: None,
            catalog_undo: Vec::new(),
            old_videos: HashMap::new(),
            old_owners: HashMap::new(),
            videos: Default::default(),
            channels: BTreeSet::new(),
            categories: BTreeSet::new(),
            tags: BTreeSet::new(),
            rejected: Vec::new(),
        };
        for event in events {
            match event {
                Event::Upsert { coll: Coll::Video, key, raw_id, doc, decoded } => {
                    self.before_video(&key, &raw_id, &mut applied);
                    let video = decoded.map_or_else(|| super::model::decode(&doc), |d| *d);
                    applied.rejected.extend(video.as_ref().err().cloned());
                    self.put_video(key, raw_id, video);
                }
                Event::Remove { coll: Coll::Video, key, raw_id } => {
                    self.before_video(&key, &raw_id, &mut applied);
                    if let Some(h) = self.videos.remove(&key) {
                        self.details.remove(&h);
                    }
                }
                Event::Upsert { coll, key, raw_id, doc, .. } => {
                    let old = self.catalog_docs[coll as usize].insert(key.clone(), doc.clone());
                    touch_catalog(coll, &raw_id, old.as_ref(), Some(&doc), &mut applied);
                    let prior = old.map_or(Prior::Absent, Prior::Replaced);
                    applied.catalog_undo.push((coll, key, prior));
                }
                Event::Remove { coll, key, raw_id } => {
                    let old = self.catalog_docs[coll as usize].shift_remove_full(&key);
                    touch_catalog(coll, &raw_id, old.as_ref().map(|(_, _, d)| d), None, &mut applied);
                    // A removal of a document the state lacks still counts
                    // as a catalogue change: a replayed one names documents
                    // the cache may still hold (see `plan_batch`).
                    let prior = old.map_or(Prior::Absent, |(at, _, doc)| Prior::Removed(at, doc));
                    applied.catalog_undo.push((coll, key, prior));
                }
            }
        }
        if !applied.catalog_undo.is_empty() {
            let before = self.recatalog(&applied.catalog_undo);
            self.rederive(&before, &applied.tags, &applied.categories);
            applied.before = Some(before);
        }
        // File the touched videos again, as they are now (they were
        // unfiled before their first change: see `before_video`).
        self.file_touched(&applied, true);
        applied
    }

    /// Files (or unfiles) the effective videos of the written ids a batch
    /// touched, as the store holds them now.
    fn file_touched(&mut self, applied: &Applied, file: bool) {
        for w in applied.videos.keys() {
            let Some(h) = self.effective_handle(&Wid::new(w)) else { continue };
            match file {
                true => self.members.insert(&self.videos, h),
                false => self.members.remove(&self.videos, h),
            }
        }
    }

    /// Records, once per batch, a video document and its written id's
    /// owners before it, and what the index families saw of that id.
    /// The first time, also unfiles the id's video from its scopes: the
    /// scopes find a member by its record, which is about to change.
    fn before_video(&mut self, key: &IdKey, raw_id: &Bson, applied: &mut Applied) {
        applied.old_videos.entry(key.clone()).or_insert_with(|| self.videos.save(key));
        if let Some(w) = written_of(raw_id) {
            applied.old_owners.entry(w.clone()).or_insert_with(|| self.videos.carriers(w.as_ref()));
            if let std::collections::btree_map::Entry::Vacant(entry) = applied.videos.entry(w.text()) {
                // One lookup of the written id for the view, the
                // categories and the members (three before).
                let h = self.effective_handle(&w);
                let video = h.and_then(|h| self.video_at(h));
                let cats = video.map(|v| self.active_categories(&self.catalog, v)).unwrap_or_default();
                entry.insert((video.map(view), cats));
                if let Some(h) = h {
                    self.members.remove(&self.videos, h);
                }
            }
        }
    }

    /// Takes back a batch whose writes failed: the documents are as before
    /// [`State::apply`], so a replay plans the same writes. Some of the
    /// writes and deletes may have landed, so the keys they name count as
    /// possibly held with unknown contents: a later change rewrites them
    /// if planned and deletes them if not.
    pub fn abort(&mut self, applied: Applied, keys: &Keys, record: &Record) {
        let (written, deleted) = (&record.written, &record.deleted);
        self.catalog_unsure |= applied.before.is_some();
        self.unsaved.extend(applied.documents());
        self.undo(applied);
        self.dirty.extend(&record.scopes);
        for key in written.iter().map(|(k, _)| k).chain(deleted) {
            self.existing.insert(keys, key, None);
        }
    }

    /// Takes a batch back: the state is exactly as before [`State::apply`].
    pub fn undo(&mut self, applied: Applied) {
        self.file_touched(&applied, false);
        let Applied { before, catalog_undo, old_videos, old_owners, videos, tags, categories, .. } = applied;
        // Between batches no detail is kept (see `commit`).
        self.details.clear();
        // Last change first, so each document goes back where it was.
        for (coll, key, prior) in catalog_undo.into_iter().rev() {
            let docs = &mut self.catalog_docs[coll as usize];
            match prior {
                Prior::Absent => drop(docs.shift_remove(&key)),
                Prior::Replaced(doc) => drop(docs.insert(key, doc)),
                Prior::Removed(at, doc) => drop(docs.shift_insert(at, key, doc)),
            }
        }
        // The memo describes the catalogue: an edit in place keeps each
        // document's id and place both ways, so it still does; an old
        // catalogue put back may hold other documents' entities.
        let undone = match before {
            Some(Before::Patched(replaced)) => Some(Before::Patched(replaced.restore(&mut self.catalog))),
            Some(Before::Whole(catalog)) => {
                self.memo.clear();
                Some(Before::Whole(Box::new(std::mem::replace(&mut self.catalog, *catalog))))
            }
            None => None,
        };
        if let Some(undone) = undone {
            self.rederive(&undone, &tags, &categories);
        }
        self.videos.undo(old_videos, old_owners);
        for w in videos.keys() {
            if let Some(h) = self.effective_handle(&Wid::new(w)) {
                self.members.insert(&self.videos, h);
            }
        }
    }

    /// Whether a failed batch's documents wait for their events to be
    /// saved again: the cache may hold writes of theirs the state lacks.
    pub fn awaits_replay(&self) -> bool {
        !self.unsaved.is_empty()
    }

    /// Whether saving `applied` ends what earlier batches left pending:
    /// not while the streams catch up with a load, nor while a failed
    /// batch's documents remain unsaved after this one.
    pub fn clears_pending(&self, applied: &Applied) -> bool {
        if self.catching_up {
            return false;
        }
        self.unsaved.iter().all(|doc| applied.changed(doc))
    }

    /// Keeps a batch whose writes are in Redis: records the keys it wrote
    /// and deleted, and drops the detail payloads it no longer needs.
    pub fn commit(&mut self, applied: Applied, keys: &Keys, record: &Record) {
        let (written, deleted) = (&record.written, &record.deleted);
        self.catalog_unsure &= !record.whole_catalog;
        let clear = self.clears_pending(&applied);
        self.unsaved.retain(|doc| !applied.changed(doc));
        if self.catching_up {
            self.dirty.extend(&record.scopes);
        } else if clear {
            self.dirty = Scopes::default();
        }
        for key in deleted {
            self.existing.remove(keys, key);
        }
        for (key, held) in written {
            self.existing.insert(keys, key, *held);
        }
        for (key, list) in &record.homes {
            self.existing.set_home_list(key, list.clone());
        }
        drop(applied);
        self.videos.commit();
        self.details.clear();
    }
}

/// A chunk of the load's videos, decoded and not yet filed: each
/// document's key, `_id`, written id and, when it decoded, its flag, time
/// and references (a symbol, or the text of one the decoder's table
/// lacked).
#[derive(Debug)]
pub struct DecodedVideos(Vec<Option<DecodedVideo>>);

/// One document of the load, decoded; `None` in [`DecodedVideos`] when
/// its `_id` cannot be read at all.
#[derive(Debug)]
struct DecodedVideo {
    key: IdKey,
    raw_id: Bson,
    /// Its written id, when usable.
    written: Option<Wid>,
    /// What it files under its scopes; `None` when it is rejected.
    refs: Option<LoadedRefs>,
}

/// A decoded video's index fields, its references looked up in the
/// catalogue's symbols (`Err`: a text the copy did not hold yet).
#[derive(Debug)]
struct LoadedRefs {
    active: bool,
    added_ms: i64,
    cats: Vec<Result<Sym, String>>,
    tags: Vec<Result<Sym, String>>,
}

/// The written id of a document's `_id`, when usable.
fn written_of(raw_id: &Bson) -> Option<Wid> {
    crate::model::id::written_id(raw_id).map(|w| Wid::new(&w))
}

/// The written ids [`State::apply`] will list in [`Applied::videos`] for
/// these events, known before it runs: what Redis holds of them can be
/// read while the batch is applied.
pub fn written_ids(events: &[Event]) -> BTreeSet<String> {
    events
        .iter()
        .filter_map(|event| match event {
            Event::Upsert { coll: Coll::Video, raw_id, .. } | Event::Remove { coll: Coll::Video, raw_id, .. } => {
                written_of(raw_id).map(|w| w.text())
            }
            _ => None,
        })
        .collect()
}

fn touch_catalog(
    coll: Coll,
    raw_id: &Bson,
    old: Option<&RawDocumentBuf>,
    new: Option<&RawDocumentBuf>,
    applied: &mut Applied,
) {
    let ids = crate::model::id::written_id(raw_id)
        .into_iter()
        .chain(old.and_then(|d| doc_id(d).ok()))
        .chain(new.and_then(|d| doc_id(d).ok()));
    let set = match coll {
        Coll::Channel => &mut applied.channels,
        Coll::Category => &mut applied.categories,
        Coll::Tag => &mut applied.tags,
        Coll::Video => return,
    };
    set.extend(ids);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracked_keys_are_filed_by_scope_and_unfiled_again() {
        let keys = Keys::new("app:");
        let mut existing = Existing::default();
        let list = keys.key(FamilyId::VideoTagList, &["c1", "t1"]).text;
        let home = keys.key(FamilyId::VideoListHome, &["ch", "latest"]).text;
        let all = keys.key(FamilyId::TagAll, &[]).text;
        let detail = keys.key(FamilyId::VideoDetail, &["v1"]).text;
        for key in [&list, &home, &all, &detail] {
            existing.insert(&keys, key, Some(Held { digest: Some(7), size: 0 }));
        }
        assert!(existing.by_category["c1"].contains(&list) && existing.by_tag["t1"].contains(&list));
        assert!(existing.by_channel["ch"].contains(&home));
        assert!(existing.catalog.contains(&all) && existing.digest(&all) == Some(7));
        assert_eq!(existing.len(), 3, "each tracked key once; per-video keys are not tracked");
        for key in [&list, &home, &all] {
            existing.remove(&keys, key);
        }
        assert!(existing.is_empty(), "{existing:?}");
        assert!(existing.by_category.is_empty() && existing.by_tag.is_empty() && existing.by_channel.is_empty());
    }

    #[test]
    fn the_ids_known_before_a_batch_are_those_it_lists_as_touched() {
        use crate::watch::model::id_key;
        use mongodb::bson::{doc, oid::ObjectId};
        let raw = |d: mongodb::bson::Document| RawDocumentBuf::from_document(&d).unwrap();
        let names = Collections { channel: "ch".into(), category: "cat".into(), tag: "tag".into(), video: "v".into() };
        let (kept, gone, repeat) = (ObjectId::new(), ObjectId::new(), ObjectId::new());
        let video = |id: Bson| raw(doc! { "_id": id, "title": "t", "listStatus": 1, "categoryIds": ["c1"] });
        let loaded = vec![video(Bson::ObjectId(kept)), video(Bson::ObjectId(gone)), video(Bson::ObjectId(repeat))];
        let loaded_again = loaded.clone();
        let mut state = State::new(&names, vec![], vec![], vec![]);
        state.load_videos(loaded);
        let upsert = |coll, id: Bson, doc| Event::Upsert { coll, key: id_key(&id), raw_id: id, doc, decoded: None };
        let remove = |coll, id: Bson| Event::Remove { coll, key: id_key(&id), raw_id: id };
        let events = vec![
            upsert(Coll::Video, Bson::ObjectId(kept), video(Bson::ObjectId(kept))),
            remove(Coll::Video, Bson::ObjectId(gone)),
            // A string repeat of a loaded ObjectId: one written id.
            upsert(Coll::Video, Bson::String(repeat.to_hex()), video(Bson::String(repeat.to_hex()))),
            // New, an unusable id, a document never loaded, a catalogue change.
            upsert(Coll::Video, Bson::String("fresh".into()), video(Bson::String("fresh".into()))),
            upsert(Coll::Video, Bson::Double(1.5), video(Bson::Double(1.5))),
            remove(Coll::Video, Bson::String("never".into())),
            upsert(Coll::Category, Bson::String("c1".into()), raw(doc! { "_id": "c1", "name": "C", "status": 1 })),
        ];
        let before = written_ids(&events);
        // The same batch with its videos decoded as the stream task does
        // on arrival, into a copy of the state.
        let mut other = State::new(&names, vec![], vec![], vec![]);
        other.load_videos(loaded_again);
        let arrived: Vec<Event> = events
            .iter()
            .cloned()
            .map(|event| match event {
                Event::Upsert { coll, key, raw_id, doc, .. } => {
                    let decoded = crate::watch::model::decode_on_arrival(coll, Some(&doc));
                    Event::Upsert { coll, key, raw_id, doc, decoded }
                }
                removed => removed,
            })
            .collect();
        let (applied, applied_other) = (state.apply(events), other.apply(arrived));
        let touched: BTreeSet<String> = applied.videos.keys().cloned().collect();
        assert_eq!(before, touched);
        assert!(touched.contains("fresh") && touched.contains(&repeat.to_hex()) && touched.len() == 5, "{touched:?}");
        assert_eq!(applied.rejected, applied_other.rejected);
        assert!(applied.rejected.len() == 1, "the double id: {:?}", applied.rejected);
        let seen = |state: &State, w: &str| {
            let names = |syms: &[Sym]| syms.iter().map(|&s| state.name(s).to_string()).collect::<Vec<_>>();
            state.effective(w).map(|v| (v.added_ms, names(v.cats), names(v.tags), v.detail.map(str::to_owned)))
        };
        for w in &touched {
            assert_eq!(seen(&state, w), seen(&other, w), "{w}");
        }
        assert!(seen(&other, "fresh").is_some_and(|(_, _, _, detail)| detail.is_some()));
    }

    #[test]
    fn a_failed_batch_s_scopes_stay_pending_until_its_documents_are_saved_again() {
        use crate::watch::model::id_key;
        use mongodb::bson::doc;
        let raw = |d: mongodb::bson::Document| RawDocumentBuf::from_document(&d).unwrap();
        let names = Collections { channel: "ch".into(), category: "cat".into(), tag: "tag".into(), video: "v".into() };
        let keys = Keys::new("app:");
        let mut state = State::new(&names, vec![], vec![], vec![]);
        state.load_videos(vec![]);
        state.catching_up = false;
        let put = |id: &str| {
            let doc = raw(doc! { "_id": id, "title": "t", "listStatus": 1, "tagIds": ["t1"] });
            Event::Upsert {
                coll: Coll::Video,
                key: id_key(&Bson::String(id.into())),
                raw_id: id.into(),
                doc,
                decoded: None,
            }
        };
        let mut record = Record::default();
        record.scopes.tags.insert("t1".into());
        // A batch of v1 and v2 fails: its scopes are dirty.
        let failed = state.apply(vec![put("v1"), put("v2")]);
        state.abort(failed, &keys, &record);
        assert!(state.dirty.tags.contains("t1"));
        // The streams, reopened, cut the replay after v1: saving it must
        // not clear what v2's failed writes may have left.
        let shorter = state.apply(vec![put("v1")]);
        assert!(!state.clears_pending(&shorter));
        state.commit(shorter, &keys, &Record::default());
        assert!(state.dirty.tags.contains("t1"), "{:?}", state.dirty);
        // The next batch saves v2 again: now the pending scopes clear.
        let rest = state.apply(vec![put("v2"), put("v3")]);
        assert!(state.clears_pending(&rest));
        state.commit(rest, &keys, &Record::default());
        assert!(state.dirty.is_empty(), "{:?}", state.dirty);
        // While catching up with a load nothing clears.
        state.catching_up = true;
        let caught = state.apply(vec![put("v4")]);
        assert!(!state.clears_pending(&caught));
    }

    #[test]
    fn an_undone_batch_leaves_a_catalogue_the_next_batch_builds_on() {
        use crate::watch::model::id_key;
        use mongodb::bson::{doc, oid::ObjectId};
        // Two documents with one written id: the string repeat is admitted
        // only while the ObjectId document before it is gone.
        let oid = ObjectId::new();
        let raw = |d: mongodb::bson::Document| RawDocumentBuf::from_document(&d).unwrap();
        let first = raw(doc! { "_id": oid, "name": "First", "seq": 1, "status": 1 });
        let repeat = raw(doc! { "_id": oid.to_hex(), "name": "Repeat", "seq": 1, "status": 1 });
        let names = Collections { channel: "ch".into(), category: "cat".into(), tag: "tag".into(), video: "v".into() };
        let mut state = State::new(&names, vec![], vec![first, repeat], vec![]);
        let remove = || {
            vec![Event::Remove { coll: Coll::Category, key: id_key(&Bson::ObjectId(oid)), raw_id: Bson::ObjectId(oid) }]
        };
        let name = |state: &State| state.catalog.category(&oid.to_hex()).map(|c| c.name.clone());
        assert_eq!(name(&state).as_deref(), Some("First"));

        let applied = state.apply(remove());
        assert_eq!(name(&state).as_deref(), Some("Repeat"));
        state.undo(applied);
        assert_eq!(name(&state).as_deref(), Some("First"));
        // The repeat was admitted in the undone catalogue only: what was
        // remembered of it then must not stand in for it now.
        state.apply(remove());
        assert_eq!(name(&state).as_deref(), Some("Repeat"));
    }

    #[test]
    fn decoding_with_an_older_symbol_table_files_the_same_references() {
        use mongodb::bson::doc;
        // The load decodes a chunk with the catalogue's symbols while the
        // chunk before it is filed, which may intern a dangling reference
        // the copy lacks: filing must give it the symbol it already has.
        let raw = |d: mongodb::bson::Document| RawDocumentBuf::from_document(&d).unwrap();
        let names = Collections { channel: "ch".into(), category: "cat".into(), tag: "tag".into(), video: "v".into() };
        let category = raw(doc! { "_id": "c1", "name": "C", "seq": 1, "status": 1 });
        let video = |id: &str| {
            raw(
                doc! { "_id": id, "title": id, "listStatus": 1, "categoryIds": ["c1", "gone"], "tagIds": ["t-gone", "gone"] },
            )
        };
        let mut state = State::new(&names, vec![], vec![category], vec![]);
        let catalog_syms = state.syms.clone();
        state.file_videos(State::decode_videos(&catalog_syms, &[video("v1")]));
        let later = State::decode_videos(&catalog_syms, &[video("v2")]);
        assert!(catalog_syms.get("gone").is_none() && state.syms.get("gone").is_some());
        state.file_videos(later);
        let refs = |state: &State, id: &str| {
            let doc = state
                .videos
                .doc(state.videos.find(&crate::watch::model::id_key(&Bson::String(id.into()))).unwrap())
                .unwrap();
            (doc.cats.to_vec(), doc.tags.to_vec())
        };
        assert_eq!(refs(&state, "v1"), refs(&state, "v2"));
        let (cats, tags) = refs(&state, "v2");
        assert_eq!(
            cats.iter().chain(&tags).map(|&s| state.name(s)).collect::<Vec<_>>(),
            ["c1", "gone", "t-gone", "gone"]
        );
    }
}
