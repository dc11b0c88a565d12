//! Compact JSON written the way `JSON.stringify` writes it: strings escaped
//! like JavaScript, doubles as ECMAScript `Number::toString`, integers as
//! exact digits, object keys in insertion order.

/// Appends `s` as a JSON string literal.
pub fn write_str(out: &mut String, s: &str) {
    out.reserve(s.len() + 2);
    out.push('"');
    let mut start = 0;
    for (i, b) in s.bytes().enumerate() {
        let escape: &str = match b {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            0..=0x1f => "",
            _ => continue,
        };
        out.push_str(&s[start..i]);
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

/// Appends a double as JavaScript prints it; NaN and ±Infinity become
/// `null`, as in `JSON.stringify`.
pub fn write_f64(out: &mut String, f: f64) {
    if !f.is_finite() {
        out.push_str("null");
    } else if f == 0.0 {
        // JSON.stringify(-0) is "0".
        out.push('0');
    } else {
        let mut buf = ryu_js::Buffer::new();
        out.push_str(buf.format_finite(f));
    }
}

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

/// Writes a JSON array of already rendered elements.
pub fn write_raw_array<'s>(out: &mut String, items: impl IntoIterator<Item = &'s str>) {
    out.push('[');
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(item);
    }
    out.push(']');
}

/// Writes a JSON array of strings.
pub fn write_str_array<'s>(out: &mut String, items: impl IntoIterator<Item = &'s str>) {
    out.push('[');
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_str(out, item);
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
