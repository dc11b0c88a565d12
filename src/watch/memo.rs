//! The watcher's decoded catalogue, kept between batches. Each catalogue
//! document is decoded once and known until an event changes it; a batch
//! that edits documents in place (a rename, a new seq, a status flip)
//! swaps the new entities into the catalogue where the old ones stood.
//! Only a batch that adds, removes or rejects a document assembles the
//! catalogue again, from what the memo and the old catalogue hold.
//!
//! The memo holds no second copy of an admitted entity (the catalogue
//! has it): a copy of every entity cost about 10 MiB at a platform's
//! 12,000 documents, and assembling the catalogue from copies cost 6 ms
//! per batch.

use super::model::{Coll, IdKey};
use crate::model::catalog::Catalog;
use crate::model::decode::{self, Category, Channel, Tag, doc_id};
use crate::model::report::{RefReport, Rejection};
use indexmap::IndexMap;
use mongodb::bson::{RawDocument, RawDocumentBuf};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::BTreeMap;

/// A document's id and decoded form, as [`decode_catalog`] would find
/// them (before repeats are settled, which depends on the other documents).
///
/// [`decode_catalog`]: crate::plan::decode_catalog
type Outcome<T> = (Result<String, Rejection>, Result<T, Rejection>);

/// What is known of one catalogue document until it changes.
#[derive(Debug)]
enum Seen<T> {
    /// It is the catalogue's entity with this id.
    Admitted(String),
    /// Its outcome, when the catalogue does not hold it: rejected, or a
    /// repeat of an earlier document's id. Boxed: an enum is as large as
    /// its largest variant, and a held entity inline made every admitted
    /// entry as large as an entity (8 MiB for 12,000 documents instead of
    /// under 1 MiB).
    Held(Box<Outcome<T>>),
}

/// A catalogue entity type: how its documents decode and where the
/// catalogue keeps it.
trait Entity: Clone {
    fn decode(doc: &RawDocument, id: String) -> Result<Self, Rejection>;
    fn all(catalog: &Catalog) -> &[Self];
    fn index(catalog: &Catalog, id: &str) -> Option<usize>;
}

/// The three impls differ only in names.
macro_rules! entity {
    ($type:ty, $decode:path, $all:ident, $index:ident) => {
        impl Entity for $type {
            fn decode(doc: &RawDocument, id: String) -> Result<Self, Rejection> {
                $decode(doc, id, &mut RefReport::default())
            }
            fn all(catalog: &Catalog) -> &[Self] {
                catalog.$all()
            }
            fn index(catalog: &Catalog, id: &str) -> Option<usize> {
                catalog.$index(id)
            }
        }
    };
}

entity!(Channel, decode::decode_channel, channels, channel_index);
entity!(Category, decode::decode_category, categories, category_index);
entity!(Tag, decode::decode_tag, tags, tag_index);

/// What is known of each catalogue document, by collection. Consistent
/// with one catalogue: the one [`CatalogMemo::assemble`] last gave, as
/// [`CatalogMemo::patch`] edited it since.
#[derive(Debug, Default)]
pub struct CatalogMemo {
    channels: FxHashMap<IdKey, Seen<Channel>>,
    categories: FxHashMap<IdKey, Seen<Category>>,
    tags: FxHashMap<IdKey, Seen<Tag>>,
}

/// The entities a batch's in-place edits replaced, by place.
#[derive(Debug, Default)]
pub struct Replaced {
    channels: BTreeMap<usize, Channel>,
    categories: BTreeMap<usize, Category>,
    tags: BTreeMap<usize, Tag>,
}

impl Replaced {
    /// Puts these entities back where they stood; gives the ones they
    /// replace.
    pub fn restore(self, catalog: &mut Catalog) -> Replaced {
        let (channels, categories, tags) = catalog.swap_in_place(self.channels, self.categories, self.tags);
        Replaced { channels, categories, tags }
    }
}

/// The catalogue as it was before a batch changed it.
#[derive(Debug)]
pub enum Before {
    /// Edited in place: these entities stood where the catalogue now holds
    /// others of the same ids; every other entity is as it was.
    Patched(Replaced),
    /// Assembled again: the whole old catalogue (boxed: a catalogue with
    /// its lookups is several times the size of the other variant).
    Whole(Box<Catalog>),
}

impl Before {
    /// The tag with this id before the batch (`now` is the catalogue
    /// after it).
    pub fn tag<'a>(&'a self, now: &'a Catalog, id: &str) -> Option<&'a Tag> {
        match self {
            Before::Whole(old) => old.tag(id),
            Before::Patched(replaced) => was(&replaced.tags, now, id),
        }
    }

    /// The category with this id before the batch.
    pub fn category<'a>(&'a self, now: &'a Catalog, id: &str) -> Option<&'a Category> {
        match self {
            Before::Whole(old) => old.category(id),
            Before::Patched(replaced) => was(&replaced.categories, now, id),
        }
    }

    /// The channel with this id before the batch.
    pub fn channel<'a>(&'a self, now: &'a Catalog, id: &str) -> Option<&'a Channel> {
        match self {
            Before::Whole(old) => old.channel(id),
            Before::Patched(replaced) => was(&replaced.channels, now, id),
        }
    }

    /// The channels before the batch.
    pub fn channels<'a>(&'a self, now: &'a Catalog) -> Vec<&'a Channel> {
        match self {
            Before::Whole(old) => old.channels().iter().collect(),
            Before::Patched(replaced) => {
                let at = |(i, ch)| replaced.channels.get(&i).unwrap_or(ch);
                now.channels().iter().enumerate().map(at).collect()
            }
        }
    }

    /// Whether the entities stood at the same places before and after.
    pub fn same_places(&self, now: &Catalog) -> bool {
        match self {
            Before::Whole(old) => old.same_places(now),
            Before::Patched(_) => true,
        }
    }
}

fn was<'a, T: Entity>(replaced: &'a BTreeMap<usize, T>, now: &'a Catalog, id: &str) -> Option<&'a T> {
    T::index(now, id).map(|i| replaced.get(&i).unwrap_or(&T::all(now)[i]))
}

impl CatalogMemo {
    /// Forgets everything: the next [`CatalogMemo::assemble`] decodes
    /// every document (the catalogue was put back to one the memo does
    /// not describe).
    pub fn clear(&mut self) {
        *self = CatalogMemo::default();
    }

    /// Drops what is known of a document that changed.
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
    /// gives. Admitted documents the memo knows are taken from `old`, the
    /// catalogue it is consistent with; the documents it does not know
    /// are decoded.
    pub fn assemble(&mut self, docs: &[IndexMap<IdKey, RawDocumentBuf>; 3], old: &Catalog) -> Catalog {
        Catalog::new(
            admit(&mut self.channels, &docs[Coll::Channel as usize], old),
            admit(&mut self.categories, &docs[Coll::Category as usize], old),
            admit(&mut self.tags, &docs[Coll::Tag as usize], old),
        )
    }

    /// Edits `catalog` in place for these changed documents, when each
    /// is one the catalogue holds and still decodes, to the same id, at
    /// the same place in its collection: gives the entities replaced.
    /// Otherwise gives `None` and changes nothing: the caller forgets the
    /// documents and assembles the catalogue.
    pub fn patch(
        &self,
        catalog: &mut Catalog,
        docs: &[IndexMap<IdKey, RawDocumentBuf>; 3],
        changed: &FxHashSet<(Coll, IdKey)>,
    ) -> Option<Replaced> {
        let keys = |coll: Coll| changed.iter().filter(move |(c, _)| *c == coll).map(|(_, k)| k);
        let channels = edits(&self.channels, catalog, &docs[Coll::Channel as usize], keys(Coll::Channel))?;
        let categories = edits(&self.categories, catalog, &docs[Coll::Category as usize], keys(Coll::Category))?;
        let tags = edits(&self.tags, catalog, &docs[Coll::Tag as usize], keys(Coll::Tag))?;
        Some(Replaced { channels, categories, tags }.restore(catalog))
    }
}

/// The new entities of these changed documents, by place, when each can
/// take its old entity's place (see [`CatalogMemo::patch`]).
fn edits<'a, T: Entity>(
    memo: &FxHashMap<IdKey, Seen<T>>,
    catalog: &Catalog,
    docs: &IndexMap<IdKey, RawDocumentBuf>,
    keys: impl Iterator<Item = &'a IdKey>,
) -> Option<BTreeMap<usize, T>> {
    let edit = |key: &IdKey| {
        let Some(Seen::Admitted(id)) = memo.get(key) else { return None };
        let doc = docs.get(key)?;
        let entity = doc_id(doc).ok().filter(|now| now == id).and_then(|id| T::decode(doc, id).ok())?;
        Some((T::index(catalog, id)?, entity))
    };
    keys.map(edit).collect()
}

/// One collection's entities: each document's outcome, known or decoded,
/// settled in cursor order as [`crate::model::decode::Intake`] settles
/// them: a document whose id reads claims it, and a later document with
/// that id is a repeat.
fn admit<T: Entity>(
    memo: &mut FxHashMap<IdKey, Seen<T>>,
    docs: &IndexMap<IdKey, RawDocumentBuf>,
    old: &Catalog,
) -> Vec<T> {
    // The documents the memo does not know, and the admitted ones `old`
    // does not hold (it is not the catalogue the memo describes), are
    // decoded first; then every outcome is read in place. Taking each
    // entry out and putting it back made this twice as slow.
    for (key, doc) in docs {
        let known = match memo.get(key) {
            Some(Seen::Admitted(id)) => T::index(old, id).is_some(),
            Some(Seen::Held(_)) => true,
            None => false,
        };
        if !known {
            let id = doc_id(doc);
            let decoded = id.clone().and_then(|id| T::decode(doc, id));
            memo.insert(key.clone(), Seen::Held(Box::new((id, decoded))));
        }
    }
    let mut claimed: FxHashSet<&str> = FxHashSet::with_capacity_and_hasher(docs.len(), Default::default());
    let mut out = Vec::with_capacity(docs.len());
    // Documents admitted now and not before, or the other way round.
    let (mut admitted, mut held) = (Vec::new(), Vec::new());
    for key in docs.keys() {
        match &memo[key] {
            Seen::Admitted(id) => {
                let entity = &T::all(old)[T::index(old, id).expect("decoded above when missing")];
                match claimed.insert(id) {
                    true => out.push(entity.clone()),
                    false => held.push((key.clone(), Seen::Held(Box::new((Ok(id.clone()), Ok(entity.clone())))))),
                }
            }
            Seen::Held(held) => {
                // The id is claimed even when the rest does not decode.
                if let (Ok(id), decoded) = &**held
                    && claimed.insert(id)
                    && let Ok(entity) = decoded
                {
                    out.push(entity.clone());
                    admitted.push((key.clone(), Seen::Admitted(id.clone())));
                }
            }
        }
    }
    memo.extend(admitted.into_iter().chain(held));
    out
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::config::Collections;
    use crate::dev::generate::{Rng, Shape, catalog};
    use crate::plan::category::Derived;
    use crate::watch::model::raw_id_key;
    use mongodb::bson::{Document, doc};
    use std::collections::BTreeSet;

    /// An admitted document costs the memo its id, not an entity's size.
    #[test]
    fn an_admitted_entry_is_about_the_size_of_its_id() {
        let bound = size_of::<String>() + size_of::<usize>();
        assert!(size_of::<Seen<Channel>>() <= bound, "{}", size_of::<Seen<Channel>>());
        assert!(size_of::<Seen<Category>>() <= bound);
        assert!(size_of::<Seen<Tag>>() <= bound);
    }

    pub fn names() -> Collections {
        let name = |n: &str| n.to_string();
        Collections { channel: name("ch"), category: name("cat"), tag: name("tag"), video: name("v") }
    }

    pub fn index(docs: &[Document]) -> IndexMap<IdKey, RawDocumentBuf> {
        let raw = docs.iter().map(|d| RawDocumentBuf::from_document(d).unwrap());
        raw.filter_map(|d| raw_id_key(&d).map(|k| (k, d))).collect()
    }

    fn whole(docs: &[IndexMap<IdKey, RawDocumentBuf>; 3]) -> String {
        let (catalog, _, _) =
            crate::plan::decode_catalog(&names(), docs[0].values(), docs[1].values(), docs[2].values());
        format!("{catalog:?}")
    }

    /// Replaces document `at` of a collection with `edit` applied to it.
    fn edit(
        docs: &mut [IndexMap<IdKey, RawDocumentBuf>; 3],
        coll: Coll,
        at: usize,
        edit: impl FnOnce(&mut Document),
    ) -> IdKey {
        let (key, raw) = docs[coll as usize].get_index(at).map(|(k, d)| (k.clone(), d.clone())).unwrap();
        let mut d: Document = raw.to_document().unwrap();
        edit(&mut d);
        docs[coll as usize].insert(key.clone(), RawDocumentBuf::from_document(&d).unwrap());
        key
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
        let mut catalog = memo.assemble(&docs, &Catalog::default());
        assert_eq!(format!("{catalog:?}"), whole(&docs));

        // The ObjectId document goes: the string repeat now owns the id.
        let key = docs[1].keys().next().unwrap().clone();
        docs[1].shift_remove(&key);
        memo.forget(Coll::Category, &key);
        catalog = memo.assemble(&docs, &catalog);
        assert_eq!(format!("{catalog:?}"), whole(&docs));

        // A tag renamed in place: patched, and put back.
        let before = format!("{catalog:?}");
        let key = edit(&mut docs, Coll::Tag, 5, |d| drop(d.insert("name", "Renamed Tag")));
        let changed = [(Coll::Tag, key.clone())].into_iter().collect();
        let replaced = memo.patch(&mut catalog, &docs, &changed).expect("a rename in place");
        assert_eq!(format!("{catalog:?}"), whole(&docs));
        assert!(catalog.tags().iter().any(|t| t.name == "Renamed Tag"));
        let renamed = replaced.restore(&mut catalog);
        assert_eq!(format!("{catalog:?}"), before);
        renamed.restore(&mut catalog);

        // A category whose `name` no longer reads is no edit in place: the
        // catalogue stays, and assembling it again rejects the document.
        let untouched = format!("{catalog:?}");
        let key = edit(&mut docs, Coll::Category, 2, |d| drop(d.insert("name", 9)));
        let changed = [(Coll::Category, key.clone())].into_iter().collect();
        assert!(memo.patch(&mut catalog, &docs, &changed).is_none());
        assert_eq!(format!("{catalog:?}"), untouched);
        memo.forget(Coll::Category, &key);
        catalog = memo.assemble(&docs, &catalog);
        assert_eq!(format!("{catalog:?}"), whole(&docs));

        // Nor is a document whose id changed (the document at a key is
        // found by the key, which the id need not give).
        let key = edit(&mut docs, Coll::Tag, 7, |d| drop(d.insert("_id", "other")));
        let changed = [(Coll::Tag, key.clone())].into_iter().collect();
        assert!(memo.patch(&mut catalog, &docs, &changed).is_none());
        memo.forget(Coll::Tag, &key);
        catalog = memo.assemble(&docs, &catalog);
        assert_eq!(format!("{catalog:?}"), whole(&docs));
    }

    #[test]
    fn in_place_edits_keep_the_catalogue_and_its_shared_values_as_a_whole_computation_does() {
        let mut rng = Rng::new(11);
        let set = catalog(Shape { channels: 2, categories: 12, tags: 80, videos: 0 }, &mut rng);
        let mut docs = [index(&set.channels), index(&set.categories), index(&set.tags)];
        let mut memo = CatalogMemo::default();
        let mut catalog = memo.assemble(&docs, &Catalog::default());
        let mut derived = Derived::new(&catalog, &mut RefReport::default());
        let cat_ids: Vec<mongodb::bson::Bson> = set.categories.iter().map(|d| d.get("_id").unwrap().clone()).collect();
        for round in 0..300 {
            // One or two documents edited in place: a rename, a new seq, a
            // status flip, a tag moved to another category.
            let (mut tags, mut cats, mut changed) = (BTreeSet::new(), BTreeSet::new(), FxHashSet::default());
            for _ in 0..=rng.below(2) {
                let coll = if rng.chance(0.7) { Coll::Tag } else { Coll::Category };
                let at = rng.below(docs[coll as usize].len() as u64) as usize;
                let (kind, name, seq, status) = (rng.below(4), rng.below(5), rng.below(3), rng.below(2));
                let owner = rng.pick(&cat_ids).clone();
                let key = edit(&mut docs, coll, at, |d| match kind {
                    0 => drop(d.insert("name", format!("n{name}"))),
                    1 => drop(d.insert("seq", seq as i32)),
                    2 => drop(d.insert("status", status as i32)),
                    _ if coll == Coll::Tag => drop(d.insert("categoryId", owner)),
                    _ => {}
                });
                let id = doc_id(&docs[coll as usize][&key]).unwrap();
                match coll {
                    Coll::Tag => tags.insert(id),
                    _ => cats.insert(id),
                };
                changed.insert((coll, key));
            }
            let replaced = memo.patch(&mut catalog, &docs, &changed).expect("edits in place keep the places");
            assert_eq!(format!("{catalog:?}"), whole(&docs), "round {round}");
            // The categories the tags left.
            let before = Before::Patched(replaced);
            cats.extend(tags.iter().filter_map(|id| before.tag(&catalog, id)).map(|t| t.category_id.clone()));
            derived = derived.update(&catalog, &tags, &cats);
            let whole = Derived::new(&catalog, &mut RefReport::default());
            assert_eq!(format!("{derived:?}"), format!("{whole:?}"), "round {round}");
        }
    }
}
