//! The fields of a video's detail payload that its index keys depend on
//! (`categoryIds`, `tagIds`, `addedTime`), read as their JSON text.
//!
//! A batch compares them between the detail Redis holds and the one it
//! writes, for every touched video, to tell whether the video's index
//! scopes need planning. Parsing both payloads into a `serde_json::Value`
//! tree allocated every field of them (about 7% of the watcher's state
//! CPU under the videos mix at 2M); borrowing the three values' text does
//! not. Both payloads come from the same renderer, so equal values have
//! equal text; text that differs for equal values (another writer's
//! spacing) only plans the scopes, which is never wrong.

use serde::Deserialize;
use serde_json::value::RawValue;

/// The three fields' text. A field absent or `null` is `None` either way,
/// as a `Value` reads both as `Null`.
#[derive(Debug, Deserialize)]
pub struct Fields<'a> {
    #[serde(rename = "categoryIds", borrow, default)]
    categories: Option<&'a RawValue>,
    #[serde(rename = "tagIds", borrow, default)]
    tags: Option<&'a RawValue>,
    #[serde(rename = "addedTime", borrow, default)]
    added: Option<&'a RawValue>,
}

/// What a payload says of its index fields: `Absent` when there is no
/// payload, `Broken` when it is not a JSON object this reads (invalid,
/// or a field named twice, where a `Value` would keep the last).
#[derive(Debug)]
pub enum DetailFields<'a> {
    Absent,
    Fields(Fields<'a>),
    Broken(&'a str),
}

impl<'a> DetailFields<'a> {
    pub fn read(detail: Option<&'a str>) -> DetailFields<'a> {
        match detail {
            None => DetailFields::Absent,
            // An object only: a struct would also take an array's
            // elements as its fields, in order.
            Some(text) if !text.trim_start().starts_with('{') => DetailFields::Broken(text),
            Some(text) => match serde_json::from_str::<Fields<'a>>(text) {
                Ok(fields) => DetailFields::Fields(fields),
                Err(_) => DetailFields::Broken(text),
            },
        }
    }

    /// Whether the index families read the same of both payloads: no
    /// payload on either side reads as all three fields absent; a broken
    /// one matches nothing.
    pub fn same_as(&self, other: &DetailFields<'_>) -> bool {
        fn fields<'h>(held: &'h DetailFields<'_>) -> Option<[Option<&'h str>; 3]> {
            match held {
                DetailFields::Absent => Some([None; 3]),
                DetailFields::Fields(f) => Some([f.categories, f.tags, f.added].map(|v| v.map(RawValue::get))),
                DetailFields::Broken(_) => None,
            }
        }
        matches!((fields(self), fields(other)), (Some(a), Some(b)) if a == b)
    }

    /// The `categoryIds` and `tagIds` the payload names (string elements
    /// only, as a tolerant reader takes them); a broken payload is read
    /// whole instead, as far as it parses.
    pub fn refs(&self) -> (Vec<String>, Vec<String>) {
        fn strings(v: &serde_json::Value) -> Vec<String> {
            v.as_array().into_iter().flatten().filter_map(|c| c.as_str().map(String::from)).collect()
        }
        let parse = |raw: Option<&RawValue>| {
            raw.and_then(|r| serde_json::from_str::<serde_json::Value>(r.get()).ok())
                .map_or_else(Vec::new, |v| strings(&v))
        };
        match self {
            DetailFields::Absent => Default::default(),
            DetailFields::Fields(f) => (parse(f.categories), parse(f.tags)),
            DetailFields::Broken(text) => match serde_json::from_str::<serde_json::Value>(text) {
                Ok(v) => (strings(&v["categoryIds"]), strings(&v["tagIds"])),
                Err(_) => Default::default(),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use std::collections::BTreeSet;

    /// What the planner compared before: each payload parsed whole.
    fn by_value(detail: Option<&str>) -> Option<[Value; 3]> {
        let Some(detail) = detail else { return Some(Default::default()) };
        let v: Value = serde_json::from_str(detail).ok()?;
        Some([v["categoryIds"].clone(), v["tagIds"].clone(), v["addedTime"].clone()])
    }

    fn by_value_refs(detail: Option<&str>) -> (Vec<String>, Vec<String>) {
        let Some(v) = detail.and_then(|d| serde_json::from_str::<Value>(d).ok()) else { return Default::default() };
        let ids =
            |f: &str| v[f].as_array().into_iter().flatten().filter_map(|c| c.as_str().map(String::from)).collect();
        (ids("categoryIds"), ids("tagIds"))
    }

    const PAYLOADS: &[&str] = &[
        r#"{"id":"a","categoryIds":["c1","c2"],"tagIds":["t1"],"addedTime":"2024-01-01T00:00:00.000Z","title":"x"}"#,
        r#"{"id":"a","categoryIds":["c1","c2"],"tagIds":["t1"],"addedTime":"2024-01-01T00:00:00.000Z","title":"y"}"#,
        r#"{"id":"a","categoryIds":["c2","c1"],"tagIds":["t1"],"addedTime":"2024-01-01T00:00:00.000Z"}"#,
        r#"{"id":"a","categoryIds":["c1","c2"],"tagIds":[],"addedTime":"2024-01-01T00:00:00.000Z"}"#,
        r#"{"id":"a","categoryIds":["c1","c2"],"tagIds":["t1"],"addedTime":null}"#,
        r#"{"id":"a","categoryIds":["c1","c2"],"tagIds":["t1"]}"#,
        r#"{"id":"a","categoryIds":["c\u0031",7,null],"tagIds":{"x":1},"addedTime":12}"#,
        r#"{"categoryIds":["c1"],"categoryIds":["c9"]}"#,
        r#"{"id":"a","nested":{"categoryIds":["zz"]},"categoryIds":["c1"]}"#,
        r#"{"id":"a""#,
        r#"[1,2]"#,
        r#"["c1",["t1"]]"#,
        r#"{"id":"b","categoryIds":"c1","tagIds":["t1"]}"#,
        r#"{}"#,
    ];

    #[test]
    fn equal_text_is_equal_values_and_the_refs_are_what_a_whole_parse_reads() {
        let mut all: Vec<Option<&str>> = PAYLOADS.iter().copied().map(Some).collect();
        all.push(None);
        for &a in &all {
            for &b in &all {
                // Never quiet where the whole parse says the fields differ.
                if DetailFields::read(a).same_as(&DetailFields::read(b)) {
                    assert_eq!(by_value(a), by_value(b), "{a:?} against {b:?}");
                    assert!(by_value(a).is_some());
                }
            }
            // The renderer's payloads compare as the whole parse does.
            let (ours, wanted) = (DetailFields::read(a), by_value(a));
            if matches!(ours, DetailFields::Fields(_) | DetailFields::Absent) {
                assert!(ours.same_as(&DetailFields::read(a)));
            }
            let (cats, tags) = DetailFields::read(a).refs();
            let (want_cats, want_tags) = by_value_refs(a);
            assert_eq!(
                (cats.into_iter().collect::<BTreeSet<_>>(), tags),
                (want_cats.into_iter().collect::<BTreeSet<_>>(), want_tags),
                "{a:?} {wanted:?}"
            );
        }
        // The title alone differs: the index fields are the same.
        assert!(DetailFields::read(Some(PAYLOADS[0])).same_as(&DetailFields::read(Some(PAYLOADS[1]))));
        assert!(!DetailFields::read(Some(PAYLOADS[0])).same_as(&DetailFields::read(Some(PAYLOADS[2]))));
        // Absent and null read alike; no payload reads as no fields.
        assert!(DetailFields::read(Some(PAYLOADS[4])).same_as(&DetailFields::read(Some(PAYLOADS[5]))));
        assert!(DetailFields::read(None).same_as(&DetailFields::read(Some("{}"))));
        // Named twice: a whole parse keeps the last one.
        assert_eq!(DetailFields::read(Some(PAYLOADS[7])).refs().0, vec!["c9".to_string()]);
    }
}
