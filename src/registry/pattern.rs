//! Key patterns: `:`-separated segments, each a literal or a placeholder.
//! A placeholder is exactly one segment and never contains `:`.

use crate::keys::segment;
use std::fmt;

/// The most segments, and placeholders, a pattern may have: a key is split
/// once into a fixed array, and its values are returned in one, since the
/// sweep and the watcher's load classify every key of the cache.
pub const MAX_SEGMENTS: usize = 8;
pub const MAX_PLACEHOLDERS: usize = 4;

/// A key's `:`-separated parts (data prefix stripped), split once.
#[derive(Debug, Clone, Copy)]
pub struct Parts<'k> {
    parts: [&'k str; MAX_SEGMENTS],
    len: usize,
}

impl<'k> Parts<'k> {
    /// `None` when the key has more parts than any pattern.
    pub fn split(rest: &'k str) -> Option<Parts<'k>> {
        let mut parts = [""; MAX_SEGMENTS];
        let mut len = 0;
        for part in rest.split(':') {
            *parts.get_mut(len)? = part;
            len += 1;
        }
        Some(Parts { parts, len })
    }

    fn as_slice(&self) -> &[&'k str] {
        &self.parts[..self.len]
    }
}

/// A key's placeholder values, in pattern order. The slots past `len`
/// are always empty, so the derived equality is the values' equality.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Args<'k> {
    values: [&'k str; MAX_PLACEHOLDERS],
    len: usize,
}

impl<'k> Args<'k> {
    pub fn as_slice(&self) -> &[&'k str] {
        &self.values[..self.len]
    }
}

impl<'k> IntoIterator for Args<'k> {
    type Item = &'k str;
    type IntoIter = std::iter::Take<std::array::IntoIter<&'k str, MAX_PLACEHOLDERS>>;

    fn into_iter(self) -> Self::IntoIter {
        self.values.into_iter().take(self.len)
    }
}

impl<'k> std::ops::Deref for Args<'k> {
    type Target = [&'k str];

    fn deref(&self) -> &[&'k str] {
        self.as_slice()
    }
}

impl fmt::Debug for Args<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegmentKind {
    /// An id (`^[0-9A-Za-z_-]{1,128}$`), written as is.
    Id,
    /// Free text, percent-encoded by [`segment::encode_text`].
    Text,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    Literal(String),
    Placeholder { name: String, kind: SegmentKind },
}

impl Segment {
    fn accepts(&self, value: &str) -> bool {
        match self {
            Segment::Literal(lit) => lit == value,
            Segment::Placeholder { kind: SegmentKind::Id, .. } => segment::is_id_segment(value),
            Segment::Placeholder { kind: SegmentKind::Text, .. } => segment::is_encoded_text_segment(value),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pattern {
    raw: String,
    segments: Vec<Segment>,
}

impl Pattern {
    /// Parses `a:b:{name}`. Placeholder names ending in `Id` and `section`
    /// are id segments; `prefix` is free text; others are refused.
    pub fn parse(raw: &str) -> Result<Pattern, String> {
        let mut segments = Vec::new();
        for part in raw.split(':') {
            if part.is_empty() {
                return Err(format!("pattern `{raw}` has an empty segment"));
            }
            if let Some(name) = part.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
                let kind = if name.ends_with("Id") || name == "section" {
                    SegmentKind::Id
                } else if name == "prefix" {
                    SegmentKind::Text
                } else {
                    return Err(format!("placeholder `{{{name}}}` has no known segment kind"));
                };
                segments.push(Segment::Placeholder { name: name.to_string(), kind });
            } else if part.contains(['{', '}', '*', '?', '[', ']', '\\', '%']) {
                return Err(format!("literal segment `{part}` holds a reserved character"));
            } else {
                segments.push(Segment::Literal(part.to_string()));
            }
        }
        if !matches!(segments.first(), Some(Segment::Literal(_))) {
            return Err(format!("pattern `{raw}` must start with a literal segment"));
        }
        let placeholders = segments.iter().filter(|s| matches!(s, Segment::Placeholder { .. })).count();
        if segments.len() > MAX_SEGMENTS || placeholders > MAX_PLACEHOLDERS {
            return Err(format!(
                "pattern `{raw}` has more than {MAX_SEGMENTS} segments or {MAX_PLACEHOLDERS} placeholders"
            ));
        }
        Ok(Pattern { raw: raw.to_string(), segments })
    }

    pub fn raw(&self) -> &str {
        &self.raw
    }

    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    pub fn placeholders(&self) -> impl Iterator<Item = (&str, SegmentKind)> {
        self.segments.iter().filter_map(|s| match s {
            Segment::Placeholder { name, kind } => Some((name.as_str(), *kind)),
            Segment::Literal(_) => None,
        })
    }

    /// The placeholder values of a key of this pattern (data prefix
    /// stripped), in order; `None` when it is not of this pattern.
    pub fn captures<'k>(&self, rest: &'k str) -> Option<Args<'k>> {
        self.captures_parts(&Parts::split(rest)?)
    }

    /// [`Pattern::captures`] of a key already split.
    pub fn captures_parts<'k>(&self, parts: &Parts<'k>) -> Option<Args<'k>> {
        let parts = parts.as_slice();
        if parts.len() != self.segments.len() {
            return None;
        }
        let mut args = Args { values: [""; MAX_PLACEHOLDERS], len: 0 };
        for (seg, part) in self.segments.iter().zip(parts) {
            if !seg.accepts(part) {
                return None;
            }
            if matches!(seg, Segment::Placeholder { .. }) {
                args.values[args.len] = part;
                args.len += 1;
            }
        }
        Some(args)
    }

    /// Whether some key could match both patterns.
    pub fn overlaps(&self, other: &Pattern) -> bool {
        self.segments.len() == other.segments.len()
            && self.segments.iter().zip(&other.segments).all(|(a, b)| match (a, b) {
                (Segment::Literal(x), Segment::Literal(y)) => x == y,
                (Segment::Literal(x), p) | (p, Segment::Literal(x)) => p.accepts(x),
                (Segment::Placeholder { kind: ka, .. }, Segment::Placeholder { kind: kb, .. }) => {
                    // An id segment is always a valid encoded text segment.
                    let _ = (ka, kb);
                    true
                }
            })
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, seg) in self.segments.iter().enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            match seg {
                Segment::Literal(lit) => f.write_str(lit)?,
                Segment::Placeholder { name, .. } => write!(f, "{{{name}}}")?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_back() {
        let p = Pattern::parse("video:tag:list:{categoryId}:{tagId}").unwrap();
        assert_eq!(p.to_string(), "video:tag:list:{categoryId}:{tagId}");
        assert_eq!(p.placeholders().count(), 2);
    }

    #[test]
    fn refuses_bad_patterns() {
        assert!(Pattern::parse("a::b").is_err());
        assert!(Pattern::parse("{xId}:a").is_err());
        assert!(Pattern::parse("a:{what}").is_err());
        assert!(Pattern::parse("a:b*").is_err());
        assert!(Pattern::parse("a:b:c:d:e:f:g:h:i").is_err(), "more segments than a key is split into");
        assert!(Pattern::parse("a:{aId}:{bId}:{cId}:{dId}:{eId}").is_err(), "more values than captures hold");
    }

    #[test]
    fn captures_take_the_values_in_order_from_one_split() {
        let p = Pattern::parse("video:tag:list:{categoryId}:{tagId}").unwrap();
        assert_eq!(p.captures("video:tag:list:c1:t2").unwrap().as_slice(), ["c1", "t2"]);
        assert_eq!(p.captures("video:tag:list:c1:t2").unwrap().into_iter().collect::<Vec<_>>(), ["c1", "t2"]);
        for other in ["video:tag:list:c1", "video:tag:list:c1:t2:x", "video:tag:lists:c1:t2", "video:tag:list:c 1:t2"] {
            assert!(p.captures(other).is_none(), "{other}");
        }
        // Keys of more parts than any pattern has are of no pattern.
        assert!(Parts::split("a:b:c:d:e:f:g:h").is_some());
        assert!(Parts::split("a:b:c:d:e:f:g:h:i").is_none());
    }

    #[test]
    fn literal_against_placeholder_overlap_depends_on_the_segment_kind() {
        let a = Pattern::parse("x:{aId}").unwrap();
        assert!(a.overlaps(&Pattern::parse("x:all").unwrap()));
        assert!(!a.overlaps(&Pattern::parse("x:all:b").unwrap()));
        assert!(!Pattern::parse("x:all").unwrap().overlaps(&Pattern::parse("y:all").unwrap()));
    }
}
