//! Who is in each scope: per referenced category and per referenced tag
//! its videos newest first. A batch plans a scope's keys from its members
//! alone, so its cost follows the scopes it touched, not the size of the
//! catalogue.
//!
//! Scopes are keyed by the reference as stored in the video (active or
//! not, known or not): a category that becomes active later finds its
//! members already filed, so a flip never needs a walk over every video.
//! Only videos that own their written id and are active are filed, the
//! ones the index families list.

use super::videos::{Handle, Videos};
use crate::model::compact::{Sym, WidRef};
use rustc_hash::FxHashMap as HashMap;
use std::cmp::{Ordering, Reverse};

/// A scope member's rank: newest first (`addedTime` descending, then id
/// ascending as bytes), the contract's order, so a scope's first members
/// are its home-section candidates.
type Rank<'a> = (Reverse<i64>, WidRef<'a>);

fn rank_of(videos: &Videos, h: Handle) -> Rank<'_> {
    let (added, w) = videos.rank(h);
    (Reverse(added), w)
}

/// One scope's members: handles of the videos sorted by rank (looked up
/// in the store), 4 bytes per entry. A sorted vector, not a tree: a scope
/// changes a few members at a time, and one insert moves the entries
/// after it, which for the largest categories is still microseconds.
/// Beside it, [`Fences`]: where a rank falls to within a few dozen
/// members, without reading the store.
#[derive(Debug, Default, Clone)]
struct Ordered(Vec<Handle>, Fences);

/// Two scopes are equal when they list the same members: fences are an
/// aid to the search, placed differently by a load and by inserts.
impl PartialEq for Ordered {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

/// Members between two fences, at most: an insert that makes a run
/// longer puts a fence in its middle, so a search ends among at most
/// this many members.
const MAX_RUN: usize = 32;
/// A load fences every this many members.
const STRIDE: usize = 16;

/// Every so many members of a scope, its place and `addedTime`, in place
/// order (so times never rise). A probe of the scope reads a video's
/// record, a cache miss in a large store; the fences are read from one
/// small array instead and leave at most [`MAX_RUN`] members to probe.
/// About 0.75 bytes a member. Each insert or removal moves the places
/// after it by one (arithmetic on that array, no record read), and a
/// run grown past [`MAX_RUN`] by inserts, or merged by removing a
/// fenced member, gets a new fence in its middle (one record read).
#[derive(Debug, Default, Clone)]
struct Fences {
    at: Vec<u32>,
    added: Vec<i64>,
}

impl Fences {
    /// Fences every [`STRIDE`]th member of a sorted scope.
    fn of(videos: &Videos, handles: &[Handle]) -> Fences {
        if handles.len() <= MAX_RUN {
            return Fences::default();
        }
        let at: Vec<u32> = (STRIDE - 1..handles.len()).step_by(STRIDE).map(|i| i as u32).collect();
        let added = at.iter().map(|&i| videos.added(handles[i as usize])).collect();
        Fences { at, added }
    }

    fn bytes(&self) -> usize {
        self.at.capacity() * size_of::<u32>() + self.added.capacity() * size_of::<i64>()
    }

    /// The window of places a rank of time `added` can take: after every
    /// fence of a newer time, before every fence of an older one, with
    /// the times of those two fences.
    fn window(&self, added: i64, len: usize) -> ((usize, Option<i64>), (usize, Option<i64>)) {
        let newer = self.added.partition_point(|&a| a > added);
        let older = newer + self.added[newer..].partition_point(|&a| a == added);
        let lo = newer.checked_sub(1).map_or((0, None), |i| (self.at[i] as usize + 1, Some(self.added[i])));
        let hi = self.added.get(older).map_or((len, None), |&a| (self.at[older] as usize, Some(a)));
        (lo, hi)
    }

    /// A member was inserted at `place`, of time `added`.
    fn inserted(&mut self, videos: &Videos, handles: &[Handle], place: usize, added: i64) {
        let next = self.at.partition_point(|&a| (a as usize) < place);
        for a in &mut self.at[next..] {
            *a += 1;
        }
        self.split(videos, handles, next, Some((place, added)));
    }

    /// The member at `place` was removed.
    fn removed(&mut self, videos: &Videos, handles: &[Handle], place: usize) {
        let next = self.at.partition_point(|&a| (a as usize) < place);
        if self.at.get(next).is_some_and(|&a| a as usize == place) {
            self.at.remove(next);
            self.added.remove(next);
        }
        for a in &mut self.at[next..] {
            *a -= 1;
        }
        self.split(videos, handles, next, None);
    }

    /// Puts a fence in the middle of the run before fence `next` (or the
    /// scope's end) when it is longer than [`MAX_RUN`]; `known` is a
    /// member whose time needs no record read.
    fn split(&mut self, videos: &Videos, handles: &[Handle], next: usize, known: Option<(usize, i64)>) {
        let from = next.checked_sub(1).map_or(0, |i| self.at[i] as usize + 1);
        let to = self.at.get(next).map_or(handles.len(), |&a| a as usize);
        if to - from <= MAX_RUN {
            return;
        }
        let mid = from + (to - from) / 2;
        let added = match known {
            Some((place, added)) if place == mid => added,
            _ => videos.added(handles[mid]),
        };
        super::arena::make_room(&mut self.at);
        super::arena::make_room(&mut self.added);
        self.at.insert(next, mid as u32);
        self.added.insert(next, added);
    }
}

impl Ordered {
    /// A scope sorted and deduplicated, fenced.
    fn sorted(videos: &Videos, mut handles: Vec<Handle>) -> Ordered {
        // Ranks computed once per entry: a comparison through the store
        // would look two records up each time.
        handles.sort_by_cached_key(|&h| rank_of(videos, h));
        // A reference repeated in one video files it once; the room
        // counted for the repeats is given back.
        handles.dedup();
        handles.shrink_to_fit();
        let fences = Fences::of(videos, &handles);
        Ordered(handles, fences)
    }

    fn insert(&mut self, videos: &Videos, h: Handle, rank: &Rank<'_>) {
        if let Err(at) = self.find(videos, rank) {
            super::arena::make_room(&mut self.0);
            self.0.insert(at, h);
            self.1.inserted(videos, &self.0, at, rank.0.0);
        }
    }

    fn remove(&mut self, videos: &Videos, rank: &Rank<'_>) {
        if let Ok(at) = self.find(videos, rank) {
            self.0.remove(at);
            self.1.removed(videos, &self.0, at);
        }
    }

    /// Where `rank` stands: `Ok` at a member of that rank, `Err` where it
    /// would go. Each probe reads a video's record, a cache miss in a
    /// large store, so the probes are spared what they can be:
    /// - `addedTime` decides nearly every probe; the written id (for an
    ///   id that is not an ObjectId, a lookup of its own) is read only on
    ///   a tie;
    /// - the newest member is tried first: uploads, and deletes and edits
    ///   of what just came, land there, and it is the scope's most read
    ///   record (home sections start from it);
    /// - the fences narrow the search to at most [`MAX_RUN`] members
    ///   (more only where that many share one `addedTime`);
    /// - every other probe goes where the rank's `addedTime` falls
    ///   between the times around the window (an interpolation search),
    ///   the others to its middle. Uploads over time spread a scope's
    ///   times, so a guess lands near the member: in a simulation over
    ///   2,500 members it took about 8 probes where a binary search takes
    ///   11 with times spread evenly, and 9 with times crowded towards
    ///   the newest (a platform that grows). The halving steps bound an
    ///   uneven spread to about twice a binary search's probes.
    fn find(&self, videos: &Videos, rank: &Rank<'_>) -> Result<usize, usize> {
        let (Reverse(added), written) = *rank;
        // The member's place from the rank: `Less` when it comes first.
        let probe = |h: Handle| added.cmp(&videos.added(h)).then_with(|| videos.rank(h).1.cmp(&written));
        let all = &self.0;
        let Some(&first) = all.first() else { return Err(0) };
        let (mut lo, mut hi) = match probe(first) {
            Ordering::Greater => return Err(0),
            Ordering::Equal => return Ok(0),
            Ordering::Less => (1, all.len()),
        };
        // The `addedTime` of the member before the window (no older than
        // the rank) and, once known, of the one after it (no newer): what
        // a guess needs.
        let mut newer = videos.added(first);
        let mut older: Option<i64> = None;
        let ((fence_lo, fence_newer), (fence_hi, fence_older)) = self.1.window(added, all.len());
        if fence_lo > lo {
            (lo, newer) = (fence_lo, fence_newer.unwrap_or(newer));
        }
        if fence_hi < hi {
            (hi, older) = (fence_hi, fence_older);
        }
        let mut guessed = false;
        while lo < hi {
            let guess = match older {
                Some(older) if !guessed && hi - lo > 8 && newer > older => {
                    // As floats: the times may span all of `i64`.
                    let share = (newer as f64 - added as f64) / (newer as f64 - older as f64);
                    Some(lo + ((share * (hi - lo) as f64) as usize).min(hi - lo - 1))
                }
                _ => None,
            };
            guessed = guess.is_some();
            let at = guess.unwrap_or(lo + (hi - lo) / 2);
            match probe(all[at]) {
                Ordering::Equal => return Ok(at),
                Ordering::Less => {
                    lo = at + 1;
                    newer = videos.added(all[at]);
                }
                Ordering::Greater => {
                    hi = at;
                    older = Some(videos.added(all[at]));
                }
            }
        }
        Err(lo)
    }
}

/// A scope's members after a rank: where the rank sits, then the members.
pub type After<'a> = (usize, Ranks<'a>);

/// A scope's members in order, each with its `addedTime`.
#[derive(Clone)]
pub struct Ranks<'a> {
    handles: std::slice::Iter<'a, Handle>,
    videos: &'a Videos,
}

impl<'a> Iterator for Ranks<'a> {
    type Item = (i64, WidRef<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        self.handles.next().map(|&h| self.videos.rank(h))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.handles.size_hint()
    }
}

/// The active videos of each referenced category and tag, by handle.
/// Only an effective video (the owner of its written id, valid, active)
/// is filed; [`Members::insert`] and [`Members::remove`] read its rank
/// and references from the store, so a video is unfiled before its
/// record changes and filed again after.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Members {
    by_category: HashMap<Sym, Ordered>,
    by_tag: HashMap<Sym, Ordered>,
}

impl Members {
    /// Files every effective video of a load at once: counted, appended
    /// to lists of that exact size, then each scope sorted once (in
    /// parallel), rather than inserted one by one. Lists grown by
    /// doubling left their outgrown copies scattered through the
    /// allocator's pages beside the kept ones: at 500K videos, 28 MiB of
    /// resident memory for 11 MiB of entries.
    pub fn build(videos: &Videos, effective: impl Iterator<Item = Handle> + Clone) -> Members {
        use rayon::prelude::*;
        let mut counts: [HashMap<Sym, usize>; 2] = Default::default();
        for doc in effective.clone().filter_map(|h| videos.doc(h)) {
            for (counts, syms) in counts.iter_mut().zip([doc.cats, doc.tags]) {
                for s in syms {
                    *counts.entry(*s).or_default() += 1;
                }
            }
        }
        let [by_category, by_tag] =
            counts.map(|counts| counts.into_iter().map(|(s, n)| (s, Vec::with_capacity(n))).collect::<HashMap<_, _>>());
        let mut lists = [by_category, by_tag];
        for h in effective {
            let Some(doc) = videos.doc(h) else { continue };
            for (map, syms) in lists.iter_mut().zip([doc.cats, doc.tags]) {
                for s in syms {
                    map.get_mut(s).expect("counted").push(h);
                }
            }
        }
        let [by_category, by_tag] = lists.map(|lists| {
            lists.into_par_iter().map(|(s, handles)| (s, Ordered::sorted(videos, handles))).collect::<HashMap<_, _>>()
        });
        Members { by_category, by_tag }
    }

    /// Files an effective video under each scope it references.
    pub fn insert(&mut self, videos: &Videos, h: Handle) {
        let Some(doc) = videos.doc(h) else { return };
        let rank = rank_of(videos, h);
        for (map, syms) in [(&mut self.by_category, doc.cats), (&mut self.by_tag, doc.tags)] {
            for s in syms {
                map.entry(*s).or_default().insert(videos, h, &rank);
            }
        }
    }

    /// Unfiles an effective video, its record as when it was filed.
    pub fn remove(&mut self, videos: &Videos, h: Handle) {
        let Some(doc) = videos.doc(h) else { return };
        let rank = rank_of(videos, h);
        for (map, syms) in [(&mut self.by_category, doc.cats), (&mut self.by_tag, doc.tags)] {
            for s in syms {
                let Some(scope) = map.get_mut(s) else { continue };
                scope.remove(videos, &rank);
                if scope.0.is_empty() {
                    map.remove(s);
                }
            }
        }
    }

    /// How many (scope, video) entries are filed.
    pub fn len(&self) -> usize {
        self.by_category.values().chain(self.by_tag.values()).map(|m| m.0.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.by_category.is_empty() && self.by_tag.is_empty()
    }

    /// About how many bytes the scopes hold.
    pub fn footprint(&self) -> usize {
        let scopes = self.by_category.values().chain(self.by_tag.values());
        scopes.map(|o| o.0.capacity() * size_of::<Handle>() + o.1.bytes() + 96).sum()
    }

    /// The members, read through the store that ranks them.
    pub fn view<'a>(&'a self, videos: &'a Videos) -> Scoped<'a> {
        Scoped { members: self, videos }
    }
}

/// The members with their store: what planning reads.
#[derive(Clone, Copy)]
pub struct Scoped<'a> {
    members: &'a Members,
    videos: &'a Videos,
}

impl<'a> Scoped<'a> {
    fn ranks(&self, scope: Option<&'a Ordered>) -> Ranks<'a> {
        const NONE: &[Handle] = &[];
        Ranks { handles: scope.map_or(NONE, |o| &o.0).iter(), videos: self.videos }
    }

    /// The active videos referencing category `sym`, newest first.
    pub fn of_category(&self, sym: Option<Sym>) -> impl Iterator<Item = WidRef<'a>> + use<'a> {
        self.ranked_of_category(sym).map(|(_, w)| w)
    }

    /// The same, each with its `addedTime`.
    pub fn ranked_of_category(&self, sym: Option<Sym>) -> Ranks<'a> {
        self.ranks(sym.and_then(|s| self.members.by_category.get(&s)))
    }

    /// The active videos referencing tag `sym`, newest first, each with
    /// its `addedTime`.
    pub fn ranked_of_tag(&self, sym: Option<Sym>) -> Ranks<'a> {
        self.ranks(sym.and_then(|s| self.members.by_tag.get(&s)))
    }

    /// Tag `tag`'s list in category `cat`: its members that are members
    /// of the category too, newest first, each with its `addedTime`. A
    /// member of any scope is an effective video, filed under every
    /// category it references, so its own references answer, without a
    /// search of the category by rank.
    pub fn ranked_of_tag_in_category(
        &self,
        tag: Option<Sym>,
        cat: Option<Sym>,
    ) -> impl Iterator<Item = (i64, WidRef<'a>)> + use<'a> {
        let videos = self.videos;
        let scope = cat.and(tag).and_then(|s| self.members.by_tag.get(&s));
        let in_cat = move |h: Handle| videos.doc(h).is_some_and(|d| cat.is_some_and(|c| d.cats.contains(&c)));
        scope.map_or(&[][..], |o| &o.0[..]).iter().copied().filter(move |&h| in_cat(h)).map(move |h| videos.rank(h))
    }

    /// How many active videos reference tag `sym`.
    pub fn count_of_tag(&self, sym: Option<Sym>) -> usize {
        sym.and_then(|s| self.members.by_tag.get(&s)).map_or(0, |o| o.0.len())
    }

    /// How many active videos reference category `sym`.
    pub fn count_of_category(&self, sym: Option<Sym>) -> usize {
        sym.and_then(|s| self.members.by_category.get(&s)).map_or(0, |o| o.0.len())
    }

    /// Category `sym`'s members as handles in handle order: what
    /// [`Scoped::count_of_tag_among`] looks members up in.
    pub fn handles_of_category(&self, sym: Option<Sym>) -> Vec<Handle> {
        let mut handles = sym.and_then(|s| self.members.by_category.get(&s)).map_or_else(Vec::new, |o| o.0.clone());
        handles.sort_unstable();
        handles
    }

    /// How many of tag `sym`'s members are among `sorted` (a category's
    /// handles, [`Scoped::handles_of_category`]): the size of the tag's
    /// list in that category. A video is filed under one handle in every
    /// scope, so handles compare without reading a record. Judging every
    /// tag list's size after a catch-up counts this way: reading each
    /// member's record instead ([`Scoped::ranked_of_tag_in_category`],
    /// which a list needs anyway for the ids) took 0.9–1.2 s at 2M
    /// videos where this takes 0.26–0.32 s.
    pub fn count_of_tag_among(&self, sym: Option<Sym>, sorted: &[Handle]) -> usize {
        let Some(scope) = sym.and_then(|s| self.members.by_tag.get(&s)) else { return 0 };
        scope.0.iter().filter(|h| sorted.binary_search(h).is_ok()).count()
    }

    /// Where a video ranked `(added, written)` sits, or would, among
    /// category `sym`'s members, and the members after it: what a patch
    /// of the category's list inserts before, found without a walk.
    pub fn after_in_category(&self, sym: Sym, added: i64, written: WidRef<'_>) -> After<'a> {
        self.after(self.members.by_category.get(&sym), added, written)
    }

    /// The same among tag `sym`'s members.
    pub fn after_in_tag(&self, sym: Sym, added: i64, written: WidRef<'_>) -> After<'a> {
        self.after(self.members.by_tag.get(&sym), added, written)
    }

    fn after(&self, scope: Option<&'a Ordered>, added: i64, written: WidRef<'_>) -> After<'a> {
        let Some(scope) = scope else { return (0, self.ranks(None)) };
        let (at, from) = match scope.find(self.videos, &(Reverse(added), written)) {
            Ok(at) => (at, at + 1),
            Err(at) => (at, at),
        };
        (at, Ranks { handles: scope.0[from..].iter(), videos: self.videos })
    }

    /// Whether the video (with its `addedTime`) references category `sym`.
    pub fn in_category(&self, sym: Option<Sym>, added: i64, written: WidRef<'_>) -> bool {
        let Some(scope) = sym.and_then(|s| self.members.by_category.get(&s)) else { return false };
        scope.find(self.videos, &(Reverse(added), written)).is_ok()
    }

    /// The first `limit` distinct videos of the union of `categories`,
    /// newest first: what a home section over them lists. A merge of the
    /// categories' ordered members, so it reads about `limit` members per
    /// call, not every member of every category. Each comes with its
    /// `addedTime`.
    pub fn newest_of(&self, categories: impl IntoIterator<Item = Sym>, limit: usize) -> Vec<(i64, WidRef<'a>)> {
        use std::collections::BinaryHeap;
        let mut heads: Vec<Ranks<'a>> = categories
            .into_iter()
            .filter_map(|c| self.members.by_category.get(&c))
            .map(|o| self.ranks(Some(o)))
            .collect();
        // A min-heap on (rank, which iterator): the next newest overall.
        let mut heap: BinaryHeap<Reverse<(Rank<'a>, usize)>> = BinaryHeap::new();
        let ranked = |(added, w): (i64, WidRef<'a>)| (Reverse(added), w);
        for (i, it) in heads.iter_mut().enumerate() {
            if let Some(first) = it.next() {
                heap.push(Reverse((ranked(first), i)));
            }
        }
        let mut out: Vec<(i64, WidRef<'a>)> = Vec::with_capacity(limit.min(1024));
        let mut last: Option<Rank<'a>> = None;
        while out.len() < limit {
            let Some(Reverse((rank, i))) = heap.pop() else { break };
            // A video in two of the categories comes out twice in a row
            // (same rank): it is listed once.
            if last.as_ref().map(|l| l.cmp(&rank)) != Some(Ordering::Equal) {
                out.push((rank.0.0, rank.1));
                last = Some(rank);
            }
            if let Some(next) = heads[i].next() {
                heap.push(Reverse((ranked(next), i)));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::compact::Wid;
    use crate::watch::model::IdKey;
    use crate::watch::videos::Fields;
    use mongodb::bson::Bson;

    /// A store of videos with text ids, and their handles by id.
    #[derive(Default)]
    struct Store {
        videos: Videos,
        members: Members,
    }

    impl Store {
        fn put(&mut self, id: &str, added_ms: i64, cats: &[Sym], tags: &[Sym]) -> Handle {
            let fields = Fields { active: true, added_ms, cats: cats.to_vec(), tags: tags.to_vec() };
            let key = IdKey::Other(id.into());
            self.videos.put(key, Bson::String(id.into()), Some(Wid::new(id)), Some(fields))
        }

        fn file(&mut self, id: &str, added_ms: i64, cats: &[Sym], tags: &[Sym]) -> Handle {
            let h = self.put(id, added_ms, cats, tags);
            self.members.insert(&self.videos, h);
            h
        }

        fn view(&self) -> Scoped<'_> {
            self.members.view(&self.videos)
        }
    }

    fn texts<'a>(ids: impl IntoIterator<Item = WidRef<'a>>) -> Vec<String> {
        ids.into_iter().map(|w| w.text()).collect()
    }

    fn w(id: &str) -> Wid {
        Wid::new(id)
    }

    const C1: Sym = 1;
    const C2: Sym = 2;
    const C3: Sym = 3;
    const T1: Sym = 11;
    const T2: Sym = 12;

    #[test]
    fn members_come_newest_first_then_by_id_bytes() {
        let mut s = Store::default();
        s.file("b", 5, &[C1], &[T1]);
        s.file("a", 5, &[C1], &[]);
        s.file("Z", 9, &[C1, C1], &[T1]);
        let m = s.view();
        assert_eq!(texts(m.of_category(Some(C1))), ["Z", "a", "b"]);
        assert_eq!(texts(m.ranked_of_tag(Some(T1)).map(|(_, w)| w)), ["Z", "b"]);
        assert!(m.in_category(Some(C1), 5, w("a").as_ref()) && !m.in_category(Some(C1), 4, w("a").as_ref()));
        assert!(!m.in_category(Some(C2), 5, w("a").as_ref()) && !m.in_category(None, 5, w("a").as_ref()));
        assert_eq!((m.of_category(Some(C1)).count(), m.of_category(Some(C3)).count()), (3, 0));
        assert_eq!(m.count_of_category(Some(C1)), 3, "a repeated reference files a video once");
        assert_eq!(m.of_category(None).count(), 0);
    }

    /// A tag list's size counted by handle, and its members read off their
    /// own references, equal those found by rank lookup, for
    /// tags whose members lie in several categories.
    #[test]
    fn a_tags_members_in_a_category_count_and_list_alike_by_handle_and_by_rank() {
        let mut s = Store::default();
        for i in 0..40i64 {
            let cats: &[Sym] = match i % 3 {
                0 => &[C1],
                1 => &[C2, C1],
                _ => &[C3],
            };
            let tags: &[Sym] = if i % 2 == 0 { &[T1] } else { &[T1, T2] };
            s.file(&format!("v{i:02}"), i % 7, cats, tags);
        }
        let m = s.view();
        for cat in [Some(C1), Some(C2), Some(C3), None] {
            let sorted = m.handles_of_category(cat);
            for tag in [Some(T1), Some(T2), None] {
                let by_rank = m.ranked_of_tag(tag).filter(|(added, w)| m.in_category(cat, *added, *w)).count();
                assert_eq!(m.count_of_tag_among(tag, &sorted), by_rank, "{cat:?} {tag:?}");
                let listed: Vec<_> = m.ranked_of_tag_in_category(tag, cat).collect();
                let looked_up: Vec<_> = m.ranked_of_tag(tag).filter(|(a, w)| m.in_category(cat, *a, *w)).collect();
                assert_eq!(listed, looked_up, "{cat:?} {tag:?}");
            }
        }
        assert_eq!(m.count_of_tag_among(Some(T2), &m.handles_of_category(Some(C1))), 14);
    }

    #[test]
    fn the_newest_of_several_categories_are_merged_once_each() {
        let mut s = Store::default();
        s.file("a", 9, &[C1, C2], &[]);
        s.file("b", 8, &[C2], &[]);
        s.file("c", 8, &[C1], &[]);
        s.file("d", 1, &[C1], &[]);
        s.file("e", 7, &[C3], &[]);
        let m = s.view();
        let newest = |cats: &[Sym], limit| m.newest_of(cats.iter().copied(), limit);
        assert_eq!(texts(newest(&[C1, C2], 10).into_iter().map(|(_, w)| w)), ["a", "b", "c", "d"]);
        assert_eq!(newest(&[C1, C2, 99], 2).iter().map(|(added, _)| *added).collect::<Vec<_>>(), [9, 8]);
        assert!(m.newest_of([], 5).is_empty());
    }

    #[test]
    fn what_comes_after_a_rank_is_found_whether_it_is_filed_or_not() {
        let mut s = Store::default();
        for (id, added) in [("a", 9), ("b", 8), ("c", 7)] {
            s.file(id, added, &[C1], &[T1]);
        }
        let m = s.view();
        let next = |(at, mut rest): After<'_>| (at, rest.next().map(|(_, w)| w.text()));
        assert_eq!(next(m.after_in_category(C1, 8, w("b").as_ref())), (1, Some("c".into())));
        assert_eq!(next(m.after_in_category(C1, 8, w("a0").as_ref())), (1, Some("b".into())));
        assert_eq!(next(m.after_in_tag(T1, 7, w("c").as_ref())), (2, None));
        assert_eq!(next(m.after_in_tag(T2, 7, w("c").as_ref())), (0, None));
        assert_eq!((m.count_of_category(Some(C1)), m.count_of_category(Some(C2))), (3, 0));
    }

    /// `find` (the newest member first, `addedTime` before the id) answers
    /// as a plain binary search over whole ranks, for ranks filed or not:
    /// newer than all, older than all, tied on time, between.
    #[test]
    fn finding_a_rank_answers_as_a_search_over_whole_ranks() {
        let mut s = Store::default();
        let mut seed = 7u64;
        let mut below = |n: u64| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        for n in 0..300 {
            let (id, added) = (format!("v{n}"), below(40) as i64 - 5);
            s.file(&id, added, &[C1], &[]);
            if n % 3 == 0 {
                s.file(&format!("w{n}"), 100, &[C2], &[]);
            }
            // Times spread as uploads spread them, a few clusters and
            // the ends of `i64`: where the search places its probes.
            let spread = match n % 10 {
                0 => i64::MAX - below(3) as i64,
                1 => i64::MIN + below(3) as i64,
                2 | 3 => 60 + below(5) as i64,
                _ => below(200) as i64 * 7 - 300,
            };
            s.file(&format!("x{n}"), spread, &[C3], &[]);
        }
        for scope in [C1, C2, C3] {
            let ordered = &s.members.by_category[&scope];
            let ranks: Vec<_> = ordered.0.iter().map(|&h| rank_of(&s.videos, h)).collect();
            assert!(ranks.windows(2).all(|p| p[0] < p[1]), "{scope} filed in rank order");
            for _ in 0..2_000 {
                let id = w(&format!("{}{}", ["v", "w", "x", "a", "z"][below(5) as usize], below(330)));
                let added = match below(4) {
                    0 if scope == C3 => [i64::MAX, i64::MIN, i64::MAX - 1, 62][below(4) as usize],
                    1 if scope == C3 => below(1_500) as i64 - 350,
                    _ => below(50) as i64 - 7 + 93 * i64::from(below(2) == 0),
                };
                let rank = (Reverse(added), id.as_ref());
                let plain = ordered.0.binary_search_by(|&h| rank_of(&s.videos, h).cmp(&rank));
                assert_eq!(ordered.find(&s.videos, &rank), plain, "{} at {added} in {scope}", id.as_ref().text());
            }
            for &h in &ordered.0 {
                assert_eq!(ordered.find(&s.videos, &rank_of(&s.videos, h)).map(|at| ordered.0[at]), Ok(h));
            }
        }
        assert_eq!(Ordered::default().find(&s.videos, &(Reverse(1), w("a").as_ref())), Err(0));
    }

    #[test]
    fn a_load_files_what_inserting_one_by_one_files() {
        let (mut built, mut one_by_one) = (Store::default(), Store::default());
        let mut handles = Vec::new();
        for i in 0..200i64 {
            let (id, cats) = (format!("v{}", (i * 37) % 200), [C1, (i % 3) as Sym, C1]);
            handles.push(built.put(&id, i % 7, &cats, &[T1, T2]));
            one_by_one.file(&id, i % 7, &cats, &[T1, T2]);
        }
        built.members = Members::build(&built.videos, handles.into_iter());
        for sym in [C1, 0, 2] {
            let ranked = |s: &Store| texts(s.view().of_category(Some(sym)));
            assert_eq!(ranked(&built), ranked(&one_by_one));
        }
        assert_eq!(built.members.len(), one_by_one.members.len());
        assert_eq!(built.view().of_category(Some(C1)).count(), 200, "repeats filed once");
    }

    #[test]
    fn removing_what_was_filed_leaves_nothing() {
        let mut s = Store::default();
        let v1 = s.file("v1", 1, &[C1, C2], &[T1]);
        let v2 = s.file("v2", 2, &[C2], &[T1, T2]);
        s.members.remove(&s.videos, v1);
        assert_eq!(texts(s.view().of_category(Some(C2))), ["v2"]);
        s.members.remove(&s.videos, v2);
        assert!(s.members.is_empty(), "{:?}", s.members);
        assert_eq!(s.members.len(), 0);
    }

    /// A scope's fences after any mix of loads, inserts and removals: in
    /// place order, at members of their time, no run of unfenced members
    /// longer than `MAX_RUN`; and every search through them answers as a
    /// plain binary search would.
    #[test]
    fn fences_hold_through_inserts_and_removals() {
        fn check(videos: &Videos, scope: &Ordered) {
            let (handles, f) = (&scope.0, &scope.1);
            assert_eq!(f.at.len(), f.added.len());
            assert!(f.at.windows(2).all(|p| p[0] < p[1]), "fences in place order");
            for (&at, &added) in f.at.iter().zip(&f.added) {
                assert_eq!(videos.added(handles[at as usize]), added, "a fence at {at} holds its member's time");
            }
            let mut edges = vec![-1i64];
            edges.extend(f.at.iter().map(|&a| i64::from(a)));
            edges.push(handles.len() as i64);
            assert!(edges.windows(2).all(|p| p[1] - p[0] - 1 <= MAX_RUN as i64), "runs of at most MAX_RUN: {edges:?}");
        }
        let mut s = Store::default();
        let mut seed = 11u64;
        let mut below = |n: u64| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) % n
        };
        let mut filed: Vec<(Handle, String)> = Vec::new();
        for n in 0..3_000u64 {
            // Mostly uploads at the newest end, edits anywhere, some
            // removals; times often tied.
            let added = match below(3) {
                0 => n as i64,
                _ => below(400) as i64,
            };
            let id = format!("v{n}");
            filed.push((s.file(&id, added, &[C1], &[]), id));
            if below(3) == 0 {
                let (h, _) = filed.swap_remove(below(filed.len() as u64) as usize);
                s.members.remove(&s.videos, h);
            }
            if n % 97 == 0 {
                check(&s.videos, &s.members.by_category[&C1]);
            }
        }
        let scope = &s.members.by_category[&C1];
        check(&s.videos, scope);
        assert!(scope.1.at.len() > filed.len() / MAX_RUN, "{} fences for {} members", scope.1.at.len(), filed.len());
        for _ in 0..3_000 {
            let rank = (Reverse(below(3_100) as i64 - 50), w(&format!("v{}", below(3_100))));
            let rank = (rank.0, rank.1.as_ref());
            let plain = scope.0.binary_search_by(|&h| rank_of(&s.videos, h).cmp(&rank));
            assert_eq!(scope.find(&s.videos, &rank), plain);
        }
        // A load fences the same members its own way, and lists them alike.
        let loaded = Members::build(&s.videos, filed.iter().map(|(h, _)| *h));
        check(&s.videos, &loaded.by_category[&C1]);
        assert_eq!(loaded.by_category[&C1], *scope);
        // Removing everything leaves no fence behind.
        for (h, _) in filed {
            s.members.remove(&s.videos, h);
        }
        assert!(s.members.is_empty());
    }
}
