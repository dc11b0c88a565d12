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
//! A list patch inserts the joining members from the tail up, each before
//! the member that follows it now: that member is either untouched (it
//! is there) or joined later in the list (it was inserted already). The
//! last goes with `RPUSH`. Then it removes the members that left.
//!
//! A patch too big for one atomic step goes as several, each guarded by
//! the size the one before leaves. The cut falls between members, never
//! inside one: a member that moved is removed right before it is
//! inserted again, in the same step, so a reader sees every member
//! either where it was or where it is now, never missing, and the key
//! between two steps is one a batch of fewer changes would have left.
//! Members join before others leave, so a key the batch does not empty
//! is never empty (gone) between its steps either.

use super::members::After;
use super::state::{Applied, IndexView, State};
use crate::keys::Key;
use crate::model::compact::{Sym, Wid, WidRef};
use crate::plan::ELEMENT_COST;
use crate::plan::patch::{Edit, Patch, SCAN_COST};
use rustc_hash::{FxHashMap, FxHashSet};
use std::cmp::Reverse;

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
    /// What one step of a patch may cost Redis (see [`stepped`]).
    pub step: usize,
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
    pub fn new(state: &State, applied: &'a Applied, step: usize) -> Deltas<'a> {
        let mut deltas =
            Deltas { step, touched: Vec::new(), by_category: Default::default(), by_tag: Default::default() };
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

/// One member's edits of a patch, which go in one step.
struct Unit {
    edits: Vec<Edit>,
    /// List entries the edits walk past.
    scans: usize,
    /// What they do to the key's size: -1, 0 or +1.
    grows: isize,
}

impl Unit {
    fn cost(&self) -> usize {
        self.edits.iter().map(Edit::cost).sum::<usize>() + self.scans * SCAN_COST
    }
}

/// The patch of a sorted set holding `before` members, in steps of at
/// most `step` each, or `None` when replacing it whole is cheaper.
pub fn zset_patch(key: Key, before: usize, moves: &Moves<'_>, step: usize) -> Option<Vec<Patch>> {
    let joined: FxHashSet<&Wid> = moves.joined.iter().map(|(_, w)| *w).collect();
    let left: FxHashSet<&Wid> = moves.left.iter().map(|(_, w)| *w).collect();
    let removed = moves.left.iter().filter(|(_, w)| !joined.contains(w)).map(|(_, w)| Unit {
        edits: vec![Edit::ZRem(w.text())],
        scans: 0,
        grows: -1,
    });
    // A member that only moved keeps its place in the count.
    let added = moves.joined.iter().map(|(added, w)| Unit {
        edits: vec![Edit::ZAdd(*added, w.text())],
        scans: 0,
        grows: if left.contains(w) { 0 } else { 1 },
    });
    stepped(key, before, added.chain(removed).collect(), moves.size_after(before)?, 2 * ELEMENT_COST, step)
}

/// The patch of a list holding `before` items, in steps of at most `step`
/// each: `after` tells where a member ranked so sits now and the member
/// that follows it. With `exact` places (the list holds every member of
/// the scope), an item in the back half is removed from the tail: Redis
/// walks a list from the end `LREM` starts at, about a quarter of it on
/// average instead of half. Otherwise a place only bounds the item's
/// index from above, which bounds a walk from the head but not one from
/// the tail.
pub fn list_patch<'m>(
    key: Key,
    before: usize,
    moves: &Moves<'_>,
    after: impl Fn(i64, WidRef<'_>) -> (usize, Option<WidRef<'m>>),
    exact: bool,
    step: usize,
) -> Option<Vec<Patch>> {
    // The removal of an item about `at` and the entries it walks past.
    let remove = |w: &Wid, at: usize| match exact && at > before / 2 {
        true => (Edit::LRemLast(w.text()), before.saturating_sub(at)),
        false => (Edit::LRem(w.text()), at),
    };
    let joining: FxHashSet<&Wid> = moves.joined.iter().map(|(_, w)| *w).collect();
    let mut units = Vec::with_capacity(moves.left.len() + moves.joined.len());
    // Where a member that left was: about where its old rank sits now.
    let mut moved: FxHashMap<&Wid, usize> = FxHashMap::default();
    let mut gone = Vec::new();
    for (added, w) in &moves.left {
        let at = after(*added, w.as_ref()).0;
        match joining.contains(w) {
            true => drop(moved.insert(*w, at)),
            false => {
                let (edit, scans) = remove(w, at);
                gone.push(Unit { edits: vec![edit], scans, grows: -1 });
            }
        }
    }
    let mut joined: Vec<(Reverse<i64>, &Wid)> = moves.joined.iter().map(|(a, w)| (Reverse(*a), *w)).collect();
    joined.sort_unstable();
    for (Reverse(added), w) in joined.into_iter().rev() {
        let (at, next) = after(added, w.as_ref());
        let mut unit = Unit { edits: Vec::with_capacity(2), scans: at, grows: 1 };
        if let Some(&was) = moved.get(w) {
            let (edit, scans) = remove(w, was);
            unit.edits.push(edit);
            unit.scans += scans;
            unit.grows = 0;
        }
        unit.edits.push(match next {
            Some(pivot) => Edit::LInsert { item: w.text(), pivot: pivot.text() },
            None => Edit::RPush(w.text()),
        });
        units.push(unit);
    }
    units.extend(gone);
    stepped(key, before, units, moves.size_after(before)?, ELEMENT_COST, step)
}

/// The first member of `after` that `keep` accepts.
pub fn next_kept<'m>(after: After<'m>, keep: impl Fn(i64, WidRef<'_>) -> bool) -> (usize, Option<WidRef<'m>>) {
    let (at, mut rest) = after;
    (at, rest.find(|(added, w)| keep(*added, *w)).map(|(_, w)| w))
}

/// `units` cut, in order, into patches of `key` costing at most `step`
/// each, the first from `before` elements and each next from the size
/// the one before leaves. `None` when one member's edits alone exceed a
/// step, or all of them cost more than replacing the key whole (`size`
/// elements after, each costing about `element`; an id is about 24
/// bytes).
fn stepped(key: Key, before: usize, units: Vec<Unit>, size: usize, element: usize, step: usize) -> Option<Vec<Patch>> {
    let fixed = Patch::fixed_cost(&key);
    let whole = size * (element + 24) + fixed;
    let mut patches = Vec::new();
    let (mut edits, mut scans, mut cost) = (Vec::new(), 0, 0);
    let (mut from, mut to) = (before, before as isize);
    for unit in units {
        let unit_cost = unit.cost();
        if fixed + unit_cost > step {
            return None;
        }
        if !edits.is_empty() && fixed + cost + unit_cost > step {
            patches.push(Patch::new(key.clone(), from, std::mem::take(&mut edits), scans));
            from = usize::try_from(to).ok()?;
            (scans, cost) = (0, 0);
        }
        edits.extend(unit.edits);
        (scans, cost, to) = (scans + unit.scans, cost + unit_cost, to + unit.grows);
    }
    if !edits.is_empty() {
        patches.push(Patch::new(key, from, edits, scans));
    }
    let total: usize = patches.iter().map(|p| p.cost).sum();
    (total <= whole && usize::try_from(to).ok() == Some(size)).then_some(patches)
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
        let after = |_, id: WidRef<'_>| {
            let at = now_ids.iter().position(|x| x.as_ref() == id).unwrap_or(0);
            (at, now_ids.get(at + 1).map(Wid::as_ref))
        };
        let patch = list_patch(key.clone(), before.len(), &moves, after, true, 30_000)
            .expect("a few moves in a long list are patched");
        let [patch] = patch.as_slice() else { panic!("one step: {patch:?}") };
        // c moved: removed right before it goes in again; b left, last.
        let members: Vec<&str> = patch.edits.iter().map(Edit::member).collect();
        assert_eq!(members, ["c", "c", "n", "b"]);
        assert!(matches!(patch.edits[..2], [Edit::LRem(_), Edit::LInsert { .. }]), "{:?}", patch.edits);
        assert_eq!(patch.apply(Some(Value::List(before.clone()))), Ok(Some(Value::List(now.clone()))));
        // Steps of a member or two: each leaves every member that stays.
        let step = Patch::fixed_cost(&key) + 2 * ELEMENT_COST + 100;
        let steps = list_patch(key, before.len(), &moves, after, true, step).expect("a member fits a step");
        assert_eq!(steps.len(), 2, "{steps:?}");
        let mut value = Some(Value::List(before));
        for step in &steps {
            value = step.apply(value).expect("each step starts where the one before left the key");
            let Some(Value::List(items)) = &value else { panic!("emptied: {value:?}") };
            assert!(["a", "c", "d"].iter().all(|m| items.iter().any(|i| i == m)), "a member went missing: {items:?}");
        }
        assert_eq!(value, Some(Value::List(now)));
    }

    /// Items in the back half of a list are removed from its tail when
    /// the places are exact, from its head when they only bound the index;
    /// both give the same list.
    #[test]
    fn a_list_patch_removes_from_the_nearer_end_when_it_knows_the_places() {
        let head: Vec<String> = (0..40).map(|i| format!("x{i:02}")).collect();
        let list = |tail: &[&str]| head.iter().cloned().chain(tail.iter().map(|s| s.to_string())).collect::<Vec<_>>();
        // Before: 40 others, then a b c. Now: b left, c moved before a.
        let (before, now) = (list(&["a", "b", "c"]), list(&["c", "a"]));
        let now_ids: Vec<Wid> = now.iter().map(|s| Wid::new(s)).collect();
        let w = ids(&["b", "c"]);
        let moves = Moves { left: vec![(8, &w[0]), (7, &w[1])], joined: vec![(9, &w[1])] };
        let key = Keys::new("app:").key(FamilyId::VideoCategoryList, &["c1"]);
        let after = |_, id: WidRef<'_>| {
            let at = now_ids.iter().position(|x| x.as_ref() == id).unwrap_or(now_ids.len());
            (at, now_ids.get(at + 1).map(Wid::as_ref))
        };
        for (exact, tail) in [(true, true), (false, false)] {
            let patch = list_patch(key.clone(), before.len(), &moves, after, exact, 30_000).expect("patched");
            let [patch] = patch.as_slice() else { panic!("one step: {patch:?}") };
            let removals: Vec<&Edit> =
                patch.edits.iter().filter(|e| matches!(e, Edit::LRem(_) | Edit::LRemLast(_))).collect();
            assert_eq!(removals.len(), 2, "{:?}", patch.edits);
            assert!(removals.iter().all(|e| matches!(e, Edit::LRemLast(_)) == tail), "{:?}", patch.edits);
            assert_eq!(patch.apply(Some(Value::List(before.clone()))), Ok(Some(Value::List(now.clone()))));
        }
    }

    #[test]
    fn a_big_patch_goes_in_steps_and_one_dearer_than_a_replace_not_at_all() {
        let w = ids(&["a", "b"]);
        let key = Keys::new("app:").key(FamilyId::VideoCategoryIndex, &["c1"]);
        let moves = Moves { left: vec![], joined: vec![(1, &w[0]), (2, &w[1])] };
        let patch = zset_patch(key.clone(), 100, &moves, 30_000).expect("two of a hundred are patched");
        assert_eq!(patch.len(), 1);
        assert_eq!(patch[0].edits, vec![Edit::ZAdd(1, "a".into()), Edit::ZAdd(2, "b".into())]);
        // A hundred members, of whom forty left, twenty moved and forty
        // joined, over 10,000: steps, each within the step and guarded by
        // the size the one before leaves.
        let many: Vec<Wid> = (0..100).map(|i| Wid::new(&format!("m{i:03}"))).collect();
        let big = Moves {
            left: many[..60].iter().map(|w| (1, w)).collect(),
            joined: many[40..].iter().map(|w| (2, w)).collect(),
        };
        let steps = zset_patch(key.clone(), 10_000, &big, 30_000).expect("cheaper than a replace");
        assert!(steps.len() > 1 && steps.iter().all(|p| p.cost <= 30_000), "{steps:?}");
        assert_eq!(steps.iter().map(|p| p.edits.len()).sum::<usize>(), 100);
        let fillers = (0..9_940).map(|i| (1, format!("f{i:04}")));
        let mut value = Some(Value::Zset(fillers.clone().chain(many[..60].iter().map(|w| (1, w.text()))).collect()));
        for step in &steps {
            value = step.apply(value).expect("each step starts where the one before left the key");
        }
        let mut now: Vec<(i64, String)> = fillers.chain(many[40..].iter().map(|w| (2, w.text()))).collect();
        now.sort();
        assert_eq!(value, Some(Value::Zset(now)));
        assert!(zset_patch(key.clone(), 100, &big, 30_000).is_none(), "dearer than replacing a hundred");
        let small = Patch::fixed_cost(&key) + ELEMENT_COST;
        assert!(zset_patch(key, 10_000, &big, small).is_none(), "a member's edit alone exceeds the step");
    }
}
