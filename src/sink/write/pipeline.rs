//! Turns planned ops into one atomic Redis pipeline.

use crate::config::TierSeconds;
use crate::plan::patch::{Edit, Patch};
use crate::plan::{Change, Op, Value};

/// Members per variadic command, so no single command grows unbounded.
const CHUNK: usize = 1000;

/// `base` plus up to `jitter × base` seconds, `u` being uniform in [0, 1).
pub fn ttl_with_jitter(base: u64, jitter: f64, u: f64) -> u64 {
    base + (u.clamp(0.0, 1.0) * jitter * base as f64).floor() as u64
}

/// Builds a MULTI/EXEC pipeline that replaces every key of `ops` whole:
/// strings with `SET … EX`, collections with `UNLINK` + adds + `EXPIRE`
/// inside the transaction, so no reader sees them missing or partial.
/// `UNLINK`, not `DEL`: a big old value is freed off Redis's main thread,
/// not inside the transaction the readers wait behind.
pub fn build_pipeline(ops: &[Op], ttl: &TierSeconds, jitter: f64, uniform: impl FnMut() -> f64) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.atomic();
    add_ops(&mut pipe, ops, ttl, jitter, uniform);
    pipe
}

/// The same commands as [`build_pipeline`] without `MULTI`/`EXEC`: what
/// the benchmark replays with `redis-cli --pipe` as the physical limit.
pub fn build_commands(ops: &[Op], ttl: &TierSeconds, jitter: f64, uniform: impl FnMut() -> f64) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    add_ops(&mut pipe, ops, ttl, jitter, uniform);
    pipe
}

/// Appends the watcher's incremental changes (whole replacements,
/// deletions and patches) to `pipe`, whose frame applies them all at
/// once. The patches run guarded (see [`add_patch`]): on a cluster
/// in their slots' scripts; on one node all of them in one write script
/// (one `EVAL` per transaction, not per key: its text travels with each
/// call), whose guards are all checked before any of them runs.
pub fn add_changes<'a>(
    pipe: &mut redis::Pipeline,
    changes: impl IntoIterator<Item = &'a Change>,
    ttl: &TierSeconds,
    jitter: f64,
    mut uniform: impl FnMut() -> f64,
    on_cluster: bool,
) {
    let mut patches = redis::pipe();
    for change in changes {
        match change {
            Change::Put(op) => add_ops(pipe, std::slice::from_ref(op), ttl, jitter, &mut uniform),
            Change::Delete(key) => {
                pipe.cmd("UNLINK").arg(&key.text).ignore();
            }
            Change::Patch(patch) => {
                let seconds = ttl_with_jitter(ttl.get(patch.tier()), jitter, uniform());
                add_patch(&mut patches, patch, seconds);
            }
        }
    }
    if patches.cmd_iter().next().is_some() {
        crate::sink::cluster::add_guarded(pipe, &patches, on_cluster);
    }
}

/// A patch's commands: the size guard, the edits in order (a run of
/// `ZREM`, `ZADD`, `SADD` or `SREM` as one command, at most [`CHUNK`]
/// members), then the key's TTL, as a whole replace sets it. An emptied
/// key is gone and its `EXPIRE` does nothing, as a rebuild writes no
/// empty collection.
pub fn add_patch(step: &mut redis::Pipeline, patch: &Patch, seconds: u64) {
    let key = patch.key.text.as_str();
    step.cmd(crate::sink::cluster::SIZE_GUARD).arg(key).arg(patch.size_command()).arg(patch.before);
    let mut edits = patch.edits.iter().peekable();
    while let Some(edit) = edits.next() {
        match edit {
            // Runs of one variadic command go as one command.
            Edit::ZRem(_) | Edit::ZAdd(..) | Edit::SAdd(_) | Edit::SRem(_) => {
                step.cmd(variadic_name(edit)).arg(key);
                add_variadic(step, edit);
                let mut n = 1;
                let same = |e: &&Edit| std::mem::discriminant(*e) == std::mem::discriminant(edit);
                while n < CHUNK
                    && let Some(next) = edits.next_if(same)
                {
                    add_variadic(step, next);
                    n += 1;
                }
            }
            Edit::LRem(item) => drop(step.cmd("LREM").arg(key).arg(1).arg(item)),
            Edit::LInsert { item, pivot } => drop(step.cmd("LINSERT").arg(key).arg("BEFORE").arg(pivot).arg(item)),
            Edit::RPush(item) => drop(step.cmd("RPUSH").arg(key).arg(item)),
        }
    }
    step.cmd("EXPIRE").arg(key).arg(seconds);
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

/// Appends a variadic edit's arguments to the pipeline's last command (a
/// sorted-set member's score first).
fn add_variadic(step: &mut redis::Pipeline, edit: &Edit) {
    match edit {
        Edit::ZAdd(score, m) => drop(step.arg(*score).arg(m)),
        Edit::ZRem(m) | Edit::SAdd(m) | Edit::SRem(m) | Edit::LRem(m) | Edit::RPush(m) => drop(step.arg(m)),
        Edit::LInsert { .. } => {}
    }
}

/// Appends the commands that replace every key of `ops` whole (see
/// [`build_pipeline`]) to `pipe`, which frames them.
pub fn add_ops<'a>(
    pipe: &mut redis::Pipeline,
    ops: impl IntoIterator<Item = &'a Op>,
    ttl: &TierSeconds,
    jitter: f64,
    mut uniform: impl FnMut() -> f64,
) {
    for op in ops {
        let seconds = ttl_with_jitter(ttl.get(op.tier()), jitter, uniform());
        let key = op.key.text.as_str();
        match &op.value {
            Value::String(value) => {
                pipe.cmd("SET").arg(key).arg(value).arg("EX").arg(seconds).ignore();
            }
            collection => {
                pipe.cmd("UNLINK").arg(key).ignore();
                add_members(pipe, key, collection, 0..collection.elements());
                pipe.cmd("EXPIRE").arg(key).arg(seconds).ignore();
            }
        }
    }
}

/// Appends the adds of a collection's elements `range` to `key`
/// (`SADD`, `RPUSH` or `ZADD`, at most [`CHUNK`] members each).
pub fn add_members(pipe: &mut redis::Pipeline, key: &str, value: &Value, range: std::ops::Range<usize>) {
    match value {
        Value::String(_) => {}
        Value::Set(members) => {
            for chunk in members[range].chunks(CHUNK) {
                pipe.cmd("SADD").arg(key).arg(chunk).ignore();
            }
        }
        Value::List(items) => {
            for chunk in items[range].chunks(CHUNK) {
                pipe.cmd("RPUSH").arg(key).arg(chunk).ignore();
            }
        }
        Value::Zset(members) => {
            for chunk in members[range].chunks(CHUNK) {
                let cmd = pipe.cmd("ZADD").arg(key);
                for (score, member) in chunk {
                    cmd.arg(*score).arg(member);
                }
                cmd.ignore();
            }
        }
    }
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
        let mut pipe = redis::pipe();
        pipe.atomic();
        add_changes(&mut pipe, &changes, &ttl, 0.0, || 0.0, false);
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
        let edits = vec![Edit::LRem("a".into()), Edit::LInsert { item: "n".into(), pivot: "b".into() }];
        let zset = vec![Edit::ZRem("a".into()), Edit::ZAdd(7, "n".into()), Edit::ZAdd(8, "m".into())];
        let changes = vec![Change::Patch(Patch::new(list, 3, edits, 2)), Change::Patch(Patch::new(index, 3, zset, 0))];
        let ttl = TierSeconds { count: 1, index: 9, detail: 3, catalog: 4 };
        let mut cluster = redis::pipe();
        add_changes(&mut cluster, &changes, &ttl, 0.0, || 0.0, true);
        assert_in_order(
            &cluster,
            &[
                "SIZEIS $26 app:video:category:list:c1 $4 LLEN $1 3",
                "LREM $26 app:video:category:list:c1 $1 1 $1 a",
                "LINSERT $26 app:video:category:list:c1 $6 BEFORE $1 b $1 n",
                "EXPIRE $26 app:video:category:list:c1 $1 9",
                "SIZEIS $34 app:video:category:index:c1:videos $5 ZCARD $1 3",
                "ZREM $34 app:video:category:index:c1:videos $1 a",
                "ZADD $34 app:video:category:index:c1:videos $1 7 $1 n $1 8 $1 m",
            ],
        );
        let mut one_node = redis::pipe();
        add_changes(&mut one_node, &changes, &ttl, 0.0, || 0.0, false);
        assert_eq!(one_node.cmd_iter().count(), 1, "one EVAL for the transaction's patches");
        assert_in_order(&one_node, &["EVAL", "SIZEIS", "LREM", "LINSERT", "SIZEIS", "ZREM", "ZADD"]);
    }

    /// A set patch: a run of joins as one `SADD`, then a run of leaves as
    /// one `SREM`, behind `SCARD`.
    #[test]
    fn a_set_patch_sends_one_sadd_and_one_srem() {
        use crate::plan::patch::{Edit, Patch};
        let key = Keys::new("app:").key(FamilyId::VideoCategories, &["v1"]);
        let edits = vec![Edit::SAdd("c3".into()), Edit::SAdd("c4".into()), Edit::SRem("c1".into())];
        let mut step = redis::pipe();
        add_patch(&mut step, &Patch::new(key, 2, edits, 0), 5);
        assert_eq!(step.cmd_iter().count(), 4, "guard, SADD, SREM, EXPIRE");
        assert_in_order(
            &step,
            &[
                "SIZEIS $23 app:video:categories:v1 $5 SCARD $1 2",
                "SADD $23 app:video:categories:v1 $2 c3 $2 c4",
                "SREM $23 app:video:categories:v1 $2 c1",
                "EXPIRE $23 app:video:categories:v1 $1 5",
            ],
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
