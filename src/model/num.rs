//! Numbers as MongoDB compares them: int32, int64, double and Decimal128
//! are one numeric type.

use mongodb::bson::RawBsonRef;
use std::cmp::Ordering;

/// A BSON number, kept exact where it is an integer or a Decimal128.
#[derive(Debug, Clone, Copy)]
pub enum Num {
    Int(i64),
    Float(f64),
    /// A finite, non-zero Decimal128 (NaN, the infinities and zeros are
    /// `Float` and `Int`, which they equal).
    Dec(Dec),
}

/// A finite decimal `±coef × 10^exp`, `coef` at most 34 digits and not 0.
#[derive(Debug, Clone, Copy)]
pub struct Dec {
    negative: bool,
    coef: u128,
    exp: i32,
}

impl Num {
    /// Reads a number; `None` for any other BSON type.
    pub fn from_bson(value: RawBsonRef<'_>) -> Option<Num> {
        match value {
            RawBsonRef::Int32(i) => Some(Num::Int(i.into())),
            RawBsonRef::Int64(i) => Some(Num::Int(i)),
            RawBsonRef::Double(f) => Some(Num::Float(f)),
            RawBsonRef::Decimal128(d) => Some(Num::from_decimal128(d.bytes())),
            _ => None,
        }
    }

    /// A Decimal128 from its bytes (IEEE 754-2008, binary integer
    /// decimal, little-endian), exactly: a double would make
    /// `1.0000000000000000000000000000001` equal to 1 and sort it with
    /// the ones, where MongoDB sorts it after them.
    fn from_decimal128(bytes: [u8; 16]) -> Num {
        let bits = u128::from_le_bytes(bytes);
        let (high, negative) = ((bits >> 64) as u64, bits >> 127 == 1);
        let (exp_bits, coef) = match (high >> 58) & 0x1f {
            0x1f => return Num::Float(f64::NAN),
            0x1e => return Num::Float(if negative { f64::NEG_INFINITY } else { f64::INFINITY }),
            // A coefficient past 2^113 is non-canonical, and zero.
            _ if (high >> 61) & 0x3 == 0x3 => ((high >> 47) & 0x3fff, 0),
            _ => ((high >> 49) & 0x3fff, bits & ((1u128 << 113) - 1)),
        };
        if coef == 0 || coef >= 10u128.pow(34) {
            return Num::Int(0);
        }
        Num::Dec(Dec { negative, coef, exp: exp_bits as i32 - 6176 })
    }

    /// The total order MongoDB sorts numbers by: NaN first, then by value.
    pub fn total_cmp(&self, other: &Num) -> Ordering {
        match (*self, *other) {
            (Num::Int(a), Num::Int(b)) => a.cmp(&b),
            (Num::Float(a), Num::Float(b)) => float_cmp(a, b),
            (Num::Int(a), Num::Float(b)) => int_float_cmp(a, b),
            (Num::Float(a), Num::Int(b)) => int_float_cmp(b, a).reverse(),
            (Num::Dec(a), b) => dec_cmp(a, b),
            (a, Num::Dec(b)) => dec_cmp(b, a).reverse(),
        }
    }
}

/// Compares a decimal with any number exactly, as MongoDB does (its
/// `compareDecimalToDouble` rounds the decimal toward negative infinity
/// and reads the inexact flag, which comes to the same), NaN below every
/// number.
fn dec_cmp(a: Dec, b: Num) -> Ordering {
    let b = match b {
        Num::Dec(b) => Some((b.negative, b.digits())),
        Num::Int(i) => (i != 0).then(|| (i < 0, digits_of(i.unsigned_abs().into(), 0))),
        Num::Float(f) if f.is_nan() => return Ordering::Greater,
        Num::Float(f) if f.is_infinite() => return if f > 0.0 { Ordering::Less } else { Ordering::Greater },
        Num::Float(f) => (f != 0.0).then(|| (f < 0.0, exact_digits(f))),
    };
    let Some((b_negative, b)) = b else {
        // `b` is zero.
        return if a.negative { Ordering::Less } else { Ordering::Greater };
    };
    let a_digits = a.digits();
    match (a.negative, b_negative) {
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        (false, false) => magnitude_cmp(&a_digits, &b),
        (true, true) => magnitude_cmp(&b, &a_digits),
    }
}

impl Dec {
    fn digits(&self) -> (String, i32) {
        digits_of(self.coef, self.exp)
    }
}

/// `coef × 10^exp` (`coef` not 0) as its digits without trailing zeros and
/// the power of ten of the last one.
fn digits_of(mut coef: u128, mut exp: i32) -> (String, i32) {
    while coef.is_multiple_of(10) {
        coef /= 10;
        exp += 1;
    }
    (coef.to_string(), exp)
}

/// A finite, non-zero double's exact decimal value in the same form. Its
/// expansion has at most 767 significant digits, and Rust prints as many
/// digits as asked from the exact value.
fn exact_digits(f: f64) -> (String, i32) {
    const PLACES: i32 = 767;
    let text = format!("{:.*e}", PLACES as usize, f.abs());
    let (mantissa, exp) = text.split_once('e').unwrap_or((&text, "0"));
    let all: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let digits = all.trim_end_matches('0');
    let exp = exp.parse::<i32>().unwrap_or(0) - PLACES + (all.len() - digits.len()) as i32;
    (digits.to_string(), exp)
}

/// `|a|` against `|b|`, each as [`digits_of`] gives it: by the power of
/// ten of the leading digit, then digit by digit (no trailing zeros, so a
/// shorter string that is a prefix is the smaller number).
fn magnitude_cmp(a: &(String, i32), b: &(String, i32)) -> Ordering {
    let leading = |(digits, exp): &(String, i32)| *exp + digits.len() as i32;
    leading(a).cmp(&leading(b)).then_with(|| a.0.cmp(&b.0))
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

    fn num(s: &str) -> Num {
        Num::from_bson(RawBsonRef::Decimal128(dec(s))).unwrap()
    }

    #[test]
    fn decimals_compare_exactly_with_every_number() {
        let above_one = num("1.0000000000000000000000000000001");
        assert_eq!(above_one.total_cmp(&Num::Int(1)), Ordering::Greater);
        assert_eq!(above_one.total_cmp(&Num::Float(1.0)), Ordering::Greater);
        assert_eq!(above_one.total_cmp(&num("1.0")), Ordering::Greater);
        assert_eq!(above_one.total_cmp(&num("1.00000000000000000000000000000011")), Ordering::Less);
        assert_eq!(num("1.0").total_cmp(&Num::Int(1)), Ordering::Equal);
        assert_eq!(num("10E-1").total_cmp(&num("0.1E+1")), Ordering::Equal);
        assert_eq!(num("2.5").total_cmp(&Num::Float(2.5)), Ordering::Equal);
        // The double nearest 0.1 is 0.1000000000000000055511151231257827021181583404541015625.
        assert_eq!(num("0.1").total_cmp(&Num::Float(0.1)), Ordering::Less);
        assert_eq!(num("0.1000000000000000055511151231257827").total_cmp(&Num::Float(0.1)), Ordering::Less);
        assert_eq!(num("0.0009765625").total_cmp(&Num::Float(2f64.powi(-10))), Ordering::Equal);
        // The smallest double is 4.9406564584124654…E-324.
        assert_eq!(num("5E-324").total_cmp(&Num::Float(5e-324)), Ordering::Greater);
        assert_eq!(num("4.940656458412465441765687928682213E-324").total_cmp(&Num::Float(5e-324)), Ordering::Less);
        assert_eq!(num("-5E-324").total_cmp(&Num::Float(-5e-324)), Ordering::Less);
        assert_eq!(num("-0.1").total_cmp(&Num::Float(-0.1)), Ordering::Greater);
        assert_eq!(num("-2").total_cmp(&Num::Int(-1)), Ordering::Less);
        assert_eq!(num("-0").total_cmp(&Num::Int(0)), Ordering::Equal);
        assert_eq!(num("0.000001").total_cmp(&Num::Int(0)), Ordering::Greater);
        assert_eq!(num("1E+3").total_cmp(&Num::Int(999)), Ordering::Greater);
        assert_eq!(num("1E+3").total_cmp(&Num::Int(1000)), Ordering::Equal);
        assert_eq!(
            num("9.999999999999999999999999999999999E+6144").total_cmp(&Num::Float(f64::MAX)),
            Ordering::Greater
        );
        assert_eq!(num("1E-6176").total_cmp(&Num::Float(5e-324)), Ordering::Less);
        assert_eq!(num("NaN").total_cmp(&Num::Int(i64::MIN)), Ordering::Less);
        assert_eq!(num("Infinity").total_cmp(&Num::Float(f64::INFINITY)), Ordering::Equal);
        assert_eq!(num("-Infinity").total_cmp(&num("-1E+6000")), Ordering::Less);
        assert_eq!(num("5").total_cmp(&Num::Float(f64::NAN)), Ordering::Greater);
    }
}
