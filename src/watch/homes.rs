//! Home sections: per channel and section, the newest videos of the
//! channel's active categories. A batch computes a section from what it
//! listed and the videos the batch moved when that is enough, and merges
//! the categories' ordered members when it is not. Pure, like the rest of
//! planning; the property test compares every batch with a full rebuild.

use super::state::{HomeList, State};
use crate::model::compact::{Sym, Wid};
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
}

/// A section's new list, when the batch's moved videos give it.
enum Listed {
    /// What it listed before.
    Same,
    New(HomeList),
}

impl HomeReach {
    pub fn new(all: bool, forced: BTreeSet<String>, moved: Vec<Moved>) -> HomeReach {
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
        HomeReach { all, forced, moved, by_category }
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
        let order = |a: &(i64, Wid), b: &(i64, Wid)| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1));
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
/// `reach`, a section whose list the batch's videos give is not merged,
/// and one that lists what it did is only named (the second list). What
/// each written section lists goes to `lists`.
pub(super) fn plan_homes(
    state: &State,
    ctx: &PlanCtx,
    channels: &BTreeSet<String>,
    reach: Option<&HomeReach>,
    lists: &mut Vec<(String, HomeList)>,
) -> (Vec<Op>, Vec<String>) {
    let catalog = &state.catalog;
    let (mut out, mut kept) = (Vec::new(), Vec::new());
    if !ctx.families.contains(FamilyId::VideoListHome) {
        return (out, kept);
    }
    for ch in catalog.channels.iter().filter(|ch| channels.contains(&ch.id)) {
        let mut cats: Vec<&str> = ch.categories.iter().map(|r| r.id.as_str()).collect();
        cats.sort_unstable();
        cats.dedup();
        let syms: Vec<_> =
            cats.iter().filter(|c| catalog.active_category(c).is_some()).filter_map(|c| state.syms.get(c)).collect();
        for section in &ctx.home_sections {
            let HomeSectionKind::Latest = section.kind;
            let key = ctx.keys.key(FamilyId::VideoListHome, &[&ch.id, &section.name]);
            let list = match reach.and_then(|r| r.listed(state, &ch.id, &syms, &key.text, section.limit)) {
                Some(Listed::Same) => {
                    kept.push(key.text);
                    continue;
                }
                Some(Listed::New(list)) => list,
                None => {
                    let picked = state.members().newest_of(syms.iter().copied(), section.limit);
                    picked.into_iter().map(|(added, w)| (added, w.to_owned())).collect()
                }
            };
            if list.is_empty() {
                continue;
            }
            let scored = list.iter().map(|(added, w)| (*added, w.text())).collect();
            lists.push((key.text.clone(), list));
            out.push(Op { key, value: Value::Zset(scored) });
        }
    }
    (out, kept)
}
