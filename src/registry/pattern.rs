//! Key patterns: `:`-separated segments, each a literal or a placeholder.
//! A placeholder is exactly one segment and never contains `:`.

use crate::keys::segment;
use std::fmt;

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

    /// Whether a key, with the data prefix stripped, is of this pattern.
    pub fn matches(&self, rest: &str) -> bool {
        let mut parts = rest.split(':');
        for seg in &self.segments {
            match parts.next() {
                Some(part) if seg.accepts(part) => {}
                _ => return false,
            }
        }
        parts.next().is_none()
    }

    /// The placeholder values of a key of this pattern (data prefix
    /// stripped), in order; `None` when it is not of this pattern.
    pub fn captures<'k>(&self, rest: &'k str) -> Option<Vec<&'k str>> {
        let mut parts = rest.split(':');
        let mut values = Vec::new();
        for seg in &self.segments {
            let part = parts.next().filter(|p| seg.accepts(p))?;
            if matches!(seg, Segment::Placeholder { .. }) {
                values.push(part);
            }
        }
        parts.next().is_none().then_some(values)
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
    }

    #[test]
    fn literal_against_placeholder_overlap_depends_on_the_segment_kind() {
        let a = Pattern::parse("x:{aId}").unwrap();
        assert!(a.overlaps(&Pattern::parse("x:all").unwrap()));
        assert!(!a.overlaps(&Pattern::parse("x:all:b").unwrap()));
        assert!(!Pattern::parse("x:all").unwrap().overlaps(&Pattern::parse("y:all").unwrap()));
    }
}
