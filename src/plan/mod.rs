//! The planner: pure functions from decoded entities to Redis writes as
//! data. No clients, no clock, no randomness; the sink executes the plan.
//!
//! - [`channel`], [`category`], [`tag`]: the catalogue families;
//! - [`video`]: the video families and `category:video:count`;
//! - [`order`]: the contract's sort orders;
//! - [`patch`]: the watcher's in-place edits of big collections;
//! - [`text`]: JavaScript string rules (trim, lowercase).

pub mod category;
pub mod channel;
pub mod decode;
pub mod index;
pub mod order;
pub mod patch;
pub mod scope;
pub mod tag;
pub mod text;
pub mod video;

pub use decode::{PlannedRun, decode_catalog, plan_in_memory};
pub use scope::{CatalogArg, CatalogKeys, CatalogScope};

use crate::keys::{Key, Keys};
use crate::model::catalog::Catalog;
use crate::model::report::RefReport;
use crate::registry::{FamilyId, HomeSection, Registry, Tier};

/// A key's whole new value. Collections replace the old value atomically.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    String(String),
    Set(Vec<String>),
    /// Elements in order, head first.
    List(Vec<String>),
    /// `(score, member)` pairs.
    Zset(Vec<(i64, String)>),
}

/// The cost of one collection element beyond its bytes (see
/// [`Value::cost`]); measured with `LATENCY HISTOGRAM exec` at 58K.
pub(crate) const ELEMENT_COST: usize = 600;

/// The cost of a key beyond its value: the commands of its replace
/// (`SET … EX`, or `DEL`, the adds and `EXPIRE`) and the key itself.
pub(crate) const KEY_COST: usize = 2_000;

impl Value {
    pub fn redis_type(&self) -> crate::registry::RedisType {
        use crate::registry::RedisType;
        match self {
            Value::String(_) => RedisType::String,
            Value::Set(_) => RedisType::Set,
            Value::List(_) => RedisType::List,
            Value::Zset(_) => RedisType::Zset,
        }
    }

    /// What writing this value costs Redis, in byte-equivalents (about a
    /// nanosecond each): its bytes, plus a fixed cost per element, which
    /// dominates for collections of short ids (a sorted-set member costs
    /// about twice a set member: skiplist and dict). Batches are bounded by
    /// this, so one `MULTI`/`EXEC` blocks readers for a bounded time
    /// whatever mix of keys it carries.
    pub fn cost(&self) -> usize {
        match self {
            Value::String(s) => s.len(),
            _ => (0..self.elements()).map(|i| self.element_cost(i)).sum(),
        }
    }

    /// How many elements a collection holds as planned (a string: none).
    pub fn elements(&self) -> usize {
        match self {
            Value::String(_) => 0,
            Value::Set(m) | Value::List(m) => m.len(),
            Value::Zset(m) => m.len(),
        }
    }

    /// What writing element `i` of a collection costs (see [`Value::cost`]).
    pub fn element_cost(&self, i: usize) -> usize {
        match self {
            Value::String(_) => 0,
            Value::Set(m) | Value::List(m) => m[i].len() + ELEMENT_COST,
            Value::Zset(m) => m[i].1.len() + 2 * ELEMENT_COST,
        }
    }
}

/// What adding one member `m` to a set costs Redis (see [`Value::cost`]).
pub fn set_member_cost(m: &str) -> usize {
    m.len() + ELEMENT_COST
}

/// One planned write: the key and its new value. The TTL tier comes from
/// the key's family.
#[derive(Debug, Clone, PartialEq)]
pub struct Op {
    pub key: Key,
    pub value: Value,
}

impl Op {
    /// What replacing this key costs Redis (see [`Value::cost`]), the key
    /// and its commands included.
    pub fn cost(&self) -> usize {
        self.value.cost() + self.key.text.len() + KEY_COST
    }
}

impl Op {
    /// Whether this key's replace is written in steps: a collection whose
    /// replace costs more than one atomic unit may carry (`max_cost`). Its
    /// elements then fill a stage key a step at a time, and one more step
    /// renames the stage onto the key (see `sink::stage`).
    pub fn is_staged(&self, max_cost: usize) -> bool {
        !matches!(self.value, Value::String(_)) && self.cost() > max_cost
    }

    /// The elements of each step of a staged write, in order: every step
    /// costs at most `max_cost` with its key and commands, and holds at
    /// least one element.
    pub fn steps(&self, max_cost: usize) -> Vec<std::ops::Range<usize>> {
        let room = max_cost.saturating_sub(self.key.text.len() + KEY_COST);
        let mut steps = Vec::new();
        let (mut start, mut cost) = (0, 0);
        for i in 0..self.value.elements() {
            let this = self.value.element_cost(i);
            if i > start && cost + this > room {
                steps.push(start..i);
                (start, cost) = (i, 0);
            }
            cost += this;
        }
        if start < self.value.elements() {
            steps.push(start..self.value.elements());
        }
        steps
    }

    pub fn tier(&self) -> Tier {
        Registry::get().family(self.key.family).tier
    }
}

/// An incremental write, as the watcher plans it.
#[derive(Debug, Clone, PartialEq)]
pub enum Change {
    /// Replace the key whole (as a rebuild writes it).
    Put(Op),
    /// The key must not exist.
    Delete(Key),
    /// Edit the key in place (the watcher's few-member changes of a big
    /// sorted set or list), in one atomic step.
    Patch(patch::Patch),
}

impl Change {
    pub fn key(&self) -> &Key {
        match self {
            Change::Put(op) => &op.key,
            Change::Delete(key) => key,
            Change::Patch(patch) => &patch.key,
        }
    }

    /// What this change costs Redis (see [`Op::cost`]); a delete is one
    /// command on its key.
    pub fn cost(&self) -> usize {
        match self {
            Change::Put(op) => op.cost(),
            Change::Delete(key) => key.text.len() + KEY_COST,
            Change::Patch(patch) => patch.cost,
        }
    }
}

/// What one transaction may carry: keys, and Redis cost (see
/// [`Op::cost`]). The rebuild's batches and the watcher's follow the same
/// rule, so a reader never waits behind a long `MULTI`/`EXEC` from either.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxBudget {
    pub max_keys: usize,
    pub max_cost: usize,
}

impl TxBudget {
    /// Whether a key costing `cost` joins a batch of `keys` keys costing
    /// `so_far`. An empty batch takes any key, so a key above the budget
    /// goes alone (the sink then writes it in steps, see [`Op::steps`]).
    pub fn admits(&self, keys: usize, so_far: usize, cost: usize) -> bool {
        keys == 0 || (keys < self.max_keys && so_far + cost <= self.max_cost)
    }

    /// Whether a batch of `keys` keys costing `cost` takes no more.
    pub fn is_full(&self, keys: usize, cost: usize) -> bool {
        keys >= self.max_keys || cost >= self.max_cost
    }

    /// `changes` cut, in order, into runs that each fit the budget.
    pub fn cut<'a>(&self, changes: &'a [Change]) -> Vec<&'a [Change]> {
        self.cut_by(changes, Change::cost)
    }

    /// `items` cut, in order, into runs that each fit the budget, an
    /// item costing `cost_of` (a run holds at least one item).
    pub fn cut_by<'a, T>(&self, items: &'a [T], cost_of: impl Fn(&T) -> usize) -> Vec<&'a [T]> {
        let mut runs = Vec::new();
        let (mut start, mut cost) = (0, 0);
        for (i, item) in items.iter().enumerate() {
            let this = cost_of(item);
            if !self.admits(i - start, cost, this) {
                runs.push(&items[start..i]);
                (start, cost) = (i, 0);
            }
            cost += this;
        }
        if start < items.len() {
            runs.push(&items[start..]);
        }
        runs
    }
}

/// A set of families, e.g. from `--only`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FamilySet(u64);

impl FamilySet {
    pub fn all() -> FamilySet {
        FamilySet::of(FamilyId::ALL.iter().copied())
    }

    pub fn of(families: impl IntoIterator<Item = FamilyId>) -> FamilySet {
        FamilySet(families.into_iter().fold(0, |acc, f| acc | (1 << f as u64)))
    }

    pub fn contains(self, family: FamilyId) -> bool {
        self.0 & (1 << family as u64) != 0
    }

    pub fn iter(self) -> impl Iterator<Item = FamilyId> {
        FamilyId::ALL.iter().copied().filter(move |f| self.contains(*f))
    }

    pub fn needs_videos(self) -> bool {
        self.iter().any(FamilyId::needs_videos)
    }
}

/// What the planner needs besides the entities: the key prefix, the
/// tag-search prefix lengths, the home sections and the selected families.
#[derive(Debug, Clone)]
pub struct PlanCtx {
    pub keys: Keys,
    pub search_lengths: Vec<usize>,
    pub home_sections: Vec<HomeSection>,
    pub families: FamilySet,
}

impl PlanCtx {
    /// Records a write unless its family is not selected or it would be an
    /// empty collection (those are not written; the sweep removes old ones).
    pub fn emit(&self, out: &mut Vec<Op>, family: FamilyId, args: &[&str], value: Value) {
        if !self.families.contains(family) {
            return;
        }
        let empty = match &value {
            Value::String(_) => false,
            Value::Set(m) | Value::List(m) => m.is_empty(),
            Value::Zset(m) => m.is_empty(),
        };
        if !empty {
            out.push(Op { key: self.keys.key(family, args), value });
        }
    }
}

/// Plans every catalogue family (channel, category and tag keys that do
/// not depend on videos).
pub fn plan_catalog(catalog: &Catalog, ctx: &PlanCtx) -> (Vec<Op>, RefReport) {
    plan_catalog_in(catalog, ctx, &CatalogScope::All)
}

/// Plans the catalogue keys `scope` covers, each exactly as
/// [`plan_catalog`] does. The dangling references counted are those of
/// what was planned.
pub fn plan_catalog_in(catalog: &Catalog, ctx: &PlanCtx, scope: &CatalogScope) -> (Vec<Op>, RefReport) {
    let mut refs = RefReport::default();
    let derived = category::Derived::new(catalog, &mut refs);
    let out = plan_catalog_with(catalog, &derived, ctx, scope, &mut refs);
    (out, refs)
}

/// [`plan_catalog_in`] with the shared values already computed (the
/// watcher keeps them between batches: see [`category::Derived::update`]).
pub fn plan_catalog_with(
    catalog: &Catalog,
    derived: &category::Derived,
    ctx: &PlanCtx,
    scope: &CatalogScope,
    refs: &mut RefReport,
) -> Vec<Op> {
    let mut out = Vec::new();
    channel::plan(catalog, derived, ctx, scope, &mut out, refs);
    category::plan(catalog, derived, ctx, scope, &mut out);
    tag::plan(catalog, derived, ctx, scope, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::{Change, Op, TxBudget, Value};
    use crate::keys::Keys;
    use crate::registry::FamilyId;
    use proptest::prelude::*;

    fn change(keys: &Keys, i: usize, bytes: usize) -> Change {
        let key = keys.key(FamilyId::VideoDetail, &[&format!("v{i}")]);
        if bytes == 0 { Change::Delete(key) } else { Change::Put(Op { key, value: Value::String("x".repeat(bytes)) }) }
    }

    #[test]
    fn a_change_above_the_budget_goes_alone_and_small_ones_fill_runs() {
        let keys = Keys::new("app:");
        let budget = TxBudget { max_keys: 3, max_cost: 10_000 };
        let changes: Vec<Change> =
            [100, 100, 0, 100, 50_000, 100].iter().enumerate().map(|(i, &b)| change(&keys, i, b)).collect();
        let sizes: Vec<usize> = budget.cut(&changes).iter().map(|run| run.len()).collect();
        // Three keys fill the first run (the key limit), the big put runs
        // alone, then what is left.
        assert_eq!(sizes, vec![3, 1, 1, 1]);
        assert!(budget.cut(&[]).is_empty());
    }

    #[test]
    fn a_big_collection_is_written_in_steps_within_the_budget() {
        let keys = Keys::new("app:");
        let key = keys.key(FamilyId::VideoCategoryIndex, &["c1"]);
        let members: Vec<(i64, String)> = (0..100).map(|i| (i, format!("v{i:02}"))).collect();
        let op = Op { key, value: Value::Zset(members) };
        // 100 members of 1,203 each; 10,000 leaves room for six after the
        // key's own cost.
        assert!(op.is_staged(10_000));
        let steps = op.steps(10_000);
        assert_eq!(steps.len(), 17);
        assert_eq!(steps[0], 0..6);
        assert_eq!(steps.last(), Some(&(96..100)));
        assert!(!op.is_staged(op.cost()));
        let string = Op { key: keys.key(FamilyId::TagAll, &[]), value: Value::String("x".repeat(50_000)) };
        assert!(!string.is_staged(10_000), "a string is one command: never staged");
    }

    proptest! {
        /// The steps cover every element once, in order; each fits the
        /// budget or holds a single element.
        #[test]
        fn steps_cover_the_elements_in_order(
            lens in proptest::collection::vec(1usize..3_000, 1..300),
            max_cost in 1usize..40_000,
        ) {
            let keys = Keys::new("app:");
            let items: Vec<String> = lens.iter().map(|&n| "x".repeat(n)).collect();
            let op = Op { key: keys.key(FamilyId::VideoCategoryList, &["c"]), value: Value::List(items) };
            let steps = op.steps(max_cost);
            let mut next = 0;
            for step in &steps {
                prop_assert_eq!(step.start, next);
                prop_assert!(step.end > step.start);
                let cost: usize = step.clone().map(|i| op.value.element_cost(i)).sum();
                prop_assert!(step.len() == 1 || cost + op.key.text.len() + super::KEY_COST <= max_cost);
                next = step.end;
            }
            prop_assert_eq!(next, lens.len());
        }

        /// Cutting keeps every change, in order, and each run of more than
        /// one change fits the budget.
        #[test]
        fn runs_keep_order_and_fit_the_budget(
            sizes in proptest::collection::vec(0usize..20_000, 0..200),
            max_keys in 1usize..50,
            max_cost in 1usize..60_000,
        ) {
            let keys = Keys::new("app:");
            let changes: Vec<Change> = sizes.iter().enumerate().map(|(i, &b)| change(&keys, i, b)).collect();
            let budget = TxBudget { max_keys, max_cost };
            let runs = budget.cut(&changes);
            let rejoined: Vec<Change> = runs.iter().flat_map(|run| run.iter().cloned()).collect();
            prop_assert_eq!(&rejoined, &changes);
            for run in &runs {
                prop_assert!(!run.is_empty());
                let cost: usize = run.iter().map(Change::cost).sum();
                prop_assert!(run.len() == 1 || (run.len() <= max_keys && cost <= max_cost));
            }
        }
    }
}
