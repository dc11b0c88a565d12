//! The order in which a batch reaches Redis, as data: the engine runs
//! these steps against Redis, and the property test (`watch_props`) runs
//! the same steps against its in-memory store, failing after any of
//! them, so the test checks the engine's real order.
//!
//! 1. The batch's scopes go to `cdc:pending` first, so a restart after a
//!    partial write knows what to recompute.
//! 2. The scope keys go out as transactions cut by the budget, in any
//!    order; then the later steps of patches too big for one, step by
//!    step.
//! 3. The touched videos' own keys follow, every run but the last.
//! 4. The last run of those carries the resume tokens (and clears
//!    `cdc:pending` once the streams have caught up with a load and no
//!    failed batch's document waits to be saved again): once
//!    it lands, the batch is saved. It holds no patch (`video:categories`
//!    patched in place): a patch's guard may refuse it.

use super::plan::BatchPlan;
use crate::plan::{Change, TxBudget};

/// One step of writing a batch.
#[derive(Debug, PartialEq)]
pub enum Step<'p> {
    /// Records these `cdc:pending` members.
    Pending(Vec<String>),
    /// Transactions that may land in any order.
    Runs(Vec<&'p [Change]>),
    /// The last transaction: these changes with the resume tokens;
    /// `clear` empties `cdc:pending` in it.
    Tokens { changes: &'p [Change], clear: bool },
}

/// The steps of writing `plan`, in order, each transaction within
/// `budget`. The tokens step always comes last, even with no change;
/// it empties `cdc:pending` when `clear` (see `State::clears_pending`).
pub fn steps(plan: &BatchPlan, budget: TxBudget, clear: bool) -> Vec<Step<'_>> {
    let mut out = Vec::new();
    if !plan.changes.is_empty() {
        out.push(Step::Pending(plan.record.scopes.to_members()));
        out.push(Step::Runs(budget.cut(&plan.changes)));
    }
    // A patch's later steps, each after the one before.
    out.extend(plan.later.iter().filter(|wave| !wave.is_empty()).map(|wave| Step::Runs(budget.cut(wave))));
    // The videos' own keys go after every key that indexes them (see
    // `BatchPlan::last`).
    // A patch's guard may refuse it, and on one node a refused command
    // does not undo the others of its transaction: patches never share
    // the tokens' transaction, so a refused one never saves the batch.
    // They come first in `plan.last`.
    let patched = plan.last.iter().take_while(|c| matches!(c, Change::Patch(_))).count();
    let (patches, rest) = plan.last.split_at(patched);
    let mut runs = budget.cut(patches);
    let mut last = budget.cut(rest);
    let with_tokens = last.pop().unwrap_or_default();
    runs.extend(last);
    if !runs.is_empty() {
        out.push(Step::Runs(runs));
    }
    out.push(Step::Tokens { changes: with_tokens, clear });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::keys::Keys;
    use crate::plan::{Op, Value};
    use crate::registry::FamilyId;

    fn put(keys: &Keys, family: FamilyId, id: &str) -> Change {
        Change::Put(Op { key: keys.key(family, &[id]), value: Value::String("x".into()) })
    }

    #[test]
    fn pending_first_then_scopes_then_videos_and_the_tokens_last() {
        let keys = Keys::new("app:");
        let mut plan = BatchPlan::default();
        plan.record.scopes.categories.insert("c1".into());
        plan.changes = (0..5).map(|i| put(&keys, FamilyId::CategoryVideoCount, &format!("c{i}"))).collect();
        plan.last = (0..3).map(|i| put(&keys, FamilyId::VideoDetail, &format!("v{i}"))).collect();
        let budget = TxBudget { max_keys: 2, max_cost: usize::MAX };
        let steps = steps(&plan, budget, true);
        assert_eq!(steps[0], Step::Pending(vec!["c:c1".to_string()]));
        assert!(matches!(&steps[1], Step::Runs(runs) if runs.len() == 3));
        assert!(matches!(&steps[2], Step::Runs(runs) if runs.len() == 1 && runs[0].len() == 2));
        assert!(matches!(&steps[3], Step::Tokens { changes, clear: true } if changes.len() == 1));
        assert_eq!(steps.len(), 4);
    }

    #[test]
    fn a_patch_s_later_steps_follow_its_first_in_order() {
        let keys = Keys::new("app:");
        let count = |id| put(&keys, FamilyId::CategoryVideoCount, id);
        let plan = BatchPlan {
            changes: vec![count("c1")],
            later: vec![vec![count("c2")], vec![], vec![count("c3")]],
            ..BatchPlan::default()
        };
        let steps = steps(&plan, TxBudget { max_keys: 10, max_cost: usize::MAX }, false);
        let runs: Vec<String> = steps
            .iter()
            .filter_map(|s| match s {
                Step::Runs(runs) => Some(runs[0][0].key().text.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(runs, ["app:category:video:count:c1", "app:category:video:count:c2", "app:category:video:count:c3"]);
        assert!(matches!(steps.last(), Some(Step::Tokens { .. })));
    }

    #[test]
    fn patched_video_keys_never_share_the_tokens_transaction() {
        use crate::plan::patch::{Edit, Patch};
        let keys = Keys::new("app:");
        let patch = |id| {
            let key = keys.key(FamilyId::VideoCategories, &[id]);
            Change::Patch(Patch::new(key, 1, vec![Edit::SAdd("c2".into())], 0))
        };
        let only_patches = BatchPlan { last: vec![patch("v1"), patch("v2")], ..BatchPlan::default() };
        let budget = TxBudget { max_keys: 10, max_cost: usize::MAX };
        let alone = steps(&only_patches, budget, false);
        assert!(matches!(&alone[0], Step::Runs(runs) if runs.len() == 1 && runs[0].len() == 2));
        assert!(matches!(&alone[1], Step::Tokens { changes, .. } if changes.is_empty()));
        let mixed = BatchPlan {
            last: vec![patch("v1"), put(&keys, FamilyId::VideoDetail, "v1"), put(&keys, FamilyId::VideoDetail, "v2")],
            ..BatchPlan::default()
        };
        let together = steps(&mixed, budget, false);
        assert!(matches!(&together[0], Step::Runs(runs) if runs.len() == 1 && matches!(runs[0][0], Change::Patch(_))));
        let puts_only = |changes: &[Change]| changes.len() == 2 && changes.iter().all(|c| matches!(c, Change::Put(_)));
        assert!(matches!(&together[1], Step::Tokens { changes, .. } if puts_only(changes)));
    }

    #[test]
    fn a_batch_without_scope_changes_records_nothing_pending_and_still_saves_its_tokens() {
        let plan = BatchPlan::default();
        let steps = steps(&plan, TxBudget { max_keys: 10, max_cost: 100 }, false);
        assert_eq!(steps, vec![Step::Tokens { changes: &[], clear: false }]);
    }
}
