//! String rules as JavaScript applies them, for the tag-search and
//! flat-name families.

/// Whether `String.prototype.trim` removes `c`: ECMAScript WhiteSpace and
/// LineTerminator. Unlike Rust's `trim`, this includes U+FEFF and excludes
/// U+0085.
fn is_js_trimmed(c: char) -> bool {
    matches!(
        c,
        '\u{9}' | '\u{a}' | '\u{b}' | '\u{c}' | '\u{d}' | ' ' | '\u{a0}' | '\u{1680}' | '\u{2000}'
            ..='\u{200a}' | '\u{2028}' | '\u{2029}' | '\u{202f}' | '\u{205f}' | '\u{3000}' | '\u{feff}'
    )
}

/// `s.trim()` as JavaScript does it.
pub fn js_trim(s: &str) -> &str {
    s.trim_matches(is_js_trimmed)
}

/// `s.toLowerCase()`: Unicode default lowercasing, final sigma included,
/// which Rust's `to_lowercase` implements too.
pub fn js_lower(s: &str) -> String {
    s.to_lowercase()
}

/// The first `n` Unicode scalar values of `s`, if it has that many.
pub fn prefix_chars(s: &str, n: usize) -> Option<&str> {
    if n == 0 {
        return None;
    }
    let mut ends = s.char_indices().map(|(i, c)| i + c.len_utf8());
    ends.nth(n - 1).map(|end| &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trims_like_javascript() {
        assert_eq!(js_trim("\u{feff} a b\u{3000}\n"), "a b");
        assert_eq!(js_trim("\u{85}x\u{85}"), "\u{85}x\u{85}");
        assert_eq!(js_trim("\u{200b}x"), "\u{200b}x");
    }

    #[test]
    fn lowercases_like_javascript() {
        assert_eq!(js_lower("ΟΔΟΣ"), "οδος");
        assert_eq!(js_lower("İ"), "i\u{307}");
        assert_eq!(js_lower("ABC动作"), "abc动作");
    }

    #[test]
    fn prefixes_count_scalar_values() {
        assert_eq!(prefix_chars("动作片", 2), Some("动作"));
        assert_eq!(prefix_chars("ab", 3), None);
        assert_eq!(prefix_chars("ab", 2), Some("ab"));
        assert_eq!(prefix_chars("😀x", 1), Some("😀"));
    }
}
