//! Incremental refresh equals a full rebuild, without servers (quickwit's
//! `proptest_merge_policy` is the model): random sequences of every change
//! the contract names go through the watcher's state and planner into an
//! in-memory key-value store, with failures between planning and
//! committing (some of the writes landed, the state is rolled back) and
//! restarts from the saved position (the state reloaded from the current
//! documents, what the cache holds scanned again). At the end the store
//! equals the full plan of the final documents, key for key: value, type
//! and TTL tier.

mod common;

use cachewright::config::Config;
use cachewright::plan::patch::Edit;
use cachewright::plan::plan_in_memory;
use cachewright::plan::{Change, FamilySet, Op, PlanCtx, TxBudget};
use cachewright::rebuild::plan_ctx;
use cachewright::registry::Tier;
use cachewright::watch::model::{Coll, Event, decode_on_arrival, id_key};
use cachewright::watch::plan::{RedisView, Shape, plan_batch};
use cachewright::watch::protocol::{self, Step as WriteStep};
use cachewright::watch::state::{Existing, Scopes, State, tracked_families};
use common::render::Content;
use indexmap::IndexMap;
use mongodb::bson::{Bson, DateTime, Document, RawDocumentBuf, doc};
use proptest::prelude::*;
use std::collections::{BTreeMap, BTreeSet};

/// The cache: key → (contents, tier).
type Store = BTreeMap<String, (Content, Tier)>;

fn config() -> Config {
    common::golden_config()
}

/// One atomic unit on a cluster: a script's share of the write budget.
fn cluster_unit(cfg: &Config) -> usize {
    cfg.write_batch_cost / cachewright::sink::cluster::SCRIPT_BUDGET_DIVISOR
}

/// One change to MongoDB.
#[derive(Debug, Clone)]
enum Step {
    Put(Coll, u8, Document),
    Delete(Coll, u8),
    /// Apply up to this many pending events as one batch.
    Flush(usize),
    /// The next batch fails after planning: a prefix of its writes lands.
    FailNext(usize),
    /// The watcher restarts from its saved position.
    Restart,
    /// A scheduled job rebuilds and sweeps from the current documents
    /// while the watcher is paused with its state kept (`serve`).
    Job,
}

fn pick<T: Clone + std::fmt::Debug + 'static>(items: Vec<T>) -> impl Strategy<Value = T> {
    proptest::sample::select(items)
}

fn status() -> impl Strategy<Value = Bson> {
    prop_oneof![4 => Just(Bson::Int32(1)), 1 => Just(Bson::Int32(0)), 1 => Just(Bson::Double(1.0))]
}

fn ids(prefix: &'static str, n: u8, most: usize) -> impl Strategy<Value = Vec<Bson>> {
    proptest::collection::vec((0..n + 1).prop_map(move |i| Bson::String(format!("{prefix}{i}"))), 0..=most)
}

fn refs(prefix: &'static str, n: u8) -> impl Strategy<Value = Bson> {
    ids(prefix, n, 3)
        .prop_map(|ids| Bson::Array(ids.into_iter().map(|id| Bson::Document(doc! { "id": id, "name": "n" })).collect()))
}

fn channel() -> impl Strategy<Value = Document> {
    (pick(vec!["A", "B", "a"]), refs("c", 4), refs("t", 5)).prop_map(
        |(name, categories, tags)| doc! { "name": name, "landingUrl": "u", "categories": categories, "tags": tags },
    )
}

fn category() -> impl Strategy<Value = Document> {
    (pick(vec!["One", "Two", "one"]), 0i32..3, status())
        .prop_map(|(name, seq, status)| doc! { "name": name, "seq": seq, "status": status, "subtitle": Bson::Null })
}

fn tag() -> impl Strategy<Value = Document> {
    (pick(vec!["Ab", "abc", " Ba"]), 0i32..3, status(), 0u8..5).prop_map(
        |(name, seq, status, c)| doc! { "name": name, "seq": seq, "status": status, "categoryId": format!("c{c}") },
    )
}

fn video() -> impl Strategy<Value = Document> {
    (ids("c", 4, 3), ids("t", 5, 3), status(), proptest::option::of(0i64..4), any::<bool>(), pick(vec!["x", "y"]))
        .prop_map(|(cats, tags, status, added, legacy, title)| {
            let mut d = doc! { "title": title, "listStatus": status, "tagIds": tags };
            if let Some(t) = added {
                d.insert("addedTime", DateTime::from_millis(t * 1000));
            }
            if legacy {
                d.insert("categoryId", cats.first().cloned().unwrap_or(Bson::String("bad id".into())));
            } else {
                d.insert("categoryIds", cats);
            }
            d
        })
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        20 => step_without_restarts(8),
        1 => Just(Step::Restart),
        1 => Just(Step::Job),
    ]
}

/// Every step but restarts and jobs, over `videos` video documents (see
/// [`doc_id`]).
fn step_without_restarts(videos: u8) -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => (0u8..videos, video()).prop_map(|(i, d)| Step::Put(Coll::Video, i, d)),
        2 => (0u8..videos).prop_map(|i| Step::Delete(Coll::Video, i)),
        2 => (0u8..5, category()).prop_map(|(i, d)| Step::Put(Coll::Category, i, d)),
        1 => (0u8..5).prop_map(|i| Step::Delete(Coll::Category, i)),
        2 => (0u8..6, tag()).prop_map(|(i, d)| Step::Put(Coll::Tag, i, d)),
        1 => (0u8..6).prop_map(|i| Step::Delete(Coll::Tag, i)),
        2 => (0u8..3, channel()).prop_map(|(i, d)| Step::Put(Coll::Channel, i, d)),
        1 => (0u8..3).prop_map(|i| Step::Delete(Coll::Channel, i)),
        4 => (1usize..5).prop_map(Step::Flush),
        1 => (0usize..40).prop_map(Step::FailNext),
    ]
}

/// Mostly video changes over 40 documents, flushed a dozen at a time:
/// scopes of a dozen members or more, several of them moving per batch.
fn step_in_big_scopes() -> impl Strategy<Value = Step> {
    prop_oneof![
        12 => (0u8..40, video()).prop_map(|(i, d)| Step::Put(Coll::Video, i, d)),
        3 => (0u8..40).prop_map(|i| Step::Delete(Coll::Video, i)),
        1 => (0u8..5, category()).prop_map(|(i, d)| Step::Put(Coll::Category, i, d)),
        1 => (0u8..6, tag()).prop_map(|(i, d)| Step::Put(Coll::Tag, i, d)),
        2 => (4usize..16).prop_map(Step::Flush),
        1 => (0usize..40).prop_map(Step::FailNext),
    ]
}

fn prefix_of(coll: Coll) -> &'static str {
    match coll {
        Coll::Channel => "ch",
        Coll::Category => "c",
        Coll::Tag => "t",
        Coll::Video => "v",
    }
}

/// MongoDB: the four collections in natural order.
#[derive(Default)]
struct Mongo([IndexMap<String, RawDocumentBuf>; 4]);

/// A document's `_id`. Videos 4 and 5 are ObjectIds and videos 6 and 7
/// strings of other hex digits: ids the watcher keeps as 12 bytes, next
/// to ids it keeps as text. Videos 8 and 9 are strings of the same hex as
/// 4 and 5: two documents writing one id (the first in natural order owns
/// it).
fn doc_id(coll: Coll, i: u8) -> Bson {
    const HEX: [&str; 4] = [
        "65a1b2c3d4e5f6a7b8c9d0e1",
        "0000000000000000000000a5",
        "ffffffffffffffffffffff00",
        "65a1b2c3d4e5f6a7b8c9d0e0",
    ];
    match (coll, i) {
        (Coll::Video, 4 | 5) => Bson::ObjectId(mongodb::bson::oid::ObjectId::parse_str(HEX[i as usize - 4]).unwrap()),
        (Coll::Video, 6 | 7) => Bson::String(HEX[i as usize - 4].to_string()),
        (Coll::Video, 8 | 9) => Bson::String(HEX[i as usize - 8].to_string()),
        _ => Bson::String(format!("{}{i}", prefix_of(coll))),
    }
}

impl Mongo {
    fn apply(&mut self, step: &Step) -> Option<Event> {
        match step {
            Step::Put(coll, i, body) => {
                let raw_id = doc_id(*coll, *i);
                let mut d = doc! { "_id": raw_id.clone() };
                d.extend(body.clone());
                let raw = RawDocumentBuf::from_document(&d).unwrap();
                self.0[*coll as usize].insert(format!("{raw_id:?}"), raw.clone());
                // Decoded as the stream task decodes an event's document.
                let decoded = decode_on_arrival(*coll, Some(&raw));
                Some(Event::Upsert { coll: *coll, key: id_key(&raw_id), raw_id, doc: raw, decoded })
            }
            Step::Delete(coll, i) => {
                let raw_id = doc_id(*coll, *i);
                self.0[*coll as usize].shift_remove(&format!("{raw_id:?}"))?;
                Some(Event::Remove { coll: *coll, key: id_key(&raw_id), raw_id })
            }
            _ => None,
        }
    }

    /// A document as it is now, as the engine reads one by id.
    fn look_up(&self, coll: Coll, raw_id: Bson) -> Event {
        match self.0[coll as usize].get(&format!("{raw_id:?}")) {
            Some(doc) => Event::Upsert { coll, key: id_key(&raw_id), raw_id, doc: doc.clone(), decoded: None },
            None => Event::Remove { coll, key: id_key(&raw_id), raw_id },
        }
    }

    fn docs(&self, coll: Coll) -> Vec<RawDocumentBuf> {
        self.0[coll as usize].values().cloned().collect()
    }

    fn full_plan(&self, cfg: &Config) -> Vec<Op> {
        let d = |c| self.docs(c);
        let ctx = plan_ctx(cfg, FamilySet::all());
        plan_in_memory(&ctx, &cfg.collections, &d(Coll::Channel), &d(Coll::Category), &d(Coll::Tag), &d(Coll::Video))
            .ops
    }

    fn load(&self, cfg: &Config) -> State {
        let d = |c| self.docs(c);
        State::load(&cfg.collections, d(Coll::Channel), d(Coll::Category), d(Coll::Tag), d(Coll::Video))
    }
}

fn write(store: &mut Store, change: &Change) {
    match change {
        Change::Put(op) => {
            store.insert(op.key.text.clone(), (Content::from_value(&op.value), op.tier()));
        }
        Change::Delete(key) => {
            store.remove(&key.text);
        }
        // The store holds only what the engine wrote, so a patch that
        // does not apply is a planning error.
        Change::Patch(patch) => match patch.apply(store.get(&patch.key.text).map(|(c, _)| c.to_value())) {
            Ok(Some(value)) => drop(store.insert(patch.key.text.clone(), (Content::from_value(&value), patch.tier()))),
            Ok(None) => drop(store.remove(&patch.key.text)),
            Err(err) => panic!("a patch did not apply: {err}"),
        },
    }
}

/// What the watcher reads of the cache at start-up.
fn scan(store: &Store, ctx: &PlanCtx) -> Existing {
    let mut existing = Existing::default();
    for key in store.keys() {
        if ctx.keys.classify(key).is_some_and(|f| tracked_families().contains(f)) {
            existing.insert(&ctx.keys, key, None);
        }
    }
    existing
}

/// What the watcher reads of the cache for a batch's videos.
fn redis_view(store: &Store, ctx: &PlanCtx, videos: impl Iterator<Item = String>) -> RedisView {
    use cachewright::registry::FamilyId;
    let mut view = RedisView::default();
    for w in videos {
        if let Some((Content::Set(members), _)) = store.get(&ctx.keys.key(FamilyId::VideoCategories, &[&w]).text) {
            view.categories.insert(w.clone(), members.iter().cloned().collect::<BTreeSet<_>>());
        }
        if let Some((Content::String(detail), _)) = store.get(&ctx.keys.key(FamilyId::VideoDetail, &[&w]).text) {
            view.details.insert(w.clone(), detail.clone());
        }
    }
    view
}

fn render(store: &Store) -> String {
    let mut out = String::new();
    for (key, (content, tier)) in store {
        out.push_str(&format!("{key} {tier:?} {content:?}\n"));
    }
    out
}

/// [`run_with`] for a sink that writes collections by commands, then for
/// one that restores them (which writes a flip's members' sets whole).
fn run(initial: Vec<Step>, steps: Vec<Step>) -> Result<(), TestCaseError> {
    run_with(initial.clone(), steps.clone(), None, false)?;
    run_with(initial, steps, None, true)
}

/// Runs `steps` after `initial` as the watcher would, with patches cut
/// into steps costing at most `patch_step` instead of the
/// configuration's unit, and collections restored whole or not.
fn run_with(
    initial: Vec<Step>,
    steps: Vec<Step>,
    patch_step: Option<usize>,
    restore: bool,
) -> Result<(), TestCaseError> {
    let cfg = config();
    let ctx = plan_ctx(&cfg, FamilySet::all());
    // A cluster script's share of the budget by default, the smaller of
    // the sink's two units.
    let shape = Shape { patch_step: patch_step.unwrap_or(cluster_unit(&cfg)), restore };
    let mut mongo = Mongo::default();
    for s in &initial {
        mongo.apply(s);
    }
    // A rebuild, then the watcher starts from what it wrote.
    let mut store = Store::new();
    for op in mongo.full_plan(&cfg) {
        write(&mut store, &Change::Put(op));
    }
    let mut state = mongo.load(&cfg);
    state.existing = scan(&store, &ctx);
    // The load saw everything logged so far (nothing yet).
    let mut loaded_at = 0usize;
    let mut log: Vec<Event> = Vec::new();
    let mut saved = 0usize;
    let mut fail_next: Option<usize> = None;

    // `saved` is the position this process resumes from in memory;
    // `persisted` the one saved in Redis, which a restart starts from.
    let mut persisted = 0usize;
    // The pending scopes as Redis holds them (`cdc:pending`).
    let mut pending = Scopes::default();
    let batch = |state: &mut State,
                 mongo: &Mongo,
                 store: &mut Store,
                 log: &[Event],
                 saved: &mut usize,
                 persisted: &mut usize,
                 pending: &mut Scopes,
                 loaded_at: &usize,
                 take: usize,
                 fail: Option<usize>| {
        let events: Vec<Event> = log[*saved..(*saved + take).min(log.len())].to_vec();
        if events.is_empty() {
            return Ok::<(), TestCaseError>(());
        }
        let n = events.len();
        let before = state_fingerprint(state);
        // The streams pass the load with the batch that reaches it.
        state.replayed = state.catching_up;
        let caught_up = state.catching_up && *saved + n >= *loaded_at;
        if caught_up {
            state.catching_up = false;
        }
        let mut applied = state.apply(events);
        // As the engine: an owner whose detail the state does not know
        // (loaded without one) is read again from MongoDB.
        let missing: Vec<Bson> = applied.videos.keys().filter_map(|w| state.needs_detail(w)).collect();
        for raw_id in missing {
            applied.absorb(state.apply(vec![mongo.look_up(Coll::Video, raw_id)]));
        }
        let view = redis_view(store, &ctx, applied.videos.keys().cloned());
        let plan = plan_batch(state, &applied, &view, &ctx, shape);
        // The engine's steps, in its order; a failure stops them after
        // `landed` transactions (the state is rolled back even when all
        // of them landed: the reply was lost).
        let budget = TxBudget { max_keys: 3, max_cost: 4_000 };
        let mut units = 0usize;
        let limit = fail.unwrap_or(usize::MAX);
        'steps: for step in protocol::steps(&plan, budget, state.clears_pending(&applied)) {
            match step {
                WriteStep::Pending(members) => {
                    if units >= limit {
                        break 'steps;
                    }
                    pending.extend(&Scopes::from_members(members));
                    units += 1;
                }
                WriteStep::Runs(runs) => {
                    for run in runs {
                        if units >= limit {
                            break 'steps;
                        }
                        run.iter().for_each(|change| write(store, change));
                        units += 1;
                    }
                }
                WriteStep::Tokens { changes, clear } => {
                    if units >= limit {
                        break 'steps;
                    }
                    changes.iter().for_each(|change| write(store, change));
                    *persisted = *saved + n;
                    if clear {
                        *pending = Scopes::default();
                    }
                }
            }
        }
        if fail.is_some() {
            state.abort(applied, &ctx.keys, &plan.record);
            prop_assert_eq!(before, state_fingerprint(state), "undo left the state changed");
        } else {
            state.commit(applied, &ctx.keys, &plan.record);
            *saved += n;
            if caught_up {
                // As the engine: keys whose size is the state's count as
                // known from here on (later batches patch them).
                let wanted = state.unknown_patchable(&ctx.keys);
                let size = |key: &String| store.get(key).map_or(0, |(c, _)| c.to_value().elements());
                let found: Vec<usize> = wanted.iter().map(|(key, _, _)| size(key)).collect();
                state.trust_sizes(wanted, &found);
            }
        }
        Ok(())
    };

    for s in &steps {
        match s {
            Step::Put(..) | Step::Delete(..) => log.extend(mongo.apply(s)),
            Step::Flush(take) => batch(
                &mut state,
                &mongo,
                &mut store,
                &log,
                &mut saved,
                &mut persisted,
                &mut pending,
                &loaded_at,
                *take,
                fail_next.take(),
            )?,
            Step::FailNext(landed) => fail_next = Some(*landed),
            Step::Job => {
                // The job writes every key from its own read and sweeps
                // the rest; the watcher resumes from its tokens with its
                // state as it was.
                store = Store::new();
                let mut names = Vec::new();
                for op in mongo.full_plan(&cfg) {
                    if tracked_families().contains(op.key.family) {
                        names.push(op.key.text.clone());
                    }
                    write(&mut store, &Change::Put(op));
                }
                state.existing.replace(&ctx.keys, tracked_families(), &names);
                // The cache is now ahead of the kept state until the
                // replay passes the job's read.
                state.catching_up = true;
                loaded_at = log.len();
            }
            Step::Restart => {
                // Lost: the in-memory state and position. Kept: the cache
                // and the saved tokens; later events are replayed.
                state = mongo.load(&cfg);
                state.existing = scan(&store, &ctx);
                state.dirty = pending.clone();
                saved = persisted;
                loaded_at = log.len();
            }
        }
    }
    // The streams go idle: a batch without events recomputes what is
    // still dirty.
    while saved < log.len() || !state.dirty.is_empty() {
        batch(&mut state, &mongo, &mut store, &log, &mut saved, &mut persisted, &mut pending, &loaded_at, 3, None)?;
    }
    let mut expected = Store::new();
    for op in mongo.full_plan(&cfg) {
        write(&mut expected, &Change::Put(op));
    }
    let (got, want) = (render(&store), render(&expected));
    if got != want {
        let diff = similar::TextDiff::from_lines(&want, &got).unified_diff().context_radius(0).to_string();
        return Err(TestCaseError::fail(format!(
            "incremental differs from a full rebuild (- full, + incremental):\n{diff}"
        )));
    }
    Ok(())
}

/// A comparable summary of the state's documents (what undo must restore).
fn state_fingerprint(state: &State) -> String {
    let docs: Vec<Vec<(String, String)>> = state
        .catalog_docs
        .iter()
        .map(|m| m.iter().map(|(k, d)| (format!("{k:?}"), format!("{d:?}"))).collect())
        .collect();
    let names = |syms: &[u32]| syms.iter().map(|&s| state.name(s).to_string()).collect::<Vec<_>>();
    let videos: BTreeMap<String, String> = state
        .videos
        .entries()
        .map(|(k, doc)| {
            let doc = doc.map(|d| (d.active, d.added_ms, names(d.cats), names(d.tags)));
            (format!("{k:?}"), format!("{doc:?}"))
        })
        .collect();
    let owners: BTreeMap<String, String> =
        state.videos.written_ids().into_iter().map(|(w, keys)| (w.text(), format!("{keys:?}"))).collect();
    let cats: Vec<(&String, bool)> = state.catalog.categories().iter().map(|c| (&c.id, c.active)).collect();
    format!("{docs:?}\n{videos:?}\n{owners:?}\n{cats:?}")
}

fn cases() -> u32 {
    std::env::var("WATCH_PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(2000)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), max_shrink_iters: 2000, ..ProptestConfig::default() })]

    #[test]
    fn incremental_refresh_equals_a_full_rebuild(
        initial in proptest::collection::vec(step(), 0..30),
        steps in proptest::collection::vec(step(), 1..40),
    ) {
        run(initial, steps)?;
    }

    /// Two documents writing one id (an ObjectId and a string of its hex),
    /// with faults, without restarts and jobs. A restart replays events
    /// the load already holds, and a replayed delete and re-insert of the
    /// id's first document moves it behind the second: which one owns
    /// the id can then differ from MongoDB's natural order until the next
    /// full rebuild (see the README's known limits).
    #[test]
    fn two_documents_with_one_written_id_follow_natural_order(
        initial in proptest::collection::vec(step_without_restarts(10), 0..30),
        steps in proptest::collection::vec(step_without_restarts(10), 1..40),
    ) {
        run(initial, steps)?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases() / 4, max_shrink_iters: 2000, ..ProptestConfig::default() })]

    /// Categories of a dozen members or more, and patches cut into steps
    /// of one or two members each (a sorted-set edit costs about 1,200, a
    /// step's key 2,000): a key's steps land in order, with faults
    /// between them.
    #[test]
    fn patches_in_small_steps_equal_a_full_rebuild(
        initial in proptest::collection::vec(step_in_big_scopes(), 20..80),
        steps in proptest::collection::vec(step_in_big_scopes(), 1..80),
    ) {
        run_with(initial, steps, Some(4_000), false)?;
    }
}

#[test]
fn a_restart_after_deletes_while_down_removes_their_keys() {
    // The case seen: a channel, a category, a tag and a video are deleted
    // while the watcher is down; it restarts from its saved position.
    let initial = vec![
        Step::Put(Coll::Category, 0, doc! { "name": "C", "seq": 1, "status": 1 }),
        Step::Put(Coll::Tag, 0, doc! { "name": "T", "seq": 1, "status": 1, "categoryId": "c0" }),
        Step::Put(
            Coll::Channel,
            0,
            doc! { "name": "Ch", "landingUrl": "u", "categories": [{"id": "c0"}], "tags": [{"id": "t0"}] },
        ),
        Step::Put(Coll::Video, 0, doc! { "title": "v", "listStatus": 1, "categoryIds": ["c0"], "tagIds": ["t0"] }),
    ];
    let steps = vec![
        Step::Restart,
        Step::Delete(Coll::Channel, 0),
        Step::Delete(Coll::Tag, 0),
        Step::Delete(Coll::Category, 0),
        Step::Delete(Coll::Video, 0),
        Step::Restart,
    ];
    run(initial, steps).unwrap();
}

#[test]
fn a_restart_after_a_shorter_replay_of_a_failed_batch_leaves_no_stale_tag_list_member() {
    // Found by the property test (its seed is in the regressions file;
    // this keeps the case if the generators change). A batch moving
    // video 4 out of tag t1 fails after its video's detail landed; the
    // replay's first batch holds only video 0, and the watcher restarts
    // before video 4's event is saved again: t1's list must not keep it.
    let video =
        |tags: Vec<&str>, cats: Vec<&str>| doc! { "title": "x", "listStatus": 1, "tagIds": tags, "categoryIds": cats };
    let steps = vec![
        Step::Put(Coll::Category, 0, doc! { "name": "One", "seq": 0, "status": 1, "subtitle": Bson::Null }),
        Step::Put(Coll::Tag, 1, doc! { "name": "Ab", "seq": 0, "status": 1, "categoryId": "c0" }),
        Step::Put(Coll::Video, 4, video(vec!["t1"], vec!["c0"])),
        Step::Flush(3),
        Step::Put(Coll::Video, 0, video(vec![], vec![])),
        Step::FailNext(7),
        Step::Put(Coll::Video, 4, video(vec![], vec![])),
        Step::Flush(2),
        Step::Flush(1),
        Step::Restart,
    ];
    run(vec![], steps).unwrap();
}

/// A state of two categories with `n` active videos each, caught up with
/// a cache the full plan wrote.
fn two_categories(n: usize) -> (Mongo, State, Store) {
    let cfg = config();
    let ctx = plan_ctx(&cfg, FamilySet::all());
    let mut mongo = Mongo::default();
    for c in 0..2u8 {
        mongo.apply(&Step::Put(Coll::Category, c, doc! { "name": format!("C{c}"), "seq": 1, "status": 1 }));
        mongo.apply(&Step::Put(
            Coll::Tag,
            c,
            doc! { "name": format!("T{c}"), "seq": 1, "status": 1, "categoryId": format!("c{c}") },
        ));
    }
    mongo.apply(&Step::Put(Coll::Channel, 0, doc! { "name": "Ch", "landingUrl": "u", "categories": [{"id": "c1"}] }));
    for i in 0..2 * n {
        let c = i % 2;
        let body = doc! { "_id": format!("w{i}"), "title": "x", "listStatus": 1, "categoryIds": [format!("c{c}")], "tagIds": [format!("t{c}")], "addedTime": DateTime::from_millis(i as i64) };
        mongo.0[Coll::Video as usize].insert(format!("w{i}"), RawDocumentBuf::from_document(&body).unwrap());
    }
    let mut store = Store::new();
    for op in mongo.full_plan(&cfg) {
        write(&mut store, &Change::Put(op));
    }
    let mut state = mongo.load(&cfg);
    state.existing = scan(&store, &ctx);
    state.catching_up = false;
    state.replayed = false;
    (mongo, state, store)
}

/// Applies one batch of steps as the engine does for a sink that writes
/// collections by commands, checks the result against a full rebuild,
/// and gives the plan.
fn one_batch(
    mongo: &mut Mongo,
    state: &mut State,
    store: &mut Store,
    steps: &[Step],
) -> cachewright::watch::plan::BatchPlan {
    one_batch_restoring(mongo, state, store, steps, false)
}

/// [`one_batch`], for a sink that restores collections or not.
fn one_batch_restoring(
    mongo: &mut Mongo,
    state: &mut State,
    store: &mut Store,
    steps: &[Step],
    restore: bool,
) -> cachewright::watch::plan::BatchPlan {
    let cfg = config();
    let ctx = plan_ctx(&cfg, FamilySet::all());
    let events: Vec<Event> = steps.iter().filter_map(|s| mongo.apply(s)).collect();
    let applied = state.apply(events);
    let view = redis_view(store, &ctx, applied.videos.keys().cloned());
    let plan = plan_batch(state, &applied, &view, &ctx, Shape { patch_step: cluster_unit(&cfg), restore });
    for change in plan.changes.iter().chain(plan.later.iter().flatten()).chain(&plan.last) {
        write(store, change);
    }
    let mut expected = Store::new();
    for op in mongo.full_plan(&cfg) {
        write(&mut expected, &Change::Put(op));
    }
    assert!(render(store) == render(&expected), "the batch left the cache unlike a full rebuild");
    state.commit(applied, &ctx.keys, &plan.record);
    plan
}

#[test]
fn a_batch_visits_only_the_members_of_the_scopes_it_touched() {
    let n = 3_000;
    let (mut mongo, mut state, mut store) = two_categories(n);
    // An upload into c0: c0's members and the video, never c1's (c0 is
    // in no channel, so no home section reads c1 either).
    let upload = doc! { "title": "new", "listStatus": 1, "categoryIds": ["c0"], "tagIds": ["t0"], "addedTime": DateTime::from_millis(1 << 40) };
    let plan = one_batch(&mut mongo, &mut state, &mut store, &[Step::Put(Coll::Video, 20, upload)]);
    // c0's members and t0's (every c0 video carries t0), and the upload:
    // the keys were scanned, so their contents are unknown and they are
    // replaced whole.
    assert_eq!(plan.visited, 2 * (n + 1) + 1, "c0's and t0's members and the upload, never c1's");
    // Now the watcher knows what they hold: the next upload is a patch of
    // c0's index and list and of t0's list, visiting the upload alone.
    let upload = doc! { "title": "newer", "listStatus": 1, "categoryIds": ["c0"], "tagIds": ["t0"], "addedTime": DateTime::from_millis(1 << 41) };
    let plan = one_batch(&mut mongo, &mut state, &mut store, &[Step::Put(Coll::Video, 21, upload)]);
    let patched: Vec<&str> = plan
        .changes
        .iter()
        .filter_map(|c| match c {
            Change::Patch(p) => Some(p.key.text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(patched.len(), 3, "c0's index and list and t0's list are patched: {patched:?}");
    assert_eq!(plan.visited, 3, "the upload, once per scope and once for its own keys");
    // Deleting a video of c0 in the middle is a patch too.
    let plan = one_batch(&mut mongo, &mut state, &mut store, &[Step::Delete(Coll::Video, 21)]);
    assert!(plan.changes.iter().any(|c| matches!(c, Change::Patch(_))) && plan.visited <= 3, "{}", plan.visited);
    // A status flip of one video in c1: c1's members, and c1's first
    // 500 again for the channel's home section (visited once).
    let flip = doc! { "title": "x", "listStatus": 0, "categoryIds": ["c1"], "tagIds": ["t1"] };
    let plan = one_batch(&mut mongo, &mut state, &mut store, &[Step::Put(Coll::Video, 1, flip)]);
    assert!(plan.visited <= n, "visited {} for a change in c1", plan.visited);
}

/// A home section follows from what it listed and the batch's videos:
/// a video below its last one leaves it unwritten, a newer one enters
/// it, and when a listed one leaves, what comes next is read from the
/// members. Each batch is checked against a full rebuild.
#[test]
fn a_home_section_follows_from_what_it_listed_and_the_moved_videos() {
    let (mut mongo, mut state, mut store) = two_categories(20);
    let cfg = config();
    let ctx = plan_ctx(&cfg, FamilySet::all());
    let home = ctx.keys.key(cachewright::registry::FamilyId::VideoListHome, &["ch0", "latest"]).text;
    let video = |cat: &str, ms: i64| doc! { "title": "x", "listStatus": 1, "categoryIds": [cat], "addedTime": DateTime::from_millis(ms) };
    let mut batch = |steps: &[Step]| {
        let plan = one_batch(&mut mongo, &mut state, &mut store, steps);
        let write = plan.changes.iter().find(|c| c.key().text == home);
        let written = write.is_some();
        let patched = write.and_then(|c| match c {
            Change::Patch(p) => Some(p.edits.clone()),
            _ => None,
        });
        let listed: Vec<String> =
            state.existing.home_list(&home).into_iter().flatten().map(|(_, w)| w.text()).collect();
        (written, listed, patched)
    };
    // The channel lists c1's videos (odd `w`, `addedTime` = their number), 3 of them.
    let (written, listed, _) = batch(&[Step::Put(Coll::Video, 20, video("c1", 100))]);
    assert!(written);
    assert_eq!(listed, ["v20", "w39", "w37"]);
    let (written, listed, _) = batch(&[Step::Put(Coll::Video, 21, video("c1", 5))]);
    assert!(!written, "a video below the last listed one changes nothing");
    assert_eq!(listed, ["v20", "w39", "w37"]);
    let (written, listed, patched) = batch(&[Step::Put(Coll::Video, 21, video("c1", 200))]);
    assert!(written);
    assert_eq!(listed, ["v21", "v20", "w39"]);
    // Known to hold what it listed, the section is patched: the video
    // that joined, and the one it pushed out.
    assert_eq!(patched, Some(vec![Edit::ZAdd(200, "v21".into()), Edit::ZRem("w37".into())]));
    let (_, listed, patched) = batch(&[Step::Put(Coll::Video, 20, video("c1", 1))]);
    assert_eq!(listed, ["v21", "w39", "w37"], "w37 comes back from the members");
    assert_eq!(patched, None, "a merged section is written whole");
    let (_, listed, _) = batch(&[Step::Delete(Coll::Video, 21), Step::Put(Coll::Video, 22, video("c0", 1000))]);
    assert_eq!(listed, ["w39", "w37", "w35"]);
    let (written, _, _) = batch(&[Step::Put(Coll::Video, 23, video("c0", 2000))]);
    assert!(!written, "a video of a category the channel does not list");
}

#[test]
fn a_big_category_renamed_touches_its_catalogue_keys_and_flipped_patches_its_members_sets() {
    let n = 9_000;
    let (mut mongo, mut state, mut store) = two_categories(n);
    let rename = doc! { "name": "Renamed", "seq": 1, "status": 1 };
    let plan = one_batch(&mut mongo, &mut state, &mut store, &[Step::Put(Coll::Category, 0, rename)]);
    assert_eq!(plan.visited, 0, "no video is visited for a rename");
    assert!(
        plan.record.scopes.videos.is_empty() && plan.record.scopes.memberships.is_empty(),
        "{:?}",
        plan.record.scopes.memberships
    );
    let written: Vec<&str> = plan.changes.iter().chain(&plan.last).map(|c| c.key().text.as_str()).collect();
    assert!(written.iter().all(|k| !k.contains("video:")), "{written:?}");
    // Turning it off changes its members' categories, and the pending
    // record still names the category, not its 9,000 videos.
    let off = doc! { "name": "Renamed", "seq": 1, "status": 0 };
    let plan = one_batch(&mut mongo, &mut state, &mut store, &[Step::Put(Coll::Category, 0, off)]);
    assert_eq!(plan.record.scopes.videos.len(), n);
    let pending = plan.record.scopes.to_members();
    assert!(pending.len() < 10 && pending.contains(&"cm:c0".to_string()), "{pending:?}");
    // Each member's set is patched from the flip alone: `SREM c0` from
    // one member (which empties it), then `SADD c0` into none.
    let sets = |plan: &cachewright::watch::plan::BatchPlan| -> Vec<(usize, Vec<Edit>)> {
        let family = |c: &&Change| c.key().family == cachewright::registry::FamilyId::VideoCategories;
        let mut out = Vec::new();
        for change in plan.changes.iter().chain(&plan.last).filter(family) {
            match change {
                Change::Patch(p) => out.push((p.before, p.edits.clone())),
                other => panic!("a member's set not patched: {other:?}"),
            }
        }
        out
    };
    let removed = sets(&plan);
    assert_eq!(removed.len(), n);
    assert!(removed.iter().all(|(before, edits)| *before == 1 && edits == &[Edit::SRem("c0".into())]));
    let on = doc! { "name": "Renamed", "seq": 1, "status": 1 };
    let plan = one_batch(&mut mongo, &mut state, &mut store, &[Step::Put(Coll::Category, 0, on)]);
    let added = sets(&plan);
    assert_eq!(added.len(), n);
    assert!(added.iter().all(|(before, edits)| *before == 0 && edits == &[Edit::SAdd("c0".into())]));
}

#[test]
fn a_sink_that_restores_writes_a_flipped_categorys_members_sets_whole() {
    let n = 2_000;
    let (mut mongo, mut state, mut store) = two_categories(n);
    let family = |c: &&Change| c.key().family == cachewright::registry::FamilyId::VideoCategories;
    // Off: each member's only category goes, so its set is deleted, not
    // patched empty.
    let off = doc! { "name": "C0", "seq": 1, "status": 0 };
    let plan = one_batch_restoring(&mut mongo, &mut state, &mut store, &[Step::Put(Coll::Category, 0, off)], true);
    let sets: Vec<&Change> = plan.changes.iter().chain(&plan.last).filter(family).collect();
    assert_eq!(sets.len(), n);
    assert!(sets.iter().all(|c| matches!(c, Change::Delete(_))), "{:?}", sets.first());
    assert_eq!(plan.visited, n, "each member read once");
    // On again: each member's set is written whole, one value, no guard.
    let on = doc! { "name": "C0", "seq": 1, "status": 1 };
    let plan = one_batch_restoring(&mut mongo, &mut state, &mut store, &[Step::Put(Coll::Category, 0, on)], true);
    let sets: Vec<&Change> = plan.changes.iter().chain(&plan.last).filter(family).collect();
    assert_eq!(sets.len(), n);
    let whole =
        |c: &&Change| matches!(c, Change::Put(op) if op.value == cachewright::plan::Value::Set(vec!["c0".into()]));
    assert!(sets.iter().all(whole), "{:?}", sets.first());
}
