//! VideoMedia decoding: the detail payload (built in one pass over the
//! stored fields) and the small index tuple every index family needs.

use super::bson_json::{self, Lossy};
use super::compact::Wid;
use super::decode::Fields;
use super::id::read_ref;
use super::json::{self, ObjectWriter};
use super::num;
use super::plain::Val;
use super::report::{Reason, RefReport, Rejection};
use mongodb::bson::{RawBsonRef, RawDocument};

pub const SITE_CATEGORY_IDS: &str = "VideoMedia.categoryIds";
pub const SITE_TAG_IDS: &str = "VideoMedia.tagIds";

/// The fields a video's index entry is decoded from (its detail is
/// rendered from every field).
const INDEX_FIELDS: [&str; 6] = ["title", "listStatus", "addedTime", "categoryIds", "categoryId", "tagIds"];

/// A decoded video. Inactive videos carry only their id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VideoDoc {
    pub id: String,
    pub active: bool,
    /// `addedTime` in epoch ms; 0 when absent or not a date.
    pub added_ms: i64,
    /// Usable category references as stored (repeats kept).
    pub category_ids: Vec<Wid>,
    /// Usable tag references as stored (repeats kept).
    pub tag_ids: Vec<Wid>,
    /// The `VideoDetailPayload` JSON, for active videos when asked for.
    pub detail: Option<String>,
}

/// The usable ids of a reference array, and how many were not.
#[derive(Default)]
struct Kept {
    ids: Vec<Wid>,
    unusable: u64,
}

impl Kept {
    fn keep(&mut self, id: Option<Wid>) {
        match id {
            Some(id) => self.ids.push(id),
            None => self.unusable += 1,
        }
    }
}

/// Keeps the usable ids of a reference array; counts the rest. The
/// array is walked the plain way, and through the library when that walk
/// stops.
fn usable_ids(value: Val<'_>, site: &'static str, refs: &mut RefReport) -> Option<Vec<Wid>> {
    let Val::Array(items) = value else {
        refs.unusable(site, 1);
        return None;
    };
    let mut kept = Kept::default();
    let whole = super::plain::each_element(items, |_, item| {
        kept.keep(item.bson().and_then(read_ref));
        Ok::<_, std::convert::Infallible>(())
    });
    if whole != Ok(true) {
        kept = Kept::default();
        // After a malformed element the library's walk ends.
        for item in items {
            kept.keep(item.ok().and_then(|(_, item)| read_ref(item)));
        }
    }
    refs.unusable(site, kept.unusable);
    Some(kept.ids)
}

/// Writes references as a JSON array of their texts.
fn write_ids(out: &mut String, ids: &[Wid]) {
    json::write_array(out, ids, |out, id| id.with_text(|text| json::write_str(out, text)));
}

fn malformed(id: &str) -> Rejection {
    Rejection { id: id.to_string(), reason: Reason::MalformedBson }
}

/// Decodes one video whose `_id` has been read as `id`.
///
/// `categoryIds` wins over a legacy `categoryId`; a lone `categoryId`
/// becomes `categoryIds: [id]` at its own position. Null counts as absent.
/// Unusable references leave the payload too. A `categoryIds` or `tagIds`
/// that is not an array is one unusable reference and is left out whole.
pub fn decode_video(
    doc: &RawDocument,
    id: String,
    refs: &mut RefReport,
    want_detail: bool,
) -> Result<VideoDoc, Rejection> {
    // Without a detail to write (the watcher's load), a plain document is
    // read from a copy of the fields an index needs (see `plain::slim`):
    // its other fields cannot be malformed. Any other document has every
    // value read through, which rejects the malformed ones as a rebuild
    // does.
    let slim = if want_detail { None } else { super::plain::slim(doc.as_bytes(), |key| INDEX_FIELDS.contains(&key)) };
    let fields = Fields::read(slim.as_deref().unwrap_or(doc));
    let field = |name: &str| fields.field(&id, name);
    fields.required_str(&id, "title")?;
    let active = num::is_one(field("listStatus")?.and_then(Val::bson));
    let added_ms = match field("addedTime")? {
        Some(Val::Bson(RawBsonRef::DateTime(dt))) => dt.timestamp_millis(),
        _ => 0,
    };
    if !active {
        return Ok(VideoDoc { id, active, added_ms, category_ids: vec![], tag_ids: vec![], detail: None });
    }
    let has_category_ids = field("categoryIds")?.is_some();
    let mut category_ids = Vec::new();
    let mut tag_ids = Vec::new();
    let mut lossy = Lossy::default();
    // JSON runs about as long as the BSON it comes from; sizing the buffer
    // up front saves the reallocations that show up in profiles.
    let mut out = String::with_capacity(if want_detail { doc.as_bytes().len() + 64 } else { 0 });
    // Without a detail to write (the watcher's load) nothing is rendered:
    // the references and the verdict are all it needs.
    let mut obj = want_detail.then(|| ObjectWriter::new(&mut out));
    if let Some(obj) = obj.as_mut() {
        obj.string("id", &id);
    }
    fields.each(
        || malformed(&id),
        |key, value| {
            match (key, value) {
                ("_id" | "id", _) => {}
                ("categoryIds", Val::Bson(RawBsonRef::Null)) => {}
                ("categoryId", _) if has_category_ids => {}
                ("categoryId", Val::Bson(RawBsonRef::Null)) => {}
                ("categoryIds", value) => {
                    if let Some(ids) = usable_ids(value, SITE_CATEGORY_IDS, refs) {
                        if let Some(out) = field_out(&mut obj, "categoryIds") {
                            write_ids(out, &ids);
                        }
                        category_ids = ids;
                    }
                }
                ("categoryId", value) => {
                    // The legacy rule comes first (`[categoryId]`), then an
                    // unusable reference is dropped: an empty array remains.
                    let ids = match value.bson().and_then(read_ref) {
                        Some(c) => vec![c],
                        None => {
                            refs.unusable(SITE_CATEGORY_IDS, 1);
                            Vec::new()
                        }
                    };
                    if let Some(out) = field_out(&mut obj, "categoryIds") {
                        write_ids(out, &ids);
                    }
                    if !ids.is_empty() {
                        category_ids = ids;
                    }
                }
                ("tagIds", value @ Val::Array(_)) => {
                    if let Some(ids) = usable_ids(value, SITE_TAG_IDS, refs) {
                        if let Some(out) = field_out(&mut obj, "tagIds") {
                            write_ids(out, &ids);
                        }
                        tag_ids = ids;
                    }
                }
                ("tagIds", Val::Bson(RawBsonRef::Null)) => {
                    if let Some(out) = field_out(&mut obj, "tagIds") {
                        out.push_str("null");
                    }
                }
                ("tagIds", _) => refs.unusable(SITE_TAG_IDS, 1),
                // Without a detail to write, the other fields are only read
                // through, which rejects the same malformed documents at a
                // fraction of the cost.
                (key, value) => match field_out(&mut obj, key) {
                    Some(out) => bson_json::write_val(out, value, &mut lossy).map_err(|_| malformed(&id))?,
                    None => bson_json::check_val(value).map_err(|_| malformed(&id))?,
                },
            }
            Ok(())
        },
    )?;
    if let Some(obj) = obj {
        obj.finish();
    }
    refs.lossy_values += lossy.0;
    Ok(VideoDoc { id, active, added_ms, category_ids, tag_ids, detail: want_detail.then_some(out) })
}

/// The buffer for a field's value in the detail being written, if one is.
fn field_out<'o>(obj: &'o mut Option<ObjectWriter<'_>>, key: &str) -> Option<&'o mut String> {
    obj.as_mut().map(|obj| obj.key(key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::bson::{Bson, DateTime, RawDocument, RawDocumentBuf, doc, oid::ObjectId};

    fn decode(d: mongodb::bson::Document) -> (VideoDoc, RefReport) {
        let raw = RawDocumentBuf::from_document(&d).unwrap();
        let mut refs = RefReport::default();
        let id = super::super::decode::doc_id(&raw).unwrap();
        (decode_video(&raw, id, &mut refs, true).unwrap(), refs)
    }

    #[test]
    fn legacy_category_id_takes_its_place() {
        let (v, _) = decode(doc! {
            "_id": "v1", "title": "t", "categoryId": "c1", "listStatus": 1_i32, "id": "x", "z": 1_i32,
        });
        assert_eq!(v.detail.unwrap(), r#"{"id":"v1","title":"t","categoryIds":["c1"],"listStatus":1,"z":1}"#);
        assert_eq!(v.category_ids, vec!["c1"]);
    }

    #[test]
    fn category_ids_win_and_nulls_count_as_absent() {
        let (v, _) = decode(doc! {
            "_id": "v1", "categoryId": "c9", "title": "t", "categoryIds": ["c1", "c1"], "listStatus": 1.0,
        });
        assert_eq!(v.detail.unwrap(), r#"{"id":"v1","title":"t","categoryIds":["c1","c1"],"listStatus":1}"#);
        let (v, _) = decode(doc! {
            "_id": "v1", "categoryIds": Bson::Null, "title": "t", "categoryId": "c2", "listStatus": 1_i64,
        });
        assert_eq!(v.detail.unwrap(), r#"{"id":"v1","title":"t","categoryIds":["c2"],"listStatus":1}"#);
        let (v, _) = decode(doc! { "_id": "v1", "title": "t", "categoryId": Bson::Null, "listStatus": 1_i32 });
        assert_eq!(v.detail.unwrap(), r#"{"id":"v1","title":"t","listStatus":1}"#);
    }

    #[test]
    fn unusable_legacy_category_id_leaves_an_empty_array() {
        let (v, refs) = decode(doc! { "_id": "v1", "title": "t", "categoryId": "bad id", "listStatus": 1_i32 });
        assert_eq!(v.detail.unwrap(), r#"{"id":"v1","title":"t","categoryIds":[],"listStatus":1}"#);
        assert!(v.category_ids.is_empty());
        assert_eq!(refs.unusable[SITE_CATEGORY_IDS], 1);
    }

    /// Without a detail, a document is accepted or rejected, and gives
    /// the same references, as with one: on documents corrupted byte by
    /// byte, plain ones (which skip reading their other values) included.
    #[test]
    fn without_a_detail_the_same_documents_pass() {
        let base = RawDocumentBuf::from_document(&doc! {
            "_id": ObjectId::parse_str("65a1b2c3d4e5f6a7b8c9d0e1").unwrap(), "title": "t", "listStatus": 1_i32,
            "categoryIds": ["c1", "c2"], "tagIds": ["t1"], "addedTime": DateTime::from_millis(7),
            "meta": { "a": "b", "n": [1_i32, "x"] }, "n": 2.5, "s": "ü",
        })
        .unwrap();
        let bytes = base.as_bytes();
        let (mut plain, mut kept, mut rejected) = (0, 0, 0);
        let values = [0x00, 0x01, 0x02, 0x03, 0x04, 0x08, 0x10, 0x7f, 0xc0, 0xff];
        for (at, byte, corrupt) in crate::model::corrupted(bytes, &values) {
            let doc = RawDocument::from_bytes(&corrupt).unwrap();
            let Ok(id) = super::super::decode::doc_id(doc) else { continue };
            let decode = |want_detail| {
                let mut refs = RefReport::default();
                let video = decode_video(doc, id.clone(), &mut refs, want_detail)
                    .map(|v| (v.active, v.added_ms, v.category_ids, v.tag_ids));
                (video, refs.unusable)
            };
            let (with, without) = (decode(true), decode(false));
            assert_eq!(with, without, "byte {at} set to {byte:#x}");
            plain += usize::from(crate::model::plain::is_plain(&corrupt));
            match with.0 {
                Ok(_) => kept += 1,
                Err(_) => rejected += 1,
            }
        }
        assert!(plain > 300 && kept > 300 && rejected > 100, "{plain} plain, {kept} kept, {rejected} rejected");
    }

    #[test]
    fn unusable_references_leave_the_payload() {
        let oid = ObjectId::parse_str("65a1b2c3d4e5f6a7b8c9d0e1").unwrap();
        let (v, refs) = decode(doc! {
            "_id": oid, "title": "t", "listStatus": 1_i32,
            "categoryIds": [oid, "bad id", 5_i32], "tagIds": "t1",
            "addedTime": DateTime::from_millis(1000),
        });
        assert_eq!(
            v.detail.unwrap(),
            r#"{"id":"65a1b2c3d4e5f6a7b8c9d0e1","title":"t","listStatus":1,"categoryIds":["65a1b2c3d4e5f6a7b8c9d0e1"],"addedTime":"1970-01-01T00:00:01.000Z"}"#
        );
        assert_eq!(refs.unusable[SITE_CATEGORY_IDS], 2);
        assert_eq!(refs.unusable[SITE_TAG_IDS], 1);
        assert_eq!(v.added_ms, 1000);
    }

    /// An ObjectId reference and its lowercase text are one id, kept as
    /// its bytes; its capitals are another id, kept as text. The detail
    /// spells each as read.
    #[test]
    fn references_keep_their_texts_in_compact_form() {
        let oid = ObjectId::parse_str("65a1b2c3d4e5f6a7b8c9d0e1").unwrap();
        let (v, _) = decode(doc! {
            "_id": "v1", "title": "t", "listStatus": 1_i32,
            "categoryIds": [oid, "65a1b2c3d4e5f6a7b8c9d0e1", "65A1B2C3D4E5F6A7B8C9D0E1"], "tagIds": ["t\u{1}", oid],
        });
        assert_eq!(
            v.detail.unwrap(),
            r#"{"id":"v1","title":"t","listStatus":1,"categoryIds":["65a1b2c3d4e5f6a7b8c9d0e1","65a1b2c3d4e5f6a7b8c9d0e1","65A1B2C3D4E5F6A7B8C9D0E1"],"tagIds":["65a1b2c3d4e5f6a7b8c9d0e1"]}"#
        );
        assert_eq!(v.category_ids[0], Wid::Hex(oid.bytes()));
        assert_eq!(v.category_ids[0], v.category_ids[1]);
        assert_ne!(v.category_ids[1], v.category_ids[2]);
        assert_eq!(v.category_ids[2], "65A1B2C3D4E5F6A7B8C9D0E1");
        assert_eq!(v.tag_ids, vec!["65a1b2c3d4e5f6a7b8c9d0e1"]);
    }

    #[test]
    fn inactive_videos_need_only_a_title() {
        for status in [Bson::String("1".into()), Bson::Boolean(true), Bson::Int32(0)] {
            let (v, _) = decode(doc! { "_id": "v1", "title": "", "listStatus": status });
            assert!(!v.active);
            assert!(v.detail.is_none());
        }
        let raw = RawDocumentBuf::from_document(&doc! { "_id": "v1", "listStatus": 1 }).unwrap();
        let err = decode_video(&raw, "v1".into(), &mut RefReport::default(), true).unwrap_err();
        assert_eq!(err.reason, Reason::Missing("title"));
    }
}
