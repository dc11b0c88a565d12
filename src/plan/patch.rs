//! Incremental writes to a collection: what the watcher sends instead of
//! a whole replace when a change touches a few members of a big sorted
//! set or list. A patch is data, like [`super::Op`]; the sink turns it
//! into commands that run in one atomic step, after a guard that the key
//! still holds the size the patch starts from (see `sink::pipeline`).
//!
//! [`Patch::apply`] is the same patch on an in-memory value: the
//! property test's store and the unit tests run it, so the order of the
//! edits (removals first, inserts from the tail) is checked where it is
//! decided.

use super::{ELEMENT_COST, KEY_COST, Value};
use crate::keys::Key;
use crate::registry::{RedisType, Registry, Tier};

/// What scanning one list entry costs Redis (`LREM` and `LINSERT` walk
/// the list up to the element or its pivot), in the units of
/// [`Value::cost`].
pub const SCAN_COST: usize = 4;

/// One edit of a patch, in the order it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Edit {
    /// `ZREM`: the member must be there.
    ZRem(String),
    /// `ZADD`: adds the member or moves it to the new score.
    ZAdd(i64, String),
    /// `LREM key 1`: the item must be there.
    LRem(String),
    /// `LREM key -1`: the same for an item in the list's back half, which
    /// Redis then walks from the tail (a list's items are distinct, so
    /// either end removes the same one).
    LRemLast(String),
    /// `LINSERT key BEFORE pivot item`: the pivot must be there.
    LInsert { item: String, pivot: String },
    /// `RPUSH`: the item goes last.
    RPush(String),
    /// `SADD`: the member must not be there yet.
    SAdd(String),
    /// `SREM`: the member must be there.
    SRem(String),
}

impl Edit {
    /// The member or item the edit adds, moves or removes.
    pub fn member(&self) -> &str {
        match self {
            Edit::ZRem(m)
            | Edit::ZAdd(_, m)
            | Edit::LRem(m)
            | Edit::LRemLast(m)
            | Edit::RPush(m)
            | Edit::SAdd(m)
            | Edit::SRem(m) => m,
            Edit::LInsert { item, .. } => item,
        }
    }

    /// What the edit costs Redis beyond the list entries it walks past.
    pub fn cost(&self) -> usize {
        match self {
            Edit::ZRem(m) | Edit::ZAdd(_, m) => m.len() + 2 * ELEMENT_COST,
            Edit::LRem(m) | Edit::LRemLast(m) | Edit::RPush(m) | Edit::SAdd(m) | Edit::SRem(m) => {
                m.len() + ELEMENT_COST
            }
            Edit::LInsert { item, pivot } => item.len() + pivot.len() + ELEMENT_COST,
        }
    }
}

/// A collection key changed in place: the size it holds before, the
/// edits in order, and what they cost Redis (the list scans included).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Patch {
    pub key: Key,
    pub before: usize,
    pub edits: Vec<Edit>,
    pub cost: usize,
}

impl Patch {
    /// A patch of `key` from `before` elements; `scans` is how many list
    /// entries its edits walk past in all (zero for a sorted set).
    pub fn new(key: Key, before: usize, edits: Vec<Edit>, scans: usize) -> Patch {
        let cost = edits.iter().map(Edit::cost).sum::<usize>() + scans * SCAN_COST + Patch::fixed_cost(&key);
        Patch { key, before, edits, cost }
    }

    /// What a patch of `key` costs beyond its edits and scans.
    pub fn fixed_cost(key: &Key) -> usize {
        key.text.len() + KEY_COST
    }

    pub fn tier(&self) -> Tier {
        Registry::get().family(self.key.family).tier
    }

    /// The command that reads the key's size, for the guard.
    pub fn size_command(&self) -> &'static str {
        match Registry::get().family(self.key.family).redis_type {
            RedisType::List => "LLEN",
            RedisType::Set => "SCARD",
            RedisType::String | RedisType::Zset => "ZCARD",
        }
    }

    /// The patch on an in-memory value (`None`: the key is missing):
    /// what Redis makes of it, an empty collection being no key. Fails,
    /// as the sink's guard does, when the value does not hold the size
    /// the patch starts from or lacks a member an edit needs.
    pub fn apply(&self, value: Option<Value>) -> Result<Option<Value>, String> {
        let size = |v: &Option<Value>| v.as_ref().map_or(0, Value::elements);
        if size(&value) != self.before {
            return Err(format!("{} holds {} elements, not {}", self.key.text, size(&value), self.before));
        }
        let lacks = |m: &str| Err(format!("{} lacks {m}", self.key.text));
        let mut value = value;
        for edit in &self.edits {
            match (edit, &mut value) {
                (Edit::ZRem(m), Some(Value::Zset(items))) => match items.iter().position(|(_, x)| x == m) {
                    Some(at) => drop(items.remove(at)),
                    None => return lacks(m),
                },
                (Edit::ZAdd(score, m), Some(Value::Zset(items))) => {
                    items.retain(|(_, x)| x != m);
                    items.push((*score, m.clone()));
                }
                (Edit::ZAdd(score, m), None) => value = Some(Value::Zset(vec![(*score, m.clone())])),
                (Edit::LRem(m), Some(Value::List(items))) => match items.iter().position(|x| x == m) {
                    Some(at) => drop(items.remove(at)),
                    None => return lacks(m),
                },
                (Edit::LRemLast(m), Some(Value::List(items))) => match items.iter().rposition(|x| x == m) {
                    Some(at) => drop(items.remove(at)),
                    None => return lacks(m),
                },
                (Edit::LInsert { item, pivot }, Some(Value::List(items))) => {
                    match items.iter().position(|x| x == pivot) {
                        Some(at) => items.insert(at, item.clone()),
                        None => return lacks(pivot),
                    }
                }
                (Edit::RPush(m), Some(Value::List(items))) => items.push(m.clone()),
                (Edit::RPush(m), None) => value = Some(Value::List(vec![m.clone()])),
                (Edit::SAdd(m), Some(Value::Set(items))) => match items.contains(m) {
                    true => return Err(format!("{} already holds {m}", self.key.text)),
                    false => items.push(m.clone()),
                },
                (Edit::SAdd(m), None) => value = Some(Value::Set(vec![m.clone()])),
                (Edit::SRem(m), Some(Value::Set(items))) => match items.iter().position(|x| x == m) {
                    Some(at) => drop(items.remove(at)),
                    None => return lacks(m),
                },
                (edit, _) => return Err(format!("{edit:?} does not apply to {}", self.key.text)),
            }
            if value.as_ref().is_some_and(|v| v.elements() == 0) {
                value = None;
            }
        }
        match &mut value {
            // A sorted set reads back by score, then member bytes.
            Some(Value::Zset(items)) => {
                items.sort_by(|(sa, a), (sb, b)| sa.cmp(sb).then_with(|| a.as_bytes().cmp(b.as_bytes())))
            }
            // A set has no order: sorted, so equal sets compare equal.
            Some(Value::Set(items)) => items.sort(),
            _ => {}
        }
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::Keys;
    use crate::registry::FamilyId;

    fn list(items: &[&str]) -> Option<Value> {
        Some(Value::List(items.iter().map(|s| s.to_string()).collect()))
    }

    #[test]
    fn list_edits_remove_first_then_insert_from_the_tail() {
        let key = Keys::new("app:").key(FamilyId::VideoCategoryList, &["c1"]);
        let edits = vec![
            Edit::LRem("b".into()),
            Edit::RPush("z".into()),
            Edit::LInsert { item: "y".into(), pivot: "z".into() },
            Edit::LInsert { item: "b".into(), pivot: "a".into() },
        ];
        let patch = Patch::new(key, 3, edits, 5);
        assert_eq!(patch.apply(list(&["b", "a", "c"])), Ok(list(&["b", "a", "c", "y", "z"])));
        assert!(patch.apply(list(&["a", "c"])).unwrap_err().contains("holds 2 elements, not 3"));
        assert!(patch.apply(list(&["x", "a", "c"])).unwrap_err().contains("lacks b"));
    }

    #[test]
    fn a_sorted_set_patch_moves_adds_and_removes_and_an_emptied_key_is_gone() {
        let key = Keys::new("app:").key(FamilyId::VideoCategoryIndex, &["c1"]);
        let before = Some(Value::Zset(vec![(1, "a".into()), (2, "b".into())]));
        let patch = Patch::new(key.clone(), 2, vec![Edit::ZAdd(5, "a".into()), Edit::ZAdd(0, "c".into())], 0);
        assert_eq!(
            patch.apply(before.clone()),
            Ok(Some(Value::Zset(vec![(0, "c".into()), (2, "b".into()), (5, "a".into())])))
        );
        let gone = Patch::new(key.clone(), 2, vec![Edit::ZRem("a".into()), Edit::ZRem("b".into())], 0);
        assert_eq!(gone.apply(before), Ok(None));
        let fresh = Patch::new(key, 0, vec![Edit::ZAdd(3, "n".into())], 0);
        assert_eq!(fresh.apply(None), Ok(Some(Value::Zset(vec![(3, "n".into())]))));
    }

    #[test]
    fn a_set_patch_adds_absent_members_and_removes_present_ones() {
        let key = Keys::new("app:").key(FamilyId::VideoCategories, &["v1"]);
        let set = |items: &[&str]| Some(Value::Set(items.iter().map(|s| s.to_string()).collect()));
        let patch = Patch::new(key.clone(), 2, vec![Edit::SAdd("c".into()), Edit::SRem("a".into())], 0);
        assert_eq!(patch.apply(set(&["b", "a"])), Ok(set(&["b", "c"])));
        assert!(patch.apply(set(&["a", "c"])).unwrap_err().contains("already holds c"));
        assert!(patch.apply(set(&["b", "d"])).unwrap_err().contains("lacks a"));
        let created = Patch::new(key.clone(), 0, vec![Edit::SAdd("c".into())], 0);
        assert_eq!(created.apply(None), Ok(set(&["c"])));
        let emptied = Patch::new(key, 1, vec![Edit::SRem("c".into())], 0);
        assert_eq!(emptied.apply(set(&["c"])), Ok(None));
    }

    #[test]
    fn a_patch_costs_its_edits_and_scans() {
        let key = Keys::new("app:").key(FamilyId::VideoCategoryList, &["c1"]);
        let small = Patch::new(key.clone(), 10, vec![Edit::RPush("v".into())], 0);
        let scanning = Patch::new(key, 10, vec![Edit::RPush("v".into())], 100);
        assert_eq!(scanning.cost - small.cost, 100 * SCAN_COST);
    }
}
