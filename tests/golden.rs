//! Golden tests: the planner's output for the hand-written edge-case
//! fixtures, compared with `fixtures/edge-cases/expected-*.txt`. No servers.

mod common;

use cachewright::plan::FamilySet;
use cachewright::plan::plan_in_memory;
use cachewright::rebuild::plan_ctx;
use mongodb::bson::RawDocumentBuf;

fn planned(families: FamilySet) -> cachewright::plan::PlannedRun {
    let cfg = common::golden_config();
    let c = &cfg.collections;
    let sets = cachewright::dev::fixtures::read_dir(
        &common::fixture_dir("edge-cases"),
        &[&c.channel, &c.category, &c.tag, &c.video],
    )
    .expect("fixtures parse");
    let raw: Vec<Vec<RawDocumentBuf>> = sets
        .iter()
        .map(|(_, docs)| docs.iter().map(|d| RawDocumentBuf::from_document(d).expect("bson")).collect())
        .collect();
    plan_in_memory(&plan_ctx(&cfg, families), &cfg.collections, &raw[0], &raw[1], &raw[2], &raw[3])
}

#[test]
fn edge_case_keys_match_the_golden_file() {
    let run = planned(FamilySet::all());
    common::render::assert_golden(
        &common::fixture_dir("edge-cases").join("expected-keys.txt"),
        &common::render::render_ops(&run.ops),
    );
}

#[test]
fn edge_case_report_matches_the_golden_file() {
    let run = planned(FamilySet::all());
    common::render::assert_golden(
        &common::fixture_dir("edge-cases").join("expected-report.txt"),
        &common::render::render_report(&run.collections, &run.refs),
    );
}

#[test]
fn planning_is_deterministic() {
    let a = common::render::render_ops(&planned(FamilySet::all()).ops);
    let b = common::render::render_ops(&planned(FamilySet::all()).ops);
    assert_eq!(a, b);
}

#[test]
fn only_selected_families_are_planned() {
    let families = cachewright::cli::parse_only(&["tag".into(), "video:detail".into()]).unwrap();
    let run = planned(families);
    assert!(!run.ops.is_empty());
    for op in &run.ops {
        assert!(families.contains(op.key.family), "{}", op.key);
    }
    let all = planned(FamilySet::all());
    let expected = all.ops.iter().filter(|op| families.contains(op.key.family)).count();
    assert_eq!(run.ops.len(), expected);
}
