//! Patches: a batch's changes to a category's sorted set and list, and to
//! a tag's list, as edits of the members that moved, instead of the
//! scope's whole value. Pure, like the rest of planning.
//!
//! A scope's members change only through the videos a batch touched
//! (see [`State::apply`]), so the members that left or joined a scope are
//! found from those videos alone: each one's index view before the batch
//! and now. A patch starts from what the key holds before the batch, which
//! the planner knows only for a key this process wrote and still knows
//! ([`super::state::Existing::held`]); its size guard makes Redis refuse
//! the patch when the key holds another size (see `sink::pipeline`).
//!
//! A list patch removes every member that left, then inserts the joining
//! ones from the tail up, each before the member that follows it now:
//! that member is either untouched (it is there) or joined later in the
//! list (it was inserted already). The last goes with `RPUSH`.

use super::members::After;
use super::state::{Applied, IndexView, State};
use crate::keys::Key;
use crate::model::compact::{Sym, Wid, WidRef};
use crate::plan::patch::{Edit, Patch};
use crate::plan::{ELEMENT_COST, KEY_COST};
use rustc_hash::FxHashMap;
use std::cmp::Reverse;

/// What one patch may cost Redis at most: it runs in one atomic step,
/// which on a cluster is a script of a quarter of the default budget.
/// Above it (or above a whole replace) the key is replaced whole.
pub const PATCH_MAX_COST: usize = 30_000;

/// A touched video whose index view changed: as it was before the batch,
/// and as it is now.
struct Touched<'a> {
    wid: Wid,
    before: Option<&'a IndexView>,
    now: Option<IndexView>,
}

/// The touched videos whose index views changed, filed by every category
/// and tag they referenced before or reference now.
pub struct Deltas<'a> {
    touched: Vec<Touched<'a>>,
    by_category: FxHashMap<Sym, Vec<usize>>,
    by_tag: FxHashMap<Sym, Vec<usize>>,
}

/// Members that left a scope (with their rank before) and joined it
/// (with their rank now); a member whose rank changed is in both.
#[derive(Debug, Default, PartialEq)]
pub struct Moves<'a> {
    pub left: Vec<(i64, &'a Wid)>,
    pub joined: Vec<(i64, &'a Wid)>,
}

impl Moves<'_> {
    pub fn is_empty(&self) -> bool {
        self.left.is_empty() && self.joined.is_empty()
    }

    /// The scope's size before, from its size now.
    pub fn size_before(&self, now: usize) -> Option<usize> {
        (now + self.left.len()).checked_sub(self.joined.len())
    }

    /// The scope's size after, from its size before (`None` when the
    /// moves do not fit it: the key is then replaced whole).
    pub fn size_after(&self, before: usize) -> Option<usize> {
        (before + self.joined.len()).checked_sub(self.left.len())
    }
}

impl<'a> Deltas<'a> {
    pub fn new(state: &State, applied: &'a Applied) -> Deltas<'a> {
        let mut deltas = Deltas { touched: Vec::new(), by_category: Default::default(), by_tag: Default::default() };
        for (written, (before, _)) in &applied.videos {
            let now = state.index_view(written);
            if before.as_ref() == now.as_ref() {
                continue;
            }
            let i = deltas.touched.len();
            for (_, cats, tags) in before.iter().chain(now.iter()) {
                cats.iter().for_each(|c| deltas.by_category.entry(*c).or_default().push(i));
                tags.iter().for_each(|t| deltas.by_tag.entry(*t).or_default().push(i));
            }
            deltas.touched.push(Touched { wid: Wid::new(written), before: before.as_ref(), now });
        }
        for filed in deltas.by_category.values_mut().chain(deltas.by_tag.values_mut()) {
            filed.sort_unstable();
            filed.dedup();
        }
        deltas
    }

    /// The moves of category `sym`'s members.
    pub fn category(&self, sym: Option<Sym>) -> Moves<'_> {
        let Some(sym) = sym else { return Moves::default() };
        self.moves(self.by_category.get(&sym), |(_, cats, _)| cats.contains(&sym))
    }

    /// The moves of a tag list's members: the videos referencing tag
    /// `sym` and its category `owner`.
    pub fn tag(&self, sym: Option<Sym>, owner: Option<Sym>) -> Moves<'_> {
        let (Some(sym), Some(owner)) = (sym, owner) else { return Moves::default() };
        self.moves(self.by_tag.get(&sym), |(_, cats, tags)| tags.contains(&sym) && cats.contains(&owner))
    }

    fn moves(&self, filed: Option<&Vec<usize>>, is_in: impl Fn(&IndexView) -> bool) -> Moves<'_> {
        let mut moves = Moves::default();
        for t in filed.into_iter().flatten().map(|&i| &self.touched[i]) {
            let rank = |view: Option<&IndexView>| view.filter(|v| is_in(v)).map(|v| v.0);
            let (before, now) = (rank(t.before), rank(t.now.as_ref()));
            if before == now {
                continue;
            }
            moves.left.extend(before.map(|added| (added, &t.wid)));
            moves.joined.extend(now.map(|added| (added, &t.wid)));
        }
        moves
    }
}

/// The patch of a sorted set holding `before` members, or `None` when
/// replacing it whole is cheaper or it would be too big a step.
pub fn zset_patch(key: Key, before: usize, moves: &Moves<'_>) -> Option<Patch> {
    let joined: rustc_hash::FxHashSet<&Wid> = moves.joined.iter().map(|(_, w)| *w).collect();
    let removed = moves.left.iter().filter(|(_, w)| !joined.contains(w)).map(|(_, w)| Edit::ZRem(w.text()));
    let added = moves.joined.iter().map(|(added, w)| Edit::ZAdd(*added, w.text()));
    let patch = Patch::new(key, before, removed.chain(added).collect(), 0);
    affordable(patch, moves.size_after(before)?, 2 * ELEMENT_COST)
}

/// The patch of a list holding `before` items: `after` tells where a
/// member ranked so sits now and the member that follows it.
pub fn list_patch<'m>(
    key: Key,
    before: usize,
    moves: &Moves<'_>,
    after: impl Fn(i64, WidRef<'_>) -> (usize, Option<WidRef<'m>>),
) -> Option<Patch> {
    let mut edits = Vec::with_capacity(moves.left.len() + moves.joined.len());
    let mut scans = 0;
    for (added, w) in &moves.left {
        // Where it was: about where its old rank sits now.
        scans += after(*added, w.as_ref()).0;
        edits.push(Edit::LRem(w.text()));
    }
    let mut joined: Vec<(Reverse<i64>, &Wid)> = moves.joined.iter().map(|(a, w)| (Reverse(*a), *w)).collect();
    joined.sort_unstable();
    for (Reverse(added), w) in joined.into_iter().rev() {
        let (at, next) = after(added, w.as_ref());
        scans += at;
        edits.push(match next {
            Some(pivot) => Edit::LInsert { item: w.text(), pivot: pivot.text() },
            None => Edit::RPush(w.text()),
        });
    }
    affordable(Patch::new(key, before, edits, scans), moves.size_after(before)?, ELEMENT_COST)
}

/// The first member of `after` that `keep` accepts.
pub fn next_kept<'m>(after: After<'m>, keep: impl Fn(i64, WidRef<'_>) -> bool) -> (usize, Option<WidRef<'m>>) {
    let (at, mut rest) = after;
    (at, rest.find(|(added, w)| keep(*added, *w)).map(|(_, w)| w))
}

/// A patch worth sending: within one step, and no dearer than replacing
/// the key whole (`size` elements after, each costing about `element`;
/// an id is about 24 bytes).
fn affordable(patch: Patch, size: usize, element: usize) -> Option<Patch> {
    let whole = size * (element + 24) + patch.key.text.len() + KEY_COST;
    (patch.cost <= PATCH_MAX_COST && patch.cost <= whole).then_some(patch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::Keys;
    use crate::plan::Value;
    use crate::registry::FamilyId;

    fn ids(items: &[&str]) -> Vec<Wid> {
        items.iter().map(|s| Wid::new(s)).collect()
    }

    #[test]
    fn a_list_patch_turns_the_old_members_into_the_new_ones() {
        // Before: a b c d and plenty more, so a patch pays. Now: n joined
        // first, b left, c moved behind d.
        let filler: Vec<String> = (0..40).map(|i| format!("x{i:02}")).collect();
        let list = |head: &[&str]| head.iter().map(|s| s.to_string()).chain(filler.iter().cloned()).collect::<Vec<_>>();
        let (before, now) = (list(&["a", "b", "c", "d"]), list(&["n", "a", "d", "c"]));
        let now_ids: Vec<Wid> = now.iter().map(|s| Wid::new(s)).collect();
        let w = ids(&["b", "c", "n"]);
        let moves = Moves { left: vec![(8, &w[0]), (7, &w[1])], joined: vec![(10, &w[2]), (5, &w[1])] };
        let key = Keys::new("app:").key(FamilyId::VideoCategoryList, &["c1"]);
        let patch = list_patch(key, before.len(), &moves, |_, id| {
            let at = now_ids.iter().position(|x| x.as_ref() == id).unwrap_or(0);
            (at, now_ids.get(at + 1).map(Wid::as_ref))
        })
        .expect("a few moves in a long list are patched");
        assert!(matches!(patch.edits[..2], [Edit::LRem(_), Edit::LRem(_)]), "{:?}", patch.edits);
        assert_eq!(patch.apply(Some(Value::List(before))), Ok(Some(Value::List(now))));
    }

    #[test]
    fn a_patch_that_costs_more_than_a_replace_is_not_sent() {
        let w = ids(&["a", "b"]);
        let key = Keys::new("app:").key(FamilyId::VideoCategoryIndex, &["c1"]);
        let moves = Moves { left: vec![], joined: vec![(1, &w[0]), (2, &w[1])] };
        let patch = zset_patch(key.clone(), 100, &moves).expect("two of a hundred are patched");
        assert_eq!(patch.edits, vec![Edit::ZAdd(1, "a".into()), Edit::ZAdd(2, "b".into())]);
        let many: Vec<Wid> = (0..100).map(|i| Wid::new(&format!("m{i}"))).collect();
        let big = Moves { left: vec![], joined: many.iter().map(|w| (1, w)).collect() };
        assert!(zset_patch(key, 10_000, &big).is_none(), "a hundred edits are more than one step carries");
    }
}
