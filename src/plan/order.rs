//! The contract's orders.

use crate::model::num::Num;
use std::cmp::Ordering;

/// "By seq": `seq` ascending, then `name` by UTF-8 bytes, then `id`.
pub fn by_seq(a: (&Num, &str, &str), b: (&Num, &str, &str)) -> Ordering {
    a.0.total_cmp(b.0).then_with(|| a.1.as_bytes().cmp(b.1.as_bytes())).then_with(|| a.2.cmp(b.2))
}

/// "Newest first": `addedTime` descending, then `id` ascending.
pub fn newest_first(a: (i64, &str), b: (i64, &str)) -> Ordering {
    b.0.cmp(&a.0).then_with(|| a.1.cmp(b.1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seq_then_name_bytes_then_id() {
        let one = Num::Int(1);
        let one_f = Num::Float(1.0);
        assert_eq!(by_seq((&one, "b", "1"), (&one_f, "a", "2")), Ordering::Greater);
        assert_eq!(by_seq((&one, "Z", "1"), (&one, "a", "0")), Ordering::Less);
        assert_eq!(by_seq((&one, "é", "1"), (&one, "z", "0")), Ordering::Greater);
        assert_eq!(by_seq((&one, "a", "1"), (&one, "a", "2")), Ordering::Less);
        assert_eq!(by_seq((&Num::Float(0.5), "z", "z"), (&one, "a", "a")), Ordering::Less);
    }

    #[test]
    fn newest_then_id() {
        assert_eq!(newest_first((5, "b"), (3, "a")), Ordering::Less);
        assert_eq!(newest_first((5, "b"), (5, "a")), Ordering::Greater);
        assert_eq!(newest_first((0, "a"), (-1, "a")), Ordering::Less);
    }
}
