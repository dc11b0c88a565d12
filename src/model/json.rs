//! Compact JSON written the way `JSON.stringify` writes it: strings escaped
//! like JavaScript, doubles as ECMAScript `Number::toString`, integers as
//! exact digits, object keys in insertion order.

/// Appends `s` as a JSON string literal.
///
/// Payload text is mostly plain (titles, names, URLs), so the scan looks
/// for the next byte that needs escaping eight bytes at a time and copies
/// the plain run before it whole; a byte-by-byte match was about 6% of a
/// rebuild's instructions.
pub fn write_str(out: &mut String, s: &str) {
    out.reserve(s.len() + 2);
    out.push('"');
    let bytes = s.as_bytes();
    let mut start = 0;
    while let Some(i) = next_escape(bytes, start) {
        let b = bytes[i];
        // Every byte that needs escaping is ASCII, so `i` and `i + 1`
        // are character boundaries.
        out.push_str(&s[start..i]);
        let escape: &str = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            _ => "",
        };
        if escape.is_empty() {
            const HEX: &[u8; 16] = b"0123456789abcdef";
            out.push_str("\\u00");
            out.push(HEX[(b >> 4) as usize] as char);
            out.push(HEX[(b & 15) as usize] as char);
        } else {
            out.push_str(escape);
        }
        start = i + 1;
    }
    out.push_str(&s[start..]);
    out.push('"');
}

/// Whether JSON needs `b` escaped: a control character, `"` or `\`.
fn needs_escape(b: u8) -> bool {
    b < 0x20 || b == b'"' || b == b'\\'
}

/// The position of the first byte at or after `from` that needs escaping.
fn next_escape(bytes: &[u8], from: usize) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    // A byte of `x` is zero exactly where the high bit of this is set
    // (bytes above the first zero may be flagged too, so the exact
    // position is found byte by byte within the word).
    let zero_in = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
    let mut i = from;
    while i + 8 <= bytes.len() {
        let word = u64::from_le_bytes(bytes[i..i + 8].try_into().expect("eight bytes"));
        // A byte below 0x20 has its three top bits clear: `word & 0xe0..`
        // has a zero byte there (and nowhere else).
        let hit = zero_in(word & 0xe0e0_e0e0_e0e0_e0e0)
            | zero_in(word ^ (ONES * b'"' as u64))
            | zero_in(word ^ (ONES * b'\\' as u64));
        if hit != 0 {
            break;
        }
        i += 8;
    }
    bytes[i..].iter().position(|&b| needs_escape(b)).map(|at| i + at)
}

/// Appends a double as JavaScript prints it; NaN and ±Infinity become
/// `null`, as in `JSON.stringify`.
pub fn write_f64(out: &mut String, f: f64) {
    if !f.is_finite() {
        out.push_str("null");
    } else if f == 0.0 {
        // JSON.stringify(-0) is "0".
        out.push('0');
    } else if f.fract() == 0.0 && f.abs() < SAFE_INTEGER_LIMIT {
        // Below 2^53 every integer is a double of its own, so its shortest
        // round-trip digits are its exact digits: what `Number::toString`
        // prints, at a fraction of the shortest-digits search's cost.
        write_i64(out, f as i64);
    } else {
        let mut buf = ryu_js::Buffer::new();
        out.push_str(buf.format_finite(f));
    }
}

/// 2^53: from here on, doubles are more than 1 apart.
const SAFE_INTEGER_LIMIT: f64 = 9_007_199_254_740_992.0;

/// Appends an integer as its exact decimal digits.
pub fn write_i64(out: &mut String, i: i64) {
    out.push_str(itoa::Buffer::new().format(i));
}

/// A small builder for JSON objects with keys in the order they are added.
pub struct ObjectWriter<'a> {
    out: &'a mut String,
    first: bool,
}

impl<'a> ObjectWriter<'a> {
    pub fn new(out: &'a mut String) -> Self {
        out.push('{');
        ObjectWriter { out, first: true }
    }

    /// Writes the key and returns the buffer for its value.
    pub fn key(&mut self, key: &str) -> &mut String {
        if !self.first {
            self.out.push(',');
        }
        self.first = false;
        write_str(self.out, key);
        self.out.push(':');
        self.out
    }

    /// Writes a key whose value is already rendered JSON.
    pub fn raw(&mut self, key: &str, json: &str) {
        self.key(key).push_str(json);
    }

    pub fn string(&mut self, key: &str, value: &str) {
        let out = self.key(key);
        write_str(out, value);
    }

    /// Writes an optional rendered value; `None` is omitted, as
    /// `JSON.stringify` omits `undefined`.
    pub fn opt_raw(&mut self, key: &str, json: Option<&str>) {
        if let Some(json) = json {
            self.raw(key, json);
        }
    }

    pub fn finish(self) {
        self.out.push('}');
    }
}

/// Writes a JSON array of already rendered elements. The room is
/// reserved once, from the elements' lengths: `tag:all` is a megabyte
/// (10,000 tags), and growing it by doubling copied it about twice over
/// and faulted fresh pages in at every step.
pub fn write_raw_array<'s, I>(out: &mut String, items: I)
where
    I: IntoIterator<Item = &'s str>,
    I::IntoIter: Clone,
{
    let items = items.into_iter();
    out.reserve(items.clone().map(|item| item.len() + 1).sum::<usize>() + 2);
    out.push('[');
    for (i, item) in items.enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(item);
    }
    out.push(']');
}

/// Writes a JSON array of strings.
pub fn write_str_array<'s>(out: &mut String, items: impl IntoIterator<Item = &'s str>) {
    write_array(out, items, write_str);
}

/// Writes a JSON array, each element by `write_item`.
pub fn write_array<T>(
    out: &mut String,
    items: impl IntoIterator<Item = T>,
    mut write_item: impl FnMut(&mut String, T),
) {
    out.push('[');
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_item(out, item);
    }
    out.push(']');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(x: &str) -> String {
        let mut out = String::new();
        write_str(&mut out, x);
        out
    }

    fn f(x: f64) -> String {
        let mut out = String::new();
        write_f64(&mut out, x);
        out
    }

    #[test]
    fn strings_escape_like_json_stringify() {
        assert_eq!(s("a\"b\\c"), r#""a\"b\\c""#);
        assert_eq!(s("\n\r\t\u{8}\u{c}"), r#""\n\r\t\b\f""#);
        assert_eq!(s("\u{0}\u{1f}\u{7f}"), "\"\\u0000\\u001f\u{7f}\"");
        assert_eq!(s("动作/é\u{2028}"), "\"动作/é\u{2028}\"");
        assert_eq!(s(""), "\"\"");
    }

    proptest::proptest! {
        /// The word-at-a-time scan escapes exactly what a byte-by-byte
        /// escaper does (serde_json's escaping matches `JSON.stringify`
        /// for any Rust string), wherever in a word the byte falls.
        #[test]
        fn strings_escape_like_a_byte_by_byte_escaper(
            chars in proptest::collection::vec(
                proptest::prop_oneof![
                    4 => proptest::char::range('a', 'z'),
                    1 => proptest::char::range('\u{0}', '\u{7f}'),
                    1 => proptest::sample::select(vec!['"', '\\', '\u{1f}', '\u{20}', '\u{7f}', '\u{80}', 'é', '动', '\u{2028}', '😀']),
                ],
                0..40,
            )
        ) {
            let text: String = chars.into_iter().collect();
            proptest::prop_assert_eq!(s(&text), serde_json::to_string(&text).unwrap());
        }
    }

    proptest::proptest! {
        /// Integral doubles below 2^53 print as ryu-js prints them.
        #[test]
        fn integral_doubles_print_like_the_shortest_digits(
            f in {
                use proptest::strategy::Strategy;
                proptest::prop_oneof![
                (-9_007_199_254_740_992_i64..=9_007_199_254_740_992).prop_map(|i| i as f64),
                (-100_000_i64..100_000).prop_map(|i| i as f64 / 4.0),
                (9_007_199_254_740_992_i64..i64::MAX).prop_map(|i| i as f64),
                proptest::num::f64::NORMAL,
            ]
            }
        ) {
            let mut expected = String::new();
            if f == 0.0 {
                expected.push('0');
            } else {
                expected.push_str(ryu_js::Buffer::new().format_finite(f));
            }
            proptest::prop_assert_eq!(self::f(f), expected);
        }
    }

    #[test]
    fn numbers_print_like_javascript() {
        assert_eq!(f(1.0), "1");
        assert_eq!(f(1e21), "1e+21");
        assert_eq!(f(1e-7), "1e-7");
        assert_eq!(f(0.1 + 0.2), "0.30000000000000004");
        assert_eq!(f(-0.0), "0");
        assert_eq!(f(123456789012345680000.0), "123456789012345680000");
        assert_eq!(f(f64::NAN), "null");
        assert_eq!(f(f64::NEG_INFINITY), "null");
        assert_eq!(f(-1.5), "-1.5");
        let mut out = String::new();
        write_i64(&mut out, i64::MIN);
        assert_eq!(out, "-9223372036854775808");
    }

    #[test]
    fn objects_keep_insertion_order_and_drop_none() {
        let mut out = String::new();
        let mut obj = ObjectWriter::new(&mut out);
        obj.string("z", "1");
        obj.opt_raw("skip", None);
        obj.raw("a", "[]");
        obj.finish();
        assert_eq!(out, r#"{"z":"1","a":[]}"#);
    }
}
