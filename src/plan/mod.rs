//! The planner: pure functions from decoded entities to Redis writes as
//! data. No clients, no clock, no randomness; the sink executes the plan.
//!
//! - [`channel`], [`category`], [`tag`]: the catalogue families;
//! - [`video`]: the video families and `category:video:count`;
//! - [`order`]: the contract's sort orders;
//! - [`text`]: JavaScript string rules (trim, lowercase).

pub mod category;
pub mod channel;
pub mod order;
pub mod tag;
pub mod text;
pub mod video;

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
const ELEMENT_COST: usize = 600;

/// The cost of a key beyond its value: the commands of its replace
/// (`SET … EX`, or `DEL`, the adds and `EXPIRE`) and the key itself.
const KEY_COST: usize = 2_000;

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
            Value::Set(m) | Value::List(m) => m.iter().map(|s| s.len() + ELEMENT_COST).sum(),
            Value::Zset(m) => m.iter().map(|(_, s)| s.len() + 2 * ELEMENT_COST).sum(),
        }
    }
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
}

impl Change {
    pub fn key(&self) -> &Key {
        match self {
            Change::Put(op) => &op.key,
            Change::Delete(key) => key,
        }
    }

    /// What this change costs Redis (see [`Op::cost`]); a delete is one
    /// command on its key.
    pub fn cost(&self) -> usize {
        match self {
            Change::Put(op) => op.cost(),
            Change::Delete(key) => key.text.len() + KEY_COST,
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
    /// `so_far`. An empty batch takes any key: a key's replace is never
    /// cut, so a key above the budget goes alone.
    pub fn admits(&self, keys: usize, so_far: usize, cost: usize) -> bool {
        keys == 0 || (keys < self.max_keys && so_far + cost <= self.max_cost)
    }

    /// Whether a batch of `keys` keys costing `cost` takes no more.
    pub fn is_full(&self, keys: usize, cost: usize) -> bool {
        keys >= self.max_keys || cost >= self.max_cost
    }

    /// `changes` cut, in order, into runs that each fit the budget.
    pub fn cut<'a>(&self, changes: &'a [Change]) -> Vec<&'a [Change]> {
        let mut runs = Vec::new();
        let (mut start, mut cost) = (0, 0);
        for (i, change) in changes.iter().enumerate() {
            let this = change.cost();
            if !self.admits(i - start, cost, this) {
                runs.push(&changes[start..i]);
                (start, cost) = (i, 0);
            }
            cost += this;
        }
        if start < changes.len() {
            runs.push(&changes[start..]);
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
    let mut out = Vec::new();
    let mut refs = RefReport::default();
    let derived = category::Derived::new(catalog, &mut refs);
    channel::plan(catalog, &derived, ctx, &mut out, &mut refs);
    category::plan(catalog, &derived, ctx, &mut out);
    tag::plan(catalog, &derived, ctx, &mut out);
    (out, refs)
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

    proptest! {
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
