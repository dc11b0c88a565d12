//! Property tests for the planner: on random, often hostile documents the
//! plan keeps the contract's invariants. No servers.

mod common;

use cachewright::plan::plan_in_memory;
use cachewright::plan::{FamilySet, Value};
use cachewright::rebuild::plan_ctx;
use cachewright::registry::{FamilyId, Registry};
use mongodb::bson::{Bson, DateTime, Document, RawDocumentBuf, doc, oid::ObjectId};
use proptest::prelude::*;
use std::collections::{BTreeMap, HashSet};

/// Ids drawn from a small pool, so repeats and dangling references occur;
/// some unusable, some ObjectIds that collide with their hex strings.
fn id() -> impl Strategy<Value = Bson> {
    prop_oneof![
        8 => (0u8..12).prop_map(|n| Bson::String(format!("i{n}"))),
        2 => (0u8..3).prop_map(|n| Bson::ObjectId(ObjectId::from_bytes([n; 12]))),
        1 => (0u8..3).prop_map(|n| Bson::String(ObjectId::from_bytes([n; 12]).to_hex())),
        1 => prop_oneof![Just(Bson::String("bad id".into())), Just(Bson::Int32(5)), Just(Bson::Null)],
    ]
}

fn number() -> impl Strategy<Value = Bson> {
    prop_oneof![
        (-3i32..4).prop_map(Bson::Int32),
        (-3i64..4).prop_map(Bson::Int64),
        prop_oneof![Just(1.0), Just(0.5), Just(f64::NAN), Just(-0.0)].prop_map(Bson::Double),
        prop_oneof![Just("1"), Just("1.0"), Just("2.5")].prop_map(|s| Bson::Decimal128(s.parse().unwrap())),
        Just(Bson::String("1".into())),
        Just(Bson::Boolean(true)),
    ]
}

fn status() -> impl Strategy<Value = Bson> {
    prop_oneof![4 => Just(Bson::Int32(1)), 1 => number()]
}

fn name() -> impl Strategy<Value = Bson> {
    prop_oneof![
        8 => "[ a-cA-C动İΣ%:*]{0,6}".prop_map(Bson::String),
        1 => Just(Bson::Null),
        1 => Just(Bson::Int32(3)),
    ]
}

fn maybe(
    field: &'static str,
    value: impl Strategy<Value = Bson>,
) -> impl Strategy<Value = Option<(&'static str, Bson)>> {
    proptest::option::weighted(0.9, value.prop_map(move |v| (field, v)))
}

fn document(fields: Vec<Option<(&'static str, Bson)>>) -> Document {
    let mut d = Document::new();
    for (k, v) in fields.into_iter().flatten() {
        d.insert(k, v);
    }
    d
}

fn refs() -> impl Strategy<Value = Bson> {
    proptest::collection::vec(id(), 0..5).prop_map(Bson::Array)
}

fn ref_items() -> impl Strategy<Value = Bson> {
    proptest::collection::vec((id(), name()).prop_map(|(id, name)| Bson::Document(doc! {"id": id, "name": name})), 0..5)
        .prop_map(Bson::Array)
}

fn category() -> impl Strategy<Value = Document> {
    (maybe("_id", id()), maybe("name", name()), maybe("seq", number()), maybe("status", status()))
        .prop_map(|(a, b, c, d)| document(vec![a, b, c, d]))
}

fn tag() -> impl Strategy<Value = Document> {
    (
        maybe("_id", id()),
        maybe("name", name()),
        maybe("categoryId", id()),
        maybe("seq", number()),
        maybe("status", status()),
    )
        .prop_map(|(a, b, c, d, e)| document(vec![a, b, c, d, e]))
}

fn channel() -> impl Strategy<Value = Document> {
    (
        maybe("_id", id()),
        maybe("name", name()),
        maybe("landingUrl", name()),
        maybe("categories", ref_items()),
        maybe("tags", ref_items()),
    )
        .prop_map(|(a, b, c, d, e)| document(vec![a, b, c, d, e]))
}

fn video() -> impl Strategy<Value = Document> {
    (
        maybe("_id", id()),
        maybe("title", name()),
        maybe("categoryIds", refs()),
        maybe("categoryId", id()),
        maybe("tagIds", refs()),
        maybe("listStatus", status()),
        maybe("addedTime", (0i64..5).prop_map(|n| Bson::DateTime(DateTime::from_millis(n * 1000)))),
    )
        .prop_map(|(a, b, c, d, e, f, g)| document(vec![a, b, c, d, e, f, g]))
}

fn raw(docs: &[Document]) -> Vec<RawDocumentBuf> {
    docs.iter().map(|d| RawDocumentBuf::from_document(d).unwrap()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn plans_keep_the_contract_invariants(
        channels in proptest::collection::vec(channel(), 0..4),
        categories in proptest::collection::vec(category(), 0..8),
        tags in proptest::collection::vec(tag(), 0..12),
        videos in proptest::collection::vec(video(), 0..20),
    ) {
        let cfg = common::golden_config();
        let ctx = plan_ctx(&cfg, FamilySet::all());
        let (ch, ca, ta, vi) = (raw(&channels), raw(&categories), raw(&tags), raw(&videos));
        let run = plan_in_memory(&ctx, &cfg.collections, &ch, &ca, &ta, &vi);

        let mut seen = HashSet::new();
        let mut by_key = BTreeMap::new();
        for op in &run.ops {
            // Every key is prefixed, registered, of its family's type, once.
            prop_assert!(op.key.text.starts_with("app:"));
            prop_assert_eq!(ctx.keys.classify(&op.key.text), Some(op.key.family));
            prop_assert_eq!(op.value.redis_type(), Registry::get().family(op.key.family).redis_type);
            prop_assert!(seen.insert(op.key.text.clone()), "{} twice", op.key.text);
            // No empty collection is written.
            let empty = match &op.value {
                Value::Set(m) | Value::List(m) => m.is_empty(),
                Value::Zset(m) => m.is_empty(),
                Value::String(_) => false,
            };
            prop_assert!(!empty, "{} empty", op.key.text);
            // JSON payloads parse.
            let plain_text = matches!(op.key.family, FamilyId::CategoryTagnamesFlat | FamilyId::CategoryVideoCount);
            if let (Value::String(s), false) = (&op.value, plain_text) {
                prop_assert!(serde_json::from_str::<serde_json::Value>(s).is_ok(), "{}: {}", op.key.text, s);
            }
            by_key.insert(op.key.text.clone(), op.value.clone());
        }

        // Counts agree with the index; lists are the index newest first.
        for (key, value) in &by_key {
            if let Some(cat) = key.strip_prefix("app:category:video:count:") {
                let Value::String(n) = value else { unreachable!() };
                let index = by_key.get(&format!("app:video:category:index:{cat}:videos"));
                let len = match index { Some(Value::Zset(m)) => m.len(), _ => 0 };
                prop_assert_eq!(n.parse::<usize>().unwrap(), len);
            }
            if let Some(cat) = key.strip_prefix("app:video:category:list:") {
                let Value::List(ids) = value else { unreachable!() };
                let Some(Value::Zset(members)) = by_key.get(&format!("app:video:category:index:{cat}:videos")) else {
                    panic!("list without index for {cat}");
                };
                let mut sorted = members.clone();
                sorted.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
                let expected: Vec<String> = sorted.into_iter().map(|(_, id)| id).collect();
                prop_assert_eq!(ids, &expected);
            }
        }

        // Deterministic, and --only plans exactly the selected part.
        let again = plan_in_memory(&ctx, &cfg.collections, &ch, &ca, &ta, &vi);
        prop_assert_eq!(&again.ops, &run.ops);
        let only = FamilySet::of([FamilyId::VideoTagList, FamilyId::ChannelWithTags, FamilyId::TagSearch]);
        let part = plan_in_memory(&plan_ctx(&cfg, only), &cfg.collections, &ch, &ca, &ta, &vi);
        let expected: Vec<_> = run.ops.iter().filter(|op| only.contains(op.key.family)).cloned().collect();
        prop_assert_eq!(part.ops, expected);
    }
}
