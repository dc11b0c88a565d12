//! Category families: `category:all`, `category:by-id`,
//! `category:with-tags`, `category:tagnames:flat`; and the category and tag
//! payloads that other families embed.

use super::order::by_seq;
use super::text::{js_lower, js_trim};
use super::{CatalogScope, Op, PlanCtx, Value};
use crate::model::catalog::Catalog;
use crate::model::decode::{Category, Tag};
use crate::model::json::{self, ObjectWriter};
use crate::model::report::RefReport;
use crate::registry::FamilyId;
use std::collections::{BTreeMap, BTreeSet};

pub const SITE_TAG_CATEGORY: &str = "Tag.categoryId";

/// Values several families share, computed once per plan.
#[derive(Debug, Default)]
pub struct Derived {
    /// Active categories by seq (indices into `catalog.categories`).
    pub active_categories: Vec<usize>,
    /// Per category: its active tags by seq; empty for inactive ones.
    pub tags_of: Vec<Vec<usize>>,
    /// Active tags by seq.
    pub active_tags: Vec<usize>,
    /// Per active category: its `CategoryCachePayload`.
    pub category_json: Vec<Option<String>>,
    /// Per active tag: its `TagCachePayload`.
    pub tag_json: Vec<Option<String>>,
    /// Per active tag: its trimmed, lowercased name, which the search
    /// prefixes are cut from (kept: a catalogue edit plans a few prefixes
    /// but reads every active tag's name).
    pub search_names: Vec<Option<String>>,
}

impl Derived {
    pub fn new(catalog: &Catalog, refs: &mut RefReport) -> Derived {
        let cats = catalog.categories();
        let tags = catalog.tags();
        let mut active_categories: Vec<usize> = (0..cats.len()).filter(|&i| cats[i].active).collect();
        active_categories.sort_by(|&a, &b| by_seq(seq_key(&cats[a]), seq_key(&cats[b])));
        let mut active_tags: Vec<usize> = (0..tags.len()).filter(|&i| tags[i].active).collect();
        active_tags.sort_by(|&a, &b| by_seq(tag_key(&tags[a]), tag_key(&tags[b])));

        let mut tags_of = vec![Vec::new(); cats.len()];
        for &t in &active_tags {
            match catalog.tag_active_category_index(t) {
                Some(c) => tags_of[c].push(t),
                None => refs.dangling(SITE_TAG_CATEGORY, 1),
            }
        }
        let tag_json: Vec<Option<String>> = tags.iter().map(|t| t.active.then(|| tag_payload(t))).collect();
        let search_names = tags.iter().map(|t| t.active.then(|| search_name(t))).collect();
        let category_json = cats
            .iter()
            .enumerate()
            .map(|(i, c)| {
                c.active.then(|| {
                    let own: Vec<&Tag> = tags_of[i].iter().map(|&t| &tags[t]).collect();
                    category_payload(c, &own, None)
                })
            })
            .collect();
        Derived { active_categories, tags_of, active_tags, category_json, tag_json, search_names }
    }
}

impl Derived {
    /// The values for `catalog` from these, computed for a catalogue
    /// with the same entities at the same places (see
    /// [`Catalog::same_places`]; a batch that edited catalogue documents
    /// in place): only the named tags and categories, and the categories
    /// the named tags now belong to, are computed again. The categories
    /// the tags left must be among `category_ids`. Dangling references are
    /// not counted (only a whole plan counts them).
    pub fn update(mut self, catalog: &Catalog, tag_ids: &BTreeSet<String>, category_ids: &BTreeSet<String>) -> Derived {
        let (cats, tags) = (catalog.categories(), catalog.tags());
        let changed_tags: BTreeSet<usize> = tag_ids.iter().filter_map(|id| catalog.tag_index(id)).collect();
        let mut changed_cats: BTreeSet<usize> =
            category_ids.iter().filter_map(|id| catalog.category_index(id)).collect();
        changed_cats.extend(changed_tags.iter().filter_map(|&t| catalog.tag_category_index(t)));
        reorder(
            &mut self.active_tags,
            &changed_tags,
            |t| tags[t].active,
            |a, b| by_seq(tag_key(&tags[a]), tag_key(&tags[b])),
        );
        reorder(
            &mut self.active_categories,
            &changed_cats,
            |c| cats[c].active,
            |a, b| by_seq(seq_key(&cats[a]), seq_key(&cats[b])),
        );
        for &t in &changed_tags {
            self.tag_json[t] = tags[t].active.then(|| tag_payload(&tags[t]));
            self.search_names[t] = tags[t].active.then(|| search_name(&tags[t]));
        }
        // The changed categories' own tags, in one pass over the active
        // tags (a pass per category cost a batch of catalogue edits
        // categories times tags lookups).
        let mut owned: BTreeMap<usize, Vec<usize>> =
            changed_cats.iter().filter(|&&c| cats[c].active).map(|&c| (c, Vec::new())).collect();
        if !owned.is_empty() {
            for &t in &self.active_tags {
                if let Some(own) = catalog.tag_active_category_index(t).and_then(|c| owned.get_mut(&c)) {
                    own.push(t);
                }
            }
        }
        for &c in &changed_cats {
            let own = owned.remove(&c).unwrap_or_default();
            let own_tags: Vec<&Tag> = own.iter().map(|&t| &tags[t]).collect();
            self.category_json[c] = cats[c].active.then(|| category_payload(&cats[c], &own_tags, None));
            self.tags_of[c] = own;
        }
        self
    }
}

/// Takes the `changed` entities out of an order and puts back the active
/// ones where `cmp` places them (a total order: ids are distinct).
fn reorder(
    order: &mut Vec<usize>,
    changed: &BTreeSet<usize>,
    active: impl Fn(usize) -> bool,
    cmp: impl Fn(usize, usize) -> std::cmp::Ordering,
) {
    if changed.is_empty() {
        return;
    }
    order.retain(|i| !changed.contains(i));
    for &i in changed.iter().filter(|&&i| active(i)) {
        let at = order.partition_point(|&x| cmp(x, i) == std::cmp::Ordering::Less);
        order.insert(at, i);
    }
}

fn seq_key(c: &Category) -> (&crate::model::num::Num, &str, &str) {
    (&c.seq, &c.name, &c.id)
}

fn tag_key(t: &Tag) -> (&crate::model::num::Num, &str, &str) {
    (&t.seq, &t.name, &t.id)
}

/// The name a tag's search prefixes are cut from.
pub fn search_name(tag: &Tag) -> String {
    js_lower(js_trim(&tag.name))
}

/// `TagCachePayload`: `id`, `name`, `categoryId`, `seq`, `status`.
pub fn tag_payload(tag: &Tag) -> String {
    let mut out = String::with_capacity(96 + tag.name.len());
    let mut obj = ObjectWriter::new(&mut out);
    obj.string("id", &tag.id);
    obj.string("name", &tag.name);
    obj.string("categoryId", &tag.category_id);
    obj.raw("seq", &tag.seq_json);
    obj.raw("status", &tag.status_json);
    obj.finish();
    out
}

/// `CategoryCachePayload`: `id`, `name`, `subtitle`, `seq`, `tags?`,
/// `tagNames?`, `status`. With `full_tags`, `tags` holds those rendered
/// `TagCachePayload`s and is always present (the `with-tags` form).
pub fn category_payload(cat: &Category, tags: &[&Tag], full_tags: Option<&[&str]>) -> String {
    let mut out = String::with_capacity(128);
    let mut obj = ObjectWriter::new(&mut out);
    obj.string("id", &cat.id);
    obj.string("name", &cat.name);
    match &cat.subtitle {
        Some(s) => obj.string("subtitle", s),
        None => obj.raw("subtitle", "null"),
    }
    obj.raw("seq", &cat.seq_json);
    match full_tags {
        Some(full) => json::write_raw_array(obj.key("tags"), full.iter().copied()),
        None if !tags.is_empty() => {
            let out = obj.key("tags");
            out.push('[');
            for (i, t) in tags.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let mut item = ObjectWriter::new(out);
                item.string("id", &t.id);
                item.string("name", &t.name);
                item.finish();
            }
            out.push(']');
        }
        None => {}
    }
    if !tags.is_empty() {
        json::write_str_array(obj.key("tagNames"), tags.iter().map(|t| t.name.as_str()));
    }
    obj.raw("status", &cat.status_json);
    obj.finish();
    out
}

pub fn plan(catalog: &Catalog, derived: &Derived, ctx: &PlanCtx, scope: &CatalogScope, out: &mut Vec<Op>) {
    let payload = |c: usize| derived.category_json[c].as_deref().unwrap_or_default();
    for &c in &derived.active_categories {
        let cat = &catalog.categories()[c];
        if !scope.category(&cat.id) {
            continue;
        }
        ctx.emit(out, FamilyId::CategoryById, &[&cat.id], Value::String(payload(c).to_string()));

        let own: Vec<&Tag> = derived.tags_of[c].iter().map(|&t| &catalog.tags()[t]).collect();
        if ctx.families.contains(FamilyId::CategoryWithTags) {
            let full: Vec<&str> = derived.tags_of[c].iter().filter_map(|&t| derived.tag_json[t].as_deref()).collect();
            let with_tags = category_payload(cat, &own, Some(&full));
            ctx.emit(out, FamilyId::CategoryWithTags, &[&cat.id], Value::String(with_tags));
        }
        if ctx.families.contains(FamilyId::CategoryTagnamesFlat) {
            let flat: Vec<String> = own.iter().map(|t| js_lower(&t.name)).collect();
            ctx.emit(out, FamilyId::CategoryTagnamesFlat, &[&cat.id], Value::String(flat.join(" ")));
        }
    }
    // Rendered only when its scope is reached: a batch that edits one
    // category's tags need not build the whole catalogue's array.
    if scope.aggregate(FamilyId::CategoryAll) {
        let mut all = String::new();
        json::write_raw_array(&mut all, derived.active_categories.iter().map(|&c| payload(c)));
        ctx.emit(out, FamilyId::CategoryAll, &[], Value::String(all));
    }
}
