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

use mongodb::bson::RawDocumentBuf;

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
        let tag = bytes[at];
        let Some(key_len) = bytes[at + 1..end].iter().position(|&b| b == 0) else { return false };
        let Ok(key) = std::str::from_utf8(&bytes[at + 1..at + 1 + key_len]) else { return false };
        let value = at + 1 + key_len + 1;
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
                _ => return false,
            },
            // string, JavaScript code, symbol
            0x02 | 0x0D | 0x0E => match string_size(&bytes[..end], value) {
                Some(size) => size,
                None => return false,
            },
            // binary, but for the old subtype whose inner length the
            // library checks
            0x05 => match (read_i32(bytes, value), bytes.get(value + 4)) {
                (Some(n), Some(&subtype)) if n >= 0 && subtype != 0x02 => 5 + n as usize,
                _ => return false,
            },
            // document, array
            0x03 | 0x04 => match read_i32(bytes, value) {
                Some(n) if n >= 5 && value + n as usize <= end => {
                    if !plain_document(&bytes[value..value + n as usize], depth + 1, None) {
                        return false;
                    }
                    n as usize
                }
                _ => return false,
            },
            _ => return false,
        };
        if value + size > end {
            return false;
        }
        if let Some(visit) = visit.as_mut() {
            visit(key, at..value + size);
        }
        at = value + size;
    }
    at == end
}

/// The size of a length-prefixed, NUL-terminated UTF-8 string at `at`.
fn string_size(bytes: &[u8], at: usize) -> Option<usize> {
    let n = read_i32(bytes, at)?;
    if n < 1 {
        return None;
    }
    let size = 4 + n as usize;
    let text = bytes.get(at + 4..at + size)?;
    let (last, text) = text.split_last()?;
    (*last == 0 && std::str::from_utf8(text).is_ok()).then_some(size)
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
        Binary, DateTime, Decimal128, RawDocument, RawDocumentBuf, Timestamp, doc, oid::ObjectId, spec,
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
