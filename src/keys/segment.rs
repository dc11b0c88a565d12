//! Key segment rules: ids are checked, free text is percent-encoded.

/// Whether `s` is a usable id segment: `^[0-9A-Za-z_-]{1,128}$`.
pub fn is_id_segment(s: &str) -> bool {
    !s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Whether a character must be percent-encoded in a free-text segment.
fn needs_encoding(c: char) -> bool {
    matches!(c, '%' | ':' | '*' | '?' | '[' | ']' | '{' | '}' | '\\') || c.is_whitespace() || c.is_control()
}

/// Encodes free text for a key segment: reserved characters, whitespace and
/// control characters become `%XX` per UTF-8 byte (uppercase hex); all else,
/// non-ASCII included, stays literal.
pub fn encode_text(text: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if needs_encoding(c) {
            let mut buf = [0u8; 4];
            for &b in c.encode_utf8(&mut buf).as_bytes() {
                out.push('%');
                out.push(HEX[(b >> 4) as usize] as char);
                out.push(HEX[(b & 15) as usize] as char);
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// Decodes a segment written by [`encode_text`]; `None` when it is not one.
pub fn decode_text(segment: &str) -> Option<String> {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = segment.get(i + 1..i + 3)?;
            if !hex.bytes().all(|b| b.is_ascii_digit() || (b'A'..=b'F').contains(&b)) {
                return None;
            }
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Whether `segment` is exactly what [`encode_text`] writes for some
/// non-empty text, so the sweep only deletes keys this service could write.
pub fn is_encoded_text_segment(segment: &str) -> bool {
    !segment.is_empty() && decode_text(segment).is_some_and(|text| !text.is_empty() && encode_text(&text) == segment)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn ids() {
        assert!(is_id_segment("65a1b2c3d4e5f6a7b8c9d0e1"));
        assert!(is_id_segment("a_b-C9"));
        assert!(!is_id_segment(""));
        assert!(!is_id_segment("a:b"));
        assert!(!is_id_segment("a b"));
        assert!(!is_id_segment("é"));
        assert!(is_id_segment(&"x".repeat(128)));
        assert!(!is_id_segment(&"x".repeat(129)));
    }

    #[test]
    fn encodes_reserved_whitespace_and_controls_only() {
        assert_eq!(encode_text("动作"), "动作");
        assert_eq!(encode_text("a b"), "a%20b");
        assert_eq!(encode_text("%:*?[]{}\\"), "%25%3A%2A%3F%5B%5D%7B%7D%5C");
        assert_eq!(encode_text("\u{3000}x"), "%E3%80%80x");
        assert_eq!(encode_text("\u{7f}\u{85}"), "%7F%C2%85");
        assert_eq!(encode_text("a/b.c#\"'"), "a/b.c#\"'");
    }

    #[test]
    fn recognises_only_canonical_encodings() {
        assert!(is_encoded_text_segment("a%20b"));
        assert!(is_encoded_text_segment("动作"));
        assert!(!is_encoded_text_segment("a%2"));
        assert!(!is_encoded_text_segment("a%61"));
        assert!(!is_encoded_text_segment("a%3a"));
        assert!(!is_encoded_text_segment("a b"));
        assert!(!is_encoded_text_segment(""));
    }

    proptest! {
        #[test]
        fn encoding_round_trips_and_never_holds_a_colon(text in "\\PC*|[ :%*\\t\u{3000}a-z]*") {
            let enc = encode_text(&text);
            prop_assert!(!enc.contains(':'));
            prop_assert!(!enc.chars().any(|c| c.is_whitespace() || c.is_control()));
            prop_assert_eq!(decode_text(&enc), Some(text.clone()));
            if !text.is_empty() {
                prop_assert!(is_encoded_text_segment(&enc));
            }
        }
    }
}
