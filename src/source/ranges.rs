//! Reading the video collection over several `_id`-range cursors at once.
//!
//! Natural order matters to the contract in one place only: of two
//! documents that write the same id, the first in natural order is kept
//! and the other is rejected as `duplicate id`. MongoDB keeps `_id`
//! unique, and only ObjectIds and strings are usable ids, so two
//! documents write the same id only when one `_id` is an ObjectId and the
//! other a string of the same 24 lowercase hex digits. When the
//! collection holds no such string, no two documents share a written id
//! and the order of the read is free: the ObjectIds are cut into ranges
//! of their 12 bytes, read side by side, and every other `_id` is read
//! by one more cursor after them. When such a string exists, the read stays one
//! cursor in natural order, so which twin is first stays exact.

use mongodb::bson::{Document, doc, oid::ObjectId};

/// The filter of a string `_id` that writes the same id as an ObjectId
/// would: 24 lowercase hex digits. The range bounds let the server walk
/// only the `_id` index's strings between them (a bare regular
/// expression would test every document).
pub fn lookalike_filter() -> Document {
    doc! { "_id": { "$gte": "0".repeat(24), "$lte": "f".repeat(24), "$regex": "^[0-9a-f]{24}$" } }
}

/// How the video collection is read.
#[derive(Debug, Clone, PartialEq)]
pub enum VideoRead {
    /// One cursor in natural order, and why.
    Natural(&'static str),
    /// One cursor per ObjectId range, read concurrently, then one over
    /// [`others_filter`]: together they match every document once.
    Ranges(Vec<Document>),
}

impl VideoRead {
    /// How many cursors the read opens.
    pub fn cursors(&self) -> usize {
        match self {
            VideoRead::Natural(_) => 1,
            VideoRead::Ranges(ranges) => ranges.len() + 1,
        }
    }

    /// Says in the log how `collection` is read.
    pub fn log(&self, collection: &str) {
        match self {
            VideoRead::Natural(why) => tracing::info!(collection, "reading with one cursor: {why}"),
            VideoRead::Ranges(_) => tracing::info!(collection, cursors = self.cursors(), "reading over _id ranges"),
        }
    }
}

/// Every `_id` that is not an ObjectId: strings and unusable ids (which
/// the run reports). Read after every range has ended, so that a string
/// inserted during the read that repeats an ObjectId already there is
/// claimed after it, as natural order would have it.
pub fn others_filter() -> Document {
    doc! { "_id": { "$not": { "$type": "objectId" } } }
}

fn to_int(id: &ObjectId) -> u128 {
    let mut bytes = [0u8; 16];
    bytes[4..].copy_from_slice(&id.bytes());
    u128::from_be_bytes(bytes)
}

fn to_oid(n: u128) -> ObjectId {
    let bytes = n.to_be_bytes();
    ObjectId::from_bytes(bytes[4..].try_into().expect("12 bytes"))
}

/// Cuts `[lo, hi]` into at most `parts` ranges of about equal width:
/// the cut points, strictly increasing, each above `lo` and at most `hi`
/// (fewer when the span is narrower than `parts`). ObjectIds begin with
/// their creation second, so on a real catalogue the ranges hold about
/// equal numbers of videos when uploads are spread over time; generated
/// ids are uniform over the 12 bytes.
pub fn cut_points(lo: &ObjectId, hi: &ObjectId, parts: usize) -> Vec<ObjectId> {
    let (lo, hi) = (to_int(lo), to_int(hi));
    if parts < 2 || hi <= lo {
        return Vec::new();
    }
    let span = hi - lo;
    let mut cuts: Vec<u128> =
        (1..parts as u128).map(|i| lo + span / parts as u128 * i + span % parts as u128 * i / parts as u128).collect();
    cuts.retain(|&c| c > lo && c <= hi);
    cuts.dedup();
    cuts.into_iter().map(to_oid).collect()
}

/// The filters of the ObjectId ranges between the cut points (the first
/// and last open-ended, so ObjectIds inserted during the read still fall
/// in a range). A comparison with an ObjectId matches ObjectIds only
/// (MongoDB compares within one type), so no range overlaps
/// [`others_filter`].
pub fn range_filters(cuts: &[ObjectId]) -> Vec<Document> {
    let mut filters = Vec::with_capacity(cuts.len() + 1);
    let mut below: Option<&ObjectId> = None;
    for cut in cuts {
        filters.push(match below {
            None => doc! { "_id": { "$lt": cut } },
            Some(from) => doc! { "_id": { "$gte": from, "$lt": cut } },
        });
        below = Some(cut);
    }
    filters.push(match below {
        None => doc! { "_id": { "$type": "objectId" } },
        Some(from) => doc! { "_id": { "$gte": from } },
    });
    filters
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn oid(n: u128) -> ObjectId {
        to_oid(n)
    }

    #[test]
    fn the_twelve_bytes_round_trip_as_a_number() {
        let id = ObjectId::parse_str("65a1b2c3d4e5f6a7b8c9d0e1").unwrap();
        assert_eq!(to_oid(to_int(&id)), id);
        assert!(to_int(&oid(5)) < to_int(&ObjectId::parse_str("000000000000000000000100").unwrap()));
    }

    #[test]
    fn a_narrow_or_empty_span_gets_fewer_cuts() {
        assert!(cut_points(&oid(7), &oid(7), 4).is_empty());
        assert!(cut_points(&oid(9), &oid(7), 4).is_empty());
        assert!(cut_points(&oid(1), &oid(100), 1).is_empty());
        assert_eq!(cut_points(&oid(1), &oid(3), 8), vec![oid(2)]);
    }

    #[test]
    fn filters_cover_the_ranges_and_every_other_id() {
        let cuts = [oid(10), oid(20)];
        let filters = range_filters(&cuts);
        assert_eq!(filters.len(), 3);
        assert_eq!(filters[0], doc! { "_id": { "$lt": oid(10) } });
        assert_eq!(filters[1], doc! { "_id": { "$gte": oid(10), "$lt": oid(20) } });
        assert_eq!(filters[2], doc! { "_id": { "$gte": oid(20) } });
        assert_eq!(others_filter(), doc! { "_id": { "$not": { "$type": "objectId" } } });
        assert_eq!(range_filters(&[])[0], doc! { "_id": { "$type": "objectId" } });
    }

    proptest! {
        #[test]
        fn cuts_rise_strictly_within_the_span_and_split_it_evenly(
            lo in 0u128..(1u128 << 96),
            width in 0u128..(1u128 << 96),
            parts in 1usize..64,
        ) {
            let hi = (lo + width).min((1u128 << 96) - 1);
            let cuts: Vec<u128> = cut_points(&oid(lo), &oid(hi), parts).iter().map(to_int).collect();
            prop_assert!(cuts.len() < parts.max(1));
            prop_assert!(cuts.windows(2).all(|w| w[0] < w[1]));
            prop_assert!(cuts.iter().all(|&c| c > lo && c <= hi));
            if hi - lo >= parts as u128 * 1000 {
                prop_assert_eq!(cuts.len(), parts - 1);
                // Every range is within one part's width of even.
                let mut edges = vec![lo];
                edges.extend(&cuts);
                edges.push(hi);
                let even = (hi - lo) / parts as u128;
                prop_assert!(edges.windows(2).all(|w| (w[1] - w[0]).abs_diff(even) <= 1));
            }
        }
    }
}
