//! Numbers as MongoDB compares them: int32, int64, double and Decimal128
//! are one numeric type.

use mongodb::bson::RawBsonRef;
use std::cmp::Ordering;

/// A BSON number, kept exact where it is an integer.
#[derive(Debug, Clone, Copy)]
pub enum Num {
    Int(i64),
    Float(f64),
}

impl Num {
    /// Reads a number; `None` for any other BSON type.
    pub fn from_bson(value: RawBsonRef<'_>) -> Option<Num> {
        match value {
            RawBsonRef::Int32(i) => Some(Num::Int(i.into())),
            RawBsonRef::Int64(i) => Some(Num::Int(i)),
            RawBsonRef::Double(f) => Some(Num::Float(f)),
            RawBsonRef::Decimal128(d) => Some(Num::Float(decimal_to_f64(&d.to_string()))),
            _ => None,
        }
    }

    /// The total order MongoDB sorts numbers by: NaN first, then by value.
    pub fn total_cmp(&self, other: &Num) -> Ordering {
        match (*self, *other) {
            (Num::Int(a), Num::Int(b)) => a.cmp(&b),
            (Num::Float(a), Num::Float(b)) => float_cmp(a, b),
            (Num::Int(a), Num::Float(b)) => int_float_cmp(a, b),
            (Num::Float(a), Num::Int(b)) => int_float_cmp(b, a).reverse(),
        }
    }
}

fn float_cmp(a: f64, b: f64) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        // -0 and 0 are equal numbers.
        (false, false) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
    }
}

/// Compares an integer with a double exactly, without rounding the integer.
fn int_float_cmp(a: i64, b: f64) -> Ordering {
    if b.is_nan() {
        return Ordering::Greater;
    }
    if b >= 9.3e18 {
        return Ordering::Less;
    }
    if b <= -9.3e18 {
        return Ordering::Greater;
    }
    let floor = b.floor();
    match (a as i128).cmp(&(floor as i128)) {
        Ordering::Equal if b > floor => Ordering::Less,
        other => other,
    }
}

/// A Decimal128's value as the nearest double, from its canonical string.
fn decimal_to_f64(text: &str) -> f64 {
    text.parse::<f64>().unwrap_or(f64::NAN)
}

/// Whether a BSON value is numerically equal to 1, as the MongoDB query
/// `{field: 1}` decides. Strings, booleans and absent values are not.
pub fn is_one(value: Option<RawBsonRef<'_>>) -> bool {
    match value {
        Some(RawBsonRef::Int32(i)) => i == 1,
        Some(RawBsonRef::Int64(i)) => i == 1,
        Some(RawBsonRef::Double(f)) => f == 1.0,
        Some(RawBsonRef::Decimal128(d)) => decimal_string_is_one(&d.to_string()),
        _ => false,
    }
}

/// Checks `1`, `1.000`, `1E+0`, `10E-1`, … exactly: a double would round
/// `1.0000000000000000000000000000001` to 1.
fn decimal_string_is_one(text: &str) -> bool {
    let (mantissa, exp) = match text.split_once('E') {
        Some((m, e)) => match e.parse::<i64>() {
            Ok(e) => (m, e),
            Err(_) => return false,
        },
        None => (text, 0),
    };
    if !mantissa.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
        return false;
    }
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let digits = format!("{int_part}{frac_part}");
    let mut exp = exp - frac_part.len() as i64;
    let trimmed_lead = digits.trim_start_matches('0');
    let trimmed = trimmed_lead.trim_end_matches('0');
    exp += (trimmed_lead.len() - trimmed.len()) as i64;
    trimmed == "1" && exp == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::bson::Decimal128;

    fn dec(s: &str) -> Decimal128 {
        s.parse().unwrap()
    }

    #[test]
    fn one_is_numeric_one_of_any_type() {
        assert!(is_one(Some(RawBsonRef::Int32(1))));
        assert!(is_one(Some(RawBsonRef::Int64(1))));
        assert!(is_one(Some(RawBsonRef::Double(1.0))));
        for s in ["1", "1.0", "1.000", "10E-1", "0.1E+1", "1E+0"] {
            assert!(is_one(Some(RawBsonRef::Decimal128(dec(s)))), "{s}");
        }
        for s in ["1.0000000000000000000000000000001", "-1", "0", "NaN", "2", "11E-1"] {
            assert!(!is_one(Some(RawBsonRef::Decimal128(dec(s)))), "{s}");
        }
        assert!(!is_one(Some(RawBsonRef::String("1"))));
        assert!(!is_one(Some(RawBsonRef::Boolean(true))));
        assert!(!is_one(None));
    }

    #[test]
    fn mixed_types_compare_exactly() {
        let big = Num::Int(9_007_199_254_740_993);
        assert_eq!(big.total_cmp(&Num::Float(9_007_199_254_740_992.0)), Ordering::Greater);
        assert_eq!(Num::Int(2).total_cmp(&Num::Float(2.5)), Ordering::Less);
        assert_eq!(Num::Int(3).total_cmp(&Num::Float(2.5)), Ordering::Greater);
        assert_eq!(Num::Int(2).total_cmp(&Num::Float(2.0)), Ordering::Equal);
        assert_eq!(Num::Float(f64::NAN).total_cmp(&Num::Int(i64::MIN)), Ordering::Less);
        assert_eq!(Num::Int(-1).total_cmp(&Num::Float(-0.5)), Ordering::Less);
        assert_eq!(Num::Float(-0.0).total_cmp(&Num::Int(0)), Ordering::Equal);
    }
}
