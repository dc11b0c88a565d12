//! A collection as the serialized value `RESTORE` takes, so that one
//! command replaces a set, list or sorted set whole with its TTL, where
//! the commands would be `UNLINK`, the adds and `EXPIRE`: about 17% of
//! Redis's CPU at 58K (docs/BENCHMARKS.md, "collections written by
//! `RESTORE`").
//!
//! The value uses the plain encodings every Redis since 5.0 loads (the
//! ones it converts to its compact forms as it loads them, as it does
//! after the adds): a length, then each element as a length and its
//! bytes. After it come the format's version (9, Redis 5.0's) and a
//! CRC-64 of everything before, both little-endian; Redis refuses a
//! value whose version is newer than its own or whose checksum differs.

use crate::plan::Value;

/// The format version the values claim: Redis 5.0's, the oldest that
/// has every type below.
const VERSION: u16 = 9;

/// Type bytes of the plain encodings.
const SET: u8 = 2;
const LIST: u8 = 1;
/// A sorted set with binary scores (`ZSET_2`).
const ZSET: u8 = 5;

/// The serialized value of a collection; `None` for a string, which
/// `SET … EX` writes in one command already.
pub fn payload(value: &Value) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(value_bytes(value) + 16);
    match value {
        Value::String(_) => return None,
        Value::Set(members) => {
            out.push(SET);
            length(&mut out, members.len());
            members.iter().for_each(|m| bytes(&mut out, m.as_bytes()));
        }
        Value::List(items) => {
            out.push(LIST);
            length(&mut out, items.len());
            items.iter().for_each(|i| bytes(&mut out, i.as_bytes()));
        }
        Value::Zset(members) => {
            out.push(ZSET);
            length(&mut out, members.len());
            for (score, member) in members {
                bytes(&mut out, member.as_bytes());
                // Scores are milliseconds, exact as doubles below 2^53,
                // as `ZADD` parses their text.
                out.extend_from_slice(&(*score as f64).to_le_bytes());
            }
        }
    }
    out.extend_from_slice(&VERSION.to_le_bytes());
    let crc = crc64(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    Some(out)
}

fn value_bytes(value: &Value) -> usize {
    match value {
        Value::String(_) => 0,
        Value::Set(m) | Value::List(m) => m.iter().map(|m| m.len() + 5).sum(),
        Value::Zset(m) => m.iter().map(|(_, m)| m.len() + 13).sum(),
    }
}

/// A length: 6 bits in one byte, 14 bits in two (big-endian), else a
/// marker byte and 32 or 64 bits big-endian.
fn length(out: &mut Vec<u8>, n: usize) {
    if n < 1 << 6 {
        out.push(n as u8);
    } else if n < 1 << 14 {
        out.extend_from_slice(&[0x40 | (n >> 8) as u8, n as u8]);
    } else if let Ok(n) = u32::try_from(n) {
        out.push(0x80);
        out.extend_from_slice(&n.to_be_bytes());
    } else {
        out.push(0x81);
        out.extend_from_slice(&(n as u64).to_be_bytes());
    }
}

fn bytes(out: &mut Vec<u8>, b: &[u8]) {
    length(out, b.len());
    out.extend_from_slice(b);
}

/// CRC-64/Jones as Redis computes it: reflected, initial value 0, the
/// polynomial 0xad93d23594c935a9 (reversed below).
///
/// Eight bytes a step ("slicing by 8", as Redis's own `crcspeed` does):
/// a byte at a time, each step waits on the table lookup of the one
/// before, and the restored values of a rebuild (every collection it
/// writes) made that a few percent of its CPU. Table `k` holds what a
/// byte contributes when `k` more zero bytes follow it, so the eight
/// lookups of a step are independent of each other.
fn crc64(data: &[u8]) -> u64 {
    let mut crc = 0u64;
    let mut chunks = data.chunks_exact(8);
    for chunk in &mut chunks {
        let x = crc ^ u64::from_le_bytes(chunk.try_into().expect("eight bytes"));
        let byte = |i: usize| ((x >> (8 * i)) & 0xff) as usize;
        crc = TABLES[7][byte(0)]
            ^ TABLES[6][byte(1)]
            ^ TABLES[5][byte(2)]
            ^ TABLES[4][byte(3)]
            ^ TABLES[3][byte(4)]
            ^ TABLES[2][byte(5)]
            ^ TABLES[1][byte(6)]
            ^ TABLES[0][byte(7)];
    }
    crc64_bytes(crc, chunks.remainder())
}

/// The plain table first, then what a byte contributes with 1 to 7 zero
/// bytes after it.
static TABLES: [[u64; 256]; 8] = tables();

/// The CRC a byte at a time, from `crc`, with the plain table.
fn crc64_bytes(crc: u64, data: &[u8]) -> u64 {
    data.iter().fold(crc, |crc, &b| TABLES[0][((crc ^ b as u64) & 0xff) as usize] ^ (crc >> 8))
}

const fn tables() -> [[u64; 256]; 8] {
    const REVERSED: u64 = 0x95ac_9329_ac4b_c9b5;
    let mut tables = [[0u64; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u64;
        let mut bit = 0;
        while bit < 8 {
            c = if c & 1 == 1 { (c >> 1) ^ REVERSED } else { c >> 1 };
            bit += 1;
        }
        tables[0][i] = c;
        i += 1;
    }
    let mut k = 1;
    while k < 8 {
        let mut i = 0;
        while i < 256 {
            let prev = tables[k - 1][i];
            tables[k][i] = (prev >> 8) ^ tables[0][(prev & 0xff) as usize];
            i += 1;
        }
        k += 1;
    }
    tables
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The catalogue's check value of CRC-64/Jones (Redis's `crc64`
    /// self-test uses the same one).
    #[test]
    fn the_checksum_is_redis_s() {
        assert_eq!(crc64(b"123456789"), 0xe9c6_d914_c4b8_d9ca);
    }

    proptest::proptest! {
        /// Eight bytes a step give the CRC a byte at a time gives, at
        /// every length and alignment.
        #[test]
        fn eight_bytes_a_step_equal_one_at_a_time(data in proptest::collection::vec(proptest::num::u8::ANY, 0..200), skip in 0usize..8) {
            let data = &data[skip.min(data.len())..];
            proptest::prop_assert_eq!(crc64(data), crc64_bytes(0, data));
        }
    }

    #[test]
    fn a_set_is_its_type_its_members_the_version_and_the_checksum() {
        let value = Value::Set(vec!["a".into(), "bc".into()]);
        let p = payload(&value).unwrap();
        let body = [SET, 2, 1, b'a', 2, b'b', b'c', 9, 0];
        assert_eq!(&p[..body.len()], body);
        assert_eq!(p[body.len()..], crc64(&body).to_le_bytes());
    }

    #[test]
    fn scores_are_little_endian_doubles_after_their_member() {
        let p = payload(&Value::Zset(vec![(1_700_000_000_123, "v".into())])).unwrap();
        assert_eq!(&p[..4], [ZSET, 1, 1, b'v']);
        assert_eq!(p[4..12], 1_700_000_000_123f64.to_le_bytes());
    }

    #[test]
    fn lengths_take_one_two_or_five_bytes() {
        let encoded = |n| {
            let mut out = Vec::new();
            length(&mut out, n);
            out
        };
        assert_eq!(encoded(63), [63]);
        assert_eq!(encoded(64), [0x40, 64]);
        assert_eq!(encoded(16383), [0x7f, 0xff]);
        assert_eq!(encoded(16384), [0x80, 0, 0, 0x40, 0]);
    }

    #[test]
    fn strings_have_no_payload() {
        assert_eq!(payload(&Value::String("x".into())), None);
    }
}
