//! The watcher's video documents, compactly: one fixed-size record per
//! document in a slab addressed by `u32` handles, found by `_id` and by
//! written id through hash tables of handles. A document costs its
//! 40-byte record, its interned references, and a few bytes of table;
//! the scopes ([`super::members`]) file handles, not ids.
//!
//! A handle freed by a batch is not reused before the batch is committed,
//! so a batch taken back puts every document back under its old handle
//! and the scopes' handles stay valid (see [`Videos::undo`]).

use super::model::IdKey;
use crate::model::compact::{Sym, Wid, WidRef};
use hashbrown::HashTable;
use mongodb::bson::Bson;
use rustc_hash::FxHashMap;
use std::hash::{BuildHasher, Hash};

/// A document's place in the slab.
pub type Handle = u32;

const LIVE: u8 = 1;
const VALID: u8 = 2;
const ACTIVE: u8 = 4;
/// The `_id` is not an ObjectId: the record's side entry in
/// [`Videos::others`] says what it is.
const OTHER: u8 = 8;

#[derive(Debug, Clone, PartialEq)]
struct Rec {
    added_ms: i64,
    /// A valid document's references as stored (repeats kept): how many
    /// are categories, then the categories, then the tags. Empty for a
    /// rejected document.
    refs: Box<[Sym]>,
    /// The `_id`'s bytes, when it is an ObjectId.
    oid: [u8; 12],
    flags: u8,
}

/// An empty slot.
fn dead() -> Rec {
    Rec { added_ms: 0, refs: Box::default(), oid: [0; 12], flags: 0 }
}

/// What the record of a document whose `_id` is not an ObjectId cannot
/// hold: the `_id` itself and its written id (rare, so kept aside).
#[derive(Debug, Clone, PartialEq)]
struct Other {
    key: Box<str>,
    raw_id: Box<Bson>,
    written: Option<Wid>,
}

/// What the index families read of a valid video document.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Doc<'a> {
    pub active: bool,
    pub added_ms: i64,
    pub cats: &'a [Sym],
    pub tags: &'a [Sym],
}

/// A valid document's fields as decoded, references interned.
#[derive(Debug, Clone, PartialEq)]
pub struct Fields {
    pub active: bool,
    pub added_ms: i64,
    pub cats: Vec<Sym>,
    pub tags: Vec<Sym>,
}

/// A document as it was before a batch: enough to put it back.
#[derive(Debug, Clone)]
pub struct Saved {
    handle: Handle,
    rec: Rec,
    other: Option<Other>,
}

/// A document's `_id` as the tables compare it.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum KeyRef<'a> {
    Oid(&'a [u8; 12]),
    Other(&'a str),
}

fn key_ref(key: &IdKey) -> KeyRef<'_> {
    match key {
        IdKey::Oid(bytes) => KeyRef::Oid(bytes),
        IdKey::Other(text) => KeyRef::Other(text),
    }
}

fn hash(value: impl Hash) -> u64 {
    rustc_hash::FxBuildHasher.hash_one(value)
}

#[derive(Debug, Default)]
pub struct Videos {
    recs: Vec<Rec>,
    others: FxHashMap<Handle, Other>,
    by_key: HashTable<Handle>,
    /// The first carrier (in arrival order) of each written id.
    owner: HashTable<Handle>,
    /// Every carrier, in arrival order, of the written ids two or more
    /// documents carry (repeats, rejected as such).
    carriers: FxHashMap<Wid, Vec<Handle>>,
    free: Vec<Handle>,
    /// Freed since the last commit (not reused before it).
    freed: Vec<Handle>,
    live: usize,
}

/// The slab's read side, borrowed apart from the tables so that a table
/// can be changed while its hasher reads records.
#[derive(Clone, Copy)]
struct Slab<'a> {
    recs: &'a [Rec],
    others: &'a FxHashMap<Handle, Other>,
}

impl<'a> Slab<'a> {
    fn key(self, h: Handle) -> KeyRef<'a> {
        let rec = &self.recs[h as usize];
        if rec.flags & OTHER == 0 { KeyRef::Oid(&rec.oid) } else { KeyRef::Other(&self.others[&h].key) }
    }

    fn written(self, h: Handle) -> Option<WidRef<'a>> {
        let rec = &self.recs[h as usize];
        if rec.flags & OTHER == 0 {
            // An ObjectId's written id is its lowercase hex: its bytes.
            Some(WidRef::Hex(&rec.oid))
        } else {
            self.others[&h].written.as_ref().map(Wid::as_ref)
        }
    }
}

impl Videos {
    fn slab(&self) -> Slab<'_> {
        Slab { recs: &self.recs, others: &self.others }
    }

    /// How many documents are held.
    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// Makes room for `more` documents at once (exactly: a load knows
    /// how many it expects).
    pub fn reserve(&mut self, more: usize) {
        let slab = Slab { recs: &self.recs, others: &self.others };
        self.by_key.reserve(more, |&h| hash(slab.key(h)));
        self.owner.reserve(more, |&h| hash(slab.written(h)));
        self.recs.reserve_exact(more.saturating_sub(self.free.len()));
    }

    /// The handle of the document with this `_id`.
    pub fn find(&self, key: &IdKey) -> Option<Handle> {
        let (slab, k) = (self.slab(), key_ref(key));
        self.by_key.find(hash(k), |&h| slab.key(h) == k).copied()
    }

    /// A held document's fields, `None` when it was rejected.
    pub fn doc(&self, h: Handle) -> Option<Doc<'_>> {
        let rec = &self.recs[h as usize];
        if rec.flags & VALID == 0 {
            return None;
        }
        let cats_len = rec.refs[0] as usize;
        let (cats, tags) = rec.refs[1..].split_at(cats_len);
        Some(Doc { active: rec.flags & ACTIVE != 0, added_ms: rec.added_ms, cats, tags })
    }

    /// A held document's `_id`.
    pub fn raw_id(&self, h: Handle) -> Bson {
        let rec = &self.recs[h as usize];
        match rec.flags & OTHER {
            0 => Bson::ObjectId(mongodb::bson::oid::ObjectId::from_bytes(rec.oid)),
            _ => (*self.others[&h].raw_id).clone(),
        }
    }

    pub fn key(&self, h: Handle) -> IdKey {
        match self.slab().key(h) {
            KeyRef::Oid(bytes) => IdKey::Oid(*bytes),
            KeyRef::Other(text) => IdKey::Other(text.into()),
        }
    }

    /// How many slots the store has, held or free: the drift check walks
    /// them by position.
    pub fn slots(&self) -> usize {
        self.recs.len()
    }

    /// The written id of the document in slot `at`, when the slot holds
    /// one with a written id.
    pub fn written_at(&self, at: usize) -> Option<WidRef<'_>> {
        let rec = self.recs.get(at)?;
        if rec.flags & LIVE == 0 {
            return None;
        }
        self.written(at as Handle)
    }

    /// A held document's written id (`None` when its `_id` gives none).
    pub fn written(&self, h: Handle) -> Option<WidRef<'_>> {
        self.slab().written(h)
    }

    /// Where a filed video ranks in a scope: its `addedTime` and written id.
    pub fn rank(&self, h: Handle) -> (i64, WidRef<'_>) {
        let rec = &self.recs[h as usize];
        (rec.added_ms, self.written(h).expect("only documents with a written id are filed"))
    }

    /// The first document carrying a written id: its owner.
    pub fn owner(&self, w: WidRef<'_>) -> Option<Handle> {
        let slab = self.slab();
        self.owner.find(hash(Some(w)), |&h| slab.written(h) == Some(w)).copied()
    }

    /// Every written id's owner.
    pub fn owners(&self) -> impl Iterator<Item = Handle> + '_ {
        self.owner.iter().copied()
    }

    /// The documents carrying a written id, in arrival order.
    pub fn carriers(&self, w: WidRef<'_>) -> Vec<Handle> {
        match self.carriers.get(&w.to_owned()) {
            Some(list) => list.clone(),
            None => self.owner(w).into_iter().collect(),
        }
    }

    /// Puts a document: one already held keeps its handle (its `_id`, so
    /// its written id, is the same), a new one is filed last among the
    /// carriers of its written id. `written` is what its `_id` writes.
    pub fn put(&mut self, key: IdKey, raw_id: Bson, written: Option<Wid>, fields: Option<Fields>) -> Handle {
        let mut rec = match fields {
            Some(f) => {
                let cats_len = Sym::try_from(f.cats.len()).expect("fewer than 4 billion references");
                let refs = std::iter::once(cats_len).chain(f.cats).chain(f.tags).collect();
                let active = if f.active { ACTIVE } else { 0 };
                Rec { added_ms: f.added_ms, refs, oid: [0; 12], flags: LIVE | VALID | active }
            }
            None => Rec { flags: LIVE, ..dead() },
        };
        if let Some(h) = self.find(&key) {
            let old = &mut self.recs[h as usize];
            rec.oid = old.oid;
            rec.flags |= old.flags & OTHER;
            *old = rec;
            return h;
        }
        match &key {
            IdKey::Oid(bytes) => rec.oid = *bytes,
            IdKey::Other(_) => rec.flags |= OTHER,
        }
        let h = self.alloc();
        self.recs[h as usize] = rec;
        if let IdKey::Other(text) = key {
            self.others.insert(h, Other { key: text, raw_id: Box::new(raw_id), written });
        }
        self.live += 1;
        let slab = Slab { recs: &self.recs, others: &self.others };
        self.by_key.insert_unique(hash(slab.key(h)), h, |&x| hash(slab.key(x)));
        self.link(h);
        h
    }

    /// Removes a document: the handle it had, `None` when not held.
    pub fn remove(&mut self, key: &IdKey) -> Option<Handle> {
        let h = self.find(key)?;
        self.unlink(h);
        self.kill(h);
        self.freed.push(h);
        Some(h)
    }

    fn alloc(&mut self) -> Handle {
        match self.free.pop() {
            Some(h) => h,
            None => {
                self.recs.push(dead());
                Handle::try_from(self.recs.len() - 1).expect("fewer than 4 billion video documents")
            }
        }
    }

    /// Drops a held document from the key table and empties its record
    /// (its written id is unlinked already).
    fn kill(&mut self, h: Handle) {
        let slab = Slab { recs: &self.recs, others: &self.others };
        let k = slab.key(h);
        if let Ok(entry) = self.by_key.find_entry(hash(k), |&x| x == h) {
            entry.remove();
        }
        self.recs[h as usize] = dead();
        self.others.remove(&h);
        self.live -= 1;
    }

    /// Files a new document last among its written id's carriers.
    fn link(&mut self, h: Handle) {
        let slab = Slab { recs: &self.recs, others: &self.others };
        let Some(w) = slab.written(h) else { return };
        match self.owner.find(hash(Some(w)), |&x| slab.written(x) == Some(w)) {
            None => {
                self.owner.insert_unique(hash(Some(w)), h, |&x| hash(slab.written(x)));
            }
            Some(&first) => {
                let list = self.carriers.entry(w.to_owned()).or_insert_with(|| vec![first]);
                if !list.contains(&h) {
                    list.push(h);
                }
            }
        }
    }

    /// Takes a document out of its written id's carriers: the next one
    /// owns the id when it owned it.
    fn unlink(&mut self, h: Handle) {
        let slab = Slab { recs: &self.recs, others: &self.others };
        let Some(w) = slab.written(h) else { return };
        let Ok(entry) = self.owner.find_entry(hash(Some(w)), |&x| slab.written(x) == Some(w)) else { return };
        let owned = w.to_owned();
        match self.carriers.get_mut(&owned) {
            None => {
                if *entry.get() == h {
                    entry.remove();
                }
            }
            Some(list) => {
                list.retain(|&x| x != h);
                *entry.into_mut() = list[0];
                if list.len() == 1 {
                    self.carriers.remove(&owned);
                }
            }
        }
    }

    /// A held document as it is now, to put back with [`Videos::undo`].
    pub fn save(&self, key: &IdKey) -> Option<Saved> {
        let h = self.find(key)?;
        Some(Saved { handle: h, rec: self.recs[h as usize].clone(), other: self.others.get(&h).cloned() })
    }

    /// Puts documents and written ids back as they were before a batch:
    /// `docs` every document the batch touched with what it was
    /// ([`Videos::save`]), `owners` every written id it touched with its
    /// carriers then ([`Videos::carriers`]).
    pub fn undo(
        &mut self,
        docs: impl IntoIterator<Item = (IdKey, Option<Saved>)>,
        owners: impl IntoIterator<Item = (Wid, Vec<Handle>)>,
    ) {
        let owners: Vec<(Wid, Vec<Handle>)> = owners.into_iter().collect();
        // The touched ids' carriers out first, while every record still
        // hashes as it did when filed.
        for (w, _) in &owners {
            let slab = Slab { recs: &self.recs, others: &self.others };
            let w = w.as_ref();
            if let Ok(entry) = self.owner.find_entry(hash(Some(w)), |&x| slab.written(x) == Some(w)) {
                entry.remove();
            }
            self.carriers.remove(&w.to_owned());
        }
        let mut gone = std::mem::take(&mut self.freed);
        let docs: Vec<(IdKey, Option<Saved>)> = docs.into_iter().collect();
        for (key, _) in &docs {
            if let Some(h) = self.find(key) {
                self.kill(h);
                gone.push(h);
            }
        }
        for saved in docs.into_iter().filter_map(|(_, saved)| saved) {
            let h = saved.handle;
            self.recs[h as usize] = saved.rec;
            if let Some(other) = saved.other {
                self.others.insert(h, other);
            }
            self.live += 1;
            let slab = Slab { recs: &self.recs, others: &self.others };
            self.by_key.insert_unique(hash(slab.key(h)), h, |&x| hash(slab.key(x)));
        }
        for (w, list) in owners {
            let Some(&first) = list.first() else { continue };
            let slab = Slab { recs: &self.recs, others: &self.others };
            self.owner.insert_unique(hash(Some(w.as_ref())), first, |&x| hash(slab.written(x)));
            if list.len() > 1 {
                self.carriers.insert(w, list);
            }
        }
        gone.sort_unstable();
        gone.dedup();
        self.free.extend(gone.into_iter().filter(|&h| self.recs[h as usize].flags & LIVE == 0));
    }

    /// Keeps a batch: the handles it freed may be reused.
    pub fn commit(&mut self) {
        self.free.append(&mut self.freed);
    }

    /// About how many bytes the store holds: its records, their
    /// references, the side entries and the two tables.
    pub fn footprint(&self) -> usize {
        let refs: usize = self.recs.iter().map(|r| r.refs.len().div_ceil(2) * 8).sum();
        let tables = (self.by_key.capacity() + self.owner.capacity()) * (size_of::<Handle>() + 1);
        let others = self.others.len() * (size_of::<Other>() + 64);
        let carriers: usize = self.carriers.values().map(|l| 48 + l.capacity() * 4).sum();
        self.recs.capacity() * size_of::<Rec>() + refs + tables + others + carriers + self.free.capacity() * 4
    }

    /// Every held document with its fields (`None`: rejected), in no
    /// particular order: for tests and diagnostics.
    pub fn entries(&self) -> impl Iterator<Item = (IdKey, Option<Doc<'_>>)> + '_ {
        self.by_key.iter().map(|&h| (self.key(h), self.doc(h)))
    }

    /// Every written id with its carriers' `_id`s in arrival order.
    pub fn written_ids(&self) -> Vec<(Wid, Vec<IdKey>)> {
        self.owners()
            .filter_map(|h| self.written(h))
            .map(|w| (w.to_owned(), self.carriers(w).into_iter().map(|h| self.key(h)).collect()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn other(id: &str) -> (IdKey, Bson, Option<Wid>) {
        (IdKey::Other(format!("String({id:?})").into()), Bson::String(id.into()), Some(Wid::new(id)))
    }

    fn fields(added_ms: i64, cats: &[Sym], tags: &[Sym]) -> Option<Fields> {
        Some(Fields { active: true, added_ms, cats: cats.to_vec(), tags: tags.to_vec() })
    }

    #[test]
    fn a_record_is_40_bytes() {
        assert_eq!(std::mem::size_of::<Rec>(), 40);
    }

    #[test]
    fn documents_are_found_by_id_and_by_written_id_in_arrival_order() {
        let mut v = Videos::default();
        let oid = mongodb::bson::oid::ObjectId::new();
        let hex = oid.to_hex();
        let a = v.put(IdKey::Oid(oid.bytes()), Bson::ObjectId(oid), Some(Wid::new(&hex)), fields(5, &[1, 1], &[7]));
        // A string `_id` of the same hex writes the same id: a repeat.
        let (key, raw, w) = other(&hex);
        let b = v.put(key.clone(), raw, w, None);
        assert_eq!((v.len(), v.find(&IdKey::Oid(oid.bytes())), v.find(&key)), (2, Some(a), Some(b)));
        let wid = Wid::new(&hex);
        assert_eq!((v.owner(wid.as_ref()), v.carriers(wid.as_ref())), (Some(a), vec![a, b]));
        assert_eq!(v.doc(a), Some(Doc { active: true, added_ms: 5, cats: &[1, 1], tags: &[7] }));
        assert_eq!((v.doc(b), v.raw_id(a), v.rank(a).1.text()), (None, Bson::ObjectId(oid), hex.clone()));
        // The owner goes: the repeat owns the id.
        assert_eq!(v.remove(&IdKey::Oid(oid.bytes())), Some(a));
        assert_eq!(v.remove(&IdKey::Oid(oid.bytes())), None);
        assert_eq!((v.owner(wid.as_ref()), v.carriers(wid.as_ref()), v.len()), (Some(b), vec![b], 1));
        assert_eq!(v.written_ids(), vec![(wid, vec![key])]);
    }

    #[test]
    fn undo_puts_every_document_back_under_its_handle() {
        let mut v = Videos::default();
        let ids: Vec<_> = (0..50).map(|i| other(&format!("v{}", i % 40))).collect();
        for (i, (key, raw, w)) in ids.iter().enumerate() {
            v.put(key.clone(), raw.clone(), w.clone(), fields(i as i64, &[1], &[]));
        }
        v.commit();
        let entries = |v: &Videos| {
            let mut e: Vec<String> = v.entries().map(|(k, d)| format!("{k:?} {d:?}")).collect();
            e.sort();
            (e, v.written_ids().len(), v.len())
        };
        let before = entries(&v);
        let handles: Vec<_> = ids.iter().map(|(k, _, _)| v.find(k)).collect();
        // A batch: removes, updates, new documents, a remove then a put.
        let touched: Vec<(IdKey, Bson, Option<Wid>)> = (0..60).map(|i| other(&format!("v{}", (i * 7) % 45))).collect();
        let saved: Vec<_> = touched.iter().map(|(k, _, _)| (k.clone(), v.save(k))).collect();
        let owners: Vec<_> = touched
            .iter()
            .map(|(_, _, w)| w.clone().expect("text ids are written"))
            .map(|w| (w.clone(), v.carriers(w.as_ref())))
            .collect();
        for (i, (key, raw, w)) in touched.iter().enumerate() {
            if i % 3 == 0 {
                v.remove(key);
            } else {
                v.put(key.clone(), raw.clone(), w.clone(), fields(-(i as i64), &[2], &[3]));
            }
        }
        assert_ne!(entries(&v), before);
        // First save per key and per written id counts.
        let mut seen = std::collections::HashSet::new();
        let saved: Vec<_> = saved.into_iter().filter(|(k, _)| seen.insert(k.clone())).collect();
        let mut seen = std::collections::HashSet::new();
        let owners: Vec<_> = owners.into_iter().filter(|(w, _)| seen.insert(w.clone())).collect();
        v.undo(saved, owners);
        assert_eq!(entries(&v), before);
        assert_eq!(ids.iter().map(|(k, _, _)| v.find(k)).collect::<Vec<_>>(), handles);
        // The handles the undone batch took for new documents are free
        // again, and reused before the slab grows.
        assert!(!v.free.is_empty());
        let slots = v.recs.len();
        v.put(other("new").0, Bson::Null, None, None);
        assert_eq!(v.recs.len(), slots);
    }
}
