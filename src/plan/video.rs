//! Video families: `video:detail`, `video:categories`,
//! `video:category:index`, `video:category:list`, `video:tag:list`,
//! `video:list:home`, and `category:video:count`.
//!
//! The rebuild plans them through [`super::index::VideoTable`]; the
//! watcher plans the selected scopes' `video:categories` with
//! [`plan_selected`].

use super::order::newest_first;
use super::{Op, PlanCtx, Value};
use crate::model::catalog::Catalog;
use crate::model::report::RefReport;
use crate::model::video::{SITE_CATEGORY_IDS, SITE_TAG_IDS, VideoDoc};
use crate::registry::{FamilyId, HomeSectionKind};
use rayon::prelude::*;
use rustc_hash::FxHashSet as HashSet;

/// Plans `video:detail` for one decoded video, moving its payload out.
pub fn plan_detail(video: &mut VideoDoc, ctx: &PlanCtx, out: &mut Vec<Op>) {
    if let Some(detail) = video.detail.take() {
        ctx.emit(out, FamilyId::VideoDetail, &[&video.id], Value::String(detail));
    }
}

/// Distinct values of `refs`, in first-seen order.
pub fn distinct<T: PartialEq + Copy>(refs: impl IntoIterator<Item = T>) -> Vec<T> {
    let mut out: Vec<T> = Vec::new();
    for r in refs {
        if !out.contains(&r) {
            out.push(r);
        }
    }
    out
}

/// One active video as the index families see it: its written id, its
/// `addedTime`, and its references resolved against the catalogue.
#[derive(Debug, Clone, Copy)]
pub struct Member<'a> {
    pub id: &'a str,
    pub added_ms: i64,
    /// Its distinct active categories (catalogue indexes), stored order.
    pub cats: &'a [usize],
    /// Its distinct active tags whose active category is one of `cats`.
    pub tags: &'a [usize],
}

/// Resolves a video's distinct references: `cats` gives each category
/// reference's active category, `tags` each tag reference's active tag
/// with its owner's active category. Dangling references are counted.
pub fn resolve(
    cats: impl IntoIterator<Item = Option<usize>>,
    tags: impl IntoIterator<Item = Option<(usize, Option<usize>)>>,
    refs: &mut RefReport,
    out_cats: &mut Vec<usize>,
    out_tags: &mut Vec<usize>,
) {
    out_cats.clear();
    out_tags.clear();
    for cat in cats {
        match cat {
            Some(c) => out_cats.push(c),
            None => refs.dangling(SITE_CATEGORY_IDS, 1),
        }
    }
    for tag in tags {
        match tag {
            Some((t, Some(owner))) if out_cats.contains(&owner) => out_tags.push(t),
            Some(_) => {}
            None => refs.dangling(SITE_TAG_IDS, 1),
        }
    }
}

/// Which index keys to plan. A rebuild plans every one; the watcher only
/// those of the scopes a batch touched. `None` means all.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Selection {
    /// Categories (catalogue indexes) whose count, index and list are planned.
    pub categories: Option<HashSet<usize>>,
    /// Tags (catalogue indexes) whose `video:tag:list` is planned.
    pub tags: Option<HashSet<usize>>,
    /// Channels (catalogue indexes) whose home sections are planned.
    pub channels: Option<HashSet<usize>>,
    /// Videos (written ids) whose `video:categories` is planned.
    pub videos: Option<HashSet<String>>,
}

impl Selection {
    pub fn all() -> Selection {
        Selection::default()
    }

    fn has<T: std::hash::Hash + Eq>(set: &Option<HashSet<T>>, item: &T) -> bool {
        set.as_ref().is_none_or(|s| s.contains(item))
    }

    /// Whether nothing is selected.
    pub fn is_empty(&self) -> bool {
        [self.categories.as_ref().map(|s| s.len()), self.tags.as_ref().map(|s| s.len())]
            .into_iter()
            .chain([self.channels.as_ref().map(|s| s.len()), self.videos.as_ref().map(|s| s.len())])
            .all(|n| n == Some(0))
    }
}

/// A list member: `addedTime` and written id.
type Listed = (i64, std::sync::Arc<str>);

/// Plans the selected index keys from the active videos `visit` yields.
/// Collections that would be empty are not planned (see [`PlanCtx::emit`]).
pub fn plan_selected(
    visit: impl FnOnce(&mut dyn FnMut(Member<'_>)),
    catalog: &Catalog,
    ctx: &PlanCtx,
    sel: &Selection,
) -> Vec<Op> {
    // The categories whose members are needed: the selected ones, and
    // every active category of a selected channel (its home sections).
    let mut needed: Vec<bool> = (0..catalog.categories().len()).map(|c| Selection::has(&sel.categories, &c)).collect();
    let channel_cats: Vec<(usize, Vec<usize>)> = catalog
        .channels()
        .iter()
        .enumerate()
        .filter(|(ch, _)| Selection::has(&sel.channels, ch))
        .map(|(ch, channel)| {
            let mut cats: Vec<usize> =
                channel.categories.iter().filter_map(|item| catalog.active_category_index(&item.id)).collect();
            cats.sort_unstable();
            cats.dedup();
            (ch, cats)
        })
        .collect();
    if ctx.families.contains(FamilyId::VideoListHome) {
        for (_, cats) in &channel_cats {
            for &c in cats {
                needed[c] = true;
            }
        }
    }
    let wanted_tag: Vec<bool> = (0..catalog.tags().len()).map(|t| Selection::has(&sel.tags, &t)).collect();

    let mut in_category: Vec<Vec<Listed>> = vec![Vec::new(); catalog.categories().len()];
    let mut with_tag: Vec<Vec<Listed>> = vec![Vec::new(); catalog.tags().len()];
    let mut out = Vec::new();
    let plan_memberships = ctx.families.contains(FamilyId::VideoCategories);
    visit(&mut |m: Member<'_>| {
        let mut shared: Option<std::sync::Arc<str>> = None;
        let mut id = || shared.get_or_insert_with(|| m.id.into()).clone();
        for &c in m.cats {
            if needed[c] {
                in_category[c].push((m.added_ms, id()));
            }
        }
        for &t in m.tags {
            if wanted_tag[t] {
                with_tag[t].push((m.added_ms, id()));
            }
        }
        if plan_memberships && sel.videos.as_ref().is_none_or(|v| v.contains(m.id)) {
            let ids = m.cats.iter().map(|&c| catalog.categories()[c].id.clone()).collect();
            ctx.emit(&mut out, FamilyId::VideoCategories, &[m.id], Value::Set(ids));
        }
    });
    let newest = |a: &Listed, b: &Listed| newest_first((a.0, &a.1), (b.0, &b.1));
    in_category.par_iter_mut().chain(with_tag.par_iter_mut()).for_each(|list| list.sort_unstable_by(newest));

    let ids_of = |members: &[Listed]| -> Vec<String> { members.iter().map(|(_, id)| id.to_string()).collect() };
    let scored = |members: &[Listed]| -> Vec<(i64, String)> {
        members.iter().map(|(added, id)| (*added, id.to_string())).collect()
    };
    let per_category: Vec<Vec<Op>> = catalog
        .categories()
        .par_iter()
        .enumerate()
        .filter(|(c, cat)| cat.active && Selection::has(&sel.categories, c))
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

    for (t, members) in with_tag.iter().enumerate().filter(|(t, _)| wanted_tag[*t]) {
        let tag = &catalog.tags()[t];
        ctx.emit(&mut out, FamilyId::VideoTagList, &[&tag.category_id, &tag.id], Value::List(ids_of(members)));
    }

    if ctx.families.contains(FamilyId::VideoListHome) {
        for (ch, cats) in &channel_cats {
            let channel = &catalog.channels()[*ch];
            for section in &ctx.home_sections {
                let HomeSectionKind::Latest = section.kind;
                // The newest `limit` of the union lie within the newest
                // `limit` of each category; a video in two of them sorts
                // next to itself and is kept once.
                let mut picked: Vec<Listed> =
                    cats.iter().flat_map(|&c| in_category[c].iter().take(section.limit).cloned()).collect();
                picked.sort_unstable_by(newest);
                picked.dedup_by(|a, b| a.1 == b.1);
                picked.truncate(section.limit);
                ctx.emit(
                    &mut out,
                    FamilyId::VideoListHome,
                    &[&channel.id, &section.name],
                    Value::Zset(scored(&picked)),
                );
            }
        }
    }
    out
}
