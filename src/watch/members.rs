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

use super::compact::{Sym, Wid};
use super::state::IndexView;
use rustc_hash::FxHashMap as HashMap;
use std::cmp::Reverse;

/// A scope member: newest first (`addedTime` descending, then id
/// ascending as bytes), the contract's order, so a scope's first members
/// are its home-section candidates.
type Ranked = (Reverse<i64>, Wid);

/// One scope's members: a sorted vector, not a tree. A tree node costs
/// about half as much again per entry, and a scope's members change a few
/// at a time (one insert moves the entries after it, which for the
/// largest categories is still microseconds).
#[derive(Debug, Default, Clone, PartialEq)]
struct Ordered(Vec<Ranked>);

impl Ordered {
    fn insert(&mut self, item: Ranked) {
        if let Err(at) = self.0.binary_search(&item) {
            self.0.insert(at, item);
        }
    }

    fn remove(&mut self, item: &Ranked) {
        if let Ok(at) = self.0.binary_search(item) {
            self.0.remove(at);
        }
    }

    fn contains(&self, item: &Ranked) -> bool {
        self.0.binary_search(item).is_ok()
    }

    fn iter(&self) -> std::slice::Iter<'_, Ranked> {
        self.0.iter()
    }

    /// Where `item` sits, or would (0: first), and the members after it.
    fn after(&self, item: &Ranked) -> (usize, std::slice::Iter<'_, Ranked>) {
        match self.0.binary_search(item) {
            Ok(at) => (at, self.0[at + 1..].iter()),
            Err(at) => (at, self.0[at..].iter()),
        }
    }
}

/// A scope's members after a rank: where the rank sits, then the members.
pub type After<'a> = (usize, std::iter::Map<std::slice::Iter<'a, Ranked>, fn(&Ranked) -> (i64, &Wid)>);

fn unrank(r: &Ranked) -> (i64, &Wid) {
    (r.0.0, &r.1)
}

#[derive(Debug, Default, Clone, PartialEq)]
pub struct Members {
    by_category: HashMap<Sym, Ordered>,
    by_tag: HashMap<Sym, Ordered>,
}

impl Members {
    /// Files every video of a load at once: appended, then each scope
    /// sorted once (in parallel), rather than inserted one by one.
    pub fn build<'a>(videos: impl IntoIterator<Item = (&'a Wid, IndexView)>) -> Members {
        use rayon::prelude::*;
        let mut members = Members::default();
        for (written, (added, cats, tags)) in videos {
            for c in cats.iter() {
                members.by_category.entry(*c).or_default().0.push((Reverse(added), written.clone()));
            }
            for t in tags.iter() {
                members.by_tag.entry(*t).or_default().0.push((Reverse(added), written.clone()));
            }
        }
        let scopes = members.by_category.values_mut().chain(members.by_tag.values_mut()).collect::<Vec<_>>();
        scopes.into_par_iter().for_each(|scope| {
            scope.0.sort_unstable();
            // A reference repeated in one video files it once.
            scope.0.dedup();
            scope.0.shrink_to_fit();
        });
        members
    }

    /// Files an active video under each scope it references.
    pub fn insert(&mut self, written: &Wid, view: &IndexView) {
        let (added, cats, tags) = view;
        for c in cats.iter() {
            self.by_category.entry(*c).or_default().insert((Reverse(*added), written.clone()));
        }
        for t in tags.iter() {
            self.by_tag.entry(*t).or_default().insert((Reverse(*added), written.clone()));
        }
    }

    /// Unfiles a video filed with `view`.
    pub fn remove(&mut self, written: &Wid, view: &IndexView) {
        let (added, cats, tags) = view;
        let ranked = (Reverse(*added), written.clone());
        for c in cats.iter() {
            if let Some(set) = self.by_category.get_mut(c) {
                set.remove(&ranked);
                if set.0.is_empty() {
                    self.by_category.remove(c);
                }
            }
        }
        for t in tags.iter() {
            if let Some(set) = self.by_tag.get_mut(t) {
                set.remove(&ranked);
                if set.0.is_empty() {
                    self.by_tag.remove(t);
                }
            }
        }
    }

    /// The active videos referencing category `sym`, newest first.
    pub fn of_category(&self, sym: Option<Sym>) -> impl Iterator<Item = &Wid> {
        self.ranked_of_category(sym).map(|(_, w)| w)
    }

    /// The same, each with its `addedTime`.
    pub fn ranked_of_category(&self, sym: Option<Sym>) -> impl Iterator<Item = (i64, &Wid)> {
        sym.and_then(|s| self.by_category.get(&s)).into_iter().flat_map(Ordered::iter).map(|(added, w)| (added.0, w))
    }

    /// How many active videos reference category `sym`.
    pub fn count_of_category(&self, sym: Option<Sym>) -> usize {
        sym.and_then(|s| self.by_category.get(&s)).map_or(0, |o| o.0.len())
    }

    /// Where a video ranked `(added, written)` sits, or would, among
    /// category `sym`'s members, and the members after it: what a patch
    /// of the category's list inserts before, found without a walk.
    pub fn after_in_category(&self, sym: Sym, added: i64, written: &Wid) -> After<'_> {
        after(self.by_category.get(&sym), added, written)
    }

    /// The same among tag `sym`'s members.
    pub fn after_in_tag(&self, sym: Sym, added: i64, written: &Wid) -> After<'_> {
        after(self.by_tag.get(&sym), added, written)
    }

    /// Whether the video (with its `addedTime`) references category `sym`.
    pub fn in_category(&self, sym: Option<Sym>, added: i64, written: &Wid) -> bool {
        let Some(set) = sym.and_then(|s| self.by_category.get(&s)) else { return false };
        set.contains(&(Reverse(added), written.clone()))
    }

    /// The first `limit` distinct videos of the union of `categories`,
    /// newest first: what a home section over them lists. A merge of the
    /// categories' ordered members, so it reads about `limit` members per
    /// call, not every member of every category. Each comes with its
    /// `addedTime`.
    pub fn newest_of(&self, categories: impl IntoIterator<Item = Sym>, limit: usize) -> Vec<(i64, &Wid)> {
        use std::collections::BinaryHeap;
        let mut heads: Vec<std::slice::Iter<'_, Ranked>> =
            categories.into_iter().filter_map(|c| self.by_category.get(&c)).map(Ordered::iter).collect();
        // A min-heap on (rank, which iterator): the next newest overall.
        let mut heap: BinaryHeap<Reverse<(&Ranked, usize)>> = BinaryHeap::new();
        for (i, it) in heads.iter_mut().enumerate() {
            if let Some(first) = it.next() {
                heap.push(Reverse((first, i)));
            }
        }
        let mut out: Vec<(i64, &Wid)> = Vec::with_capacity(limit.min(1024));
        let mut last: Option<&Ranked> = None;
        while out.len() < limit {
            let Some(Reverse((ranked, i))) = heap.pop() else { break };
            // A video in two of the categories comes out twice in a row
            // (same rank): it is listed once.
            if last != Some(ranked) {
                out.push((ranked.0.0, &ranked.1));
                last = Some(ranked);
            }
            if let Some(next) = heads[i].next() {
                heap.push(Reverse((next, i)));
            }
        }
        out
    }

    /// The active videos referencing tag `sym`, newest first, each with
    /// its `addedTime`.
    pub fn ranked_of_tag(&self, sym: Option<Sym>) -> impl Iterator<Item = (i64, &Wid)> {
        sym.and_then(|s| self.by_tag.get(&s)).into_iter().flat_map(Ordered::iter).map(|(added, w)| (added.0, w))
    }

    /// How many (scope, video) entries are filed.
    pub fn len(&self) -> usize {
        self.by_category.values().chain(self.by_tag.values()).map(|m| m.0.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.by_category.is_empty() && self.by_tag.is_empty()
    }
}

fn after<'a>(scope: Option<&'a Ordered>, added: i64, written: &Wid) -> After<'a> {
    const NONE: &[Ranked] = &[];
    let (at, rest) = match scope {
        Some(scope) => scope.after(&(Reverse(added), written.clone())),
        None => (0, NONE.iter()),
    };
    (at, rest.map(unrank as fn(&Ranked) -> (i64, &Wid)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(added: i64, cats: &[Sym], tags: &[Sym]) -> IndexView {
        (added, cats.into(), tags.into())
    }

    fn texts<'a>(ids: impl IntoIterator<Item = &'a Wid>) -> Vec<String> {
        ids.into_iter().map(Wid::text).collect()
    }

    const C1: Sym = 1;
    const C2: Sym = 2;
    const C3: Sym = 3;
    const T1: Sym = 11;
    const T2: Sym = 12;

    #[test]
    fn members_come_newest_first_then_by_id_bytes() {
        let mut m = Members::default();
        m.insert(&Wid::new("b"), &view(5, &[C1], &[T1]));
        m.insert(&Wid::new("a"), &view(5, &[C1], &[]));
        m.insert(&Wid::new("Z"), &view(9, &[C1, C1], &[T1]));
        assert_eq!(texts(m.of_category(Some(C1))), ["Z", "a", "b"]);
        assert_eq!(texts(m.ranked_of_tag(Some(T1)).map(|(_, w)| w)), ["Z", "b"]);
        assert!(m.in_category(Some(C1), 5, &Wid::new("a")) && !m.in_category(Some(C1), 4, &Wid::new("a")));
        assert!(!m.in_category(Some(C2), 5, &Wid::new("a")) && !m.in_category(None, 5, &Wid::new("a")));
        assert_eq!((m.of_category(Some(C1)).count(), m.of_category(Some(C3)).count()), (3, 0));
        assert_eq!(m.of_category(Some(C1)).count(), 3, "a repeated reference files a video once");
        assert_eq!(m.of_category(None).count(), 0);
    }

    #[test]
    fn the_newest_of_several_categories_are_merged_once_each() {
        let mut m = Members::default();
        m.insert(&Wid::new("a"), &view(9, &[C1, C2], &[]));
        m.insert(&Wid::new("b"), &view(8, &[C2], &[]));
        m.insert(&Wid::new("c"), &view(8, &[C1], &[]));
        m.insert(&Wid::new("d"), &view(1, &[C1], &[]));
        m.insert(&Wid::new("e"), &view(7, &[C3], &[]));
        let newest = |cats: &[Sym], limit| m.newest_of(cats.iter().copied(), limit);
        assert_eq!(texts(newest(&[C1, C2], 10).into_iter().map(|(_, w)| w)), ["a", "b", "c", "d"]);
        assert_eq!(newest(&[C1, C2, 99], 2).iter().map(|(added, _)| *added).collect::<Vec<_>>(), [9, 8]);
        assert!(m.newest_of([], 5).is_empty());
    }

    #[test]
    fn what_comes_after_a_rank_is_found_whether_it_is_filed_or_not() {
        let mut m = Members::default();
        for (w, added) in [("a", 9), ("b", 8), ("c", 7)] {
            m.insert(&Wid::new(w), &view(added, &[C1], &[T1]));
        }
        let next = |(at, mut rest): After<'_>| (at, rest.next().map(|(_, w)| w.text()));
        assert_eq!(next(m.after_in_category(C1, 8, &Wid::new("b"))), (1, Some("c".into())));
        assert_eq!(next(m.after_in_category(C1, 8, &Wid::new("a0"))), (1, Some("b".into())));
        assert_eq!(next(m.after_in_tag(T1, 7, &Wid::new("c"))), (2, None));
        assert_eq!(next(m.after_in_tag(T2, 7, &Wid::new("c"))), (0, None));
        assert_eq!((m.count_of_category(Some(C1)), m.count_of_category(Some(C2))), (3, 0));
    }

    #[test]
    fn a_load_files_what_inserting_one_by_one_files() {
        let videos: Vec<(Wid, IndexView)> = (0..200)
            .map(|i: i64| {
                (Wid::new(&format!("v{}", (i * 37) % 200)), view(i % 7, &[C1, (i % 3) as Sym, C1], &[T1, T2]))
            })
            .collect();
        let mut one_by_one = Members::default();
        for (w, v) in &videos {
            one_by_one.insert(w, v);
        }
        let built = Members::build(videos.iter().map(|(w, v)| (w, v.clone())));
        assert_eq!(built, one_by_one);
        assert_eq!(built.of_category(Some(C1)).count(), 200, "repeats filed once");
    }

    #[test]
    fn removing_what_was_filed_leaves_nothing() {
        let mut m = Members::default();
        let (one, two) = (view(1, &[C1, C2], &[T1]), view(2, &[C2], &[T1, T2]));
        let (v1, v2) = (Wid::new("v1"), Wid::new("v2"));
        m.insert(&v1, &one);
        m.insert(&v2, &two);
        m.remove(&v1, &one);
        assert_eq!(texts(m.of_category(Some(C2))), ["v2"]);
        m.remove(&v2, &two);
        assert!(m.is_empty(), "{m:?}");
        assert_eq!(m.len(), 0);
    }
}
