//! Planning one batch: pure. From the state after the batch's events, what
//! it touched, and what Redis holds of the touched videos, it gives the
//! writes that make every affected key equal to what a full rebuild of the
//! new state writes. Catalogue values and the touched videos'
//! `video:categories` come from the rebuild's own planners
//! ([`crate::plan::plan_catalog`], [`crate::plan::video::plan_selected`]);
//! the index keys of a touched scope are read off its ordered members
//! ([`super::members`]), what the rebuild's index planner lists for it
//! (the property test compares every batch with a full rebuild).

use super::delta::{self, Deltas};
use super::homes::{HomeReach, Moved, plan_homes};
use super::index_fields::DetailFields;
use super::state::{Applied, Held, Record, Scopes, State};
use crate::model::catalog::Catalog;
use crate::model::compact::{Sym, Wid, WidRef};
use crate::model::decode::Tag;
use crate::model::report::RefReport;
use crate::plan::patch::{Edit, Patch};
use crate::plan::video::{Member, Selection, distinct, plan_selected, resolve};
use crate::plan::{self, Change, Op, PlanCtx, Value};
use crate::registry::FamilyId;
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::{BTreeSet, HashMap, HashSet};

/// What Redis holds of the touched videos: the categories their
/// `video:categories` lists and their `video:detail` payloads. After a
/// restart this, not the state, says what was written before.
#[derive(Debug, Default, Clone)]
pub struct RedisView {
    pub categories: HashMap<String, BTreeSet<String>>,
    pub details: HashMap<String, String>,
}

/// A batch's writes, and what committing them records.
#[derive(Debug, Default)]
pub struct BatchPlan {
    /// The keys of the scopes the batch touched, in any order.
    pub changes: Vec<Change>,
    /// The steps of patches too big for one after their first (which is
    /// in `changes`): the `n`th list holds every patch's step `n + 1`, so
    /// a key's steps land in order, each after the one before.
    pub later: Vec<Vec<Change>>,
    /// The touched videos' own keys (`video:detail`, `video:categories`),
    /// patches first, written after every other change, their last
    /// transaction (never a patch) with the resume tokens: once one is in
    /// Redis, every key that indexes its video is too, and once all are,
    /// the batch is saved. A replay after a partial write sees the others
    /// old and recomputes what they index.
    pub last: Vec<Change>,
    /// What the writes change in what the state knows of the cache.
    pub record: Record,
    /// How many scope members planning read (a category's or tag's, and
    /// the touched videos), never the whole catalogue.
    pub visited: usize,
}

/// A 128-bit digest of a value: its type, then each element with its
/// length (so no two values share a byte stream). Hashed directly, not
/// through its `Debug` text, which cost most of a catalogue re-plan.
pub(super) fn digest(value: &Value) -> u128 {
    let mut d = Digester::default();
    match value {
        Value::String(v) => {
            d.feed(b"s");
            d.feed(v.as_bytes());
        }
        Value::Set(items) | Value::List(items) => {
            d.feed(if matches!(value, Value::Set(_)) { b"S" } else { b"L" });
            items.iter().for_each(|i| d.feed(i.as_bytes()));
        }
        Value::Zset(items) => {
            d.feed(b"Z");
            for (score, member) in items {
                d.feed(&score.to_le_bytes());
                d.feed(member.as_bytes());
            }
        }
    }
    d.finish()
}

/// The [`digest`] of a home section's value, from what it lists without
/// rendering its ids.
pub(super) fn home_digest(list: &super::state::HomeList) -> u128 {
    let mut d = Digester::default();
    d.feed(b"Z");
    for (added, w) in list {
        d.feed(&added.to_le_bytes());
        w.with_text(|text| d.feed(text.as_bytes()));
    }
    d.finish()
}

/// XXH3's 128-bit hash of one byte stream: each piece with its length
/// before it. Pieces are gathered on the stack and hashed a block at a
/// time (and a short stream at once): a home section is a hundred pieces
/// of a few bytes, which the hasher's own streaming took one call each
/// for, slower than the SipHash pair it replaced. A piece longer than
/// the block (`tag:all` is a megabyte) goes to the hasher as it is.
/// Whatever the blocks, the digest is XXH3-128 of the whole stream.
struct Digester {
    stream: Option<xxhash_rust::xxh3::Xxh3Default>,
    block: [u8; DIGEST_BLOCK],
    len: usize,
}

const DIGEST_BLOCK: usize = 512;

impl Default for Digester {
    fn default() -> Digester {
        Digester { stream: None, block: [0; DIGEST_BLOCK], len: 0 }
    }
}

impl Digester {
    fn feed(&mut self, bytes: &[u8]) {
        self.gather(&(bytes.len() as u64).to_le_bytes());
        self.gather(bytes);
    }

    fn gather(&mut self, bytes: &[u8]) {
        if self.len + bytes.len() > DIGEST_BLOCK {
            let stream = self.stream.get_or_insert_with(Default::default);
            stream.update(&self.block[..self.len]);
            self.len = 0;
            if bytes.len() > DIGEST_BLOCK {
                stream.update(bytes);
                return;
            }
        }
        self.block[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }

    fn finish(self) -> u128 {
        let rest = &self.block[..self.len];
        match self.stream {
            None => xxhash_rust::xxh3::xxh3_128(rest),
            Some(mut stream) => {
                stream.update(rest);
                stream.digest128()
            }
        }
    }
}

/// At least how many videos' `video:categories` patches one rayon task
/// computes: enough to make a task's overhead small beside a few
/// microseconds each.
const PATCH_CHUNK: usize = 256;

/// What the sink's writes let a batch's plan choose.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// What a patch's step may cost Redis: one atomic unit of the sink
    /// (`Sink::unit_cost`).
    pub patch_step: usize,
    /// Whether the sink replaces a collection whole with one `RESTORE` in
    /// a transaction (`Sink::restores_in_transactions`). Then a flipped
    /// category's members' `video:categories` are written whole, one
    /// command each, instead of patched behind a size guard in the write
    /// script: the same cost to Redis, less to the watcher, and a set
    /// drifted behind its back is replaced instead of refusing the block.
    pub restore: bool,
}

/// Plans the writes of one applied batch, patches cut into steps that
/// cost Redis at most `shape.patch_step` each.
pub fn plan_batch(state: &State, applied: &Applied, redis: &RedisView, ctx: &PlanCtx, shape: Shape) -> BatchPlan {
    // The catalogue's keys (`tag:all` alone is a megabyte to render and
    // digest) beside the index scopes': neither reads what the other
    // plans.
    let (diff, mut out) =
        rayon::join(|| plan_catalog(state, applied, ctx), || plan_scoped(state, applied, redis, ctx, shape));
    if let Some(diff) = diff {
        // First, as when planned in one pass: the catalogue's keys are
        // none of the touched videos' own, which go last.
        out.changes.splice(0..0, diff.changes);
        out.record.written.splice(0..0, diff.record.written);
        out.record.deleted.splice(0..0, diff.record.deleted);
        out.record.whole_catalog = diff.record.whole_catalog;
    }
    out
}

/// The catalogue's keys that a batch touching catalogue documents
/// changes; `None` for a batch that touched none.
fn plan_catalog(state: &State, applied: &Applied, ctx: &PlanCtx) -> Option<BatchPlan> {
    let before = applied.before.as_ref()?;
    let mut out = BatchPlan::default();
    // After a load, or while the replay may hold what the load saw (the
    // old documents are then unknown), every catalogue key.
    let whole = state.catalog_unsure || state.catching_up || state.replayed;
    let scope = match whole {
        true => plan::CatalogScope::All,
        false => plan::CatalogScope::Some(super::catalog::reached(before, &state.catalog, applied, ctx)),
    };
    super::catalog::plan_diff(state, ctx, &scope, &mut out);
    out.record.whole_catalog = whole;
    Some(out)
}

/// The index scopes' keys and the touched videos' own.
fn plan_scoped(state: &State, applied: &Applied, redis: &RedisView, ctx: &PlanCtx, shape: Shape) -> BatchPlan {
    let patch_step = shape.patch_step;
    let catalog = &state.catalog;
    let mut out = BatchPlan::default();

    // Scopes by id: categories, tags and channels whose index keys must be
    // recomputed whole, videos whose `video:categories` must be, and
    // categories whose members' `video:categories` must be. Scopes an
    // earlier batch may have left half-written come first; while the
    // streams catch up with a load they wait for the batch that ends the
    // catch-up, which recomputes them once instead of in every batch.
    let dirty = if state.catching_up { Scopes::default() } else { state.dirty.clone() };
    let Scopes { categories: mut cats, mut tags, mut channels, mut videos, memberships: mut flipped } = dirty;
    // Tags whose list an earlier batch may have left half-written, or
    // whose catalogue side changed, are replaced whole.
    let mut whole_tags = tags.clone();
    // Categories whose activation this batch changed from what the cache
    // is known to hold (see `categories_write`).
    let mut sure_flips: HashSet<String> = HashSet::new();
    tags.extend(applied.tags.iter().cloned());
    channels.extend(applied.channels.iter().cloned());

    if let Some(before) = &applied.before {
        // What index families read of the catalogue changes only with the
        // documents the batch touched.
        let was_active = |id: &str| before.category(catalog, id).is_some_and(|c| c.active);
        let flips = |id: &&String| was_active(id) != catalog.active_category(id).is_some();
        // The cache holds what the state held before these flips unless
        // an earlier batch may have left their members half-written (a
        // state ahead of the cache is refused per video, by `trusted`).
        let sure = applied.categories.iter().filter(flips).filter(|c| !state.dirty.memberships.contains(*c));
        sure_flips.extend(sure.cloned());
        flipped.extend(applied.categories.iter().filter(flips).cloned());
        // Replayed events may name categories whose activation the
        // loaded documents already hold but the cache does not: every
        // category such a batch touches counts as flipped.
        if state.replayed {
            flipped.extend(applied.categories.iter().cloned());
        }
        let owner = |t: Option<&crate::model::decode::Tag>| t.filter(|t| t.active).map(|t| t.category_id.clone());
        for id in applied.tags.iter().filter(|id| owner(before.tag(catalog, id)) != owner(catalog.tag(id))) {
            tags.insert(id.clone());
            whole_tags.insert(id.clone());
        }
        let refs = |ch: Option<&crate::model::decode::Channel>| {
            ch.map(|ch| ch.categories.iter().map(|r| r.id.clone()).collect::<Vec<_>>())
        };
        for id in applied.channels.iter().filter(|id| refs(before.channel(catalog, id)) != refs(catalog.channel(id))) {
            channels.insert(id.clone());
        }
    }
    // A category that turned (in)active changes its own index keys, its
    // tags' lists, and the category set of every video referencing it.
    cats.extend(flipped.iter().cloned());
    for tag in tags_of_categories(catalog, &flipped) {
        tags.insert(tag.id.clone());
        whole_tags.insert(tag.id.clone());
    }
    for c in &flipped {
        videos.extend(state.members().of_category(state.syms.get(c)).map(|w| w.text()));
    }
    // Home sections merged again whatever they listed: those of the
    // channels the batch or a failed one changed, and of the categories
    // that turned (in)active or a failed batch may have half-written.
    let mut forced = channels.clone();
    forced.extend(reading(catalog.channels(), &cats));
    let mut moved: Vec<Moved> = Vec::new();

    // Touched videos: the detail always; the index scopes only when what
    // they index may have changed, here or in what Redis holds.
    for (w, (before_view, before_cats)) in &applied.videos {
        let video = state.effective(w);
        let detail = video.and_then(|v| v.detail);
        match detail {
            Some(detail) => put(&mut out, ctx, FamilyId::VideoDetail, &[w], Value::String(detail.to_string())),
            None => delete(&mut out, ctx, FamilyId::VideoDetail, &[w]),
        }
        let now_cats = video.map(|v| state.active_categories(catalog, v)).unwrap_or_default();
        let redis_cats = redis.categories.get(w).cloned().unwrap_or_default();
        let now_view = state.index_view(w);
        let held = DetailFields::read(redis.details.get(w).map(String::as_str));
        let quiet = *before_view == now_view
            && redis_cats == now_cats.iter().cloned().collect::<BTreeSet<_>>()
            && held.same_as(&DetailFields::read(detail))
            && video.is_none_or(|v| v.detail.is_some());
        if quiet {
            continue;
        }
        videos.insert(w.clone());
        let rank = |v: &Option<super::state::IndexView>| v.as_ref().map(|(added, refs, _)| (*added, refs.clone()));
        moved.push(Moved { id: Wid::new(w), before: rank(before_view), now: rank(&now_view) });
        cats.extend(before_cats.iter().cloned());
        cats.extend(redis_cats);
        // The detail Redis holds names the categories and tags it was
        // indexed under, even when `video:categories` was rewritten since
        // (a category's status changed after a restart).
        let (held_cats, held_tags) = held.refs();
        cats.extend(held_cats);
        cats.extend(now_cats);
        // The tag lists it was or is in.
        for (_, _, refs) in before_view.iter().chain(&now_view) {
            tags.extend(refs.iter().map(|&t| state.name(t).to_string()));
        }
        tags.extend(held_tags);
    }

    // A category's channels' home sections read it.
    let old_channels = applied.before.as_ref().map(|b| b.channels(catalog)).unwrap_or_default();
    channels.extend(reading(catalog.channels().iter().chain(old_channels), &cats));

    // A video's `video:categories` whose contents the batch knows is
    // patched; the rebuild's planner gives the other videos' sets, and
    // the scopes' keys come off their ordered members.
    let mut set_patches: Vec<Patch> = Vec::new();
    let mut set_ops: Vec<Op> = Vec::new();
    let mut patched: FxHashSet<&str> = FxHashSet::default();
    let mut selected = FxHashSet::default();
    // A flip reaches every member of its category: thousands of sets,
    // each computed on its own, in chunks over the rayon pool.
    let listed: Vec<&String> = videos.iter().collect();
    let found: Vec<Option<SetWrite>> = {
        use rayon::prelude::*;
        let flips = Flips::new(state, &flipped, &sure_flips, shape.restore);
        let patch = |w: &&String| categories_write(state, applied, redis, ctx, &flips, w);
        listed.par_iter().with_min_len(PATCH_CHUNK).map(patch).collect()
    };
    for (w, write) in listed.into_iter().zip(found) {
        match write {
            Some(SetWrite::Patch(patch)) => {
                set_patches.push(patch);
                patched.insert(w.as_str());
            }
            Some(SetWrite::Whole(op)) => {
                out.visited += 1;
                set_ops.push(op);
            }
            // Neither planned nor patched: deleted below.
            Some(SetWrite::Gone) => out.visited += 1,
            None => drop(selected.insert(w.clone())),
        }
    }
    out.visited += set_patches.len();
    group_flips(&mut set_patches);
    let sel = Selection {
        categories: Some(Default::default()),
        tags: Some(Default::default()),
        channels: Some(Default::default()),
        videos: Some(selected),
    };
    // While the streams catch up, the state may be ahead of the cache:
    // every scope is computed whole and every section merged.
    let ahead = state.catching_up || state.replayed;
    let reach = HomeReach::new(ahead, forced, moved, patch_step);
    let whole_cats: BTreeSet<String> = state.dirty.categories.union(&flipped).cloned().collect();
    let whole = Whole { all: ahead, cats: &whole_cats, tags: &whole_tags };
    let deltas = Deltas::new(state, applied, patch_step);
    // The channels' home sections beside the categories' and tags' keys.
    let ((homes, home_lists), scoped) = rayon::join(
        || {
            let mut lists = Vec::new();
            (plan_homes(state, ctx, &channels, Some(&reach), &mut lists), lists)
        },
        || plan_scopes(state, ctx, (&cats, &tags), &whole, &deltas),
    );
    out.record.homes.extend(home_lists);
    out.visited += scoped.visited;
    let mut ops = homes.ops;
    ops.extend(scoped.ops);
    ops.extend(set_ops);
    if !sel.is_empty() {
        let walk = |f: &mut dyn FnMut(Member<'_>)| out.visited += visit(state, catalog, &sel, f);
        ops.extend(plan_selected(walk, catalog, ctx, &sel));
    }
    let mut planned: FxHashSet<String> = ops.iter().map(|op| op.key.text.clone()).collect();
    planned.extend(scoped.kept);
    planned.extend(homes.kept);
    for (patch, held) in homes.patches {
        planned.insert(patch.key.text.clone());
        out.record.written.push((patch.key.text.clone(), Some(held)));
        out.changes.push(Change::Patch(patch));
    }
    let tracked = super::state::tracked_families();
    for op in ops {
        // A scope's key whose value is what this process last wrote
        // there is left alone: most of a busy batch's home sections and
        // lists come out as they were. Per-video keys are not tracked, so
        // the record leaves them out (the state would only skip them).
        if tracked.contains(op.key.family) {
            let d = digest(&op.value);
            if state.existing.digest(&op.key.text) == Some(d) {
                continue;
            }
            let held = Held { digest: Some(d), size: op.value.elements() };
            out.record.written.push((op.key.text.clone(), Some(held)));
        }
        out.changes.push(Change::Put(op));
    }
    // A set the patch empties is dropped by Redis itself. Like every
    // per-video key it is not recorded (see above).
    out.changes.extend(set_patches.into_iter().map(Change::Patch));
    for (steps, size) in scoped.patches {
        let mut steps = steps.into_iter();
        let Some(first) = steps.next() else { continue };
        let key = first.key.text.clone();
        // Never also deleted: an emptied key is gone by the patch itself
        // (an `UNLINK` in another transaction of the batch could land
        // first and fail the patch's guard).
        planned.insert(key.clone());
        match size {
            0 => out.record.deleted.push(key),
            size => out.record.written.push((key, Some(Held { digest: None, size }))),
        }
        out.changes.push(Change::Patch(first));
        for (wave, patch) in steps.enumerate() {
            if out.later.len() == wave {
                out.later.push(Vec::new());
            }
            out.later[wave].push(Change::Patch(patch));
        }
    }

    // Keys of the affected scopes that the new state no longer has. A
    // category's tag lists are its tags' scope, unless the category
    // itself turned (in)active.
    if ctx.families.contains(FamilyId::VideoCategories) {
        for w in videos.iter().filter(|w| !patched.contains(w.as_str())) {
            let key = ctx.keys.key(FamilyId::VideoCategories, &[w]);
            if !planned.contains(&key.text) {
                out.changes.push(Change::Delete(key));
            }
        }
    }
    let mut stale: BTreeSet<&String> = BTreeSet::new();
    let unplanned = |k: &&String| !planned.contains(*k);
    for c in &cats {
        let keys = state.existing.by_category.get(c).into_iter().flatten().filter(unplanned);
        let whole = flipped.contains(c);
        stale.extend(keys.filter(|k| whole || !scoped_by_tag(ctx, k)));
    }
    for (scopes, existing) in [(&tags, &state.existing.by_tag), (&channels, &state.existing.by_channel)] {
        for scope in scopes {
            stale.extend(existing.get(scope).into_iter().flatten().filter(unplanned));
        }
    }
    for key in stale {
        if let Some(family) = ctx.keys.classify(key).filter(|f| ctx.families.contains(*f)) {
            out.record.deleted.push(key.clone());
            out.changes.push(Change::Delete(crate::keys::Key { family, text: key.clone() }));
        }
    }
    out.record.scopes = Scopes { categories: cats, tags, channels, videos, memberships: flipped };
    let per_video = |c: &Change| matches!(c.key().family, FamilyId::VideoDetail | FamilyId::VideoCategories);
    let (mut last, changes): (Vec<Change>, _) = std::mem::take(&mut out.changes).into_iter().partition(per_video);
    // Patches first: the protocol keeps them out of the tokens' run.
    last.sort_by_key(|c| !matches!(c, Change::Patch(_)));
    out.changes = changes;
    out.last = last;
    out
}

/// The ids of the `channels` whose home sections read one of `cats`.
fn reading<'a>(
    channels: impl IntoIterator<Item = &'a crate::model::decode::Channel>,
    cats: &BTreeSet<String>,
) -> Vec<String> {
    let reads = |ch: &&crate::model::decode::Channel| ch.categories.iter().any(|r| cats.contains(&r.id));
    channels.into_iter().filter(reads).map(|ch| ch.id.clone()).collect()
}

/// The tags whose `categoryId` is one of `ids`: by the category's place,
/// kept per tag ([`Catalog::tag_category_index`]), instead of comparing
/// every tag's id text with each of `ids`; by text only for a tag whose
/// category is not in the catalogue (one the batch deleted, say).
fn tags_of_categories<'a>(catalog: &'a Catalog, ids: &BTreeSet<String>) -> impl Iterator<Item = &'a Tag> {
    let (mut places, mut gone) = (FxHashSet::default(), Vec::new());
    for id in ids {
        match catalog.category_index(id) {
            Some(at) => drop(places.insert(at)),
            None => gone.push(id),
        }
    }
    let named = move |(t, tag): &(usize, &Tag)| match catalog.tag_category_index(*t) {
        Some(c) => places.contains(&c),
        None => gone.contains(&&tag.category_id),
    };
    catalog.tags().iter().enumerate().filter(named).map(|(_, tag)| tag)
}

/// Whether the cache is known to hold what the state says of video `w`
/// before the batch: not while the state may be ahead of the cache, nor
/// for a video an earlier batch may have left half-written.
fn trusted(state: &State, w: &str) -> bool {
    !(state.catching_up || state.replayed || state.dirty.videos.contains(w))
}

/// What [`categories_write`] asks of every member of a flipped category,
/// by symbol: which categories are active now, which the batch flipped,
/// and which of those flips are sure. With a flip, the first is read
/// once for the batch into a table by symbol, so that a member costs
/// array reads instead of a name and an id lookup per category it
/// references (thousands of members a flip at 2M videos); without one
/// (a batch of a few touched videos) the table would cost more than it
/// saves, and each answer is looked up.
struct Flips<'s> {
    state: &'s State,
    /// Per symbol: what `catalog.active_category(name)` says of its name.
    active: Option<Vec<bool>>,
    /// Per symbol: flipped (`Some`), and whether surely (`Some(true)`).
    flipped: FxHashMap<Sym, bool>,
    /// Whether a member's set is written whole ([`Shape::restore`]).
    whole: bool,
}

impl<'s> Flips<'s> {
    fn new(state: &'s State, flipped: &BTreeSet<String>, sure: &HashSet<String>, whole: bool) -> Flips<'s> {
        // A name no video references has no symbol, and no member to patch.
        let flipped: FxHashMap<Sym, bool> =
            flipped.iter().filter_map(|c| state.syms.get(c).map(|sym| (sym, sure.contains(c)))).collect();
        let active = (!flipped.is_empty()).then(|| {
            let mut active = vec![false; state.syms.len()];
            for c in state.catalog.categories() {
                if let Some(sym) = state.syms.get(&c.id) {
                    active[sym as usize] = state.catalog.active_category(&c.id).is_some();
                }
            }
            active
        });
        Flips { state, active, flipped, whole }
    }

    fn active(&self, sym: Sym) -> bool {
        match &self.active {
            Some(active) => active.get(sym as usize).copied().unwrap_or(false),
            None => self.state.catalog.active_category(self.state.name(sym)).is_some(),
        }
    }
}

/// How a video's `video:categories` is written without the planner.
enum SetWrite {
    /// Patched: its key's contents before are known.
    Patch(Patch),
    /// Replaced whole with its active categories (by one `RESTORE`).
    Whole(Op),
    /// Deleted: the video is in no active category any more.
    Gone,
}

/// How video `w`'s `video:categories` is written without planning it
/// whole from scratch: a patch (`SADD` of the categories it joins, then
/// `SREM` of those it leaves) when the batch knows what its key holds
/// before: for a video the batch touched, what it just
/// read of it from Redis; for another (a member of categories the batch
/// (de)activated), its active categories with those flips undone, when
/// each of them is sure (`flips`: the batch's flipped categories, and
/// those whose members the cache holds as the state did before the
/// batch). Such a member's set is instead written whole from its active
/// categories when the sink restores collections (`Flips::whole`), or
/// deleted when it has none. `None`, and the set is planned whole, for
/// a video not [`trusted`] or not active, a key that waits for its slot
/// (unknown contents), or a key missing before and after.
fn categories_write(
    state: &State,
    applied: &Applied,
    redis: &RedisView,
    ctx: &PlanCtx,
    flips: &Flips,
    w: &str,
) -> Option<SetWrite> {
    if !ctx.families.contains(FamilyId::VideoCategories) || !trusted(state, w) {
        return None;
    }
    let cats = state.effective_categories(w)?;
    let key = ctx.keys.key(FamilyId::VideoCategories, &[w]);
    if state.deferred.contains(&key.text) {
        return None;
    }
    // Distinct symbols are distinct ids (one symbol a name).
    let refs = distinct(cats.iter().copied());
    let now: Vec<Sym> = refs.iter().copied().filter(|&c| flips.active(c)).collect();
    let name = |c: &Sym| state.name(*c);
    let (before, joins, leaves): (usize, Vec<&str>, Vec<&str>) = match applied.videos.contains_key(w) {
        true => {
            let old = redis.categories.get(w);
            let held = |c: &str| old.is_some_and(|old| old.contains(c));
            let now: Vec<&str> = now.iter().map(name).collect();
            let leaves = old.into_iter().flatten().map(String::as_str).filter(|c| !now.contains(c)).collect();
            let joins = now.into_iter().filter(|c| !held(c)).collect();
            (old.map_or(0, BTreeSet::len), joins, leaves)
        }
        false if flips.whole => {
            if now.is_empty() {
                return Some(SetWrite::Gone);
            }
            // In stored order, as the planner lists them.
            let members = now.iter().map(|c| name(c).to_string()).collect();
            return Some(SetWrite::Whole(Op { key, value: crate::plan::Value::Set(members) }));
        }
        false => {
            let mut was = Vec::new();
            for &c in &refs {
                let active = flips.active(c);
                let before = match flips.flipped.get(&c) {
                    Some(true) => !active,
                    Some(false) => return None,
                    None => active,
                };
                if before {
                    was.push(c);
                }
            }
            let joins = now.iter().filter(|c| !was.contains(c)).map(name).collect();
            // Leaves in the order of the ids, as the set's members sort.
            let mut leaves: Vec<&str> = was.iter().filter(|c| !now.contains(c)).map(name).collect();
            leaves.sort_unstable();
            (was.len(), joins, leaves)
        }
    };
    if before == 0 && now.is_empty() {
        return None;
    }
    let joins = joins.into_iter().map(|c| Edit::SAdd(c.to_string()));
    let leaves = leaves.into_iter().map(|c| Edit::SRem(c.to_string()));
    Some(SetWrite::Patch(Patch::new(key, before, joins.chain(leaves).collect(), 0)))
}

/// Puts the `video:categories` patches one flip makes together, so that
/// the write script carries each run as one block (`sink::script_args`):
/// sorted by id, the members of two categories flipped in one batch
/// would alternate. Patches of one edit go by that edit (joins first,
/// then by member), the others last.
fn group_flips(patches: &mut [Patch]) {
    fn flip(patch: &Patch) -> (bool, bool, &str) {
        let edit = patch.edits.first().filter(|_| patch.edits.len() == 1);
        (edit.is_none(), !matches!(edit, Some(Edit::SAdd(_))), edit.map_or("", Edit::member))
    }
    patches.sort_by(|a, b| flip(a).cmp(&flip(b)));
}

/// Whether a key's family is recomputed by tag too (its tag's scope
/// covers it), per the registry.
fn scoped_by_tag(ctx: &PlanCtx, key: &str) -> bool {
    let registry = crate::registry::Registry::get();
    ctx.keys.classify(key).is_some_and(|f| registry.family(f).scope.contains(&crate::registry::Scope::Tag))
}

/// Which scopes are replaced whole instead of patched: all of them while
/// the streams catch up with a load (the state is ahead of the cache),
/// and the categories and tags whose catalogue side changed or that an
/// earlier batch may have left half-written.
struct Whole<'a> {
    all: bool,
    cats: &'a BTreeSet<String>,
    tags: &'a BTreeSet<String>,
}

/// The planned keys of the touched categories and tags.
#[derive(Default)]
struct ScopePlan {
    /// Keys replaced whole.
    ops: Vec<Op>,
    /// Keys patched, each as its steps in order, with its size after (0:
    /// the patch empties it, and Redis drops it).
    patches: Vec<(Vec<Patch>, usize)>,
    /// Keys of patched scopes that stay as they are, or are patched.
    kept: Vec<String>,
    /// How many members planning them read.
    visited: usize,
}

/// The keys of the selected categories and tags over the new catalogue:
/// patched from the members that moved when the cache is known to hold
/// what the state held before the batch ([`super::delta`]), else read
/// off their ordered members (what a full rebuild lists, in its order):
/// an active category's count, index and list are its members; an
/// active tag's list is those of its members that are also members of
/// the tag's category, when that category is active. Counts the members
/// read into `visited`.
fn plan_scopes(
    state: &State,
    ctx: &PlanCtx,
    (cats, tags): (&BTreeSet<String>, &BTreeSet<String>),
    whole: &Whole<'_>,
    deltas: &Deltas<'_>,
) -> ScopePlan {
    use rayon::prelude::*;
    let catalog = &state.catalog;
    // Each scope is planned on its own: a busy batch's (de)activations
    // and big categories read thousands of members each, spread over the
    // rayon pool (the engine's thread waits, off the async runtime). The
    // parts are joined in catalogue order.
    let chosen: Vec<&str> =
        catalog.categories().iter().filter(|c| c.active && cats.contains(&c.id)).map(|c| c.id.as_str()).collect();
    let category = |id: &&str| {
        let mut part = ScopePlan::default();
        if whole.all || whole.cats.contains(*id) || !patch_category(state, ctx, id, deltas, &mut part) {
            whole_category(state, ctx, id, &mut part.visited, &mut part.ops);
        }
        part
    };
    let mut out = ScopePlan::join(chosen.par_iter().map(category).collect());
    if ctx.families.contains(FamilyId::VideoTagList) {
        let chosen: Vec<(&crate::model::decode::Tag, Option<Sym>)> = catalog
            .tags()
            .iter()
            .filter(|t| t.active && tags.contains(&t.id))
            .filter_map(|t| catalog.active_category(&t.category_id).map(|owner| (t, state.syms.get(&owner.id))))
            .collect();
        let tag = |(tag, owner): &(&crate::model::decode::Tag, Option<Sym>)| {
            let mut part = ScopePlan::default();
            let args = [tag.category_id.as_str(), tag.id.as_str()];
            if whole.all || whole.tags.contains(&tag.id) || !patch_tag(state, ctx, &args, *owner, deltas, &mut part) {
                whole_tag(state, ctx, &args, *owner, &mut part.visited, &mut part.ops);
            }
            part
        };
        out.absorb(ScopePlan::join(chosen.par_iter().map(tag).collect()));
    }
    out
}

impl ScopePlan {
    fn absorb(&mut self, other: ScopePlan) {
        self.ops.extend(other.ops);
        self.patches.extend(other.patches);
        self.kept.extend(other.kept);
        self.visited += other.visited;
    }

    fn join(parts: Vec<ScopePlan>) -> ScopePlan {
        let mut out = ScopePlan::default();
        parts.into_iter().for_each(|part| out.absorb(part));
        out
    }
}

/// An active tag's list (`args`: its category and tag) whose category
/// `owner` is active, whole.
fn whole_tag(
    state: &State,
    ctx: &PlanCtx,
    args: &[&str; 2],
    owner: Option<Sym>,
    visited: &mut usize,
    out: &mut Vec<Op>,
) {
    let members = state.members();
    let tag = state.syms.get(args[1]);
    // Every member of the tag is read, listed or not.
    *visited += members.count_of_tag(tag);
    let ids: Vec<String> = members.ranked_of_tag_in_category(tag, owner).map(|(_, w)| w.text()).collect();
    ctx.emit(out, FamilyId::VideoTagList, args, Value::List(ids));
}

/// What a rebuild writes for one scope, read off the state: the keys of
/// a category (its count, index and list), of a tag (its list), of a
/// channel (its home sections) or of a video (`video:categories`; the
/// detail needs the document). Nothing for an entity that is absent or
/// inactive. For the drift check, which compares them with Redis.
pub(super) fn plan_scope(state: &State, ctx: &PlanCtx, scope: crate::registry::Scope, id: &str) -> Vec<Op> {
    use crate::registry::Scope;
    let catalog = &state.catalog;
    let mut out = Vec::new();
    let mut visited = 0;
    match scope {
        Scope::Category => {
            if catalog.active_category(id).is_some() {
                whole_category(state, ctx, id, &mut visited, &mut out);
            }
        }
        Scope::Tag => {
            if let Some(tag) = catalog.active_tag(id)
                && let Some(owner) = catalog.active_category(&tag.category_id)
                && ctx.families.contains(FamilyId::VideoTagList)
            {
                let args = [tag.category_id.as_str(), tag.id.as_str()];
                whole_tag(state, ctx, &args, state.syms.get(&owner.id), &mut visited, &mut out);
            }
        }
        Scope::Channel => out = plan_homes(state, ctx, &BTreeSet::from([id.to_string()]), None, &mut Vec::new()).ops,
        Scope::Video => {
            let sel = Selection {
                categories: Some(Default::default()),
                tags: Some(Default::default()),
                channels: Some(Default::default()),
                videos: Some(std::iter::once(id.to_string()).collect()),
            };
            let walk = |f: &mut dyn FnMut(Member<'_>)| {
                visit(state, catalog, &sel, f);
            };
            out = plan_selected(walk, catalog, ctx, &sel);
        }
        Scope::Global => {}
    }
    out
}

/// An active category's count, index and list, whole.
fn whole_category(state: &State, ctx: &PlanCtx, id: &str, visited: &mut usize, out: &mut Vec<Op>) {
    let scored: Vec<(i64, String)> =
        state.members().ranked_of_category(state.syms.get(id)).map(|(added, w)| (added, w.text())).collect();
    *visited += scored.len();
    let id = [id];
    ctx.emit(out, FamilyId::CategoryVideoCount, &id, Value::String(scored.len().to_string()));
    if ctx.families.contains(FamilyId::VideoCategoryList) {
        let ids = scored.iter().map(|(_, w)| w.clone()).collect();
        ctx.emit(out, FamilyId::VideoCategoryList, &id, Value::List(ids));
    }
    ctx.emit(out, FamilyId::VideoCategoryIndex, &id, Value::Zset(scored));
}

/// Patches an active category's index and list, and sets its count when
/// it moved. `false` (nothing planned) when a key's contents are not
/// known or a patch would not pay: the caller replaces them whole.
fn patch_category(state: &State, ctx: &PlanCtx, id: &str, deltas: &Deltas<'_>, out: &mut ScopePlan) -> bool {
    let sym = state.syms.get(id);
    let moves = deltas.category(sym);
    let now = state.members().count_of_category(sym);
    let Some(before) = moves.size_before(now) else { return false };
    let families = [FamilyId::VideoCategoryIndex, FamilyId::VideoCategoryList];
    let keys: Vec<_> =
        families.iter().filter(|f| ctx.families.contains(**f)).map(|f| ctx.keys.key(*f, &[id])).collect();
    // A key written whole or patched since the last load or job, whose
    // size agrees with the members: the cache holds the members before.
    if before == 0 || keys.iter().any(|k| state.existing.size(&k.text) != Some(before)) {
        return false;
    }
    let count_key = ctx.keys.key(FamilyId::CategoryVideoCount, &[id]).text;
    if moves.is_empty() {
        out.kept.extend(keys.into_iter().map(|k| k.text).chain([count_key]));
        return true;
    }
    out.visited += moves.left.len() + moves.joined.len();
    let mut patches = Vec::new();
    for key in keys {
        let patch = match key.family {
            FamilyId::VideoCategoryIndex => delta::zset_patch(key.clone(), before, &moves, deltas.step),
            _ => {
                let sym = sym.expect("a category with members is referenced");
                let after = |added, w: WidRef<'_>| {
                    delta::next_kept(state.members().after_in_category(sym, added, w), |_, _| true)
                };
                delta::list_patch(key.clone(), before, &moves, after, true, deltas.step)
            }
        };
        match patch {
            Some(patch) => patches.push(patch),
            None => return false,
        }
    }
    out.patches.extend(patches.into_iter().map(|p| (p, now)));
    if now != before {
        ctx.emit(&mut out.ops, FamilyId::CategoryVideoCount, &[id], Value::String(now.to_string()));
    } else {
        out.kept.push(count_key);
    }
    true
}

/// Patches a tag list (`args`: its category and tag) whose category
/// `owner` is active. `false` as for [`patch_category`].
fn patch_tag(
    state: &State,
    ctx: &PlanCtx,
    args: &[&str; 2],
    owner: Option<Sym>,
    deltas: &Deltas<'_>,
    out: &mut ScopePlan,
) -> bool {
    let key = ctx.keys.key(FamilyId::VideoTagList, args);
    let Some(before) = state.existing.size(&key.text).filter(|n| *n > 0) else { return false };
    let sym = state.syms.get(args[1]);
    let moves = deltas.tag(sym, owner);
    if moves.is_empty() {
        out.kept.push(key.text);
        return true;
    }
    let (Some(sym), Some(owner)) = (sym, owner) else { return false };
    let Some(now) = moves.size_after(before) else { return false };
    out.visited += moves.left.len() + moves.joined.len();
    let members = state.members();
    let in_owner = |added, w: WidRef<'_>| members.in_category(Some(owner), added, w);
    let after = |added, w: WidRef<'_>| delta::next_kept(members.after_in_tag(sym, added, w), in_owner);
    match delta::list_patch(key, before, &moves, after, false, deltas.step) {
        Some(patch) => {
            out.patches.push((patch, now));
            true
        }
        None => false,
    }
}

/// Visits the selected videos (distinct: a set) that are active. Gives
/// how many it visited.
fn visit(state: &State, catalog: &Catalog, sel: &Selection, f: &mut dyn FnMut(Member<'_>)) -> usize {
    let (mut cats, mut tags) = (Vec::new(), Vec::new());
    let mut refs = RefReport::default();
    let mut visited = 0;
    for w in sel.videos.iter().flatten() {
        let Some(v) = state.effective(w) else { continue };
        let cat_refs =
            distinct(v.cats.iter().copied()).into_iter().map(|c| catalog.active_category_index(state.name(c)));
        let tag_refs = distinct(v.tags.iter().copied()).into_iter().map(|t| {
            let tag = catalog.active_tag_index(state.name(t));
            tag.map(|i| (i, catalog.tag_category_index(i).filter(|&c| catalog.categories()[c].active)))
        });
        resolve(cat_refs, tag_refs, &mut refs, &mut cats, &mut tags);
        f(Member { id: w, added_ms: v.added_ms, cats: &cats, tags: &tags });
        visited += 1;
    }
    visited
}

fn put(out: &mut BatchPlan, ctx: &PlanCtx, family: FamilyId, args: &[&str], value: Value) {
    if ctx.families.contains(family) {
        out.changes.push(Change::Put(Op { key: ctx.keys.key(family, args), value }));
    }
}

fn delete(out: &mut BatchPlan, ctx: &PlanCtx, family: FamilyId, args: &[&str]) {
    if ctx.families.contains(family) {
        out.changes.push(Change::Delete(ctx.keys.key(family, args)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::Keys;

    /// Two categories flipped in one batch: their members' patches come
    /// out by flip, not by video id, so each flip is one run.
    #[test]
    fn set_patches_of_one_flip_go_together() {
        let keys = Keys::new("app:");
        let patch = |v: &str, edits: Vec<Edit>| Patch::new(keys.key(FamilyId::VideoCategories, &[v]), 2, edits, 0);
        let mut patches = [
            patch("v1", vec![Edit::SRem("c2".into())]),
            patch("v2", vec![Edit::SRem("c1".into()), Edit::SAdd("c3".into())]),
            patch("v3", vec![Edit::SRem("c1".into())]),
            patch("v4", vec![Edit::SAdd("c9".into())]),
            patch("v5", vec![Edit::SRem("c2".into())]),
            patch("v6", vec![Edit::SRem("c1".into())]),
        ];
        group_flips(&mut patches);
        let order: Vec<&str> = patches.iter().map(|p| p.key.text.rsplit(':').next().unwrap()).collect();
        assert_eq!(order, ["v4", "v3", "v6", "v1", "v5", "v2"]);
    }

    /// A flipped category's tags are found by place, and those of a
    /// category no longer in the catalogue by text, exactly as comparing
    /// every tag's `categoryId` with the flipped ids finds them.
    #[test]
    fn the_tags_of_flipped_categories_are_those_naming_them() {
        use mongodb::bson::{doc, rawdoc};
        let hex = |n: u8| format!("{:024x}", n);
        let categories: Vec<_> = ["c1".to_string(), "c2".to_string(), hex(0xab), "c1".to_string()]
            .iter()
            .map(|id| {
                mongodb::bson::RawDocumentBuf::from_document(&doc! {"_id": id, "name": "n", "seq": 1, "status": 1})
                    .unwrap()
            })
            .collect();
        // Owners: present, repeated, hex, a capitalised hex (another id),
        // and ids no category has (gone, or never there).
        let owners = ["c1", "c2", &hex(0xab), &hex(0xab).to_uppercase(), "gone", "never", "c1", "gone"];
        let tags: Vec<_> = owners
            .iter()
            .enumerate()
            .map(|(t, owner)| {
                let tag = doc! {"_id": format!("t{t}"), "name": "n", "seq": 1, "status": 1, "categoryId": *owner};
                mongodb::bson::RawDocumentBuf::from_document(&tag).unwrap()
            })
            .collect();
        let channels = [rawdoc! {"_id": "ch", "name": "n"}];
        let names = crate::config::Config::from_raw(crate::config::RawConfig::default()).unwrap().collections;
        let (catalog, _, _) = crate::plan::decode::decode_catalog(&names, &channels, &categories, &tags);
        let subsets: [&[&str]; 6] =
            [&[], &["c1"], &["c2", "gone"], &[&hex(0xab)], &["gone", "never", "nothing"], &["c1", "c2"]];
        for ids in subsets {
            let ids: BTreeSet<String> = ids.iter().map(|s| s.to_string()).collect();
            let by_place: Vec<&str> = tags_of_categories(&catalog, &ids).map(|t| t.id.as_str()).collect();
            let by_text: Vec<&str> =
                catalog.tags().iter().filter(|t| ids.contains(&t.category_id)).map(|t| t.id.as_str()).collect();
            assert_eq!(by_place, by_text, "flipped {ids:?}");
        }
        let ids: BTreeSet<String> = ["c2", "gone"].iter().map(|s| s.to_string()).collect();
        let found: Vec<&str> = tags_of_categories(&catalog, &ids).map(|t| t.id.as_str()).collect();
        assert_eq!(found, ["t1", "t4", "t7"]);
    }

    /// A value's digest frames each piece with its length and its type,
    /// so values that share a byte stream do not share a digest.
    #[test]
    fn digests_tell_apart_values_of_one_byte_stream() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let values = [
            Value::String("abc".into()),
            Value::String("ab".into()),
            Value::List(s(&["abc"])),
            Value::List(s(&["ab", "c"])),
            Value::List(s(&["a", "bc"])),
            Value::List(s(&["c", "ab"])),
            Value::Set(s(&["ab", "c"])),
            Value::List(vec![]),
            Value::Set(vec![]),
            Value::Zset(vec![(1, "ab".into())]),
            Value::Zset(vec![(2, "ab".into())]),
            Value::Zset(vec![(1, "a".into()), (1, "b".into())]),
        ];
        let digests: std::collections::HashSet<u128> = values.iter().map(digest).collect();
        assert_eq!(digests.len(), values.len());
        assert_eq!(digest(&Value::List(s(&["ab", "c"]))), digest(&values[3]));
    }

    /// Gathering pieces into blocks changes nothing: the digest is XXH3-128
    /// of the framed stream, for short streams, pieces that straddle a
    /// block, and a piece longer than one.
    #[test]
    fn a_digest_is_xxh3_of_the_framed_stream_whatever_the_blocks() {
        let framed = |tag: &[u8], pieces: &[&[u8]]| {
            let mut stream = Vec::new();
            for piece in std::iter::once(tag).chain(pieces.iter().copied()) {
                stream.extend_from_slice(&(piece.len() as u64).to_le_bytes());
                stream.extend_from_slice(piece);
            }
            xxhash_rust::xxh3::xxh3_128(&stream)
        };
        for sizes in [vec![], vec![3], vec![500], vec![497, 3, 9], vec![30; 40], vec![5, 2000, 7], vec![1 << 20]] {
            let items: Vec<String> =
                sizes.iter().enumerate().map(|(i, &n)| ((b'a' + i as u8 % 26) as char).to_string().repeat(n)).collect();
            let pieces: Vec<&[u8]> = items.iter().map(|i| i.as_bytes()).collect();
            assert_eq!(digest(&Value::List(items.clone())), framed(b"L", &pieces), "{sizes:?}");
        }
    }
}
