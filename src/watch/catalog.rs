//! The watcher's catalogue keys, planned per entity. A catalogue edit (a
//! category renamed, a tag moved) plans the keys of the entities whose
//! inputs it changed (see [`crate::plan::scope`]), not all of them; its
//! documents are decoded once ([`super::memo`]). Decoding and planning
//! the whole catalogue of a platform (12,000 documents) took about 50 ms,
//! and a platform's change mix has a catalogue edit in nearly every batch.

use super::memo::Before;
use super::plan::{BatchPlan, digest};
use super::state::{Applied, Held, State};
use crate::model::catalog::Catalog;
use crate::model::report::RefReport;
use crate::plan::text::prefix_chars;
use crate::plan::{self, CatalogArg, CatalogKeys, CatalogScope, Change, FamilySet, PlanCtx};
use crate::registry::Registry;
use std::collections::{BTreeSet, HashSet};

/// The catalogue keys a batch's catalogue changes reach: the entities
/// whose inputs changed and the aggregates over them.
///
/// - A touched tag reaches its old and new categories (their payloads
///   name their tags; their tag lists hold it), the search prefixes of its
///   old and new names, and `tag:all`.
/// - A touched category, or one of those, reaches its own keys and
///   `category:all`.
/// - A channel is reached when touched, or when it references a reached
///   category or a touched tag (it embeds their payloads); `channel:all`
///   only when a channel document changed (it embeds none).
pub fn reached(before: &Before, new: &Catalog, applied: &Applied, ctx: &PlanCtx) -> CatalogKeys {
    let mut keys = CatalogKeys { categories: applied.categories.iter().cloned().collect(), ..Default::default() };
    for id in &applied.tags {
        for tag in [before.tag(new, id), new.tag(id)].into_iter().flatten() {
            keys.categories.insert(tag.category_id.clone());
            let name = crate::plan::category::search_name(tag);
            keys.prefixes.extend(ctx.search_lengths.iter().filter_map(|&n| prefix_chars(&name, n)).map(String::from));
        }
    }
    keys.channels = applied.channels.iter().cloned().collect();
    for ch in before.channels(new).into_iter().chain(new.channels()) {
        let refs_category = ch.categories.iter().any(|r| keys.categories.contains(&r.id));
        if refs_category || ch.tags.iter().any(|r| applied.tags.contains(&r.id)) {
            keys.channels.insert(ch.id.clone());
        }
    }
    let registry = Registry::get();
    for family in ctx.families.iter().filter(|&f| CatalogArg::of(f) == Some(CatalogArg::Aggregate)) {
        let reached = match registry.family(family).collection.as_str() {
            "channel" => !applied.channels.is_empty(),
            "category" => !keys.categories.is_empty(),
            "tag" => !applied.tags.is_empty(),
            _ => true,
        };
        if reached {
            keys.aggregates.insert(family);
        }
    }
    keys
}

/// The keys `keys` names in the catalogue families of `ctx` (those that
/// may exist: ids that make no key make none).
fn named(keys: &CatalogKeys, ctx: &PlanCtx) -> Vec<crate::keys::Key> {
    let mut out = Vec::new();
    for family in ctx.families.iter() {
        let args: Vec<&str> = match CatalogArg::of(family) {
            None => continue,
            Some(CatalogArg::Aggregate) if keys.aggregates.contains(&family) => vec![],
            Some(CatalogArg::Aggregate) => continue,
            Some(CatalogArg::Category) => keys.categories.iter().map(String::as_str).collect(),
            Some(CatalogArg::Channel) => keys.channels.iter().map(String::as_str).collect(),
            Some(CatalogArg::Prefix) => keys.prefixes.iter().map(String::as_str).collect(),
        };
        match args.is_empty() {
            true => out.extend(ctx.keys.render(family, &[]).ok()),
            false => out.extend(args.iter().filter_map(|a| ctx.keys.render(family, &[a]).ok())),
        }
    }
    out
}

/// Re-plans the catalogue keys a batch reached (all of them when `scope`
/// is [`CatalogScope::All`]); writes what differs from what the cache
/// holds and deletes what is gone.
pub fn plan_diff(state: &State, ctx: &PlanCtx, scope: &CatalogScope, out: &mut BatchPlan) {
    let catalog_families = FamilySet::of(ctx.families.iter().filter(|f| !f.needs_videos()));
    let ctx = PlanCtx { families: catalog_families, ..ctx.clone() };
    let ops = plan::plan_catalog_with(&state.catalog, &state.derived, &ctx, scope, &mut RefReport::default());
    let mut planned: HashSet<String> = HashSet::with_capacity(ops.len());
    for op in ops {
        let d = digest(&op.value);
        planned.insert(op.key.text.clone());
        if state.existing.digest(&op.key.text) != Some(d) {
            out.record.written.push((op.key.text.clone(), Some(Held { digest: Some(d), size: op.value.elements() })));
            out.changes.push(Change::Put(op));
        }
    }
    let gone: BTreeSet<crate::keys::Key> = match scope {
        CatalogScope::All => state
            .existing
            .catalog
            .iter()
            .filter_map(|k| ctx.keys.classify(k).map(|family| crate::keys::Key { family, text: k.clone() }))
            .collect(),
        CatalogScope::Some(keys) => {
            named(keys, &ctx).into_iter().filter(|k| state.existing.catalog.contains(&k.text)).collect()
        }
    };
    for key in gone.into_iter().filter(|k| !planned.contains(&k.text)) {
        out.record.deleted.push(key.text.clone());
        out.changes.push(Change::Delete(key));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::Keys;
    use crate::watch::memo::CatalogMemo;
    use crate::watch::memo::tests::{index, names};
    use crate::watch::model::Coll;
    use mongodb::bson::doc;

    #[test]
    fn a_tag_rename_reaches_its_category_prefixes_and_referencing_channels() {
        let cat = |id: &str| doc! { "_id": id, "name": id, "seq": 1, "status": 1 };
        let tag =
            |name: &str, owner: &str| doc! { "_id": "t1", "name": name, "categoryId": owner, "seq": 1, "status": 1 };
        let channel = |id: &str, cats: &[&str], tags: &[&str]| {
            let refs = |ids: &[&str]| ids.iter().map(|i| doc! { "id": *i }).collect::<Vec<_>>();
            doc! { "_id": id, "name": id, "landingUrl": "u", "categories": refs(cats), "tags": refs(tags) }
        };
        let channels = [channel("k1", &["c1"], &[]), channel("k2", &[], &["t1"]), channel("k3", &["c3"], &[])];
        let mut docs = [index(&channels), index(&[cat("c1"), cat("c2"), cat("c3")]), index(&[tag("Alpha", "c1")])];
        let mut memo = CatalogMemo::default();
        let mut new = memo.assemble(&docs, &Catalog::default());
        docs[2] = index(&[tag("Beta", "c2")]);
        let changed = [(Coll::Tag, docs[2].keys().next().unwrap().clone())].into_iter().collect();
        let before = Before::Patched(memo.patch(&mut new, &docs, &changed).expect("a rename in place"));

        let mut state = crate::watch::state::State::new(&names(), vec![], vec![], vec![]);
        let mut applied = state.apply(Vec::new());
        applied.tags.insert("t1".into());
        let ctx = PlanCtx {
            keys: Keys::new("app:"),
            search_lengths: vec![2, 3],
            home_sections: vec![],
            families: crate::plan::FamilySet::all(),
        };
        let keys = reached(&before, &new, &applied, &ctx);
        let set = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<HashSet<String>>();
        assert_eq!(keys.categories, set(&["c1", "c2"]));
        assert_eq!(keys.prefixes, set(&["al", "alp", "be", "bet"]));
        assert_eq!(keys.channels, set(&["k1", "k2"]), "k3 references neither the tag nor its categories");
        let aggregates: Vec<&str> =
            keys.aggregates.iter().map(|f| f.name()).collect::<BTreeSet<_>>().into_iter().collect();
        assert_eq!(aggregates, ["category:all", "tag:all"]);
    }
}
