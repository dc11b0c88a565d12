//! Video families: `video:detail`, `video:categories`,
//! `video:category:index`, `video:category:list`, `video:tag:list`,
//! `video:list:home`, and `category:video:count`.
//!
//! Details are planned one video at a time as documents stream in; the
//! index families are planned at the end from the small per-video tuples
//! kept in a [`VideoIndex`].

use super::order::newest_first;
use super::{Op, PlanCtx, Value};
use crate::model::catalog::Catalog;
use crate::model::report::RefReport;
use crate::model::video::{SITE_CATEGORY_IDS, SITE_TAG_IDS, VideoDoc};
use crate::registry::{FamilyId, HomeSectionKind};
use rayon::prelude::*;
use rustc_hash::FxHashMap as HashMap;

/// Plans `video:detail` for one decoded video, moving its payload out.
pub fn plan_detail(video: &mut VideoDoc, ctx: &PlanCtx, out: &mut Vec<Op>) {
    if let Some(detail) = video.detail.take() {
        ctx.emit(out, FamilyId::VideoDetail, &[&video.id], Value::String(detail));
    }
}

/// What the index families need of one active video.
#[derive(Debug, Clone)]
struct Entry {
    id: Box<str>,
    added_ms: i64,
    /// Interned category and tag references, as stored.
    cats: Box<[u32]>,
    tags: Box<[u32]>,
}

/// The per-video tuples of every active video, with referenced ids
/// interned so that 500K videos stay small.
#[derive(Debug, Default)]
pub struct VideoIndex {
    entries: Vec<Entry>,
    ids: Vec<Box<str>>,
    interned: HashMap<Box<str>, u32>,
}

impl VideoIndex {
    fn intern(&mut self, id: &str) -> u32 {
        if let Some(&n) = self.interned.get(id) {
            return n;
        }
        let n = self.ids.len() as u32;
        self.ids.push(id.into());
        self.interned.insert(id.into(), n);
        n
    }

    /// Keeps an active video's tuple; inactive videos are left out.
    pub fn push(&mut self, video: &VideoDoc) {
        if !video.active {
            return;
        }
        let cats = video.category_ids.iter().map(|c| self.intern(c)).collect();
        let tags = video.tag_ids.iter().map(|t| self.intern(t)).collect();
        self.entries.push(Entry { id: video.id.as_str().into(), added_ms: video.added_ms, cats, tags });
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Distinct values of `refs`, in first-seen order.
fn distinct(refs: &[u32]) -> Vec<u32> {
    let mut out: Vec<u32> = Vec::with_capacity(refs.len());
    for &r in refs {
        if !out.contains(&r) {
            out.push(r);
        }
    }
    out
}

/// Plans every index family from the collected tuples.
pub fn plan_indexes(index: &VideoIndex, catalog: &Catalog, ctx: &PlanCtx) -> (Vec<Op>, RefReport) {
    let mut refs = RefReport::default();
    // Resolve each interned id once: to an active category, and to an
    // active tag (with the active category that owns it, if any).
    let cat_of: Vec<Option<usize>> = index.ids.iter().map(|id| catalog.active_category_index(id)).collect();
    let tag_of: Vec<Option<(usize, Option<usize>)>> = index
        .ids
        .iter()
        .map(|id| {
            catalog.active_tag_index(id).map(|t| (t, catalog.active_category_index(&catalog.tags[t].category_id)))
        })
        .collect();

    // Newest first once; every list below is filled in this order.
    let mut order: Vec<u32> = (0..index.entries.len() as u32).collect();
    order.par_sort_unstable_by(|&a, &b| {
        let (ea, eb) = (&index.entries[a as usize], &index.entries[b as usize]);
        newest_first((ea.added_ms, &ea.id), (eb.added_ms, &eb.id))
    });

    let mut in_category: Vec<Vec<u32>> = vec![Vec::new(); catalog.categories.len()];
    let mut with_tag: Vec<Vec<u32>> = vec![Vec::new(); catalog.tags.len()];
    let mut out = Vec::new();
    for &v in &order {
        let entry = &index.entries[v as usize];
        let mut cats = Vec::new();
        for c in distinct(&entry.cats) {
            match cat_of[c as usize] {
                Some(cat) => cats.push(cat),
                None => refs.dangling(SITE_CATEGORY_IDS, 1),
            }
        }
        for &cat in &cats {
            in_category[cat].push(v);
        }
        for t in distinct(&entry.tags) {
            match tag_of[t as usize] {
                Some((tag, Some(owner))) if cats.contains(&owner) => with_tag[tag].push(v),
                Some(_) => {}
                None => refs.dangling(SITE_TAG_IDS, 1),
            }
        }
        if ctx.families.contains(FamilyId::VideoCategories) {
            let ids = cats.iter().map(|&c| catalog.categories[c].id.clone()).collect();
            ctx.emit(&mut out, FamilyId::VideoCategories, &[&entry.id], Value::Set(ids));
        }
    }

    let ids_of = |members: &[u32]| -> Vec<String> {
        members.iter().map(|&v| index.entries[v as usize].id.to_string()).collect()
    };
    let scored = |members: &[u32]| -> Vec<(i64, String)> {
        members
            .iter()
            .map(|&v| {
                let e = &index.entries[v as usize];
                (e.added_ms, e.id.to_string())
            })
            .collect()
    };

    let per_category: Vec<Vec<Op>> = catalog
        .categories
        .par_iter()
        .enumerate()
        .filter(|(_, c)| c.active)
        .map(|(c, cat)| {
            let members = &in_category[c];
            let mut ops = Vec::new();
            let count = members.len().to_string();
            ctx.emit(&mut ops, FamilyId::CategoryVideoCount, &[&cat.id], Value::String(count));
            ctx.emit(&mut ops, FamilyId::VideoCategoryIndex, &[&cat.id], Value::Zset(scored(members)));
            ctx.emit(&mut ops, FamilyId::VideoCategoryList, &[&cat.id], Value::List(ids_of(members)));
            ops
        })
        .collect();
    out.extend(per_category.into_iter().flatten());

    for (t, members) in with_tag.iter().enumerate() {
        let tag = &catalog.tags[t];
        ctx.emit(&mut out, FamilyId::VideoTagList, &[&tag.category_id, &tag.id], Value::List(ids_of(members)));
    }

    if ctx.families.contains(FamilyId::VideoListHome) {
        let rank = {
            let mut rank = vec![0u32; index.entries.len()];
            for (pos, &v) in order.iter().enumerate() {
                rank[v as usize] = pos as u32;
            }
            rank
        };
        for ch in &catalog.channels {
            let mut cats: Vec<usize> =
                ch.categories.iter().filter_map(|item| catalog.active_category_index(&item.id)).collect();
            cats.sort_unstable();
            cats.dedup();
            for section in &ctx.home_sections {
                let HomeSectionKind::Latest = section.kind;
                // The newest `limit` of the union lie within the newest
                // `limit` of each category.
                let mut picked: Vec<u32> = cats
                    .iter()
                    .flat_map(|&c| in_category[c].iter().take(section.limit))
                    .map(|&v| rank[v as usize])
                    .collect();
                picked.sort_unstable();
                picked.dedup();
                picked.truncate(section.limit);
                let members: Vec<u32> = picked.iter().map(|&r| order[r as usize]).collect();
                ctx.emit(&mut out, FamilyId::VideoListHome, &[&ch.id, &section.name], Value::Zset(scored(&members)));
            }
        }
    }
    (out, refs)
}
