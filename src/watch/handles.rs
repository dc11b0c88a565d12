//! The video store's `_id` table: handles found by the hash of the key
//! their record holds, in open addressing with linear probing.
//!
//! Why not `hashbrown`: its tables grow by doubling and never fill past
//! 7/8, so a table of 2M handles (just past 2^21 · 7/8) had 4M buckets at
//! 5 bytes each, 10.4 bytes a video, at the scale where the watcher's
//! memory target is tightest. This table takes any size: it grows by a
//! quarter and fills to 7/8, so a handle costs 5 to 7 bytes
//! (its 4 and a one-byte tag, over the load factor).
//!
//! The table stores no key and no full hash: the caller gives a key's
//! hash to look it up and a way to hash any held handle again (through
//! its record) for the moves that need it (growing, deleting). A slot's
//! tag is eight bits of its handle's hash, 0 marking an empty slot, so a
//! probe reads its record only on a tag match (1 in 255 for another key).
//! A deletion shifts the rest of its run back (no tombstones), so probe
//! runs never lengthen under churn. A growth hashes every held handle
//! again through its record: a pass over the records in the batch that
//! crosses 7/8, once per quarter more documents (about four hashes per
//! inserted document over time, against one or two for a doubling
//! table; a catalogue grows slowly beside that pass).

/// Fills to at most this share of the slots (7/8) before growing.
const MAX_LOAD: (usize, usize) = (7, 8);
/// A growth leaves the table this full (0.7): a quarter more slots.
const GROWN_LOAD: (usize, usize) = (7, 10);
/// A reserve for a known count leaves the table this full (0.8): a load
/// knows how many documents it holds, and its first growth then comes
/// after a tenth more.
const RESERVED_LOAD: (usize, usize) = (4, 5);

/// Slots needed to hold `len` handles at `load`.
fn slots_for(len: usize, load: (usize, usize)) -> usize {
    (len * load.1).div_ceil(load.0).max(8)
}

/// Spreads a key's hash over every bit: the table takes its home slot
/// from the high bits and its tag from the low ones (splitmix64's
/// finalizer; FxHash's low bits depend on few input bits).
fn mix(mut h: u64) -> u64 {
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

fn tag_of(mixed: u64) -> u8 {
    (mixed as u8).max(1)
}

#[derive(Debug, Default, Clone)]
pub struct Handles {
    /// A held handle per slot (meaningless where the tag is 0).
    slots: Vec<u32>,
    /// Per slot: 0 when empty, else eight bits of its handle's hash.
    tags: Vec<u8>,
    len: usize,
}

impl Handles {
    /// How many handles it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// The slot a mixed hash starts probing from (Lemire's multiply-shift:
    /// any table size, no division).
    fn home(&self, mixed: u64) -> usize {
        ((u128::from(mixed) * self.slots.len() as u128) >> 64) as usize
    }

    fn next(&self, at: usize) -> usize {
        if at + 1 == self.slots.len() { 0 } else { at + 1 }
    }

    /// Makes room for `more` handles beyond those held without growing
    /// again on the way.
    pub fn reserve(&mut self, more: usize, rehash: impl Fn(u32) -> u64) {
        let want = self.len + more;
        if want * MAX_LOAD.1 > self.slots.len() * MAX_LOAD.0 {
            self.resize(slots_for(want, RESERVED_LOAD), &rehash);
        }
    }

    /// The held handle whose key has `hash` and passes `eq`.
    pub fn find(&self, hash: u64, eq: impl Fn(u32) -> bool) -> Option<u32> {
        self.slot_of(hash, eq).map(|at| self.slots[at])
    }

    /// The slot of that handle: its home's run is read up to the first
    /// empty slot, records only where the tag matches.
    fn slot_of(&self, hash: u64, eq: impl Fn(u32) -> bool) -> Option<usize> {
        if self.len == 0 {
            return None;
        }
        let mixed = mix(hash);
        let tag = tag_of(mixed);
        let mut at = self.home(mixed);
        loop {
            match self.tags[at] {
                0 => return None,
                t if t == tag && eq(self.slots[at]) => return Some(at),
                _ => at = self.next(at),
            }
        }
    }

    /// Adds a handle whose key no held handle has.
    pub fn insert_unique(&mut self, hash: u64, h: u32, rehash: impl Fn(u32) -> u64) {
        if (self.len + 1) * MAX_LOAD.1 > self.slots.len() * MAX_LOAD.0 {
            self.resize(slots_for(self.len + 1, GROWN_LOAD), &rehash);
        }
        self.place(mix(hash), h);
        self.len += 1;
    }

    fn place(&mut self, mixed: u64, h: u32) {
        let mut at = self.home(mixed);
        while self.tags[at] != 0 {
            at = self.next(at);
        }
        self.tags[at] = tag_of(mixed);
        self.slots[at] = h;
    }

    /// Removes handle `h`, whose key has `hash`; false when not held.
    pub fn remove(&mut self, hash: u64, h: u32, rehash: impl Fn(u32) -> u64) -> bool {
        let Some(mut hole) = self.slot_of(hash, |x| x == h) else { return false };
        // Backward shift: a later handle of the run moves into the hole
        // when its home is not between the hole and itself (cyclically),
        // so every handle stays reachable from its home without gaps.
        let mut at = self.next(hole);
        while self.tags[at] != 0 {
            let home = self.home(mix(rehash(self.slots[at])));
            let stays = if hole <= at { hole < home && home <= at } else { hole < home || home <= at };
            if !stays {
                self.tags[hole] = self.tags[at];
                self.slots[hole] = self.slots[at];
                hole = at;
            }
            at = self.next(at);
        }
        self.tags[hole] = 0;
        self.len -= 1;
        true
    }

    fn resize(&mut self, slots: usize, rehash: &impl Fn(u32) -> u64) {
        let old = std::mem::replace(self, Handles { slots: vec![0; slots], tags: vec![0; slots], len: self.len });
        for (&tag, &h) in old.tags.iter().zip(&old.slots) {
            if tag != 0 {
                self.place(mix(rehash(h)), h);
            }
        }
    }

    /// Every held handle, in slot order.
    pub fn iter(&self) -> impl Iterator<Item = u32> + '_ {
        self.tags.iter().zip(&self.slots).filter(|(t, _)| **t != 0).map(|(_, &h)| h)
    }

    /// Bytes its slots take.
    pub fn footprint(&self) -> usize {
        self.slots.capacity() * size_of::<u32>() + self.tags.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// Keys are the handles' own values here; a few hashes collide on
    /// purpose so that runs form and deletions shift them.
    fn hash_of(h: u32) -> u64 {
        u64::from(h % 97)
    }

    #[test]
    fn finds_what_it_holds_and_nothing_else() {
        let mut t = Handles::default();
        for h in 0..1000 {
            t.insert_unique(hash_of(h), h, hash_of);
        }
        assert_eq!(t.len(), 1000);
        for h in 0..1000 {
            assert_eq!(t.find(hash_of(h), |x| x == h), Some(h));
        }
        assert_eq!(t.find(hash_of(1000), |x| x == 1000), None);
        assert!(t.remove(hash_of(500), 500, hash_of));
        assert!(!t.remove(hash_of(500), 500, hash_of));
        assert_eq!(t.find(hash_of(500), |x| x == 500), None);
        assert_eq!(t.iter().count(), 999);
    }

    #[test]
    fn grows_by_a_quarter_and_fills_to_seven_eighths() {
        let mut t = Handles::default();
        let hash = |h: u32| u64::from(h).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        t.reserve(200_000, hash);
        assert_eq!(t.footprint(), 250_000 * 5, "a reserve leaves it 80% full");
        for h in 0..218_750 {
            t.insert_unique(hash(h), h, hash);
        }
        assert_eq!(t.footprint(), 250_000 * 5, "no growth up to 7/8");
        t.insert_unique(hash(218_750), 218_750, hash);
        assert_eq!(t.footprint(), 312_502 * 5, "one growth past 7/8, to 0.7 full");
        assert!((0..=218_750).all(|h| t.find(hash(h), |x| x == h) == Some(h)));
    }

    proptest! {
        /// Against a map, through inserts and deletions in any order with
        /// heavy hash collisions: every held handle is found, no removed
        /// one is.
        #[test]
        fn behaves_as_a_map(ops in proptest::collection::vec((any::<bool>(), 0u32..300), 0..600)) {
            let mut t = Handles::default();
            let mut model = BTreeMap::new();
            for (insert, h) in ops {
                if insert {
                    if model.insert(h, ()).is_none() {
                        t.insert_unique(hash_of(h), h, hash_of);
                    }
                } else {
                    prop_assert_eq!(t.remove(hash_of(h), h, hash_of), model.remove(&h).is_some());
                }
                prop_assert_eq!(t.len(), model.len());
            }
            for h in 0..300 {
                prop_assert_eq!(t.find(hash_of(h), |x| x == h), model.contains_key(&h).then_some(h));
            }
            let mut held: Vec<u32> = t.iter().collect();
            held.sort_unstable();
            prop_assert_eq!(held, model.keys().copied().collect::<Vec<_>>());
        }
    }
}
