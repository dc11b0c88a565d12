//! Home sections: per channel and section, the newest videos of the
//! channel's active categories. A batch computes a section from what it
//! listed and the videos the batch moved when that is enough, and merges
//! the categories' ordered members when it is not. Pure, like the rest of
//! planning; the property test compares every batch with a full rebuild.
//!
//! A section whose new list follows from what it listed goes to Redis as
//! a patch: the videos that joined it or moved (`ZADD`) and those that
//! left it (`ZREM`), guarded by the size it held, instead of its few
//! hundred members through a stage. An upload into a channel's
//! categories then costs its sections two edits each, not a rewrite.

use super::state::{Held, HomeList, State};
use crate::model::compact::{Sym, Wid};
use crate::plan::patch::{Edit, Patch};
use crate::plan::{Op, PlanCtx, Value};
use crate::registry::{FamilyId, HomeSectionKind};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::BTreeSet;

/// A video the batch moved: its `addedTime` and references before and
/// after the batch, while it was or is active.
pub(super) struct Moved {
    pub id: Wid,
    pub before: Option<(i64, Box<[Sym]>)>,
    pub now: Option<(i64, Box<[Sym]>)>,
}

/// How a batch reaches the home sections. A section lists the newest
/// videos of its channel's categories, so from what it listed and the
/// videos the batch moved, its new list follows without the merge over
/// its categories' members (hundreds of reads, each a cache miss in a
/// large store): the moved videos leave it, those in the categories now
/// come back at their new rank, and the newest `limit` stay. That holds
/// while at least `limit` of them rank no lower than the old last one
/// (or the section listed fewer than `limit`, so it held every member):
/// below it lie videos the section never listed, which only the merge
/// reads.
pub(super) struct HomeReach {
    /// Every section is merged (while the streams catch up, the state
    /// may be ahead of what the cache's sections were computed from).
    all: bool,
    /// Channels whose sections are merged whatever they listed.
    forced: BTreeSet<String>,
    moved: Vec<Moved>,
    /// The moved videos (their places in `moved`) by each category they
    /// referenced before or after the batch.
    by_category: FxHashMap<Sym, Vec<usize>>,
    /// What a patch may cost Redis: one atomic unit of the sink. A
    /// section whose patch costs more is written whole.
    step: usize,
}

/// The home sections a batch writes.
#[derive(Default)]
pub(super) struct HomesPlan {
    /// Sections written whole.
    pub ops: Vec<Op>,
    /// Sections patched from what they listed, each with what it then
    /// holds (its whole value's digest, as a whole write records it).
    pub patches: Vec<(Patch, Held)>,
    /// Sections that list what they did.
    pub kept: Vec<String>,
}

/// A section's new list, when the batch's moved videos give it.
enum Listed {
    /// What it listed before.
    Same,
    New(HomeList),
}

impl HomeReach {
    pub fn new(all: bool, forced: BTreeSet<String>, moved: Vec<Moved>, step: usize) -> HomeReach {
        let mut by_category: FxHashMap<Sym, Vec<usize>> = Default::default();
        for (at, m) in moved.iter().enumerate() {
            for (_, refs) in [&m.before, &m.now].into_iter().flatten() {
                for &c in refs.iter() {
                    let list = by_category.entry(c).or_default();
                    if list.last() != Some(&at) {
                        list.push(at);
                    }
                }
            }
        }
        HomeReach { all, forced, moved, by_category, step }
    }

    /// The new list of section `key` of channel `ch` over the categories
    /// `syms`, listing at most `limit` videos; `None` when only a merge
    /// can tell.
    fn listed(&self, state: &State, ch: &str, syms: &[Sym], key: &str, limit: usize) -> Option<Listed> {
        if self.all || self.forced.contains(ch) {
            return None;
        }
        let old = state.existing.home_list(key)?;
        let mut reaching: Vec<usize> = syms.iter().filter_map(|c| self.by_category.get(c)).flatten().copied().collect();
        if reaching.is_empty() {
            return Some(Listed::Same);
        }
        reaching.sort_unstable();
        reaching.dedup();
        let in_channel = |refs: &[Sym]| refs.iter().any(|c| syms.contains(c));
        let gone: FxHashSet<&Wid> = reaching.iter().map(|&at| &self.moved[at].id).collect();
        let mut came: HomeList = reaching
            .iter()
            .map(|&at| &self.moved[at])
            .filter_map(|m| {
                m.now.as_ref().filter(|(_, refs)| in_channel(refs)).map(|(added, _)| (*added, m.id.clone()))
            })
            .collect();
        came.sort_unstable_by(order);
        // Both in order: merged, not sorted again.
        let mut list: HomeList = Vec::with_capacity(old.len() + came.len());
        let mut came = came.into_iter().peekable();
        for v in old.iter().filter(|(_, w)| !gone.contains(w)) {
            while let Some(c) = came.next_if(|c| order(c, v).is_lt()) {
                list.push(c);
            }
            list.push(v.clone());
        }
        list.extend(came);
        if let Some(last) = old.last().filter(|_| old.len() >= limit) {
            let above = list.iter().take_while(|v| order(v, last).is_le()).count();
            if above < limit {
                return None;
            }
        }
        list.truncate(limit);
        Some(if list == *old { Listed::Same } else { Listed::New(list) })
    }
}

/// The home sections of the selected channels: per section the newest
/// `limit` distinct members of the channel's active categories, read off
/// their ordered members (a merge), never by looking a video up. With a
/// `reach`, a section whose list the batch's videos give is not merged:
/// it is patched from what it listed, or only named when it lists what
/// it did. What each written section lists goes to `lists`.
pub(super) fn plan_homes(
    state: &State,
    ctx: &PlanCtx,
    channels: &BTreeSet<String>,
    reach: Option<&HomeReach>,
    lists: &mut Vec<(String, HomeList)>,
) -> HomesPlan {
    let catalog = &state.catalog;
    let mut out = HomesPlan::default();
    if !ctx.families.contains(FamilyId::VideoListHome) {
        return out;
    }
    for ch in catalog.channels().iter().filter(|ch| channels.contains(&ch.id)) {
        let mut cats: Vec<&str> = ch.categories.iter().map(|r| r.id.as_str()).collect();
        cats.sort_unstable();
        cats.dedup();
        let syms: Vec<_> =
            cats.iter().filter(|c| catalog.active_category(c).is_some()).filter_map(|c| state.syms.get(c)).collect();
        for section in &ctx.home_sections {
            let HomeSectionKind::Latest = section.kind;
            let key = ctx.keys.key(FamilyId::VideoListHome, &[&ch.id, &section.name]);
            let listed = reach.and_then(|r| Some((r, r.listed(state, &ch.id, &syms, &key.text, section.limit)?)));
            let (list, patch) = match listed {
                Some((_, Listed::Same)) => {
                    out.kept.push(key.text);
                    continue;
                }
                Some((reach, Listed::New(list))) => {
                    let old = state.existing.home_list(&key.text);
                    let patch = old.and_then(|old| home_patch(&key, old, &list, reach.step));
                    (list, patch)
                }
                None => {
                    let picked = state.members().newest_of(syms.iter().copied(), section.limit);
                    (picked.into_iter().map(|(added, w)| (added, w.to_owned())).collect(), None)
                }
            };
            if list.is_empty() {
                continue;
            }
            match patch {
                Some(patch) => {
                    let held = Held { digest: Some(super::plan::home_digest(&list)), size: list.len() };
                    out.patches.push((patch, held));
                }
                None => {
                    let value = Value::Zset(list.iter().map(|(added, w)| (*added, w.text())).collect());
                    out.ops.push(Op { key: key.clone(), value });
                }
            }
            lists.push((key.text, list));
        }
    }
    out
}

/// A section's order: newest first, then by id.
fn order(a: &(i64, Wid), b: &(i64, Wid)) -> std::cmp::Ordering {
    b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1))
}

/// The patch that turns section `key` from listing `old` into listing
/// `new` (neither empty): `ZADD` of the videos that joined it or whose
/// `addedTime` moved, `ZREM` of those that left. `None` when it would
/// cost more than one `step`, or more than writing `new` whole.
///
/// Both lists are in section order, so one walk over them pairs what
/// stayed; only the few entries left over are compared by id (a moved
/// video is one of each), not the whole section hashed.
fn home_patch(key: &crate::keys::Key, old: &HomeList, new: &HomeList, step: usize) -> Option<Patch> {
    let mut joins: Vec<&(i64, Wid)> = Vec::new();
    let mut left: Vec<&(i64, Wid)> = Vec::new();
    let (mut olds, mut news) = (old.iter().peekable(), new.iter().peekable());
    loop {
        match (olds.peek(), news.peek()) {
            (Some(o), Some(n)) if o == n => drop((olds.next(), news.next())),
            (Some(o), Some(n)) if order(o, n).is_lt() => left.push(olds.next().expect("peeked")),
            (_, Some(_)) => joins.push(news.next().expect("peeked")),
            (Some(_), None) => left.push(olds.next().expect("peeked")),
            (None, None) => break,
        }
        // Every join and every leave but a moved one is an edit.
        if joins.len().max(left.len()) >= new.len() {
            return None;
        }
    }
    let moved: FxHashSet<&Wid> = joins.iter().map(|(_, w)| w).collect();
    let leaves = left.into_iter().filter(|(_, w)| !moved.contains(w));
    let edits: Vec<Edit> = joins
        .iter()
        .map(|(added, w)| Edit::ZAdd(*added, w.text()))
        .chain(leaves.map(|(_, w)| Edit::ZRem(w.text())))
        .collect();
    if edits.is_empty() || edits.len() >= new.len() {
        return None;
    }
    let patch = Patch::new(key.clone(), old.len(), edits, 0);
    (patch.cost <= step).then_some(patch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::Keys;

    fn list(items: &[(i64, &str)]) -> HomeList {
        items.iter().map(|(added, w)| (*added, Wid::new(w))).collect()
    }

    /// The value Redis holds for a list, as [`Patch::apply`] reads it
    /// back: by score.
    fn held(list: &HomeList) -> Value {
        let mut items: Vec<(i64, String)> = list.iter().map(|(added, w)| (*added, w.text())).collect();
        items.sort();
        Value::Zset(items)
    }

    #[test]
    fn a_section_is_patched_by_the_videos_that_joined_moved_or_left() {
        let key = Keys::new("app:").key(FamilyId::VideoListHome, &["ch", "latest"]);
        let old = list(&[(9, "a"), (8, "b"), (7, "c"), (6, "d"), (5, "e")]);
        // `n` joined, `b` moved down, `d` left.
        let new = list(&[(10, "n"), (9, "a"), (7, "c"), (5, "e"), (4, "b")]);
        let patch = home_patch(&key, &old, &new, usize::MAX).expect("a patch");
        assert_eq!(patch.before, 5);
        assert_eq!(patch.edits, [Edit::ZAdd(10, "n".into()), Edit::ZAdd(4, "b".into()), Edit::ZRem("d".into())]);
        assert_eq!(patch.apply(Some(held(&old))), Ok(Some(held(&new))));
        // Over one step, or no cheaper than the whole value: written whole.
        assert_eq!(home_patch(&key, &old, &new, patch.cost - 1), None);
        let replaced = list(&[(20, "p"), (19, "q"), (18, "r")]);
        assert_eq!(home_patch(&key, &old, &replaced, usize::MAX), None);
    }

    #[test]
    fn a_section_s_digest_is_its_value_s_without_rendering_it() {
        let l = list(&[(3, "0123456789abcdef01234567"), (2, "not-hex"), (-1, "")]);
        let value = Value::Zset(l.iter().map(|(added, w)| (*added, w.text())).collect());
        assert_eq!(super::super::plan::home_digest(&l), super::super::plan::digest(&value));
        assert_ne!(super::super::plan::home_digest(&l[..2].to_vec()), super::super::plan::digest(&value));
    }
}
