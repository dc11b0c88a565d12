//! Decoded source entities and the value rules the contract puts on them:
//! usable ids, numbers, JS-compatible JSON and BSON → JSON conversion.

pub mod bson_json;
pub mod catalog;
pub mod compact;
pub mod decode;
pub mod id;
pub mod json;
pub mod num;
pub mod plain;
pub mod report;
pub mod video;

/// Every copy of a BSON document with one byte, past its length and
/// before its terminator, set to one of `values`: with the position and
/// the value set, the malformed inputs of the decoding tests.
#[cfg(test)]
pub(crate) fn corrupted<'a>(bytes: &'a [u8], values: &'a [u8]) -> impl Iterator<Item = (usize, u8, Vec<u8>)> + 'a {
    (4..bytes.len() - 1).flat_map(move |at| {
        values.iter().map(move |&byte| {
            let mut corrupt = bytes.to_vec();
            corrupt[at] = byte;
            (at, byte, corrupt)
        })
    })
}
