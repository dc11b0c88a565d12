//! The rebuild's per-video index: what the index families and the sweep
//! need of every video read, about 70 bytes a video whatever its payload.
//!
//! The catalogue is read first, so a video's references are resolved
//! while it is decoded (in parallel) and its `video:detail` and
//! `video:categories` are planned as it is admitted. What stays is one
//! 32-byte record per video (its written id as ObjectId bytes, `addedTime`,
//! flags) and, for an active video, its resolved category and tag indexes
//! in one shared arena. At the end the index keys (`video:category:*`,
//! `video:tag:list`, `video:list:home`, `category:video:count`) are planned
//! one group of keys at a time, so that the run never holds every index's
//! operations at once. The sweep asks the index which per-video keys the
//! run produced instead of keeping a digest of each.

use super::video::plan_detail;
use super::{Op, PlanCtx, Value};
use crate::model::catalog::Catalog;
use crate::model::compact::{Wid, WidRef};
use crate::model::report::RefReport;
use crate::model::video::VideoDoc;
use crate::model::video::{SITE_CATEGORY_IDS, SITE_TAG_IDS};
use crate::registry::{FamilyId, HomeSectionKind};
use hashbrown::HashTable;
use rayon::prelude::*;
use std::cmp::Ordering;
use std::hash::BuildHasher;

/// Indexed: an admitted active video (its references are in the arena).
const ACTIVE: u8 = 1;
/// Its `video:detail` was planned.
const DETAIL: u8 = 2;
/// Its `video:categories` was planned.
const CATEGORIES: u8 = 4;
/// Its written id is not ObjectId hex: `id` holds an index into `texts`.
const TEXT: u8 = 8;

/// One video read with a usable id (admitted or not: a later repeat of
/// its id is a duplicate either way).
#[derive(Debug, Clone, Copy)]
struct Rec {
    added_ms: i64,
    /// Where its references start in the arena (active videos only).
    refs_at: u64,
    id: [u8; 12],
    flags: u8,
}

/// A video's resolved references in arena form: the number of categories,
/// the categories (catalogue indexes), the number of tags, the tags.
pub type Resolved = Vec<u32>;

/// Resolves an active video's references against the catalogue, as the
/// index families read them: its distinct active categories in stored
/// order, and its distinct active tags whose active category is one of
/// them. Dangling references are counted into `refs`.
///
/// Runs once per video of a rebuild, so it allocates only its answer: the
/// repeats are found in the id lists themselves (a handful of ids each),
/// and a tag's category is matched by its id against the video's own
/// active category ids instead of being looked up again.
pub fn resolve_refs(video: &VideoDoc, catalog: &Catalog, refs: &mut RefReport) -> Resolved {
    let (cat_ids, tag_ids) = (&video.category_ids, &video.tag_ids);
    let mut out = Vec::with_capacity(2 + cat_ids.len() + tag_ids.len());
    out.push(0);
    for (i, id) in cat_ids.iter().enumerate() {
        if cat_ids[..i].contains(id) {
            continue;
        }
        match catalog.active_category_place(id) {
            Some(c) => out.push(c as u32),
            None => refs.dangling(SITE_CATEGORY_IDS, 1),
        }
    }
    let cats = out.len() - 1;
    out[0] = cats as u32;
    out.push(0);
    for (i, id) in tag_ids.iter().enumerate() {
        if tag_ids[..i].contains(id) {
            continue;
        }
        match catalog.active_tag_place(id) {
            // An id names one place in the catalogue, so the tag's category
            // is one of the video's active ones exactly when its place is
            // one of theirs: positions compared, not id texts.
            Some(t) if catalog.tag_category_index(t).is_some_and(|tc| out[1..=cats].contains(&(tc as u32))) => {
                out.push(t as u32)
            }
            Some(_) => {}
            None => refs.dangling(SITE_TAG_IDS, 1),
        }
    }
    out[cats + 1] = (out.len() - cats - 2) as u32;
    out
}

/// Resolved references, in pages that are never moved: a growing `Vec`
/// would, at its last doubling, hold the old and the new copy at once
/// (about three times the data) at the end of the read, when the run is
/// at its largest.
#[derive(Debug, Default)]
struct Arena {
    pages: Vec<Vec<u32>>,
}

/// Entries per page (256 KiB).
const PAGE: usize = 1 << 16;

impl Arena {
    /// Stores one video's references; its place is the page (high 32
    /// bits) and the offset in it. A run longer than a page gets a page
    /// of its own.
    fn push(&mut self, refs: &[u32]) -> u64 {
        let fits = self.pages.last().is_some_and(|page| page.capacity() - page.len() >= refs.len());
        if !fits {
            self.pages.push(Vec::with_capacity(PAGE.max(refs.len())));
        }
        let page = self.pages.len() - 1;
        let last = &mut self.pages[page];
        let offset = last.len();
        last.extend_from_slice(refs);
        ((page as u64) << 32) | offset as u64
    }

    /// The references stored from `at` to the end of its page (the
    /// caller reads its own lengths).
    fn get(&self, at: u64) -> &[u32] {
        &self.pages[(at >> 32) as usize][(at & 0xffff_ffff) as usize..]
    }
}

/// The written id of the record at `at` (a text id's record holds its
/// index into `texts`).
fn written_id<'a>(recs: &'a [Rec], texts: &'a [Box<str>], at: u32) -> WidRef<'a> {
    let rec = &recs[at as usize];
    if rec.flags & TEXT != 0 {
        let n = u32::from_le_bytes(rec.id[..4].try_into().expect("4 bytes"));
        WidRef::Text(&texts[n as usize])
    } else {
        WidRef::Hex(&rec.id)
    }
}

/// Every video read, by written id.
#[derive(Debug, Default)]
pub struct VideoTable {
    recs: Vec<Rec>,
    texts: Vec<Box<str>>,
    seen: HashTable<u32>,
    arena: Arena,
    indexed: usize,
}

impl VideoTable {
    /// Room for `n` videos in all, taken at once (growing by doubling
    /// would double the run's largest structure at its end).
    pub fn reserve(&mut self, n: usize) {
        let more = n.saturating_sub(self.recs.len());
        self.recs.reserve(more);
        let Self { seen, recs, texts, .. } = self;
        seen.reserve(more, |&at| rustc_hash::FxBuildHasher.hash_one(written_id(recs, texts, at)));
    }

    fn wid(&self, at: u32) -> WidRef<'_> {
        written_id(&self.recs, &self.texts, at)
    }

    fn hash(&self, id: WidRef<'_>) -> u64 {
        rustc_hash::FxBuildHasher.hash_one(id)
    }

    fn find(&self, id: WidRef<'_>) -> Option<u32> {
        self.seen.find(self.hash(id), |&at| self.wid(at) == id).copied()
    }

    /// Claims a written id in cursor order: its position, or `None` when
    /// an earlier document had it (this one is a duplicate). One probe
    /// of the table: the id is hashed once and its slot, when free, is
    /// the one the lookup ended on (a lookup and a separate insert were
    /// two cache misses a video at this size).
    pub fn claim(&mut self, id: &str) -> Option<u32> {
        let wid = Wid::new(id);
        let hash = self.hash(wid.as_ref());
        let at = u32::try_from(self.recs.len()).expect("fewer than 4 billion videos");
        let Self { seen, recs, texts, .. } = self;
        let slot = {
            let (recs, texts) = (&*recs, &*texts);
            seen.entry(
                hash,
                |&other| written_id(recs, texts, other) == wid.as_ref(),
                |&other| rustc_hash::FxBuildHasher.hash_one(written_id(recs, texts, other)),
            )
        };
        let hashbrown::hash_table::Entry::Vacant(slot) = slot else { return None };
        let (bytes, flags) = match &wid {
            Wid::Hex(bytes) => (*bytes, 0),
            Wid::Text(text) => {
                let n = u32::try_from(texts.len()).expect("fewer than 4 billion text ids");
                texts.push((**text).clone());
                let mut bytes = [0; 12];
                bytes[..4].copy_from_slice(&n.to_le_bytes());
                (bytes, TEXT)
            }
        };
        recs.push(Rec { added_ms: 0, refs_at: 0, id: bytes, flags });
        slot.insert(at);
        Some(at)
    }

    /// Admits a claimed video: plans its `video:detail` and, when it is
    /// active, keeps its resolved references and plans its
    /// `video:categories`.
    pub fn admit(
        &mut self,
        at: u32,
        video: &mut VideoDoc,
        resolved: Option<Resolved>,
        catalog: &Catalog,
        ctx: &PlanCtx,
        ops: &mut Vec<Op>,
    ) {
        let mut flags = 0;
        let before = ops.len();
        plan_detail(video, ctx, ops);
        if ops.len() > before {
            flags |= DETAIL;
        }
        if let (true, Some(resolved)) = (video.active, resolved) {
            flags |= ACTIVE;
            self.indexed += 1;
            let cats = &resolved[1..=resolved[0] as usize];
            if !cats.is_empty() && ctx.families.contains(FamilyId::VideoCategories) {
                let ids = cats.iter().map(|&c| catalog.categories()[c as usize].id.clone()).collect();
                ops.push(Op { key: ctx.keys.key(FamilyId::VideoCategories, &[&video.id]), value: Value::Set(ids) });
                flags |= CATEGORIES;
            }
            let rec = &mut self.recs[at as usize];
            rec.refs_at = self.arena.push(&resolved);
            rec.added_ms = video.added_ms;
        }
        self.recs[at as usize].flags |= flags;
    }

    /// How many active videos the index families see.
    pub fn indexed(&self) -> usize {
        self.indexed
    }

    /// Whether the run planned this per-video key (`id` is the key's
    /// video id); `None` for a family that is not per video.
    pub fn planned(&self, family: FamilyId, id: &str) -> Option<bool> {
        let flag = match family {
            FamilyId::VideoDetail => DETAIL,
            FamilyId::VideoCategories => CATEGORIES,
            _ => return None,
        };
        let wid = Wid::new(id);
        Some(self.find(wid.as_ref()).is_some_and(|at| self.recs[at as usize].flags & flag != 0))
    }

    fn refs(&self, at: u32) -> (&[u32], &[u32]) {
        let refs = self.arena.get(self.recs[at as usize].refs_at);
        let n_cats = refs[0] as usize;
        let cats = &refs[1..1 + n_cats];
        let n_tags = refs[1 + n_cats] as usize;
        let tags = &refs[2 + n_cats..2 + n_cats + n_tags];
        (cats, tags)
    }

    fn newest(&self, a: u32, b: u32) -> Ordering {
        let (ra, rb) = (&self.recs[a as usize], &self.recs[b as usize]);
        rb.added_ms.cmp(&ra.added_ms).then_with(|| self.wid(a).cmp(&self.wid(b)))
    }

    /// Members of each category and tag (positions), newest first.
    fn scopes(&self, catalog: &Catalog) -> (Vec<Vec<u32>>, Vec<Vec<u32>>) {
        let active = || (0..self.recs.len() as u32).filter(|&at| self.recs[at as usize].flags & ACTIVE != 0);
        // Counted first so that every list is allocated once, exactly.
        let (mut n_cat, mut n_tag) = (vec![0usize; catalog.categories().len()], vec![0usize; catalog.tags().len()]);
        for at in active() {
            let (cats, tags) = self.refs(at);
            cats.iter().for_each(|&c| n_cat[c as usize] += 1);
            tags.iter().for_each(|&t| n_tag[t as usize] += 1);
        }
        let mut in_cat: Vec<Vec<u32>> = n_cat.into_iter().map(Vec::with_capacity).collect();
        let mut with_tag: Vec<Vec<u32>> = n_tag.into_iter().map(Vec::with_capacity).collect();
        for at in active() {
            let (cats, tags) = self.refs(at);
            cats.iter().for_each(|&c| in_cat[c as usize].push(at));
            tags.iter().for_each(|&t| with_tag[t as usize].push(at));
        }
        in_cat
            .par_iter_mut()
            .chain(with_tag.par_iter_mut())
            .for_each(|m| m.sort_unstable_by(|&a, &b| self.newest(a, b)));
        (in_cat, with_tag)
    }

    fn ids(&self, members: &[u32]) -> Vec<String> {
        members.iter().map(|&at| self.wid(at).text()).collect()
    }

    fn scored(&self, members: &[u32]) -> Vec<(i64, String)> {
        members.iter().map(|&at| (self.recs[at as usize].added_ms, self.wid(at).text())).collect()
    }

    /// Plans every index key, a group at a time: `send` gets each group's
    /// ops and returns false to stop (the writer failed).
    pub fn plan_index_keys(&self, catalog: &Catalog, ctx: &PlanCtx, send: &mut dyn FnMut(Vec<Op>) -> bool) {
        /// Scopes planned together (in parallel) and sent as one group.
        const GROUP: usize = 16;
        let (in_cat, with_tag) = self.scopes(catalog);
        let categories: Vec<usize> =
            (0..catalog.categories().len()).filter(|&c| catalog.categories()[c].active).collect();
        for group in categories.chunks(GROUP) {
            let ops = group
                .par_iter()
                .flat_map_iter(|&c| {
                    let (cat, members) = (&catalog.categories()[c], &in_cat[c]);
                    let mut ops = Vec::with_capacity(3);
                    let count = members.len().to_string();
                    ctx.emit(&mut ops, FamilyId::CategoryVideoCount, &[&cat.id], Value::String(count));
                    if ctx.families.contains(FamilyId::VideoCategoryIndex) {
                        ctx.emit(&mut ops, FamilyId::VideoCategoryIndex, &[&cat.id], Value::Zset(self.scored(members)));
                    }
                    if ctx.families.contains(FamilyId::VideoCategoryList) {
                        ctx.emit(&mut ops, FamilyId::VideoCategoryList, &[&cat.id], Value::List(self.ids(members)));
                    }
                    ops
                })
                .collect();
            if !send(ops) {
                return;
            }
        }
        if ctx.families.contains(FamilyId::VideoTagList) {
            let tags: Vec<usize> = (0..catalog.tags().len()).filter(|&t| !with_tag[t].is_empty()).collect();
            for group in tags.chunks(GROUP) {
                let ops = group
                    .par_iter()
                    .flat_map_iter(|&t| {
                        let tag = &catalog.tags()[t];
                        let mut ops = Vec::with_capacity(1);
                        let ids = Value::List(self.ids(&with_tag[t]));
                        ctx.emit(&mut ops, FamilyId::VideoTagList, &[&tag.category_id, &tag.id], ids);
                        ops
                    })
                    .collect();
                if !send(ops) {
                    return;
                }
            }
        }
        drop(with_tag);
        if ctx.families.contains(FamilyId::VideoListHome) {
            for channel in catalog.channels() {
                let mut cats: Vec<usize> =
                    channel.categories.iter().filter_map(|item| catalog.active_category_index(&item.id)).collect();
                cats.sort_unstable();
                cats.dedup();
                let mut ops = Vec::new();
                for section in &ctx.home_sections {
                    let HomeSectionKind::Latest = section.kind;
                    // The newest `limit` of the union lie within the newest
                    // `limit` of each category; a video in two of them
                    // sorts next to itself and is kept once.
                    let mut picked: Vec<u32> =
                        cats.iter().flat_map(|&c| in_cat[c].iter().take(section.limit).copied()).collect();
                    picked.sort_unstable_by(|&a, &b| self.newest(a, b));
                    picked.dedup();
                    picked.truncate(section.limit);
                    let value = Value::Zset(self.scored(&picked));
                    ctx.emit(&mut ops, FamilyId::VideoListHome, &[&channel.id, &section.name], value);
                }
                if !send(ops) {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::compact::Wid;
    use crate::plan::order::newest_first;

    /// The references as the watcher resolves them (`video::resolve` over
    /// the distinct ids, every tag's category looked up): the rebuild's
    /// allocation-free path must agree, dangling counts included. The
    /// expected places are found by comparing id texts one by one, so the
    /// catalogue's keyed lookups (ObjectId hex by its bytes, other ids by
    /// text) are checked too: half the categories have hex ids, and some
    /// references spell them in capitals, which names no category.
    #[test]
    fn references_resolve_as_the_shared_rule_says() {
        use crate::plan::video::{distinct, resolve};
        use mongodb::bson::{doc, rawdoc};
        let cid = |c: u64| if c.is_multiple_of(2) { format!("c{c}") } else { format!("{:024x}", 0xabc0 + c) };
        let spelled = |c: u64, upper: bool| if upper { cid(c).to_uppercase() } else { cid(c) };
        let categories: Vec<_> = (0..6)
            .map(|c| {
                mongodb::bson::RawDocumentBuf::from_document(
                    &doc! {"_id": cid(c), "name": "n", "seq": 1, "status": (c % 3) as i32},
                )
                .unwrap()
            })
            .collect();
        let tags: Vec<_> = (0..10)
            .map(|t| {
                // c6 and c7 do not exist; every third tag is inactive.
                let owner = spelled((t * 5) % 8, t % 4 == 1);
                mongodb::bson::RawDocumentBuf::from_document(&doc! {"_id": format!("t{t}"), "name": "n", "seq": 1, "status": i32::from(t % 3 != 0), "categoryId": owner}).unwrap()
            })
            .collect();
        let channels = [rawdoc! {"_id": "ch", "name": "n"}];
        let names = crate::config::Config::from_raw(crate::config::RawConfig::default()).unwrap().collections;
        let (catalog, _, _) = crate::plan::decode::decode_catalog(&names, &channels, &categories, &tags);
        let mut seed = 0x2545_f491_4f6c_dd1d_u64;
        let mut below = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for _ in 0..2_000 {
            let category_ids: Vec<Wid> = (0..below(6)).map(|_| Wid::new(&spelled(below(9), below(5) == 0))).collect();
            let tag_ids: Vec<Wid> = (0..below(8)).map(|_| Wid::new(&format!("t{}", below(12)))).collect();
            let video = VideoDoc { id: "v".into(), active: true, added_ms: 0, category_ids, tag_ids, detail: None };
            let mut got_refs = RefReport::default();
            let got = resolve_refs(&video, &catalog, &mut got_refs);
            let mut want_refs = RefReport::default();
            let category_at = |id: &str| catalog.categories().iter().rposition(|c| c.id == id);
            let active_category = |id: &str| category_at(id).filter(|&c| catalog.categories()[c].active);
            let (cat_texts, tag_texts): (Vec<String>, Vec<String>) =
                (video.category_ids.iter().map(Wid::text).collect(), video.tag_ids.iter().map(Wid::text).collect());
            let cats = distinct(cat_texts.iter().map(String::as_str)).into_iter().map(active_category);
            let tags = distinct(tag_texts.iter().map(String::as_str)).into_iter().map(|t| {
                let at = catalog.tags().iter().rposition(|x| x.id == t).filter(|&x| catalog.tags()[x].active);
                at.map(|t| (t, active_category(&catalog.tags()[t].category_id)))
            });
            let (mut out_cats, mut out_tags) = (Vec::new(), Vec::new());
            resolve(cats, tags, &mut want_refs, &mut out_cats, &mut out_tags);
            let mut want = vec![out_cats.len() as u32];
            want.extend(out_cats.iter().map(|&c| c as u32));
            want.push(out_tags.len() as u32);
            want.extend(out_tags.iter().map(|&t| t as u32));
            assert_eq!(got, want, "{video:?}");
            assert_eq!(got_refs.dangling, want_refs.dangling, "{video:?}");
        }
    }

    #[test]
    fn a_record_is_32_bytes() {
        assert_eq!(size_of::<Rec>(), 32);
    }

    #[test]
    fn references_keep_their_place_across_pages() {
        let mut arena = Arena::default();
        let long: Vec<u32> = (0..PAGE as u32 + 5).collect();
        let places: Vec<(u64, Vec<u32>)> = [vec![1, 7], long.clone(), vec![0, 1, 9], vec![2; PAGE - 2], vec![3, 4]]
            .into_iter()
            .map(|refs| (arena.push(&refs), refs))
            .collect();
        for (at, refs) in &places {
            assert_eq!(&arena.get(*at)[..refs.len()], refs.as_slice());
        }
        // The long run got a page of its own; the next ones share one
        // until it is full.
        assert_eq!(arena.pages.len(), 4);
    }

    #[test]
    fn repeats_of_a_written_id_are_refused_in_either_form() {
        let mut table = VideoTable::default();
        let hex = "65a1b2c3d4e5f6a7b8c9d0e1";
        assert_eq!(table.claim(hex), Some(0));
        assert_eq!(table.claim("v-1"), Some(1));
        assert_eq!(table.claim(hex), None);
        assert_eq!(table.claim("v-1"), None);
        assert_eq!(table.claim("65A1B2C3D4E5F6A7B8C9D0E1"), Some(2));
        assert_eq!((table.wid(0).text(), table.wid(1).text()), (hex.to_string(), "v-1".to_string()));
    }

    /// The estimate may come after the first videos: reserving then
    /// keeps every claimed id found, and makes room for the rest at once.
    #[test]
    fn room_reserved_after_the_first_claims_keeps_them_claimed() {
        let mut table = VideoTable::default();
        let ids: Vec<String> =
            (0..300).map(|i| if i % 3 == 0 { format!("v-{i}") } else { format!("{i:024x}") }).collect();
        for id in &ids[..100] {
            assert!(table.claim(id).is_some());
        }
        table.reserve(10_000);
        assert!(table.seen.capacity() >= 10_000 && table.recs.capacity() >= 10_000);
        let (seen, recs) = (table.seen.capacity(), table.recs.capacity());
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(table.claim(id).is_some(), i >= 100, "{id}");
        }
        assert_eq!((table.seen.capacity(), table.recs.capacity()), (seen, recs), "grew after reserving");
    }

    #[test]
    fn members_sort_newest_first_then_by_id_text() {
        let mut table = VideoTable::default();
        let ids = ["ffffffffffffffffffffffff", "Z", "0000000000000000000000aa", "a", "b"];
        let added = [5, 5, 5, 9, 5];
        for (id, added) in ids.iter().zip(added) {
            let at = table.claim(id).unwrap();
            table.recs[at as usize].added_ms = added;
        }
        let mut at: Vec<u32> = (0..ids.len() as u32).collect();
        at.sort_unstable_by(|&a, &b| table.newest(a, b));
        let got: Vec<String> = at.iter().map(|&a| table.wid(a).text()).collect();
        let mut want: Vec<(i64, &str)> = ids.iter().zip(added).map(|(i, a)| (a, *i)).collect();
        want.sort_unstable_by(|a, b| newest_first(*a, *b));
        assert_eq!(got, want.iter().map(|(_, i)| i.to_string()).collect::<Vec<_>>());
    }
}
