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
