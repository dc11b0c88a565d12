//! What a key holds in Redis against what it should hold: one verdict per
//! key, for `verify` (every planned key, or a sample) and the watcher's
//! continuous drift check. Pure: the reads happen in [`crate::sink::inspect`].

use crate::plan::Value;
use crate::sink::inspect::{Inspected, Observed};

/// How a key differs from what it should hold.
#[derive(Debug, Clone, PartialEq)]
pub enum Difference {
    /// It should exist and does not.
    Missing,
    /// It exists and should not.
    Extra,
    /// It holds another Redis type (found, wanted).
    WrongType(String, &'static str),
    /// It holds another value (where they first differ).
    WrongValue(String),
    /// It holds the right value without a TTL.
    NoTtl,
}

impl Difference {
    /// A line for a report or a log: `missing app:k`, `wrong value app:k: …`.
    pub fn describe(&self, key: &str) -> String {
        match self {
            Difference::Missing => format!("missing {key}"),
            Difference::Extra => format!("extra {key}"),
            Difference::WrongType(found, wanted) => format!("wrong type {key}: {found} instead of {wanted}"),
            Difference::WrongValue(detail) => format!("wrong value {key}: {detail}"),
            Difference::NoTtl => format!("no ttl {key}"),
        }
    }
}

/// Compares a key as inspected with what it should hold (`None`: no key).
pub fn difference(want: Option<&Value>, seen: &Inspected) -> Option<Difference> {
    let Some(want) = want else {
        return (seen.value != Observed::Missing).then_some(Difference::Extra);
    };
    if seen.value == Observed::Missing {
        return Some(Difference::Missing);
    }
    let wanted = want.redis_type().as_str();
    if seen.value.type_name() != wanted {
        return Some(Difference::WrongType(seen.value.type_name().to_string(), wanted));
    }
    if let Some(detail) = compare(want, &seen.value) {
        return Some(Difference::WrongValue(detail));
    }
    (seen.ttl < 0).then_some(Difference::NoTtl)
}

fn shorten(s: &str) -> String {
    const MAX: usize = 120;
    if s.chars().count() <= MAX { s.to_string() } else { format!("{}…", s.chars().take(MAX).collect::<String>()) }
}

/// Where two strings first differ, with a little context.
fn first_difference(expected: &str, found: &str) -> String {
    let at = expected.bytes().zip(found.bytes()).take_while(|(a, b)| a == b).count();
    let start = at.saturating_sub(30);
    let window = |s: &str| -> String {
        let mut from = start.min(s.len());
        while !s.is_char_boundary(from) {
            from -= 1;
        }
        shorten(&s[from..])
    };
    format!("at byte {at}: expected …{} found …{}", window(expected), window(found))
}

/// Describes how a value of the same type differs; `None` when equal.
fn compare(expected: &Value, found: &Observed) -> Option<String> {
    match (expected, found) {
        (Value::String(e), Observed::String(f)) => (e != f).then(|| first_difference(e, f)),
        (Value::Set(e), Observed::Set(f)) => {
            let mut e = e.clone();
            e.sort();
            e.dedup();
            (e != *f).then(|| {
                let missing: Vec<&String> = e.iter().filter(|m| !f.contains(m)).take(3).collect();
                let extra: Vec<&String> = f.iter().filter(|m| !e.contains(m)).take(3).collect();
                format!("members missing {missing:?}, extra {extra:?}")
            })
        }
        (Value::List(e), Observed::List(f)) => (e != f).then(|| {
            let at = e.iter().zip(f).take_while(|(a, b)| a == b).count();
            format!("lengths {} vs {}, first difference at index {at}", e.len(), f.len())
        }),
        (Value::Zset(e), Observed::Zset(f)) => {
            let mut e: Vec<(String, f64)> = e.iter().map(|(s, m)| (m.clone(), *s as f64)).collect();
            e.sort_by(|a, b| a.0.cmp(&b.0));
            (e != *f).then(|| {
                let missing: Vec<&String> =
                    e.iter().filter(|m| !f.iter().any(|x| x.0 == m.0)).map(|m| &m.0).take(3).collect();
                let extra: Vec<&String> =
                    f.iter().filter(|m| !e.iter().any(|x| x.0 == m.0)).map(|m| &m.0).take(3).collect();
                format!("members missing {missing:?}, extra {extra:?} (or scores differ)")
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(value: Observed, ttl: i64) -> Inspected {
        Inspected { value, ttl }
    }

    #[test]
    fn values_are_compared_as_redis_holds_them() {
        assert_eq!(compare(&Value::String("a".into()), &Observed::String("a".into())), None);
        let d = compare(&Value::String("{\"a\":1}".into()), &Observed::String("{\"a\":2}".into())).unwrap();
        assert!(d.starts_with("at byte 5"), "{d}");
        assert_eq!(
            compare(&Value::Set(vec!["b".into(), "a".into()]), &Observed::Set(vec!["a".into(), "b".into()])),
            None
        );
        assert!(
            compare(&Value::Set(vec!["a".into()]), &Observed::Set(vec!["a".into(), "x".into()]))
                .unwrap()
                .contains("extra [\"x\"]")
        );
        assert_eq!(compare(&Value::Zset(vec![(5, "v".into())]), &Observed::Zset(vec![("v".into(), 5.0)])), None);
        assert!(compare(&Value::Zset(vec![(5, "v".into())]), &Observed::Zset(vec![("v".into(), 6.0)])).is_some());
        assert!(
            compare(&Value::List(vec!["1".into(), "2".into()]), &Observed::List(vec!["2".into(), "1".into()]))
                .unwrap()
                .contains("index 0")
        );
    }

    #[test]
    fn every_kind_of_difference_has_its_verdict() {
        let value = Value::String("1".into());
        assert_eq!(difference(Some(&value), &seen(Observed::String("1".into()), 60)), None);
        assert_eq!(difference(None, &seen(Observed::Missing, -2)), None);
        assert_eq!(difference(Some(&value), &seen(Observed::Missing, -2)), Some(Difference::Missing));
        assert_eq!(difference(None, &seen(Observed::String("1".into()), 60)), Some(Difference::Extra));
        assert_eq!(
            difference(Some(&value), &seen(Observed::List(vec![]), 60)),
            Some(Difference::WrongType("list".into(), "string"))
        );
        assert!(matches!(
            difference(Some(&value), &seen(Observed::String("2".into()), 60)),
            Some(Difference::WrongValue(_))
        ));
        assert_eq!(difference(Some(&value), &seen(Observed::String("1".into()), -1)), Some(Difference::NoTtl));
        assert_eq!(Difference::Missing.describe("app:k"), "missing app:k");
    }
}
