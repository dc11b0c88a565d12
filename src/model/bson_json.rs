//! BSON → JSON as the contract's VideoDetailPayload rules say: the JSON a
//! JavaScript reader would get from the document.

use super::json::{self, ObjectWriter};
use super::plain::{self, Val};
use base64::Engine;
use mongodb::bson::{RawArray, RawBsonRef, RawDocument, raw::Error as RawError};

/// Counts conversions that fall back to a value's text.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Lossy(pub u64);

/// Appends a BSON value as JSON.
pub fn write_value(out: &mut String, value: RawBsonRef<'_>, lossy: &mut Lossy) -> Result<(), RawError> {
    match value {
        RawBsonRef::Double(f) => json::write_f64(out, f),
        RawBsonRef::String(s) => json::write_str(out, s),
        RawBsonRef::Document(doc) => write_document(out, doc, lossy)?,
        RawBsonRef::Array(arr) => write_array(out, arr, lossy)?,
        RawBsonRef::Boolean(b) => out.push_str(if b { "true" } else { "false" }),
        RawBsonRef::Null => out.push_str("null"),
        RawBsonRef::Int32(i) => json::write_i64(out, i.into()),
        RawBsonRef::Int64(i) => json::write_i64(out, i),
        RawBsonRef::ObjectId(oid) => json::write_str(out, &super::id::oid_hex(&oid)),
        RawBsonRef::DateTime(dt) => write_date(out, dt.timestamp_millis()),
        RawBsonRef::Decimal128(d) => json::write_str(out, &d.to_string()),
        RawBsonRef::Binary(bin) => json::write_str(out, &base64::engine::general_purpose::STANDARD.encode(bin.bytes)),
        // JSON.stringify(/re/) is "{}".
        RawBsonRef::RegularExpression(_) => out.push_str("{}"),
        other => {
            lossy.0 += 1;
            json::write_str(out, &other_text(other));
        }
    }
    Ok(())
}

/// Reads a BSON value through as [`write_value`] does, writing nothing:
/// it fails exactly where the conversion would (a malformed element), so
/// a caller that needs no JSON still rejects the same documents.
pub fn check_value(value: RawBsonRef<'_>) -> Result<(), RawError> {
    match value {
        RawBsonRef::Document(doc) => doc.into_iter().try_for_each(|element| check_value(element?.1)),
        RawBsonRef::Array(arr) => arr.into_iter().try_for_each(|value| check_value(value?)),
        _ => Ok(()),
    }
}

/// [`write_value`] of a value as a plain walk gives it: an array is
/// walked the plain way too, and through the library when that walk
/// stops (what it wrote is taken back first).
pub fn write_val(out: &mut String, value: Val<'_>, lossy: &mut Lossy) -> Result<(), RawError> {
    let items = match value {
        Val::Bson(value) => return write_value(out, value, lossy),
        Val::Array(items) => items,
    };
    let (start, counted) = (out.len(), *lossy);
    out.push('[');
    let mut first = true;
    let whole = plain::each_element(items, |_, item| {
        if !std::mem::take(&mut first) {
            out.push(',');
        }
        write_val(out, item, lossy)
    })?;
    if whole {
        out.push(']');
        return Ok(());
    }
    out.truncate(start);
    *lossy = counted;
    write_items(out, items.into_iter().map(|item| item.map(|(_, value)| value)), lossy)
}

/// [`check_value`] of a value as a plain walk gives it.
pub fn check_val(value: Val<'_>) -> Result<(), RawError> {
    match value {
        Val::Bson(value) => check_value(value),
        // The array's document walks as the array does.
        Val::Array(items) => match plain::each_element(items, |_, item| check_val(item))? {
            true => Ok(()),
            false => check_value(RawBsonRef::Document(items)),
        },
    }
}

/// The text of a BSON value JSON has no form for: a symbol's or code's own
/// string, otherwise the value as the BSON library prints it.
fn other_text(value: RawBsonRef<'_>) -> String {
    match value {
        RawBsonRef::Symbol(s) | RawBsonRef::JavaScriptCode(s) => s.to_string(),
        RawBsonRef::JavaScriptCodeWithScope(c) => c.code.to_string(),
        RawBsonRef::Undefined => "undefined".to_string(),
        other => match other.to_raw_bson().try_into() {
            Ok(bson) => {
                let bson: mongodb::bson::Bson = bson;
                bson.to_string()
            }
            Err(_) => format!("{:?}", other.element_type()),
        },
    }
}

pub fn write_document(out: &mut String, doc: &RawDocument, lossy: &mut Lossy) -> Result<(), RawError> {
    let mut obj = ObjectWriter::new(out);
    for element in doc {
        let (key, value) = element?;
        write_value(obj.key(key), value, lossy)?;
    }
    obj.finish();
    Ok(())
}

pub fn write_array(out: &mut String, arr: &RawArray, lossy: &mut Lossy) -> Result<(), RawError> {
    write_items(out, arr, lossy)
}

/// Appends values as a JSON array, as the library's walk yields them: the
/// first malformed one stops it.
fn write_items<'v>(
    out: &mut String,
    items: impl IntoIterator<Item = Result<RawBsonRef<'v>, RawError>>,
    lossy: &mut Lossy,
) -> Result<(), RawError> {
    out.push('[');
    for (i, value) in items.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_value(out, value?, lossy)?;
    }
    out.push(']');
    Ok(())
}

/// The largest time value a JavaScript Date holds (±100,000,000 days).
const JS_DATE_LIMIT_MS: i64 = 8_640_000_000_000_000;

/// Appends a date as `Date.prototype.toJSON` does: ISO-8601 UTC with
/// milliseconds, six-digit signed years outside 0..=9999, and `null` for
/// times a JavaScript Date cannot hold.
///
/// The digits are placed in a fixed buffer: a video carries a few dates,
/// and `write!` with padded fields cost about a thousand instructions a
/// date, 3.5% of a rebuild's.
pub fn write_date(out: &mut String, ms: i64) {
    if !(-JS_DATE_LIMIT_MS..=JS_DATE_LIMIT_MS).contains(&ms) {
        out.push_str("null");
        return;
    }
    let days = ms.div_euclid(86_400_000);
    let in_day = ms.rem_euclid(86_400_000) as u64;
    let (y, m, d) = civil_from_days(days);
    // `"+275760-09-13T00:00:00.000Z"` is the longest: 29 bytes.
    let mut buf = Digits { bytes: [0; 32], len: 0 };
    buf.push(b'"');
    if (0..=9999).contains(&y) {
        buf.padded(y as u64, 4);
    } else {
        buf.push(if y < 0 { b'-' } else { b'+' });
        buf.padded(y.unsigned_abs(), 6);
    }
    buf.push(b'-');
    buf.padded(m.into(), 2);
    buf.push(b'-');
    buf.padded(d.into(), 2);
    buf.push(b'T');
    buf.padded(in_day / 3_600_000, 2);
    buf.push(b':');
    buf.padded(in_day / 60_000 % 60, 2);
    buf.push(b':');
    buf.padded(in_day / 1000 % 60, 2);
    buf.push(b'.');
    buf.padded(in_day % 1000, 3);
    buf.push(b'Z');
    buf.push(b'"');
    out.push_str(std::str::from_utf8(&buf.bytes[..buf.len]).expect("a date is ASCII"));
}

/// A few ASCII bytes put together on the stack.
struct Digits {
    bytes: [u8; 32],
    len: usize,
}

impl Digits {
    fn push(&mut self, b: u8) {
        self.bytes[self.len] = b;
        self.len += 1;
    }

    /// `value` as exactly `width` digits, zero-padded (the callers'
    /// values always fit).
    fn padded(&mut self, mut value: u64, width: usize) {
        for at in (self.len..self.len + width).rev() {
            self.bytes[at] = b'0' + (value % 10) as u8;
            value /= 10;
        }
        self.len += width;
    }
}

/// Days since 1970-01-01 → proleptic Gregorian (year, month, day).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::bson::{Bson, DateTime, RawDocumentBuf, doc, spec::BinarySubtype};

    fn date(ms: i64) -> String {
        let mut out = String::new();
        write_date(&mut out, ms);
        out
    }

    #[test]
    fn checking_fails_where_converting_fails() {
        let doc = mongodb::bson::rawdoc! { "a": { "b": [1, { "c": "x" }] }, "d": 2.5 };
        let value = RawBsonRef::Document(&doc);
        assert!(check_value(value).is_ok() && write_value(&mut String::new(), value, &mut Lossy::default()).is_ok());
        // The inner array's declared length runs past the document's end:
        // the outer document still frames, the element inside does not.
        let mut bytes = doc.as_bytes().to_vec();
        let at = bytes.windows(2).position(|w| w == b"b\0").expect("the array's key") + 2;
        bytes[at] = 0x7f;
        let broken = RawDocument::from_bytes(&bytes).expect("the outer frame is intact");
        let value = RawBsonRef::Document(broken);
        assert!(check_value(value).is_err(), "checking reads into the broken element");
        assert!(write_value(&mut String::new(), value, &mut Lossy::default()).is_err());
    }

    /// The formatted writes the digit buffer replaced.
    fn date_by_format(ms: i64) -> String {
        if !(-JS_DATE_LIMIT_MS..=JS_DATE_LIMIT_MS).contains(&ms) {
            return "null".into();
        }
        let in_day = ms.rem_euclid(86_400_000);
        let (y, m, d) = civil_from_days(ms.div_euclid(86_400_000));
        let year = match y {
            0..=9999 => format!("{y:04}"),
            y if y < 0 => format!("-{:06}", -y),
            y => format!("+{y:06}"),
        };
        format!(
            "\"{year}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z\"",
            in_day / 3_600_000,
            in_day / 60_000 % 60,
            in_day / 1000 % 60,
            in_day % 1000
        )
    }

    proptest::proptest! {
        #[test]
        fn dates_print_as_the_formatted_writes_did(
            ms in proptest::prop_oneof![
                -JS_DATE_LIMIT_MS - 10..=JS_DATE_LIMIT_MS + 10,
                -100_000_000_000_000_i64..=300_000_000_000_000,
                proptest::num::i64::ANY,
            ]
        ) {
            proptest::prop_assert_eq!(date(ms), date_by_format(ms));
        }
    }

    #[test]
    fn dates_print_like_date_to_json() {
        assert_eq!(date(0), "\"1970-01-01T00:00:00.000Z\"");
        assert_eq!(date(1_714_564_800_000), "\"2024-05-01T12:00:00.000Z\"");
        assert_eq!(date(-1), "\"1969-12-31T23:59:59.999Z\"");
        assert_eq!(date(951_782_400_000), "\"2000-02-29T00:00:00.000Z\"");
        assert_eq!(date(253_402_300_800_000), "\"+010000-01-01T00:00:00.000Z\"");
        assert_eq!(date(-62_198_755_200_000), "\"-000001-01-01T00:00:00.000Z\"");
        assert_eq!(date(-62_167_219_200_000), "\"0000-01-01T00:00:00.000Z\"");
        assert_eq!(date(8_640_000_000_000_000), "\"+275760-09-13T00:00:00.000Z\"");
        assert_eq!(date(8_640_000_000_000_001), "null");
        assert_eq!(date(i64::MIN), "null");
    }

    #[test]
    fn documents_convert_in_stored_order() {
        let doc = doc! {
            "z": 1_i32, "big": 9_007_199_254_740_993_i64, "d": 1.0, "nan": f64::NAN,
            "s": "x\"y", "n": Bson::Null, "t": true,
            "when": DateTime::from_millis(1_714_564_800_000),
            "dec": Bson::Decimal128("1.50".parse().unwrap()),
            "bin": Bson::Binary(mongodb::bson::Binary { subtype: BinarySubtype::Generic, bytes: vec![1, 2, 3] }),
            "re": Bson::RegularExpression(mongodb::bson::Regex { pattern: "a.*".into(), options: "i".into() }),
            "nested": { "b": [1_i32, { "c": "d" }], "a": [] },
            "sym": Bson::Symbol("sy".into()),
            "ts": Bson::Timestamp(mongodb::bson::Timestamp { time: 5, increment: 6 }),
            "min": Bson::MinKey,
        };
        let raw = RawDocumentBuf::from_document(&doc).unwrap();
        let mut out = String::new();
        let mut lossy = Lossy::default();
        write_document(&mut out, &raw, &mut lossy).unwrap();
        assert_eq!(
            out,
            r#"{"z":1,"big":9007199254740993,"d":1,"nan":null,"s":"x\"y","n":null,"t":true,"when":"2024-05-01T12:00:00.000Z","dec":"1.50","bin":"AQID","re":{},"nested":{"b":[1,{"c":"d"}],"a":[]},"sym":"sy","ts":"Timestamp(5, 6)","min":"MinKey"}"#
        );
        assert_eq!(lossy, Lossy(3));
    }
}
