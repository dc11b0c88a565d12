//! The watcher's catalogue: decoded once per document, planned per
//! entity. A catalogue edit (a category renamed, a tag moved) decodes the
//! documents it changed, not the whole catalogue, and plans the keys of
//! the entities whose inputs it changed (see [`crate::plan::scope`]),
//! not all of them. Decoding and planning the whole catalogue of a
//! platform (12,000 documents) took about 50 ms, and a platform's change
//! mix has a catalogue edit in nearly every batch.

use super::model::{Coll, IdKey};
use super::plan::{BatchPlan, digest};
use super::state::{Applied, Held, State};
use crate::model::catalog::Catalog;
use crate::model::decode::{self, Category, Channel, Intake, Tag, doc_id};
use crate::model::report::{RefReport, Rejection};
use crate::plan::text::{js_lower, js_trim, prefix_chars};
use crate::plan::{self, CatalogArg, CatalogKeys, CatalogScope, Change, FamilySet, PlanCtx};
use crate::registry::Registry;
use indexmap::IndexMap;
use mongodb::bson::{RawDocument, RawDocumentBuf};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::{BTreeSet, HashSet};

/// A document's id and decoded form, as [`decode_catalog`] would find
/// them (before repeats are settled, which depends on the other documents).
///
/// [`decode_catalog`]: crate::plan::decode_catalog
type Outcome<T> = (Result<String, Rejection>, Result<T, Rejection>);

type Decoder<T> = fn(&RawDocument, String, &mut RefReport) -> Result<T, Rejection>;

/// Each catalogue document's decoded form, kept until the document
/// changes.
#[derive(Debug, Default)]
pub struct CatalogMemo {
    channels: FxHashMap<IdKey, Outcome<Channel>>,
    categories: FxHashMap<IdKey, Outcome<Category>>,
    tags: FxHashMap<IdKey, Outcome<Tag>>,
}

impl CatalogMemo {
    /// Drops what is known of a document that changed (or was put back).
    pub fn forget(&mut self, coll: Coll, key: &IdKey) {
        match coll {
            Coll::Channel => drop(self.channels.remove(key)),
            Coll::Category => drop(self.categories.remove(key)),
            Coll::Tag => drop(self.tags.remove(key)),
            Coll::Video => {}
        }
    }

    /// The catalogue of these documents (channels, categories, tags, each
    /// in cursor order), equal to what [`crate::plan::decode_catalog`]
    /// gives; only the documents not seen since they changed are decoded.
    pub fn decode(&mut self, docs: &[IndexMap<IdKey, RawDocumentBuf>; 3]) -> Catalog {
        Catalog::new(
            admit(&mut self.channels, &docs[Coll::Channel as usize], decode::decode_channel),
            admit(&mut self.categories, &docs[Coll::Category as usize], decode::decode_category),
            admit(&mut self.tags, &docs[Coll::Tag as usize], decode::decode_tag),
        )
    }
}

/// One collection's entities: decoded (or remembered) per document, then
/// settled in cursor order, where a repeated id is rejected.
fn admit<T: Clone>(
    memo: &mut FxHashMap<IdKey, Outcome<T>>,
    docs: &IndexMap<IdKey, RawDocumentBuf>,
    decode: Decoder<T>,
) -> Vec<T> {
    for (key, doc) in docs {
        memo.entry(key.clone()).or_insert_with(|| {
            let id = doc_id(doc);
            let decoded = id.clone().and_then(|id| decode(doc, id, &mut RefReport::default()));
            (id, decoded)
        });
    }
    let mut intake = Intake::default();
    let mut seen: FxHashSet<&str> = FxHashSet::default();
    let mut out = Vec::with_capacity(docs.len());
    for key in docs.keys() {
        let (id, decoded) = &memo[key];
        // Claimed only for an id that reads: the memo's copy, which
        // outlives the loop.
        let claim = |_: &str| id.as_deref().is_ok_and(|id| seen.insert(id));
        if let Some(item) = intake.admit_by(id.clone(), decoded.clone(), RefReport::default(), claim) {
            out.push(item);
        }
    }
    out
}

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
pub fn reached(old: &Catalog, new: &Catalog, applied: &Applied, ctx: &PlanCtx) -> CatalogKeys {
    let mut keys = CatalogKeys { categories: applied.categories.iter().cloned().collect(), ..Default::default() };
    for id in &applied.tags {
        for tag in [old.tag(id), new.tag(id)].into_iter().flatten() {
            keys.categories.insert(tag.category_id.clone());
            let name = js_lower(js_trim(&tag.name));
            keys.prefixes.extend(ctx.search_lengths.iter().filter_map(|&n| prefix_chars(&name, n)).map(String::from));
        }
    }
    keys.channels = applied.channels.iter().cloned().collect();
    for ch in old.channels.iter().chain(&new.channels) {
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
    use crate::config::Collections;
    use crate::dev::generate::{Rng, Shape, catalog};
    use crate::keys::Keys;
    use crate::watch::model::raw_id_key;
    use mongodb::bson::{Document, doc};

    fn names() -> Collections {
        let name = |n: &str| n.to_string();
        Collections { channel: name("ch"), category: name("cat"), tag: name("tag"), video: name("v") }
    }

    fn index(docs: &[Document]) -> IndexMap<IdKey, RawDocumentBuf> {
        let raw = docs.iter().map(|d| RawDocumentBuf::from_document(d).unwrap());
        raw.filter_map(|d| raw_id_key(&d).map(|k| (k, d))).collect()
    }

    fn whole(docs: &[IndexMap<IdKey, RawDocumentBuf>; 3]) -> String {
        let (catalog, _, _) =
            crate::plan::decode_catalog(&names(), docs[0].values(), docs[1].values(), docs[2].values());
        format!("{catalog:?}")
    }

    #[test]
    fn the_memo_decodes_as_the_whole_catalogue_does() {
        let set = catalog(Shape { channels: 3, categories: 30, tags: 120, videos: 0 }, &mut Rng::new(3));
        let mut categories = set.categories.clone();
        // A repeat of the first category's id as a string (it loses to the
        // ObjectId before it) and a document whose `name` is no string.
        let first = categories[0].get_object_id("_id").unwrap();
        categories.push(doc! { "_id": first.to_hex(), "name": "repeat", "seq": 1, "status": 1 });
        categories.push(doc! { "_id": "bad", "name": 7, "seq": 1, "status": 1 });
        let mut docs = [index(&set.channels), index(&categories), index(&set.tags)];
        let mut memo = CatalogMemo::default();
        assert_eq!(format!("{:?}", memo.decode(&docs)), whole(&docs));

        // The ObjectId document goes: the string repeat now owns the id.
        let key = docs[1].keys().next().unwrap().clone();
        docs[1].shift_remove(&key);
        memo.forget(Coll::Category, &key);
        assert_eq!(format!("{:?}", memo.decode(&docs)), whole(&docs));

        // A tag renamed in place.
        let (key, raw) = docs[2].get_index(5).map(|(k, d)| (k.clone(), d.clone())).unwrap();
        let mut renamed: Document = raw.to_document().unwrap();
        renamed.insert("name", "Renamed Tag");
        docs[2].insert(key.clone(), RawDocumentBuf::from_document(&renamed).unwrap());
        memo.forget(Coll::Tag, &key);
        let decoded = memo.decode(&docs);
        assert_eq!(format!("{decoded:?}"), whole(&docs));
        assert!(decoded.tags.iter().any(|t| t.name == "Renamed Tag"));
    }

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
        let old = memo.decode(&docs);
        docs[2] = index(&[tag("Beta", "c2")]);
        memo.forget(Coll::Tag, docs[2].keys().next().unwrap());
        let new = memo.decode(&docs);

        let mut state = crate::watch::state::State::new(&names(), vec![], vec![], vec![]);
        let mut applied = state.apply(Vec::new());
        applied.tags.insert("t1".into());
        let ctx = PlanCtx {
            keys: Keys::new("app:"),
            search_lengths: vec![2, 3],
            home_sections: vec![],
            families: crate::plan::FamilySet::all(),
        };
        let keys = reached(&old, &new, &applied, &ctx);
        let set = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<HashSet<String>>();
        assert_eq!(keys.categories, set(&["c1", "c2"]));
        assert_eq!(keys.prefixes, set(&["al", "alp", "be", "bet"]));
        assert_eq!(keys.channels, set(&["k1", "k2"]), "k3 references neither the tag nor its categories");
        let aggregates: Vec<&str> =
            keys.aggregates.iter().map(|f| f.name()).collect::<BTreeSet<_>>().into_iter().collect();
        assert_eq!(aggregates, ["category:all", "tag:all"]);
    }

    #[test]
    fn kept_shared_values_follow_in_place_edits_as_a_whole_computation_does() {
        use crate::plan::category::Derived;
        let mut rng = Rng::new(11);
        let set = catalog(Shape { channels: 2, categories: 12, tags: 80, videos: 0 }, &mut rng);
        let mut docs = [index(&set.channels), index(&set.categories), index(&set.tags)];
        let mut memo = CatalogMemo::default();
        let mut before = memo.decode(&docs);
        let mut derived = Derived::new(&before, &mut RefReport::default());
        let cat_ids: Vec<mongodb::bson::Bson> = set.categories.iter().map(|d| d.get("_id").unwrap().clone()).collect();
        for round in 0..300 {
            // One or two documents edited in place: a rename, a new seq, a
            // status flip, a tag moved to another category.
            let (mut tags, mut cats) = (BTreeSet::new(), BTreeSet::new());
            for _ in 0..=rng.below(2) {
                let coll = if rng.chance(0.7) { Coll::Tag } else { Coll::Category };
                let docs = &mut docs[coll as usize];
                let at = rng.below(docs.len() as u64) as usize;
                let (key, raw) = docs.get_index(at).map(|(k, d)| (k.clone(), d.clone())).unwrap();
                let mut d: Document = raw.to_document().unwrap();
                match rng.below(4) {
                    0 => drop(d.insert("name", format!("n{}", rng.below(5)))),
                    1 => drop(d.insert("seq", rng.below(3) as i32)),
                    2 => drop(d.insert("status", rng.below(2) as i32)),
                    _ if coll == Coll::Tag => drop(d.insert("categoryId", rng.pick(&cat_ids).clone())),
                    _ => {}
                }
                let id = doc_id(&RawDocumentBuf::from_document(&d).unwrap()).unwrap();
                match coll {
                    Coll::Tag => tags.insert(id),
                    _ => cats.insert(id),
                };
                docs.insert(key.clone(), RawDocumentBuf::from_document(&d).unwrap());
                memo.forget(coll, &key);
            }
            let now = memo.decode(&docs);
            derived = derived.update(&before, &now, &tags, &cats).expect("edits in place keep the places");
            let whole = Derived::new(&now, &mut RefReport::default());
            assert_eq!(format!("{derived:?}"), format!("{whole:?}"), "round {round}");
            before = now;
        }
    }
}
