//! The watcher's video documents, compactly: one 28-byte record per
//! document in a paged slab ([`Paged`]: it never moves what it holds)
//! addressed by `u32` handles, its references packed in
//! an arena ([`super::arena`]), found by `_id` through a hash table of
//! handles ([`super::handles`]). A document costs its record, its
//! references (4 bytes each) and 5 to 7 bytes of table; the scopes
//! ([`super::members`]) file handles, not ids.
//!
//! A written id's owner (its first carrier) needs no table of its own:
//! nearly every document's `_id` is an ObjectId whose written id is its
//! hex, and is its id's only carrier, so the `_id` table finds it. Only
//! the exceptions are kept aside: ids two or more documents carry, and ids
//! whose one carrier has another kind of `_id`.
//!
//! A handle (or a span of references) freed by a batch is not reused
//! before the batch is committed, so a batch taken back puts every
//! document back under its old handle and the scopes' handles stay valid
//! (see [`Videos::undo`]).

use super::arena::{Arena, Paged};
use super::handles::Handles;
use super::model::IdKey;
use crate::model::compact::{Sym, Wid, WidRef};
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
/// The references are too many for the record's counts: they are in
/// [`Videos::long`].
const LONG: u8 = 16;

/// One document. `addedTime` is kept as two halves so that the record
/// aligns to 4 bytes: 28 bytes, not 32.
/// `Default` is an empty slot: dead, no references.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
struct Rec {
    added: [u32; 2],
    /// The `_id`'s bytes, when it is an ObjectId.
    oid: [u8; 12],
    /// Where a valid document's references start in the arena: its
    /// categories as stored (repeats kept), then its tags.
    refs: u32,
    cats: u8,
    tags: u8,
    flags: u8,
}

impl Rec {
    fn added_ms(&self) -> i64 {
        ((u64::from(self.added[0]) << 32) | u64::from(self.added[1])) as i64
    }

    fn set_added_ms(&mut self, ms: i64) {
        self.added = [((ms as u64) >> 32) as u32, ms as u32];
    }

    /// How many symbols its span holds (none when they are kept aside).
    fn span(&self) -> usize {
        if self.flags & LONG != 0 { 0 } else { usize::from(self.cats) + usize::from(self.tags) }
    }
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

/// A document as it was before a batch: enough to put it back. Its
/// references stay in their span, which the batch cannot reuse.
#[derive(Debug, Clone)]
pub struct Saved {
    handle: Handle,
    rec: Rec,
    other: Option<Other>,
    long: Option<Long>,
}

/// References too many for a record's counts: how many are categories,
/// then the categories, then the tags.
type Long = (usize, Box<[Sym]>);

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
    recs: Paged<Rec>,
    refs: Arena,
    others: FxHashMap<Handle, Other>,
    long: FxHashMap<Handle, Long>,
    by_key: Handles,
    /// Every carrier, in arrival order, of the written ids two or more
    /// documents carry (repeats, rejected as such).
    carriers: FxHashMap<Wid, Vec<Handle>>,
    /// The one carrier of each written id that one document carries,
    /// when its `_id` is not an ObjectId (an ObjectId carrier is found by
    /// its `_id`).
    other_owner: FxHashMap<Wid, Handle>,
    free: Vec<Handle>,
    /// Freed since the last commit (not reused before it).
    freed: Vec<Handle>,
}

/// The slab's read side, borrowed apart from the tables so that a table
/// can be changed while its hasher reads records.
#[derive(Clone, Copy)]
struct Slab<'a> {
    recs: &'a Paged<Rec>,
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
        self.by_key.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_key.len() == 0
    }

    /// Makes room in the key table for `more` documents at once (a load
    /// knows how many it expects; the records grow by pages).
    pub fn reserve(&mut self, more: usize) {
        let slab = Slab { recs: &self.recs, others: &self.others };
        self.by_key.reserve(more, |h| hash(slab.key(h)));
    }

    /// The handle of the document with this `_id`.
    pub fn find(&self, key: &IdKey) -> Option<Handle> {
        self.find_ref(key_ref(key))
    }

    fn find_ref(&self, k: KeyRef<'_>) -> Option<Handle> {
        let slab = self.slab();
        self.by_key.find(hash(k), |h| slab.key(h) == k)
    }

    /// A held document's fields, `None` when it was rejected.
    pub fn doc(&self, h: Handle) -> Option<Doc<'_>> {
        let rec = &self.recs[h as usize];
        if rec.flags & VALID == 0 {
            return None;
        }
        let (cats, tags) = if rec.flags & LONG != 0 {
            let (cats_len, refs) = &self.long[&h];
            refs.split_at(*cats_len)
        } else {
            self.refs.get(rec.refs, rec.span()).split_at(usize::from(rec.cats))
        };
        Some(Doc { active: rec.flags & ACTIVE != 0, added_ms: rec.added_ms(), cats, tags })
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

    /// A held document's `addedTime` in epoch milliseconds (0 when absent).
    pub fn added(&self, h: Handle) -> i64 {
        self.recs[h as usize].added_ms()
    }

    /// Where a filed video ranks in a scope: its `addedTime` and written id.
    pub fn rank(&self, h: Handle) -> (i64, WidRef<'_>) {
        let rec = &self.recs[h as usize];
        (rec.added_ms(), self.written(h).expect("only documents with a written id are filed"))
    }

    /// The first document carrying a written id: its owner.
    pub fn owner(&self, w: WidRef<'_>) -> Option<Handle> {
        if !self.carriers.is_empty()
            && let Some(list) = self.carriers.get(&w.to_owned())
        {
            return list.first().copied();
        }
        self.sole(w)
    }

    /// The carrier of a written id that no other document carries: the
    /// document whose ObjectId it is, or one kept aside.
    fn sole(&self, w: WidRef<'_>) -> Option<Handle> {
        if let WidRef::Hex(bytes) = w
            && let Some(h) = self.find_ref(KeyRef::Oid(bytes))
        {
            return Some(h);
        }
        if self.other_owner.is_empty() {
            return None;
        }
        self.other_owner.get(&w.to_owned()).copied()
    }

    /// Every written id's owner, in slot order.
    pub fn owners(&self) -> impl Iterator<Item = Handle> + Clone + '_ {
        (0..self.recs.len() as Handle).filter(move |&h| {
            let rec = &self.recs[h as usize];
            if rec.flags & LIVE == 0 {
                return false;
            }
            // An ObjectId document owns its hex unless another document
            // carried it first; the rest are asked the long way.
            if rec.flags & OTHER == 0 && self.carriers.is_empty() {
                return true;
            }
            self.written(h).is_some_and(|w| self.owner(w) == Some(h))
        })
    }

    /// The documents carrying a written id, in arrival order.
    pub fn carriers(&self, w: WidRef<'_>) -> Vec<Handle> {
        match self.carriers.get(&w.to_owned()) {
            Some(list) => list.clone(),
            None => self.sole(w).into_iter().collect(),
        }
    }

    /// Puts a document: one already held keeps its handle (its `_id`, so
    /// its written id, is the same), a new one is filed last among the
    /// carriers of its written id. `written` is what its `_id` writes.
    pub fn put(&mut self, key: IdKey, raw_id: Bson, written: Option<Wid>, fields: Option<Fields>) -> Handle {
        let mut rec = Rec { flags: LIVE, ..Rec::default() };
        let mut long = None;
        if let Some(f) = fields {
            rec.flags |= VALID | if f.active { ACTIVE } else { 0 };
            rec.set_added_ms(f.added_ms);
            match (u8::try_from(f.cats.len()), u8::try_from(f.tags.len())) {
                (Ok(cats), Ok(tags)) => {
                    let refs: Vec<Sym> = f.cats.into_iter().chain(f.tags).collect();
                    (rec.refs, rec.cats, rec.tags) = (self.refs.put(&refs), cats, tags);
                }
                _ => {
                    rec.flags |= LONG;
                    long = Some((f.cats.len(), f.cats.into_iter().chain(f.tags).collect()));
                }
            }
        }
        if let Some(h) = self.find(&key) {
            let old = self.recs[h as usize];
            self.refs.release(old.refs, old.span());
            rec.oid = old.oid;
            rec.flags |= old.flags & OTHER;
            self.recs[h as usize] = rec;
            match long {
                Some(l) => self.long.insert(h, l),
                None => self.long.remove(&h),
            };
            return h;
        }
        match &key {
            IdKey::Oid(bytes) => rec.oid = *bytes,
            IdKey::Other(_) => rec.flags |= OTHER,
        }
        let h = self.alloc();
        self.recs[h as usize] = rec;
        if let Some(l) = long {
            self.long.insert(h, l);
        }
        if let IdKey::Other(text) = key {
            self.others.insert(h, Other { key: text, raw_id: Box::new(raw_id), written });
        }
        let slab = Slab { recs: &self.recs, others: &self.others };
        self.by_key.insert_unique(hash(slab.key(h)), h, |x| hash(slab.key(x)));
        self.link(h);
        h
    }

    /// Removes a document: the handle it had, `None` when not held.
    pub fn remove(&mut self, key: &IdKey) -> Option<Handle> {
        let h = self.find(key)?;
        self.unlink(h);
        let rec = self.recs[h as usize];
        self.refs.release(rec.refs, rec.span());
        self.kill(h);
        self.freed.push(h);
        Some(h)
    }

    fn alloc(&mut self) -> Handle {
        match self.free.pop() {
            Some(h) => h,
            None => {
                self.recs.push(Rec::default());
                Handle::try_from(self.recs.len() - 1).expect("fewer than 4 billion video documents")
            }
        }
    }

    /// Drops a held document from the key table and empties its record
    /// (its written id is unlinked already, its span released or kept
    /// by the caller).
    fn kill(&mut self, h: Handle) {
        let slab = Slab { recs: &self.recs, others: &self.others };
        let k = slab.key(h);
        self.by_key.remove(hash(k), h, |x| hash(slab.key(x)));
        self.recs[h as usize] = Rec::default();
        self.others.remove(&h);
        self.long.remove(&h);
    }

    /// Files a new document (held already) last among its written id's
    /// carriers.
    fn link(&mut self, h: Handle) {
        let Some(w) = self.written(h).map(|w| w.to_owned()) else { return };
        if let Some(list) = self.carriers.get_mut(&w) {
            if !list.contains(&h) {
                list.push(h);
            }
            return;
        }
        // Without a list the id has at most one carrier besides `h`: the
        // document whose ObjectId it is, or one kept aside.
        let by_oid = match w.as_ref() {
            WidRef::Hex(bytes) => self.find_ref(KeyRef::Oid(bytes)),
            WidRef::Text(_) => None,
        };
        match [by_oid, self.other_owner.get(&w).copied()].into_iter().flatten().find(|&x| x != h) {
            Some(first) => {
                self.other_owner.remove(&w);
                self.carriers.insert(w, vec![first, h]);
            }
            None if self.recs[h as usize].flags & OTHER != 0 => {
                self.other_owner.insert(w, h);
            }
            None => {}
        }
    }

    /// Takes a document out of its written id's carriers: the next one
    /// owns the id when it owned it.
    fn unlink(&mut self, h: Handle) {
        let Some(w) = self.written(h).map(|w| w.to_owned()) else { return };
        match self.carriers.get_mut(&w) {
            Some(list) => {
                list.retain(|&x| x != h);
                if let [last] = list[..] {
                    self.carriers.remove(&w);
                    self.set_sole(w, last);
                }
            }
            None => {
                if self.other_owner.get(&w) == Some(&h) {
                    self.other_owner.remove(&w);
                }
            }
        }
    }

    /// Records the one carrier of a written id where [`Videos::sole`]
    /// finds it.
    fn set_sole(&mut self, w: Wid, h: Handle) {
        if self.recs[h as usize].flags & OTHER != 0 {
            self.other_owner.insert(w, h);
        }
    }

    /// A held document as it is now, to put back with [`Videos::undo`].
    pub fn save(&self, key: &IdKey) -> Option<Saved> {
        let h = self.find(key)?;
        Some(Saved {
            handle: h,
            rec: self.recs[h as usize],
            other: self.others.get(&h).cloned(),
            long: self.long.get(&h).cloned(),
        })
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
        for (w, _) in &owners {
            self.carriers.remove(w);
            self.other_owner.remove(w);
        }
        let mut gone = std::mem::take(&mut self.freed);
        let docs: Vec<(IdKey, Option<Saved>)> = docs.into_iter().collect();
        for (key, _) in &docs {
            if let Some(h) = self.find(key) {
                self.kill(h);
                gone.push(h);
            }
        }
        // The spans the batch took are free again; the ones it released
        // hold the restored records' references.
        self.refs.undo();
        for saved in docs.into_iter().filter_map(|(_, saved)| saved) {
            let h = saved.handle;
            self.recs[h as usize] = saved.rec;
            if let Some(other) = saved.other {
                self.others.insert(h, other);
            }
            if let Some(long) = saved.long {
                self.long.insert(h, long);
            }
            let slab = Slab { recs: &self.recs, others: &self.others };
            self.by_key.insert_unique(hash(slab.key(h)), h, |x| hash(slab.key(x)));
        }
        for (w, mut list) in owners {
            match list.len() {
                0 => {}
                1 => self.set_sole(w, list.remove(0)),
                _ => {
                    self.carriers.insert(w, list);
                }
            }
        }
        gone.sort_unstable();
        gone.dedup();
        self.free.extend(gone.into_iter().filter(|&h| self.recs[h as usize].flags & LIVE == 0));
    }

    /// Keeps a batch: the handles and spans it freed may be reused.
    pub fn commit(&mut self) {
        self.free.append(&mut self.freed);
        self.refs.commit();
    }

    /// About how many bytes the store holds: its records, their
    /// references, the side entries and the table.
    pub fn footprint(&self) -> usize {
        let table = self.by_key.footprint();
        let others = (self.others.len() + self.other_owner.len()) * (size_of::<Other>() + 64);
        let long: usize = self.long.values().map(|(_, refs)| 48 + refs.len() * 4).sum();
        let carriers: usize = self.carriers.values().map(|l| 48 + l.capacity() * 4).sum();
        let recs = self.recs.footprint();
        recs + self.refs.footprint() + table + others + long + carriers + self.free.capacity() * 4
    }

    /// Every held document with its fields (`None`: rejected), in no
    /// particular order: for tests and diagnostics.
    pub fn entries(&self) -> impl Iterator<Item = (IdKey, Option<Doc<'_>>)> + '_ {
        self.by_key.iter().map(|h| (self.key(h), self.doc(h)))
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
    fn a_record_is_28_bytes() {
        assert_eq!(std::mem::size_of::<Rec>(), 28);
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
    fn an_id_carried_first_by_a_string_then_by_its_object_id_keeps_arrival_order() {
        let mut v = Videos::default();
        let oid = mongodb::bson::oid::ObjectId::new();
        let hex = oid.to_hex();
        let wid = Wid::new(&hex);
        let (key, raw, w) = other(&hex);
        let s = v.put(key.clone(), raw, w, fields(1, &[1], &[]));
        assert_eq!((v.owner(wid.as_ref()), v.owners().collect::<Vec<_>>()), (Some(s), vec![s]));
        let o = v.put(IdKey::Oid(oid.bytes()), Bson::ObjectId(oid), Some(wid.clone()), fields(2, &[2], &[]));
        assert_eq!((v.owner(wid.as_ref()), v.carriers(wid.as_ref())), (Some(s), vec![s, o]));
        assert_eq!(v.owners().collect::<Vec<_>>(), vec![s]);
        v.remove(&key);
        assert_eq!((v.owner(wid.as_ref()), v.carriers(wid.as_ref())), (Some(o), vec![o]));
        assert_eq!(v.owners().collect::<Vec<_>>(), vec![o]);
        v.commit();
        // Back again: last now.
        let (key, raw, w) = other(&hex);
        let s = v.put(key, raw, w, None);
        assert_eq!(v.carriers(wid.as_ref()), vec![o, s]);
    }

    #[test]
    fn references_beyond_a_records_counts_are_kept_aside_and_undone() {
        let mut v = Videos::default();
        let tags: Vec<Sym> = (0..300).collect();
        let (key, raw, w) = other("long");
        let h = v.put(key.clone(), raw.clone(), w.clone(), fields(7, &[1, 2], &tags));
        assert_eq!(v.doc(h).map(|d| (d.cats.to_vec(), d.tags.len())), Some((vec![1, 2], 300)));
        v.commit();
        let saved = v.save(&key);
        let wid = w.clone().expect("written");
        let owners = vec![(wid.clone(), v.carriers(wid.as_ref()))];
        // A batch shortens them into a span, then is taken back.
        v.put(key.clone(), raw.clone(), w.clone(), fields(8, &[3], &[4]));
        assert_eq!(v.doc(h).map(|d| (d.cats.to_vec(), d.tags.to_vec())), Some((vec![3], vec![4])));
        v.undo(vec![(key.clone(), saved)], owners);
        assert_eq!(v.doc(h).map(|d| (d.added_ms, d.tags.len())), Some((7, 300)));
        assert_eq!((v.refs.held(), v.owner(wid.as_ref())), (0, Some(h)));
    }

    #[test]
    fn added_time_survives_its_two_halves() {
        let mut rec = Rec::default();
        for ms in [0, -1, i64::MIN, i64::MAX, 1_767_225_600_000, -62_135_596_800_000] {
            rec.set_added_ms(ms);
            assert_eq!(rec.added_ms(), ms);
        }
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
