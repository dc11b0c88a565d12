//! Typed key constructors. Every data key the service writes is rendered
//! here from its family's registered pattern; no other module formats keys.

pub mod segment;
pub mod slot;
pub mod status;

use crate::registry::{FamilyId, Registry, SegmentKind};
use std::fmt;

/// A rendered data key and the family it belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key {
    pub family: FamilyId,
    pub text: String,
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("family {family} takes {expected} segment(s), got {got}")]
    Arity { family: FamilyId, expected: usize, got: usize },
    #[error("`{value}` is not a usable id for {family}")]
    BadId { family: FamilyId, value: String },
}

/// Renders keys under one data prefix.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: impl Into<String>) -> Keys {
        Keys { prefix: prefix.into() }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Renders a key of `family` from its placeholder values, in pattern
    /// order. Id values are checked; free text is encoded.
    pub fn render(&self, family: FamilyId, args: &[&str]) -> Result<Key, KeyError> {
        let pattern = &Registry::get().family(family).pattern;
        let expected = pattern.placeholders().count();
        if expected != args.len() {
            return Err(KeyError::Arity { family, expected, got: args.len() });
        }
        let mut text = String::with_capacity(
            self.prefix.len() + pattern.raw().len() + args.iter().map(|a| a.len()).sum::<usize>(),
        );
        text.push_str(&self.prefix);
        let mut args = args.iter();
        for (i, seg) in pattern.segments().iter().enumerate() {
            if i > 0 {
                text.push(':');
            }
            match seg {
                crate::registry::Segment::Literal(lit) => text.push_str(lit),
                crate::registry::Segment::Placeholder { kind, .. } => {
                    let value = args.next().copied().unwrap_or_default();
                    match kind {
                        SegmentKind::Id if segment::is_id_segment(value) => text.push_str(value),
                        SegmentKind::Id => {
                            return Err(KeyError::BadId { family, value: value.to_string() });
                        }
                        SegmentKind::Text => text.push_str(&segment::encode_text(value)),
                    }
                }
            }
        }
        Ok(Key { family, text })
    }

    /// Renders a key whose values the caller has already checked (decoded
    /// ids, configured section names). A failure here is a planner bug.
    pub fn key(&self, family: FamilyId, args: &[&str]) -> Key {
        self.render(family, args).unwrap_or_else(|err| panic!("planner produced a bad key: {err}"))
    }

    /// The family of a full key under this prefix, if it has one.
    pub fn classify(&self, key: &str) -> Option<FamilyId> {
        Registry::get().classify(key.strip_prefix(&self.prefix)?)
    }

    /// A full key's family and placeholder values, if it has a family.
    pub fn parse<'k>(&self, key: &'k str) -> Option<(FamilyId, crate::registry::Args<'k>)> {
        Registry::get().parse(key.strip_prefix(&self.prefix)?)
    }

    /// The prefix with glob metacharacters escaped, for SCAN MATCH.
    pub fn scan_glob_prefix(&self) -> String {
        escape_glob(&self.prefix)
    }
}

/// Escapes the glob metacharacters Redis MATCH understands.
fn escape_glob(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_what_it_renders() {
        let keys = Keys::new("app:");
        for (family, args) in [
            (FamilyId::VideoTagList, vec!["c1", "t2"]),
            (FamilyId::VideoCategoryIndex, vec!["c1"]),
            (FamilyId::VideoListHome, vec!["ch", "latest"]),
            (FamilyId::ChannelAll, vec![]),
        ] {
            let key = keys.key(family, &args);
            assert_eq!(keys.parse(&key.text).map(|(f, a)| (f, a.to_vec())), Some((family, args.clone())), "{key}");
        }
        assert_eq!(keys.parse("app:video:tag:list:c1"), None);
        assert_eq!(keys.parse("other:channel:all"), None);
    }

    #[test]
    fn renders_from_the_registry() {
        let keys = Keys::new("app:");
        assert_eq!(keys.key(FamilyId::ChannelAll, &[]).text, "app:channel:all");
        assert_eq!(keys.key(FamilyId::VideoCategoryIndex, &["c1"]).text, "app:video:category:index:c1:videos");
        assert_eq!(keys.key(FamilyId::TagSearch, &["a b"]).text, "app:tag:search:a%20b");
        assert_eq!(keys.key(FamilyId::TagSearch, &["动作"]).text, "app:tag:search:动作");
        assert_eq!(
            keys.render(FamilyId::VideoDetail, &["a:b"]),
            Err(KeyError::BadId { family: FamilyId::VideoDetail, value: "a:b".into() })
        );
        assert!(matches!(keys.render(FamilyId::VideoTagList, &["a"]), Err(KeyError::Arity { .. })));
    }

    #[test]
    fn every_rendered_key_classifies_back_to_its_family() {
        let keys = Keys::new("app:v2:");
        for family in Registry::get().families() {
            let args: Vec<&str> = family.pattern.placeholders().map(|_| "x1").collect();
            let key = keys.key(family.id, &args);
            assert_eq!(keys.classify(&key.text), Some(family.id), "{}", key.text);
            assert!(key.text.starts_with("app:v2:"));
        }
        assert_eq!(Keys::new("app:").classify("app:v2:channel:all"), None);
    }

    #[test]
    fn scan_globs_escape_the_prefix() {
        let keys = Keys::new("a*b:");
        assert_eq!(keys.scan_glob_prefix(), "a\\*b:");
    }
}
