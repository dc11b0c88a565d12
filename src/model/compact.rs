//! Compact forms of ids and references: written ids as 12 bytes when
//! they are ObjectId hex, category and tag references interned as `u32`
//! symbols (the watcher's video store and the rebuild's index keep them).

use rustc_hash::FxHashMap as HashMap;
use std::fmt;

/// A written id. The 24 lowercase hex digits of an ObjectId (what nearly
/// every id is) are kept as their 12 bytes; any other id as its text,
/// behind one more pointer so that a `Wid` is 16 bytes, not 24 (it is
/// filed once per scope a video is in). The two forms never describe the
/// same text, so equality is the text's.
#[derive(Clone, PartialEq, Eq, Hash)]
pub enum Wid {
    Hex([u8; 12]),
    Text(Box<Box<str>>),
}

impl Wid {
    pub fn new(text: &str) -> Wid {
        match hex12(text) {
            Some(bytes) => Wid::Hex(bytes),
            None => Wid::Text(Box::new(text.into())),
        }
    }

    /// The id as text (allocates for the hex form).
    pub fn text(&self) -> String {
        self.to_string()
    }

    pub fn as_ref(&self) -> WidRef<'_> {
        match self {
            Wid::Hex(bytes) => WidRef::Hex(bytes),
            Wid::Text(text) => WidRef::Text(text),
        }
    }

    /// Calls `f` with the id as text, without allocating.
    pub fn with_text<R>(&self, f: impl FnOnce(&str) -> R) -> R {
        match self {
            Wid::Hex(bytes) => f(std::str::from_utf8(&hex24(bytes)).expect("hex digits")),
            Wid::Text(text) => f(text),
        }
    }
}

/// A `Wid` equals a text when it is that id.
impl PartialEq<str> for Wid {
    fn eq(&self, other: &str) -> bool {
        self.with_text(|text| text == other)
    }
}

impl PartialEq<&str> for Wid {
    fn eq(&self, other: &&str) -> bool {
        *self == **other
    }
}

/// A borrowed [`Wid`]: what the video store hands out without copying
/// (its records keep an ObjectId's bytes, not a `Wid`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub enum WidRef<'a> {
    Hex(&'a [u8; 12]),
    Text(&'a str),
}

impl WidRef<'_> {
    pub fn text(&self) -> String {
        match self {
            WidRef::Hex(bytes) => std::str::from_utf8(&hex24(bytes)).expect("hex digits").to_owned(),
            WidRef::Text(text) => (*text).to_owned(),
        }
    }

    pub fn to_owned(&self) -> Wid {
        match self {
            WidRef::Hex(bytes) => Wid::Hex(**bytes),
            WidRef::Text(text) => Wid::Text(Box::new((*text).into())),
        }
    }
}

/// The same order as [`Wid`]'s.
impl Ord for WidRef<'_> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        match (self, other) {
            (WidRef::Hex(a), WidRef::Hex(b)) => a.cmp(b),
            (WidRef::Text(a), WidRef::Text(b)) => a.cmp(b),
            _ => self.text().cmp(&other.text()),
        }
    }
}

impl PartialOrd for WidRef<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for WidRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WidRef::Hex(bytes) => f.write_str(std::str::from_utf8(&hex24(bytes)).expect("hex digits")),
            WidRef::Text(text) => f.write_str(text),
        }
    }
}

impl fmt::Debug for WidRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.to_string())
    }
}

/// Text order, the contract's tie-break (ids compared as bytes): two hex
/// forms compare by their bytes, which is their text's order; mixed
/// forms compare by text.
impl Ord for Wid {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_ref().cmp(&other.as_ref())
    }
}

impl PartialOrd for Wid {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for Wid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_ref().fmt(f)
    }
}

impl fmt::Debug for Wid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.as_ref().fmt(f)
    }
}

/// The 24 lowercase hex digits of 12 bytes (formatting byte by byte with
/// `{:02x}` cost a rebuild several percent of its CPU).
fn hex24(bytes: &[u8; 12]) -> [u8; 24] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 24];
    for (i, b) in bytes.iter().enumerate() {
        out[2 * i] = DIGITS[usize::from(b >> 4)];
        out[2 * i + 1] = DIGITS[usize::from(b & 0xf)];
    }
    out
}

/// The bytes of 24 lowercase hex digits (uppercase would not round-trip).
pub(crate) fn hex12(text: &str) -> Option<[u8; 12]> {
    let digits = text.as_bytes();
    if digits.len() != 24 {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut out = [0u8; 12];
    for (i, pair) in digits.chunks_exact(2).enumerate() {
        out[i] = (nibble(pair[0])? << 4) | nibble(pair[1])?;
    }
    Some(out)
}

/// An interned category or tag reference.
pub type Sym = u32;

/// Category and tag references as stored in videos, each text once. The
/// table keeps every reference it has seen: it is bounded by the distinct
/// references in the data (the catalogue, plus whatever dangling ids the
/// videos carry), not by the number of videos.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Syms {
    names: Vec<Box<str>>,
    by_name: HashMap<Box<str>, Sym>,
}

impl Syms {
    pub fn intern(&mut self, name: &str) -> Sym {
        if let Some(&sym) = self.by_name.get(name) {
            return sym;
        }
        let sym = Sym::try_from(self.names.len()).expect("fewer than 4 billion distinct references");
        self.names.push(name.into());
        self.by_name.insert(name.into(), sym);
        sym
    }

    /// The symbol of a reference already seen.
    pub fn get(&self, name: &str) -> Option<Sym> {
        self.by_name.get(name).copied()
    }

    pub fn name(&self, sym: Sym) -> &str {
        &self.names[sym as usize]
    }

    /// How many symbols there are: each is below it.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_id_hex_is_kept_as_bytes_and_reads_back_the_same() {
        let hex = "65a1b2c3d4e5f6a7b8c9d0e1";
        assert!(matches!(Wid::new(hex), Wid::Hex(_)));
        assert_eq!(Wid::new(hex).text(), hex);
        for other in ["65A1B2C3D4E5F6A7B8C9D0E1", "65a1b2c3d4e5f6a7b8c9d0e", "v-1", "65a1b2c3d4e5f6a7b8c9d0zz"] {
            assert!(matches!(Wid::new(other), Wid::Text(_)), "{other}");
            assert_eq!(Wid::new(other).text(), other);
        }
    }

    #[test]
    fn a_wid_is_16_bytes() {
        assert_eq!(std::mem::size_of::<Wid>(), 16);
    }

    #[test]
    fn wids_order_as_their_text() {
        let ids =
            ["0000000000000000000000ff", "65a1b2c3d4e5f6a7b8c9d0e1", "65a1", "Z", "a", "ffffffffffffffffffffffff"];
        let mut texts: Vec<&str> = ids.to_vec();
        texts.sort_unstable();
        let mut wids: Vec<Wid> = ids.iter().map(|s| Wid::new(s)).collect();
        wids.sort();
        assert_eq!(wids.iter().map(Wid::text).collect::<Vec<_>>(), texts);
    }

    #[test]
    fn a_reference_is_interned_once() {
        let mut syms = Syms::default();
        let (a, b) = (syms.intern("c1"), syms.intern("t1"));
        assert_eq!(syms.intern("c1"), a);
        assert_ne!(a, b);
        assert_eq!((syms.name(a), syms.get("t1"), syms.get("x")), ("c1", Some(b), None));
    }
}
