//! Turns planned ops into one atomic unit of Redis commands.

use crate::config::TierSeconds;
use crate::plan::patch::{Edit, Patch};
use crate::plan::{Change, Op, Value};
use crate::sink::write::dump;
use crate::sink::write::unit::{Step, Unit};

/// Members per variadic command, so no single command grows unbounded.
const CHUNK: usize = 1000;

/// `base` plus up to `jitter × base` seconds, `u` being uniform in [0, 1).
pub fn ttl_with_jitter(base: u64, jitter: f64, u: f64) -> u64 {
    base + (u.clamp(0.0, 1.0) * jitter * base as f64).floor() as u64
}

/// Builds a MULTI/EXEC pipeline that replaces every key of `ops` whole,
/// as one node runs it: strings with `SET … EX`, collections with
/// `UNLINK` + adds + `EXPIRE` inside the transaction, so no reader sees
/// them missing or partial. `UNLINK`, not `DEL`: a big old value is freed
/// off Redis's main thread, not inside the transaction the readers wait
/// behind.
pub fn build_pipeline(ops: &[Op], ttl: &TierSeconds, jitter: f64, uniform: impl FnMut() -> f64) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.atomic();
    let mut unit = Unit::new();
    add_ops(&mut unit, ops, ttl, jitter, uniform, Replace::Commands);
    unit.append_to(&mut pipe);
    pipe
}

/// The same commands as [`build_pipeline`] without `MULTI`/`EXEC`: what
/// the benchmark replays with `redis-cli --pipe` as the physical limit.
pub fn build_commands(ops: &[Op], ttl: &TierSeconds, jitter: f64, uniform: impl FnMut() -> f64) -> redis::Pipeline {
    let mut unit = Unit::new();
    add_ops(&mut unit, ops, ttl, jitter, uniform, Replace::Commands);
    unit.into_pipeline()
}

/// Appends the watcher's incremental changes (whole replacements,
/// deletions and patches) to `unit`, which applies them all at once. The
/// patches go as one guarded step (see [`add_patch`]): the topology runs
/// it as one write script on one node (one `EVAL` per transaction, not
/// per key: its text travels with each call), whose guards are all
/// checked before any of them runs, and in the slots' scripts on a
/// cluster.
pub fn add_changes<'a>(
    unit: &mut Unit,
    changes: impl IntoIterator<Item = &'a Change>,
    ttl: &TierSeconds,
    jitter: f64,
    mut uniform: impl FnMut() -> f64,
    replace: Replace,
) {
    let mut patches = Step::default();
    for change in changes {
        match change {
            Change::Put(op) => add_ops(unit, std::slice::from_ref(op), ttl, jitter, &mut uniform, replace),
            Change::Delete(key) => {
                unit.cmd("UNLINK", &key.text);
            }
            Change::Patch(patch) => {
                let seconds = ttl_with_jitter(ttl.get(patch.tier()), jitter, uniform());
                add_patch(&mut patches, patch, seconds);
            }
        }
    }
    unit.guarded(patches);
}

/// A patch's commands: the size guard, the edits in order (a run of
/// `ZREM`, `ZADD`, `SADD` or `SREM` as one command, at most [`CHUNK`]
/// members), then the key's TTL, as a whole replace sets it. An emptied
/// key is gone and its `EXPIRE` does nothing, as a rebuild writes no
/// empty collection.
pub fn add_patch(step: &mut Step, patch: &Patch, seconds: u64) {
    let key = patch.key.text.as_str();
    step.cmd(crate::sink::cluster::SIZE_GUARD, key).arg(patch.size_command()).arg(patch.before);
    let mut edits = patch.edits.iter().peekable();
    while let Some(edit) = edits.next() {
        match edit {
            // Runs of one variadic command go as one command.
            Edit::ZRem(_) | Edit::ZAdd(..) | Edit::SAdd(_) | Edit::SRem(_) => {
                let cmd = step.cmd(variadic_name(edit), key);
                add_variadic(cmd, edit);
                let mut n = 1;
                let same = |e: &&Edit| std::mem::discriminant(*e) == std::mem::discriminant(edit);
                while n < CHUNK
                    && let Some(next) = edits.next_if(same)
                {
                    add_variadic(cmd, next);
                    n += 1;
                }
            }
            Edit::LRem(item) => drop(step.cmd("LREM", key).arg(1).arg(item)),
            Edit::LRemLast(item) => drop(step.cmd("LREM", key).arg(-1).arg(item)),
            Edit::LInsert { item, pivot } => drop(step.cmd("LINSERT", key).arg("BEFORE").arg(pivot).arg(item)),
            Edit::RPush(item) => drop(step.cmd("RPUSH", key).arg(item)),
        }
    }
    step.cmd("EXPIRE", key).arg(seconds);
}

/// The command of an edit that runs of its kind share.
fn variadic_name(edit: &Edit) -> &'static str {
    match edit {
        Edit::ZRem(_) => "ZREM",
        Edit::ZAdd(..) => "ZADD",
        Edit::SAdd(_) => "SADD",
        _ => "SREM",
    }
}

/// Appends a variadic edit's arguments to its command (a sorted-set
/// member's score first).
fn add_variadic(cmd: &mut redis::Cmd, edit: &Edit) {
    match edit {
        Edit::ZAdd(score, m) => drop(cmd.arg(*score).arg(m)),
        Edit::ZRem(m) | Edit::SAdd(m) | Edit::SRem(m) | Edit::LRem(m) | Edit::LRemLast(m) | Edit::RPush(m) => {
            cmd.arg(m);
        }
        Edit::LInsert { .. } => {}
    }
}

/// How a collection is replaced whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Replace {
    /// `UNLINK`, the adds, then `EXPIRE`.
    Commands,
    /// One `RESTORE key ttl value REPLACE` (see [`dump`]), for a user
    /// the ACL allows it (see `acl::Sink::may_restore`).
    Restore,
}

/// Appends the commands that replace every key of `ops` whole (see
/// [`build_pipeline`]) to `unit`.
///
/// The collections' old values go first, in one `UNLINK` of them all:
/// a rebuild's batch replaces a `video:categories` set per video, and a
/// command per key for its `UNLINK` was a quarter of the batch's commands,
/// each encoded, queued, answered twice (`QUEUED`, then in `EXEC`'s reply)
/// and parsed. Inside the transaction nothing can tell the two orders
/// apart, unless a key comes twice: then each keeps its own `UNLINK` in
/// its place.
pub fn add_ops<'a>(
    unit: &mut Unit,
    ops: impl IntoIterator<Item = &'a Op>,
    ttl: &TierSeconds,
    jitter: f64,
    mut uniform: impl FnMut() -> f64,
    replace: Replace,
) {
    let ops: Vec<&Op> = ops.into_iter().collect();
    let collections: Vec<&str> = match replace {
        Replace::Restore => Vec::new(),
        Replace::Commands => {
            ops.iter().filter(|op| !matches!(op.value, Value::String(_))).map(|op| op.key.text.as_str()).collect()
        }
    };
    let unlinked_first = collections.len() > 1 && distinct_keys(&ops);
    if unlinked_first {
        unit.unlink(&collections);
    }
    for op in ops {
        let seconds = ttl_with_jitter(ttl.get(op.tier()), jitter, uniform());
        let key = op.key.text.as_str();
        match &op.value {
            Value::String(value) => {
                // "EX" and the seconds: at most 2 + 20 bytes.
                unit.cmd_with_room("SET", key, 3, value.len() + 22).arg(value).arg("EX").arg(seconds);
            }
            collection if replace == Replace::Restore => {
                // `REPLACE` drops the old value as `UNLINK` would (off
                // the main thread where `lazyfree-lazy-server-del` says).
                let value = dump::payload(collection).expect("strings take the arm above");
                let millis = seconds.saturating_mul(1000);
                unit.cmd_with_room("RESTORE", key, 3, value.len() + 28)
                    .arg(millis)
                    .arg(value.as_slice())
                    .arg("REPLACE");
            }
            collection => {
                if !unlinked_first {
                    unit.cmd("UNLINK", key);
                }
                add_members(unit, key, collection, 0..collection.elements());
                unit.cmd("EXPIRE", key).arg(seconds);
            }
        }
    }
}

/// Whether no key comes twice among `ops`.
fn distinct_keys(ops: &[&Op]) -> bool {
    let mut seen = rustc_hash::FxHashSet::with_capacity_and_hasher(ops.len(), Default::default());
    ops.iter().all(|op| seen.insert(op.key.text.as_str()))
}

/// Appends the adds of a collection's elements `range` to `key`
/// (`SADD`, `RPUSH` or `ZADD`, at most [`CHUNK`] members each).
pub fn add_members(unit: &mut Unit, key: &str, value: &Value, range: std::ops::Range<usize>) {
    match value {
        Value::String(_) => {}
        Value::Set(members) => {
            for chunk in members[range].chunks(CHUNK) {
                unit.cmd_with_room("SADD", key, chunk.len(), text_bytes(chunk)).arg(chunk);
            }
        }
        Value::List(items) => {
            for chunk in items[range].chunks(CHUNK) {
                unit.cmd_with_room("RPUSH", key, chunk.len(), text_bytes(chunk)).arg(chunk);
            }
        }
        Value::Zset(members) => {
            for chunk in members[range].chunks(CHUNK) {
                // A score is an integer: at most 20 bytes as text.
                let bytes = chunk.iter().map(|(_, m)| m.len() + 20).sum();
                let cmd = unit.cmd_with_room("ZADD", key, 2 * chunk.len(), bytes);
                for (score, member) in chunk {
                    cmd.arg(*score).arg(member);
                }
            }
        }
    }
}

/// The bytes of `items` together.
fn text_bytes(items: &[String]) -> usize {
    items.iter().map(String::len).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::Keys;
    use crate::registry::FamilyId;

    #[test]
    fn jitter_stays_within_the_fraction() {
        assert_eq!(ttl_with_jitter(3600, 0.1, 0.0), 3600);
        assert_eq!(ttl_with_jitter(3600, 0.1, 0.999_999), 3959);
        assert_eq!(ttl_with_jitter(3600, 0.0, 0.5), 3600);
    }

    #[test]
    fn collections_are_replaced_inside_one_transaction() {
        let keys = Keys::new("app:");
        let ops = vec![
            Op { key: keys.key(FamilyId::TagAll, &[]), value: Value::String("[]".into()) },
            Op {
                key: keys.key(FamilyId::VideoCategoryList, &["c1"]),
                value: Value::List(vec!["v2".into(), "v1".into()]),
            },
        ];
        let ttl = TierSeconds { count: 1, index: 7200, detail: 3, catalog: 604_800 };
        let pipe = build_pipeline(&ops, &ttl, 0.0, || 0.0);
        let expected = [
            "MULTI",
            "SET $11 app:tag:all $2 [] $2 EX $6 604800",
            "UNLINK $26 app:video:category:list:c1",
            "RPUSH $26 app:video:category:list:c1 $2 v2 $2 v1",
            "EXPIRE $26 app:video:category:list:c1 $4 7200",
            "EXEC",
        ];
        assert_in_order(&pipe, &expected);
    }

    /// Several collections lose their old values in one `UNLINK` ahead of
    /// their adds; a key that comes twice keeps each `UNLINK` in its place.
    #[test]
    fn collections_are_unlinked_together_unless_a_key_repeats() {
        let keys = Keys::new("app:");
        let set = |id: &str, member: &str| Op {
            key: keys.key(FamilyId::VideoCategories, &[id]),
            value: Value::Set(vec![member.into()]),
        };
        let ttl = TierSeconds { count: 1, index: 2, detail: 3, catalog: 4 };
        let packed = |ops: &[Op]| {
            let pipe = build_pipeline(ops, &ttl, 0.0, || 0.0);
            String::from_utf8_lossy(&pipe.get_packed_pipeline()).replace("\r\n", " ")
        };
        let together = packed(&[set("v1", "c1"), set("v2", "c2")]);
        assert_eq!(together.matches("UNLINK").count(), 1, "{together}");
        assert!(
            together.contains("*3 $6 UNLINK $23 app:video:categories:v1 $23 app:video:categories:v2 *3 $4 SADD"),
            "{together}"
        );
        let repeated = packed(&[set("v1", "c1"), set("v2", "c2"), set("v1", "c3")]);
        assert_eq!(repeated.matches("UNLINK").count(), 3, "{repeated}");
        let order: Vec<&str> = repeated.split(" *").filter_map(|c| c.split(' ').nth(2)).collect();
        assert_eq!(
            order,
            ["MULTI", "UNLINK", "SADD", "EXPIRE", "UNLINK", "SADD", "EXPIRE", "UNLINK", "SADD", "EXPIRE", "EXEC"]
        );
    }

    /// The watcher's changes go in their order: a put as a rebuild writes
    /// it, a deletion as `UNLINK`.
    #[test]
    fn changes_are_puts_and_unlinks_in_order() {
        let keys = Keys::new("app:");
        let changes = vec![
            Change::Delete(keys.key(FamilyId::VideoDetail, &["gone"])),
            Change::Put(Op { key: keys.key(FamilyId::VideoDetail, &["v1"]), value: Value::String("{}".into()) }),
        ];
        let ttl = TierSeconds { count: 1, index: 2, detail: 3, catalog: 4 };
        let mut unit = Unit::new();
        add_changes(&mut unit, &changes, &ttl, 0.0, || 0.0, Replace::Commands);
        let mut pipe = redis::pipe();
        pipe.atomic();
        unit.append_to(&mut pipe);
        assert_in_order(
            &pipe,
            &["MULTI", "UNLINK $21 app:video:detail:gone", "SET $19 app:video:detail:v1 $2 {} $2 EX $1 3", "EXEC"],
        );
    }

    /// A transaction's patches: plain guarded commands on a cluster (the
    /// slot scripts run the guards), one write script on one node.
    #[test]
    fn patches_are_guarded_and_one_node_runs_them_in_one_script() {
        use crate::plan::patch::{Edit, Patch};
        let keys = Keys::new("app:");
        let list = keys.key(FamilyId::VideoCategoryList, &["c1"]);
        let index = keys.key(FamilyId::VideoCategoryIndex, &["c1"]);
        let edits = vec![
            Edit::LRem("a".into()),
            Edit::LInsert { item: "n".into(), pivot: "b".into() },
            Edit::LRemLast("z".into()),
        ];
        let zset = vec![Edit::ZRem("a".into()), Edit::ZAdd(7, "n".into()), Edit::ZAdd(8, "m".into())];
        let changes = vec![Change::Patch(Patch::new(list, 3, edits, 2)), Change::Patch(Patch::new(index, 3, zset, 0))];
        let ttl = TierSeconds { count: 1, index: 9, detail: 3, catalog: 4 };
        let mut unit = Unit::new();
        add_changes(&mut unit, &changes, &ttl, 0.0, || 0.0, Replace::Commands);
        let cluster: Vec<String> =
            crate::sink::cluster::split(&unit).parts.iter().flat_map(|part| part.lines()).collect();
        assert_eq!(
            cluster,
            [
                "SIZEIS app:video:category:list:c1 LLEN 3",
                "LREM app:video:category:list:c1 1 a",
                "LINSERT app:video:category:list:c1 BEFORE b n",
                "LREM app:video:category:list:c1 -1 z",
                "EXPIRE app:video:category:list:c1 9",
                "SIZEIS app:video:category:index:c1:videos ZCARD 3",
                "ZREM app:video:category:index:c1:videos a",
                "ZADD app:video:category:index:c1:videos 7 n 8 m",
                "EXPIRE app:video:category:index:c1:videos 9",
            ]
        );
        let one_node = unit.into_pipeline();
        assert_eq!(one_node.cmd_iter().count(), 1, "one EVAL for the transaction's patches");
        assert_in_order(&one_node, &["EVAL", "SIZEIS", "LREM", "LINSERT", "LREM", "SIZEIS", "ZREM", "ZADD"]);
    }

    /// A set patch: a run of joins as one `SADD`, then a run of leaves as
    /// one `SREM`, behind `SCARD`.
    #[test]
    fn a_set_patch_sends_one_sadd_and_one_srem() {
        use crate::plan::patch::{Edit, Patch};
        let key = Keys::new("app:").key(FamilyId::VideoCategories, &["v1"]);
        let edits = vec![Edit::SAdd("c3".into()), Edit::SAdd("c4".into()), Edit::SRem("c1".into())];
        let mut step = Step::default();
        add_patch(&mut step, &Patch::new(key, 2, edits, 0), 5);
        let mut unit = Unit::new();
        unit.guarded(step);
        let parts = crate::sink::cluster::split(&unit).parts;
        let commands = parts[0].lines();
        assert_eq!(
            commands,
            [
                "SIZEIS app:video:categories:v1 SCARD 2",
                "SADD app:video:categories:v1 c3 c4",
                "SREM app:video:categories:v1 c1",
                "EXPIRE app:video:categories:v1 5",
            ],
            "guard, SADD, SREM, EXPIRE"
        );
    }

    fn assert_in_order(pipe: &redis::Pipeline, expected: &[&str]) {
        let text = String::from_utf8_lossy(&pipe.get_packed_pipeline()).replace("\r\n", " ");
        let mut at = 0;
        for part in expected {
            let found = text[at..].find(part).unwrap_or_else(|| panic!("missing {part:?} after {at} in {text}"));
            at += found + part.len();
        }
    }
}
