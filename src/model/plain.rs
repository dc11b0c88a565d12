//! A fast check that a document is plain: made only of the BSON types a
//! catalogue document ordinarily holds (numbers, strings, booleans, dates,
//! ObjectIds, binary, null, and documents and arrays of them), every length in
//! bounds and every string valid UTF-8.
//!
//! The watcher's load reads every video to file its references but writes
//! no payload, yet it must reject the malformed documents a rebuild
//! rejects. Walking each value through the BSON library for that was most
//! of the load's CPU. A plain document cannot fail that walk, so its
//! values need not be read one by one; any other document (a rarer type,
//! a length that does not fit) takes the library's walk as before. The
//! check only has to be sound, never complete: answering `false` costs
//! time, not exactness.

use mongodb::bson::oid::ObjectId;
use mongodb::bson::{DateTime, Decimal128, RawBinaryRef, RawBsonRef, RawDocument, RawDocumentBuf};

/// Whether every element of the document walks without error through
/// `RawDocument::iter` and [`super::bson_json::check_value`].
#[cfg(test)]
pub fn is_plain(bytes: &[u8]) -> bool {
    plain_document(bytes, 0, None)
}

/// When the document is plain, a copy of it holding only the elements
/// whose key `keep` accepts, in their order (repeated keys included).
///
/// A decoder that reads only those fields, and otherwise needs the
/// document only to walk without error, then walks a few elements instead
/// of all of them: the copy answers every lookup and iteration of those
/// keys as the whole document does, and a plain document's other
/// elements cannot fail.
pub fn slim(bytes: &[u8], keep: impl Fn(&str) -> bool) -> Option<RawDocumentBuf> {
    // The length is filled in once the kept elements are in.
    let mut out = vec![0; 4];
    let mut visit = |key: &str, element: std::ops::Range<usize>| {
        if keep(key) {
            out.extend_from_slice(&bytes[element]);
        }
    };
    if !plain_document(bytes, 0, Some(&mut visit)) {
        return None;
    }
    out.push(0);
    let len = out.len() as i32;
    out[..4].copy_from_slice(&len.to_le_bytes());
    RawDocumentBuf::from_bytes(out).ok()
}

/// Deeper nesting is left to the library (and stack depth stays bounded).
const MAX_DEPTH: usize = 32;

/// Sees each of a document's own elements: its key and its byte range
/// (type, key and value).
type Visit<'v> = &'v mut dyn FnMut(&str, std::ops::Range<usize>);

/// Walks a document, showing its own elements to `visit` when given.
fn plain_document(bytes: &[u8], depth: usize, mut visit: Option<Visit<'_>>) -> bool {
    let len = bytes.len();
    if len < 5 || depth > MAX_DEPTH || read_i32(bytes, 0) != Some(len as i32) || bytes[len - 1] != 0 {
        return false;
    }
    // The last byte is the terminator: every element must end before it.
    let end = len - 1;
    let mut at = 4;
    while at < end {
        let Some(element) = element_at(bytes, at, end) else { return false };
        let Element { tag, key, value, size, .. } = element;
        if matches!(tag, 0x03 | 0x04) && !plain_document(&bytes[value..value + size], depth + 1, None) {
            return false;
        }
        if let Some(visit) = visit.as_mut() {
            visit(key, at..value + size);
        }
        at = value + size;
    }
    at == end
}

/// One element of a plain type, framed: its type byte, key, and where its
/// value starts and how long it is.
struct Element<'a> {
    tag: u8,
    key: &'a str,
    value: usize,
    size: usize,
    /// A string's text (empty for other types).
    text: &'a str,
}

/// The element at `at` when its type is plain and it ends before `end`
/// (a document's terminator). Nested documents and arrays are framed
/// (their length in bounds, at least 5), not looked into.
fn element_at(bytes: &[u8], at: usize, end: usize) -> Option<Element<'_>> {
    let tag = bytes[at];
    let key_len = bytes[at + 1..end].iter().position(|&b| b == 0)?;
    let key = utf8(&bytes[at + 1..at + 1 + key_len])?;
    let value = at + 1 + key_len + 1;
    let mut text = "";
    let size = match tag {
        // double, datetime, timestamp, int64
        0x01 | 0x09 | 0x11 | 0x12 => 8,
        0x10 => 4,
        0x07 => 12,
        0x13 => 16,
        // null, undefined, min key, max key
        0x0A | 0x06 | 0xFF | 0x7F => 0,
        0x08 => match bytes.get(value) {
            Some(0 | 1) => 1,
            _ => return None,
        },
        // string, JavaScript code, symbol
        0x02 | 0x0D | 0x0E => {
            let (found, size) = string_at(&bytes[..end], value)?;
            text = found;
            size
        }
        // binary, but for the old subtype whose inner length the
        // library checks
        0x05 => match (read_i32(bytes, value), bytes.get(value + 4)) {
            (Some(n), Some(&subtype)) if n >= 0 && subtype != 0x02 => 5 + n as usize,
            _ => return None,
        },
        // document, array
        0x03 | 0x04 => match read_i32(bytes, value) {
            Some(n) if n >= 5 => n as usize,
            _ => return None,
        },
        _ => return None,
    };
    (value + size <= end).then_some(Element { tag, key, value, size, text })
}

/// The bytes as text when they are UTF-8. Keys are short and nearly
/// always ASCII, which is checked without the general validator's
/// per-call cost: for a video's fifty keys, 2.6% fewer instructions in a
/// warm 58K rebuild (callgrind).
fn utf8(bytes: &[u8]) -> Option<&str> {
    if bytes.is_ascii() {
        // SAFETY: every ASCII byte sequence is valid UTF-8.
        Some(unsafe { std::str::from_utf8_unchecked(bytes) })
    } else {
        std::str::from_utf8(bytes).ok()
    }
}

/// The text and size of a length-prefixed, NUL-terminated UTF-8 string
/// at `at`.
fn string_at(bytes: &[u8], at: usize) -> Option<(&str, usize)> {
    let n = read_i32(bytes, at)?;
    if n < 1 {
        return None;
    }
    let size = 4 + n as usize;
    let text = bytes.get(at + 4..at + size)?;
    let (last, text) = text.split_last()?;
    if *last != 0 {
        return None;
    }
    Some((std::str::from_utf8(text).ok()?, size))
}

/// A value as [`each_element`] gives it: the library's own reference,
/// but an array as the document it is framed as (the library builds an
/// array reference only in its own walk). Iterating that document gives
/// the array's values as iterating the array does, each with its index
/// as key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Val<'a> {
    Bson(RawBsonRef<'a>),
    Array(&'a RawDocument),
}

impl<'a> Val<'a> {
    /// The library's value in this form.
    pub fn of(value: RawBsonRef<'a>) -> Val<'a> {
        match value {
            // The library framed the array as a document when it made the
            // reference, with this same check: it cannot fail here.
            RawBsonRef::Array(arr) => {
                Val::Array(RawDocument::from_bytes(arr.as_bytes()).expect("an array the library framed is a document"))
            }
            other => Val::Bson(other),
        }
    }

    /// The value when it is not an array.
    pub fn bson(self) -> Option<RawBsonRef<'a>> {
        match self {
            Val::Bson(value) => Some(value),
            Val::Array(_) => None,
        }
    }
}

/// Visits a document's own elements, as iterating it through the library
/// yields them, while each is of a plain type, in bounds, and framed (a
/// nested document or array is framed, not walked: the library's
/// iteration does not look into it either). Gives `Ok(false)` at the
/// first element it does not take, having shown `visit` the ones before
/// it; the caller then takes the library's walk from the start, which
/// decides on that element as it always did. A timestamp is left to the
/// library too.
///
/// The library's walk builds an error value at each step it checks and
/// validates each key again; through it, a video's own elements were
/// about a tenth of a rebuild's CPU.
pub fn each_element<'a, E>(
    doc: &'a RawDocument,
    mut visit: impl FnMut(&'a str, Val<'a>) -> Result<(), E>,
) -> Result<bool, E> {
    let bytes = doc.as_bytes();
    // A `RawDocument` is framed: its length is its size, its last byte 0.
    let end = bytes.len() - 1;
    let mut at = 4;
    while at < end {
        let Some(Element { tag, key, value, size, text }) = element_at(bytes, at, end) else { return Ok(false) };
        let span = &bytes[value..value + size];
        let val = match tag {
            0x01 => Val::Bson(RawBsonRef::Double(f64::from_le_bytes(array(span)))),
            0x02 => Val::Bson(RawBsonRef::String(text)),
            0x0D => Val::Bson(RawBsonRef::JavaScriptCode(text)),
            0x0E => Val::Bson(RawBsonRef::Symbol(text)),
            0x03 => match RawDocument::from_bytes(span) {
                Ok(nested) => Val::Bson(RawBsonRef::Document(nested)),
                Err(_) => return Ok(false),
            },
            0x04 => match RawDocument::from_bytes(span) {
                Ok(nested) => Val::Array(nested),
                Err(_) => return Ok(false),
            },
            0x05 => Val::Bson(RawBsonRef::Binary(RawBinaryRef { subtype: span[4].into(), bytes: &span[5..] })),
            0x07 => Val::Bson(RawBsonRef::ObjectId(ObjectId::from_bytes(array(span)))),
            0x08 => Val::Bson(RawBsonRef::Boolean(span[0] == 1)),
            0x09 => Val::Bson(RawBsonRef::DateTime(DateTime::from_millis(i64::from_le_bytes(array(span))))),
            0x0A => Val::Bson(RawBsonRef::Null),
            0x06 => Val::Bson(RawBsonRef::Undefined),
            0xFF => Val::Bson(RawBsonRef::MinKey),
            0x7F => Val::Bson(RawBsonRef::MaxKey),
            0x10 => Val::Bson(RawBsonRef::Int32(i32::from_le_bytes(array(span)))),
            0x12 => Val::Bson(RawBsonRef::Int64(i64::from_le_bytes(array(span)))),
            0x13 => Val::Bson(RawBsonRef::Decimal128(Decimal128::from_bytes(array(span)))),
            _ => return Ok(false),
        };
        visit(key, val)?;
        at = value + size;
    }
    Ok(true)
}

/// The first `N` bytes of a value (its frame has exactly that many).
fn array<const N: usize>(span: &[u8]) -> [u8; N] {
    span[..N].try_into().expect("the element's frame holds its fixed size")
}

fn read_i32(bytes: &[u8], at: usize) -> Option<i32> {
    let four = bytes.get(at..at.checked_add(4)?)?;
    Some(i32::from_le_bytes(four.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::bson_json::check_value;
    use mongodb::bson::{
        Binary, Bson, DateTime, Decimal128, RawDocument, RawDocumentBuf, Timestamp, doc, oid::ObjectId, spec,
    };

    /// What the check stands for: the library's walk of every value.
    fn walks(doc: &RawDocument) -> bool {
        doc.iter().all(|e| e.is_ok_and(|(_, value)| check_value(value).is_ok()))
    }

    fn base() -> RawDocumentBuf {
        RawDocumentBuf::from_document(&doc! {
            "_id": ObjectId::parse_str("65a1b2c3d4e5f6a7b8c9d0e1").unwrap(),
            "title": "tïtle", "listStatus": 1_i32, "views": 12_i64, "score": 2.5, "ok": true,
            "addedTime": DateTime::from_millis(7), "ts": Timestamp { time: 1, increment: 2 },
            "categoryIds": ["c1", "c2"], "tagIds": [], "pc": "2.50".parse::<Decimal128>().unwrap(),
            "pb": Binary { subtype: spec::BinarySubtype::Generic, bytes: vec![1, 2, 3] }, "meta": { "a": "b", "n": null, "deep": { "x": [1_i32] } },
        })
        .unwrap()
    }

    #[test]
    fn ordinary_documents_are_plain() {
        assert!(is_plain(base().as_bytes()));
        assert!(is_plain(RawDocumentBuf::new().as_bytes()));
    }

    #[test]
    fn a_slim_copy_keeps_the_chosen_elements_in_order() {
        let mut doc = RawDocumentBuf::new();
        doc.append("a", 1_i32);
        doc.append("t", "x");
        doc.append("m", RawDocumentBuf::from_document(&doc! { "t": "nested" }).unwrap());
        doc.append("t", "y");
        doc.append("b", true);
        let copy = slim(doc.as_bytes(), |key| key == "t").expect("plain");
        let kept: Vec<(&str, &str)> = copy.iter().map(|e| e.map(|(k, v)| (k, v.as_str().unwrap())).unwrap()).collect();
        assert_eq!(kept, [("t", "x"), ("t", "y")], "both repeats, in order; not the nested one");
        assert_eq!(copy.get_str("t").unwrap(), "x", "a lookup finds the first, as in the whole document");
        let none = slim(doc.as_bytes(), |_| false).unwrap();
        assert!(none.is_empty());
        let old = Binary { subtype: spec::BinarySubtype::BinaryOld, bytes: vec![1, 2] };
        let other = RawDocumentBuf::from_document(&doc! { "t": "x", "b": old }).unwrap();
        assert!(slim(other.as_bytes(), |_| true).is_none(), "not plain: no copy");
    }

    #[test]
    fn rarer_types_take_the_library_walk() {
        let old = Binary { subtype: spec::BinarySubtype::BinaryOld, bytes: vec![1, 2] };
        let regex = mongodb::bson::Regex { pattern: "a".into(), options: "i".into() };
        for doc in [doc! { "b": old }, doc! { "r": regex }] {
            let doc = RawDocumentBuf::from_document(&doc).unwrap();
            assert!(!is_plain(doc.as_bytes()));
            assert!(walks(&doc));
        }
    }

    /// The plain walk gives each element as the library's iteration does,
    /// up to where it stops, on documents corrupted byte by byte; where it
    /// does not stop, the library's iteration ends without error there
    /// too. Arrays come as their documents.
    #[test]
    fn the_plain_walk_gives_what_the_library_gives() {
        // The timestamp is left to the library: without it here, so that
        // the walk goes on.
        let mut doc = RawDocumentBuf::new();
        for element in base().iter() {
            let (key, value) = element.unwrap();
            if key != "ts" {
                doc.append(key, value.to_raw_bson());
            }
        }
        doc.append("js", mongodb::bson::RawBson::JavaScriptCode("f()".into()));
        doc.append("sym", mongodb::bson::RawBson::Symbol("s".into()));
        doc.append("ints", RawDocumentBuf::from_document(&doc! { "0": [1_i32, [2_i64]], "1": -3.5 }).unwrap());
        for value in [Bson::MinKey, Bson::MaxKey, Bson::Undefined, Bson::Null, Bson::Boolean(false)] {
            doc.append(format!("k{}", doc.iter().count()), mongodb::bson::RawBson::try_from(value).unwrap());
        }
        let bytes = doc.as_bytes().to_vec();
        let (mut whole, mut stopped) = (0, 0);
        let values = [0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x08, 0x10, 0x11, 0x7f, 0x80, 0xc0, 0xff];
        for (at, byte, corrupt) in crate::model::corrupted(&bytes, &values).chain([(0, 0, bytes.clone())]) {
            let doc = RawDocument::from_bytes(&corrupt).unwrap();
            let mut library = doc.iter();
            let walked = each_element(doc, |key, value| {
                let expected = library.next().map(|e| e.map(|(key, value)| (key, Val::of(value))).ok());
                assert_eq!(expected, Some(Some((key, value))), "byte {at} set to {byte:#x}");
                Ok::<_, ()>(())
            });
            if walked == Ok(true) {
                assert!(library.next().is_none(), "the library's walk goes on: byte {at} set to {byte:#x}");
                whole += 1;
            } else {
                stopped += 1;
            }
        }
        assert!(whole > 300 && stopped > 300, "{whole} whole, {stopped} stopped");
        assert_eq!(each_element(&base(), |_, _| Ok::<_, ()>(())), Ok(false), "the timestamp is the library's");
    }

    /// Sound on documents corrupted byte by byte: a document called plain
    /// walks through the library without error. Both answers are met, so
    /// the check is neither always `false` nor blind.
    #[test]
    fn a_plain_document_always_walks() {
        let bytes = base().as_bytes().to_vec();
        let (mut plain, mut other, mut broken) = (0, 0, 0);
        let values = [0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x08, 0x10, 0x7f, 0x80, 0xc0, 0xff];
        for (at, byte, corrupt) in crate::model::corrupted(&bytes, &values) {
            let doc = RawDocument::from_bytes(&corrupt).unwrap();
            let walked = walks(doc);
            if is_plain(&corrupt) {
                assert!(walked, "called plain but does not walk: byte {at} set to {byte:#x}");
                plain += 1;
            } else if walked {
                other += 1;
            } else {
                broken += 1;
            }
        }
        assert!(plain > 500 && broken > 500, "{plain} plain, {other} walk but not plain, {broken} broken");
    }
}
