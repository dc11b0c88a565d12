//! Redis Cluster's key slots: which of the 16,384 slots a key hashes to,
//! and for every slot a short hash tag that lands there (the status keys
//! that must live in one given slot are named with it, in [`super::status`]).

use std::sync::OnceLock;

pub const SLOTS: usize = 16384;

/// CRC16/XMODEM, the checksum Redis Cluster hashes keys with, a byte at
/// a time from a table (every key of every write is hashed).
fn crc16(data: &[u8]) -> u16 {
    static TABLE: OnceLock<[u16; 256]> = OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut table = [0u16; 256];
        for (byte, entry) in table.iter_mut().enumerate() {
            let mut crc = (byte as u16) << 8;
            for _ in 0..8 {
                crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
            }
            *entry = crc;
        }
        table
    });
    data.iter().fold(0u16, |crc, &byte| (crc << 8) ^ table[usize::from((crc >> 8) as u8 ^ byte)])
}

/// The slot of a key: of its hash tag (the text between the first `{` and
/// the next `}`, when not empty), else of the whole key.
pub fn slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter().position(|&b| b == b'}').filter(|&len| len > 0).map(|len| &rest[..len])
        })
        .unwrap_or(key);
    crc16(hashed) % SLOTS as u16
}

/// For every slot, a short tag that hashes to it: the smallest decimal
/// number that does. Computed once (about 170,000 checksums).
pub(crate) fn tags() -> &'static [String] {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    TAGS.get_or_init(|| {
        let mut tags = vec![String::new(); SLOTS];
        let mut missing = SLOTS;
        let mut n: u64 = 0;
        while missing > 0 {
            let text = n.to_string();
            let s = usize::from(slot(text.as_bytes()));
            if tags[s].is_empty() {
                tags[s] = text;
                missing -= 1;
            }
            n += 1;
        }
        tags
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_match_redis() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"bar"), 5061);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
    }
}
