//! The continuous drift check: between batches, the leader's watcher
//! compares a few keys of every family with what a rebuild would write
//! for them, and rewrites through its fenced writer any key that another
//! writer, an eviction or a lost write left different.
//!
//! What a key should hold comes from the watcher's state: MongoDB as of
//! the changes the watcher applied, which is what the cache must hold
//! once those changes are written. The check runs only between batches
//! (nothing is in flight), never while the streams catch up with a load
//! or a job, and never while a failed batch's scopes are pending, so a
//! change the watcher has not applied yet, or is applying, is never
//! taken for drift. `video:detail` is the one family the state cannot
//! render (it keeps no payloads): its document is read again by `_id`,
//! compared only when what the state holds of it (status, `addedTime`,
//! references) is what the document says now, and a difference counts
//! only when it is still there, with the same document, on a second
//! look [`CONFIRM`] later.
//!
//! Keys are walked family by family in turn (so every family gets its
//! share of the rate), each family from a random starting point through
//! its scopes in order: on a small catalogue every key is seen within a
//! few rounds, on a big one a random sample. The scopes walked are those
//! the state knows (the catalogue's entities, the videos, and the keys it
//! knows the cache holds). A tenth of the keys of each round are drawn
//! from Redis instead (`RANDOMKEY`) and judged the same way: that is how
//! a key of a scope the state does not know, which another writer made,
//! is found and deleted.

use super::plan::{digest, plan_scope};
use super::state::{Held, IndexView, State};
use crate::keys::Key;
use crate::plan::{FamilySet, Op, PlanCtx, Value};
use crate::registry::{FamilyId, Registry, Scope};
use mongodb::bson::Bson;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// How often the check runs (its share of the rate each time).
pub const TICK: Duration = Duration::from_secs(1);

/// How long a detail payload that differed waits for its second look.
pub const CONFIRM: Duration = Duration::from_secs(3);

/// A key the check compares, and what it should hold (`None`: no key).
#[derive(Debug, Clone, PartialEq)]
pub struct Expected {
    pub key: Key,
    pub want: Option<Value>,
}

impl Expected {
    /// The write that makes the key hold what it should: the value, or
    /// its absence.
    pub fn change(&self) -> crate::plan::Change {
        match &self.want {
            Some(value) => crate::plan::Change::Put(Op { key: self.key.clone(), value: value.clone() }),
            None => crate::plan::Change::Delete(self.key.clone()),
        }
    }
}

/// An active video whose detail payload is compared with its document,
/// read again: the document's `_id`, and what the state holds of it.
#[derive(Debug, Clone)]
pub struct DetailProbe {
    pub key: Key,
    pub raw_id: Bson,
    pub view: IndexView,
}

/// A detail payload that differed from its document once: compared again
/// after [`CONFIRM`], it is drift only if it still differs from the same
/// rendering.
#[derive(Debug, Clone)]
pub struct Suspect {
    pub probe: DetailProbe,
    pub want: u128,
    pub since: Instant,
}

/// What the check carries from one round to the next.
#[derive(Debug)]
pub struct Drift {
    per_minute: u64,
    /// Keys owed to the rate, carried between rounds (the rate per round
    /// need not be whole).
    owed: f64,
    /// The next family in turn.
    turn: usize,
    /// Where each family's walk stands.
    cursors: HashMap<FamilyId, usize>,
    /// The catalogue families' keys, planned and known extra, by family;
    /// dropped when the catalogue changes.
    catalog: Option<HashMap<FamilyId, Vec<Expected>>>,
    pub suspects: Vec<Suspect>,
}

impl Drift {
    /// A check of `per_minute` keys a minute; `None` when it is off (0).
    pub fn new(per_minute: u64) -> Option<Drift> {
        (per_minute > 0).then(|| Drift {
            per_minute,
            owed: 0.0,
            turn: 0,
            cursors: HashMap::new(),
            catalog: None,
            suspects: Vec::new(),
        })
    }

    /// How many keys this round checks: the rate's share of one tick.
    pub fn due(&mut self) -> usize {
        self.owed += self.per_minute as f64 * TICK.as_secs_f64() / 60.0;
        let n = self.owed.floor();
        self.owed -= n;
        n as usize
    }

    /// Forgets the planned catalogue keys (the catalogue changed, or the
    /// state was reloaded).
    pub fn forget_catalog(&mut self) {
        self.catalog = None;
    }

    /// Suspects due for their second look, taken out.
    pub fn due_suspects(&mut self, now: Instant) -> Vec<Suspect> {
        let (due, later) = std::mem::take(&mut self.suspects).into_iter().partition(|s| now >= s.since + CONFIRM);
        self.suspects = later;
        due
    }

    /// Draws `n` scopes, families in turn, and gives the keys they make
    /// with what each should hold, and the detail payloads to compare
    /// with their documents. Pure: reads the state only.
    pub fn draw(&mut self, state: &State, ctx: &PlanCtx, n: usize) -> (Vec<Expected>, Vec<DetailProbe>) {
        let families: Vec<FamilyId> = ctx.families.iter().collect();
        let (mut keys, mut probes) = (Vec::new(), Vec::new());
        if families.is_empty() {
            return (keys, probes);
        }
        let registry = Registry::get();
        for _ in 0..n {
            let family = families[self.turn % families.len()];
            self.turn = self.turn.wrapping_add(1);
            let cursor = self.cursors.entry(family).or_insert_with(|| rand::random_range(0..1 << 20));
            let at = *cursor;
            *cursor = cursor.wrapping_add(1);
            let scope = registry.family(family).scope.as_slice();
            match scope {
                [Scope::Global] => {
                    let planned = self.catalog.get_or_insert_with(|| catalog_keys(state, ctx));
                    if let Some(list) = planned.get(&family).filter(|l| !l.is_empty()) {
                        keys.push(list[at % list.len()].clone());
                    }
                }
                [Scope::Video] => {
                    let Some(w) = video_at(state, at) else { continue };
                    let key = ctx.keys.key(family, &[&w]);
                    if family == FamilyId::VideoDetail {
                        match state.detail_probe(&w) {
                            Some((raw_id, view)) => probes.push(DetailProbe { key, raw_id, view }),
                            None => keys.push(Expected { key, want: None }),
                        }
                    } else {
                        keys.extend(scope_keys(state, ctx, family, Scope::Video, &w));
                    }
                }
                _ => {
                    // A tag's list is the tag's; the others are their
                    // first entity's.
                    let kind = if scope.contains(&Scope::Tag) { Scope::Tag } else { scope[0] };
                    let Some(id) = entity_at(state, kind, at) else { continue };
                    keys.extend(scope_keys(state, ctx, family, kind, &id));
                }
            }
        }
        (keys, probes)
    }
}

impl Drift {
    /// What an existing key drawn at random from Redis should hold, when
    /// it is one of the selected families: planned (compared like a drawn
    /// key) or not planned (`want: None`, an extra key, which the walk
    /// of known scopes would never meet: another writer's
    /// `category:by-id:nosuch`). `None` for a key that is not the
    /// contract's, and for an active video's detail, which only its
    /// document can judge.
    pub fn judge_existing(&mut self, state: &State, ctx: &PlanCtx, key: &str) -> Option<Expected> {
        judge_key(state, ctx, key, &mut self.catalog)
    }
}

/// What `key` should hold now, when it is one of the selected families
/// (see [`Drift::judge_existing`]); `catalog` caches the catalogue
/// families' keys between calls on one state.
pub fn judge_key(
    state: &State,
    ctx: &PlanCtx,
    key: &str,
    catalog: &mut Option<HashMap<FamilyId, Vec<Expected>>>,
) -> Option<Expected> {
    let (family, args) = ctx.keys.parse(key)?;
    if !ctx.families.contains(family) {
        return None;
    }
    let extra = || Expected { key: Key { family, text: key.to_string() }, want: None };
    let scope = Registry::get().family(family).scope.as_slice();
    let planned = match scope {
        [Scope::Global] => {
            let planned = catalog.get_or_insert_with(|| catalog_keys(state, ctx));
            planned.get(&family).into_iter().flatten().cloned().collect()
        }
        [Scope::Video] if family == FamilyId::VideoDetail => {
            return state.detail_probe(args.first()?).is_none().then(extra);
        }
        [Scope::Video] => scope_keys(state, ctx, family, Scope::Video, args.first()?),
        _ => {
            let kind = if scope.contains(&Scope::Tag) { Scope::Tag } else { scope[0] };
            let at = scope.iter().position(|s| *s == kind)?;
            scope_keys(state, ctx, family, kind, args.get(at)?)
        }
    };
    Some(planned.into_iter().find(|e| e.key.text == key).unwrap_or_else(extra))
}

/// The written id of a video in the walk's `at`-th slot, or the next
/// one that holds a video (a few slots on, at most).
fn video_at(state: &State, at: usize) -> Option<String> {
    let slots = state.videos.slots();
    (0..slots.min(64)).find_map(|i| state.videos.written_at((at + i) % slots).map(|w| w.text()))
}

/// The id of the `at`-th entity of a kind: the catalogue's, then those
/// the cache holds keys of and the catalogue lacks.
fn entity_at(state: &State, kind: Scope, at: usize) -> Option<String> {
    let c = &state.catalog;
    let (listed, held) = match kind {
        Scope::Category => (c.categories().len(), &state.existing.by_category),
        Scope::Tag => (c.tags().len(), &state.existing.by_tag),
        Scope::Channel => (c.channels().len(), &state.existing.by_channel),
        Scope::Global | Scope::Video => return None,
    };
    let total = listed + held.len();
    if total == 0 {
        return None;
    }
    let at = at % total;
    if at >= listed {
        return held.keys().nth(at - listed).cloned();
    }
    Some(match kind {
        Scope::Category => c.categories()[at].id.clone(),
        Scope::Tag => c.tags()[at].id.clone(),
        _ => c.channels()[at].id.clone(),
    })
}

/// The keys of `family` one scope makes (what a rebuild writes), and the
/// keys of it the cache is known to hold that it no longer makes.
fn scope_keys(state: &State, ctx: &PlanCtx, family: FamilyId, kind: Scope, id: &str) -> Vec<Expected> {
    let planned: Vec<Op> = plan_scope(state, ctx, kind, id).into_iter().filter(|op| op.key.family == family).collect();
    let held = match kind {
        Scope::Category => state.existing.by_category.get(id),
        Scope::Tag => state.existing.by_tag.get(id),
        Scope::Channel => state.existing.by_channel.get(id),
        Scope::Global | Scope::Video => None,
    };
    let gone: Vec<Expected> = held
        .into_iter()
        .flatten()
        .filter(|k| ctx.keys.classify(k) == Some(family) && !planned.iter().any(|op| &op.key.text == *k))
        .map(|k| Expected { key: Key { family, text: k.clone() }, want: None })
        .collect();
    planned.into_iter().map(|op| Expected { key: op.key, want: Some(op.value) }).chain(gone).collect()
}

/// The catalogue families' keys by family: what a rebuild writes, and
/// the keys the cache is known to hold that it no longer writes.
fn catalog_keys(state: &State, ctx: &PlanCtx) -> HashMap<FamilyId, Vec<Expected>> {
    let families = FamilySet::of(ctx.families.iter().filter(|f| !f.needs_videos()));
    let ctx = PlanCtx { families, ..ctx.clone() };
    // The shared values the watcher keeps, not computed again per check.
    let whole = crate::plan::CatalogScope::All;
    let mut refs = crate::model::report::RefReport::default();
    let ops = crate::plan::plan_catalog_with(&state.catalog, &state.derived, &ctx, &whole, &mut refs);
    let planned: std::collections::HashSet<&str> = ops.iter().map(|op| op.key.text.as_str()).collect();
    let mut out: HashMap<FamilyId, Vec<Expected>> = HashMap::new();
    for key in state.existing.catalog.iter().filter(|k| !planned.contains(k.as_str())) {
        if let Some(family) = ctx.keys.classify(key).filter(|f| families.contains(*f)) {
            out.entry(family).or_default().push(Expected { key: Key { family, text: key.clone() }, want: None });
        }
    }
    for op in ops {
        out.entry(op.key.family).or_default().push(Expected { key: op.key, want: Some(op.value) });
    }
    out
}

/// The detail payload a document makes, when what the state holds of
/// its video is what the document says now; `None` otherwise (the
/// document changed and the watcher has not applied it yet, or it is no
/// longer an active video).
pub fn detail_of(state: &State, probe: &DetailProbe, doc: &mongodb::bson::RawDocument) -> Option<String> {
    let video = super::model::decode(doc).ok()?;
    let (added_ms, cats, tags) = &probe.view;
    let names = |syms: &[crate::model::compact::Sym]| -> Vec<&str> { syms.iter().map(|s| state.name(*s)).collect() };
    let same = video.active
        && video.added_ms == *added_ms
        && video.category_ids.iter().eq(names(cats))
        && video.tag_ids.iter().eq(names(tags));
    same.then_some(video.detail).flatten()
}

/// What a repaired key now holds, for the state's record of the cache:
/// a tracked key's value digest and size, or its absence.
pub fn record_repair(state: &mut State, ctx: &PlanCtx, expected: &Expected) {
    match &expected.want {
        Some(value) => {
            let held = Held { digest: Some(digest(value)), size: value.elements() };
            state.existing.insert(&ctx.keys, &expected.key.text, Some(held));
        }
        None => state.existing.remove(&ctx.keys, &expected.key.text),
    }
}

/// A digest of a detail payload, to know a second look saw the same one.
pub fn detail_digest(detail: &str) -> u128 {
    digest(&Value::String(detail.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rate_is_kept_across_rounds() {
        let mut drift = Drift::new(90).unwrap();
        let first: usize = (0..60).map(|_| drift.due()).sum();
        assert_eq!(first, 90, "a minute of rounds checks the minute's keys");
        assert!(Drift::new(0).is_none(), "0 turns the check off");
    }

    #[test]
    fn suspects_wait_for_their_second_look() {
        let mut drift = Drift::new(60).unwrap();
        let now = Instant::now();
        let probe = DetailProbe {
            key: Key { family: FamilyId::VideoDetail, text: "app:video:detail:v1".into() },
            raw_id: Bson::String("v1".into()),
            view: (0, Box::default(), Box::default()),
        };
        drift.suspects.push(Suspect { probe, want: 1, since: now });
        assert!(drift.due_suspects(now + CONFIRM / 2).is_empty());
        assert_eq!(drift.due_suspects(now + CONFIRM).len(), 1);
        assert!(drift.suspects.is_empty());
    }
}
