//! Ids: ObjectIds written as lowercase hex, or strings that match
//! `^[0-9A-Za-z_-]{1,128}$`. Anything else is unusable.

use super::compact::Wid;
use mongodb::bson::RawBsonRef;

pub use crate::keys::segment::is_id_segment as is_usable_id;

/// An ObjectId as 24 lowercase hex characters (faster than the BSON
/// library's iterator-based `to_hex`, which shows up in rebuild profiles).
pub fn oid_hex(oid: &mongodb::bson::oid::ObjectId) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(24);
    for b in oid.bytes() {
        out.push(HEX[(b >> 4) as usize] as char);
        out.push(HEX[(b & 15) as usize] as char);
    }
    out
}

/// An id read from BSON.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdValue {
    Usable(String),
    /// Present but unusable; carries a printable form for reports.
    Unusable(String),
}

/// Reads an id (an `_id` or a reference) from a BSON value.
pub fn read_id(value: RawBsonRef<'_>) -> IdValue {
    match value {
        RawBsonRef::ObjectId(oid) => IdValue::Usable(oid_hex(&oid)),
        RawBsonRef::String(s) if is_usable_id(s) => IdValue::Usable(s.to_string()),
        RawBsonRef::String(s) => IdValue::Unusable(format!("{s:?}")),
        other => IdValue::Unusable(format!("<{:?}>", other.element_type())),
    }
}

/// Reads a reference (a `categoryIds` or `tagIds` item, a legacy
/// `categoryId`) as a [`Wid`], when it is usable. An ObjectId is kept as
/// its bytes without being spelled out: the rebuild reads several
/// references in every video, and the text it then made and dropped was
/// an allocation each.
pub fn read_ref(value: RawBsonRef<'_>) -> Option<Wid> {
    match value {
        RawBsonRef::ObjectId(oid) => Some(Wid::Hex(oid.bytes())),
        RawBsonRef::String(s) if is_usable_id(s) => Some(Wid::new(s)),
        _ => None,
    }
}

/// The written id of an owned BSON value (an `_id` from a change event or
/// a driver document), when it is usable.
pub fn written_id(value: &mongodb::bson::Bson) -> Option<String> {
    let raw = mongodb::bson::RawBson::try_from(value.clone()).ok()?;
    match read_id(raw.as_raw_bson_ref()) {
        IdValue::Usable(id) => Some(id),
        IdValue::Unusable(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::bson::oid::ObjectId;

    #[test]
    fn object_ids_and_strings() {
        let oid = ObjectId::parse_str("65A1B2C3D4E5F6A7B8C9D0E1").unwrap();
        assert_eq!(read_id(RawBsonRef::ObjectId(oid)), IdValue::Usable("65a1b2c3d4e5f6a7b8c9d0e1".into()));
        assert_eq!(oid_hex(&oid), oid.to_hex());
        assert_eq!(read_id(RawBsonRef::String("c-1_x")), IdValue::Usable("c-1_x".into()));
        assert!(matches!(read_id(RawBsonRef::String("a b")), IdValue::Unusable(_)));
        assert!(matches!(read_id(RawBsonRef::String("")), IdValue::Unusable(_)));
        assert!(matches!(read_id(RawBsonRef::Int32(5)), IdValue::Unusable(_)));
        assert_eq!(written_id(&mongodb::bson::Bson::ObjectId(oid)), Some("65a1b2c3d4e5f6a7b8c9d0e1".into()));
        assert_eq!(written_id(&mongodb::bson::Bson::String("a b".into())), None);
        // A reference reads as the same id, ObjectId or its text.
        assert_eq!(read_ref(RawBsonRef::ObjectId(oid)), Some(Wid::new("65a1b2c3d4e5f6a7b8c9d0e1")));
        assert_eq!(read_ref(RawBsonRef::String("65a1b2c3d4e5f6a7b8c9d0e1")), Some(Wid::Hex(oid.bytes())));
        assert_eq!(read_ref(RawBsonRef::String("65A1B2C3D4E5F6A7B8C9D0E1")).unwrap(), "65A1B2C3D4E5F6A7B8C9D0E1");
        assert_eq!(read_ref(RawBsonRef::String("c-1_x")).unwrap(), "c-1_x");
        assert_eq!(read_ref(RawBsonRef::String("a b")), None);
        assert_eq!(read_ref(RawBsonRef::Int32(5)), None);
    }
}
