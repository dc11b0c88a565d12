//! Who is in each scope: per referenced category its videos newest
//! first, per referenced tag its videos. A batch plans a scope's keys
//! from its members alone, so its cost follows the scopes it touched, not
//! the size of the catalogue.
//!
//! Scopes are keyed by the reference as stored in the video (active or
//! not, known or not): a category that becomes active later finds its
//! members already filed, so a flip never needs a walk over every video.
//! Only videos that own their written id and are active are filed, the
//! ones the index families list.

use super::state::IndexView;
use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

/// A category member: newest first (`addedTime` descending, then id
/// ascending as bytes), the contract's order, so a scope's first members
/// are its home-section candidates.
type Ranked = (Reverse<i64>, Arc<str>);

#[derive(Debug, Default, Clone, PartialEq)]
pub struct Members {
    by_category: HashMap<Box<str>, BTreeSet<Ranked>>,
    by_tag: HashMap<Box<str>, BTreeSet<Arc<str>>>,
}

impl Members {
    /// Files an active video under each scope it references.
    pub fn insert(&mut self, written: &str, view: &IndexView) {
        let (added, cats, tags) = view;
        let id: Arc<str> = written.into();
        for c in cats {
            self.by_category.entry(c.as_str().into()).or_default().insert((Reverse(*added), id.clone()));
        }
        for t in tags {
            self.by_tag.entry(t.as_str().into()).or_default().insert(id.clone());
        }
    }

    /// Unfiles a video filed with `view`.
    pub fn remove(&mut self, written: &str, view: &IndexView) {
        let (added, cats, tags) = view;
        let id: Arc<str> = written.into();
        for c in cats {
            if let Some(set) = self.by_category.get_mut(c.as_str()) {
                set.remove(&(Reverse(*added), id.clone()));
                if set.is_empty() {
                    self.by_category.remove(c.as_str());
                }
            }
        }
        for t in tags {
            if let Some(set) = self.by_tag.get_mut(t.as_str()) {
                set.remove(&id);
                if set.is_empty() {
                    self.by_tag.remove(t.as_str());
                }
            }
        }
    }

    /// The active videos referencing category `id`, newest first.
    pub fn of_category(&self, id: &str) -> impl Iterator<Item = &str> {
        self.by_category.get(id).into_iter().flatten().map(|(_, w)| &**w)
    }

    /// The first `limit` distinct videos of the union of `categories`,
    /// newest first: what a home section over them lists. A merge of the
    /// categories' ordered members, so it reads about `limit` members per
    /// call, not every member of every category.
    pub fn newest_of<'a>(&'a self, categories: impl IntoIterator<Item = &'a str>, limit: usize) -> Vec<&'a str> {
        use std::collections::BinaryHeap;
        let mut heads: Vec<std::collections::btree_set::Iter<'a, Ranked>> =
            categories.into_iter().filter_map(|c| self.by_category.get(c)).map(BTreeSet::iter).collect();
        // A min-heap on (rank, which iterator): the next newest overall.
        let mut heap: BinaryHeap<Reverse<(&'a Ranked, usize)>> = BinaryHeap::new();
        for (i, it) in heads.iter_mut().enumerate() {
            if let Some(first) = it.next() {
                heap.push(Reverse((first, i)));
            }
        }
        let mut out: Vec<&'a str> = Vec::with_capacity(limit.min(1024));
        let mut last: Option<&'a Ranked> = None;
        while out.len() < limit {
            let Some(Reverse((ranked, i))) = heap.pop() else { break };
            // A video in two of the categories comes out twice in a row
            // (same rank): it is listed once.
            if last != Some(ranked) {
                out.push(&ranked.1);
                last = Some(ranked);
            }
            if let Some(next) = heads[i].next() {
                heap.push(Reverse((next, i)));
            }
        }
        out
    }

    /// The active videos referencing tag `id`.
    pub fn of_tag(&self, id: &str) -> impl Iterator<Item = &str> {
        self.by_tag.get(id).into_iter().flatten().map(|w| &**w)
    }

    /// How many (scope, video) entries are filed.
    pub fn len(&self) -> usize {
        self.by_category.values().map(BTreeSet::len).sum::<usize>()
            + self.by_tag.values().map(BTreeSet::len).sum::<usize>()
    }

    pub fn is_empty(&self) -> bool {
        self.by_category.is_empty() && self.by_tag.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(added: i64, cats: &[&str], tags: &[&str]) -> IndexView {
        (added, cats.iter().map(|s| s.to_string()).collect(), tags.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn members_come_newest_first_then_by_id_bytes() {
        let mut m = Members::default();
        m.insert("b", &view(5, &["c1"], &["t1"]));
        m.insert("a", &view(5, &["c1"], &[]));
        m.insert("Z", &view(9, &["c1", "c1"], &["t1"]));
        assert_eq!(m.of_category("c1").collect::<Vec<_>>(), ["Z", "a", "b"]);
        assert_eq!(m.of_tag("t1").collect::<Vec<_>>(), ["Z", "b"]);
        assert_eq!(m.of_category("c1").count(), 3, "a repeated reference files a video once");
    }

    #[test]
    fn the_newest_of_several_categories_are_merged_once_each() {
        let mut m = Members::default();
        m.insert("a", &view(9, &["c1", "c2"], &[]));
        m.insert("b", &view(8, &["c2"], &[]));
        m.insert("c", &view(8, &["c1"], &[]));
        m.insert("d", &view(1, &["c1"], &[]));
        m.insert("e", &view(7, &["c3"], &[]));
        assert_eq!(m.newest_of(["c1", "c2"], 10), ["a", "b", "c", "d"]);
        assert_eq!(m.newest_of(["c1", "c2", "missing"], 2), ["a", "b"]);
        assert!(m.newest_of([], 5).is_empty());
    }

    #[test]
    fn removing_what_was_filed_leaves_nothing() {
        let mut m = Members::default();
        let (one, two) = (view(1, &["c1", "c2"], &["t1"]), view(2, &["c2"], &["t1", "t2"]));
        m.insert("v1", &one);
        m.insert("v2", &two);
        m.remove("v1", &one);
        assert_eq!(m.of_category("c2").collect::<Vec<_>>(), ["v2"]);
        m.remove("v2", &two);
        assert!(m.is_empty(), "{m:?}");
        assert_eq!(m.len(), 0);
    }
}
