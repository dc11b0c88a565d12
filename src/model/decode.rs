//! Decoding of Channel, Category and Tag documents, with the contract's
//! rejection rules. Video documents are decoded in [`super::video`].

use super::bson_json::{self, Lossy};
use super::id::{IdValue, read_id};
use super::num::{self, Num};
use super::plain::{self, Val};
use super::report::{CollectionReport, Reason, RefReport, Rejection};
use mongodb::bson::{RawBsonRef, RawDocument};
use rustc_hash::FxHashSet as HashSet;

/// An element of a channel's `categories` or `tags`, reduced to `id` and
/// `name` (rendered JSON; `None` when the element has no `name`).
#[derive(Debug, Clone, PartialEq)]
pub struct RefItem {
    pub id: String,
    pub name: Option<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Channel {
    pub id: String,
    pub name: String,
    pub landing_url: String,
    /// `videoCdn`, `coverCdn`, `clientName`, `clientNotice`, `remark` as
    /// rendered JSON, `None` when absent, null or an empty array.
    pub extras: Vec<(&'static str, Option<String>)>,
    pub categories: Vec<RefItem>,
    pub tags: Vec<RefItem>,
    pub tag_names: Option<String>,
}

pub const CHANNEL_EXTRAS: [&str; 5] = ["videoCdn", "coverCdn", "clientName", "clientNotice", "remark"];

#[derive(Debug, Clone)]
pub struct Category {
    pub id: String,
    pub name: String,
    pub subtitle: Option<String>,
    pub seq: Num,
    pub seq_json: String,
    pub status_json: String,
    pub active: bool,
}

#[derive(Debug, Clone)]
pub struct Tag {
    pub id: String,
    pub name: String,
    pub category_id: String,
    pub seq: Num,
    pub seq_json: String,
    pub status_json: String,
    pub active: bool,
}

/// Reads a document's own `_id`, or says why it is unusable.
pub fn doc_id(doc: &RawDocument) -> Result<String, Rejection> {
    match doc.get("_id") {
        Ok(Some(value)) => match read_id(value) {
            IdValue::Usable(id) => Ok(id),
            IdValue::Unusable(shown) => Err(Rejection { id: shown, reason: Reason::InvalidId }),
        },
        Ok(None) => Err(Rejection { id: "<none>".into(), reason: Reason::InvalidId }),
        Err(_) => Err(Rejection { id: "<malformed>".into(), reason: Reason::MalformedBson }),
    }
}

/// The BSON was malformed up to the element asked for, or at its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Malformed;

/// A document's elements from one walk. A video is looked up four times
/// and then rendered field by field; each `RawDocument::get` walks the
/// document from its start, so the lookups and the loop answer from one
/// walk instead (about 1.5% of a rebuild's CPU). The walk is the plain
/// one ([`plain::each_element`]) where it takes the document, else the
/// library's.
pub struct Fields<'a> {
    /// Each element's key and value, or whether its value is malformed.
    elements: Vec<(&'a str, Result<Val<'a>, Malformed>)>,
    /// The walk stopped at malformed BSON after `elements`.
    malformed: bool,
}

impl<'a> Fields<'a> {
    pub fn read(doc: &'a RawDocument) -> Fields<'a> {
        // A video carries about 50 fields (its provider's), so room for
        // 64 is allocated once; 32 grew on every video.
        let mut elements = Vec::with_capacity(64);
        let plain = plain::each_element(doc, |key, value| {
            elements.push((key, Ok(value)));
            Ok::<_, std::convert::Infallible>(())
        });
        if plain == Ok(true) {
            return Fields { elements, malformed: false };
        }
        elements.clear();
        let mut malformed = false;
        for element in doc.iter_elements() {
            match element {
                Ok(element) => elements.push((element.key(), element.value().map(Val::of).map_err(|_| Malformed))),
                Err(_) => {
                    malformed = true;
                    break;
                }
            }
        }
        Fields { elements, malformed }
    }

    /// Visits the elements as iterating the document yields them, in
    /// order: `visit` gets each name and value, and the first malformed
    /// value, or the place where the walk stopped, ends the visit with
    /// `malformed()`.
    ///
    /// A plain loop, not an iterator of `Result`s: through the adapters'
    /// layers each value was copied from stack slot to stack slot in
    /// overlapping halves, and every copy stalled on store forwarding
    /// (three quarters of `decode_video`'s own samples in a `perf
    /// annotate` of `cachewright-dev bench` planning 500K videos).
    pub fn each<E>(
        &self,
        malformed: impl Fn() -> E,
        mut visit: impl FnMut(&'a str, Val<'a>) -> Result<(), E>,
    ) -> Result<(), E> {
        for (key, value) in &self.elements {
            match value {
                Ok(value) => visit(key, *value)?,
                Err(_) => return Err(malformed()),
            }
        }
        if self.malformed { Err(malformed()) } else { Ok(()) }
    }

    /// [`field`] of these elements.
    pub fn field(&self, id: &str, name: &str) -> Result<Option<Val<'a>>, Rejection> {
        present(self.get(name), |value| matches!(value, Val::Bson(RawBsonRef::Null)), id)
    }

    /// [`required_str`] of these elements, without copying the text.
    pub fn required_str(&self, id: &str, name: &'static str) -> Result<&'a str, Rejection> {
        let found = self.field(id, name)?.map(|value| match value {
            Val::Bson(RawBsonRef::String(s)) => Some(s),
            _ => None,
        });
        required_text(found, id, name)
    }

    /// The first element named `name`, as [`RawDocument::get`] answers:
    /// an error when the BSON is malformed up to it or at its value.
    pub fn get(&self, name: &str) -> Result<Option<Val<'a>>, Malformed> {
        match self.elements.iter().find(|(key, _)| *key == name) {
            Some((_, value)) => value.map(Some),
            None if self.malformed => Err(Malformed),
            None => Ok(None),
        }
    }
}

/// A field lookup that turns malformed BSON into a rejection.
pub fn field<'a>(doc: &'a RawDocument, id: &str, name: &str) -> Result<Option<RawBsonRef<'a>>, Rejection> {
    present(doc.get(name).map_err(|_| Malformed), |value| matches!(value, RawBsonRef::Null), id)
}

/// A looked-up field as the decoders take it: null counts as absent, and
/// BSON malformed up to it (or at its value) rejects the document.
fn present<V>(
    found: Result<Option<V>, Malformed>,
    is_null: impl Fn(&V) -> bool,
    id: &str,
) -> Result<Option<V>, Rejection> {
    match found {
        Ok(Some(value)) if is_null(&value) => Ok(None),
        Ok(value) => Ok(value),
        Err(Malformed) => Err(Rejection { id: id.to_string(), reason: Reason::MalformedBson }),
    }
}

pub fn required_str(doc: &RawDocument, id: &str, name: &'static str) -> Result<String, Rejection> {
    let found = field(doc, id, name)?.map(|value| match value {
        RawBsonRef::String(s) => Some(s),
        _ => None,
    });
    required_text(found, id, name).map(str::to_string)
}

/// The rule for a required string field, given what was found (`None`:
/// absent or null; `Some(None)`: not a string).
fn required_text<'a>(found: Option<Option<&'a str>>, id: &str, name: &'static str) -> Result<&'a str, Rejection> {
    match found {
        Some(Some(text)) => Ok(text),
        Some(None) => Err(Rejection { id: id.to_string(), reason: Reason::WrongType(name) }),
        None => Err(Rejection { id: id.to_string(), reason: Reason::Missing(name) }),
    }
}

fn required_num(doc: &RawDocument, id: &str, name: &'static str) -> Result<(Num, String), Rejection> {
    match field(doc, id, name)? {
        Some(value) => match Num::from_bson(value) {
            Some(num) => Ok((num, render(value))),
            None => Err(Rejection { id: id.to_string(), reason: Reason::WrongType(name) }),
        },
        None => Err(Rejection { id: id.to_string(), reason: Reason::Missing(name) }),
    }
}

/// Renders a value with the generic BSON → JSON rules.
pub fn render(value: RawBsonRef<'_>) -> String {
    let mut out = String::new();
    // Malformed nested BSON renders as far as it goes; the document's own
    // fields were already walked, so this cannot fail at the top level.
    let _ = bson_json::write_value(&mut out, value, &mut Lossy::default());
    out
}

/// Renders an optional payload field: `None` for absent, null or `[]`.
fn optional(doc: &RawDocument, name: &str, lossy: &mut Lossy) -> Option<String> {
    match doc.get(name).ok().flatten()? {
        RawBsonRef::Null => None,
        RawBsonRef::Array(arr) if arr.into_iter().next().is_none() => None,
        value => {
            let mut out = String::new();
            bson_json::write_value(&mut out, value, lossy).ok()?;
            Some(out)
        }
    }
}

/// Reads a channel's `[{id, name}]` list, dropping unusable elements.
fn ref_items(doc: &RawDocument, name: &str, site: &'static str, refs: &mut RefReport) -> Vec<RefItem> {
    let Some(RawBsonRef::Array(arr)) = doc.get(name).ok().flatten() else {
        if !matches!(doc.get(name), Ok(None) | Ok(Some(RawBsonRef::Null))) {
            refs.unusable(site, 1);
        }
        return Vec::new();
    };
    let mut items = Vec::new();
    for element in arr {
        let item = element.ok().and_then(|value| match value {
            RawBsonRef::Document(d) => match d.get("id").ok().flatten().map(read_id) {
                Some(IdValue::Usable(id)) => {
                    let name = d.get("name").ok().flatten().map(render);
                    Some(RefItem { id, name })
                }
                _ => None,
            },
            _ => None,
        });
        match item {
            Some(item) => items.push(item),
            None => refs.unusable(site, 1),
        }
    }
    items
}

pub fn decode_channel(doc: &RawDocument, id: String, refs: &mut RefReport) -> Result<Channel, Rejection> {
    let name = required_str(doc, &id, "name")?;
    let landing_url = required_str(doc, &id, "landingUrl")?;
    let mut lossy = Lossy::default();
    let extras = CHANNEL_EXTRAS.iter().map(|f| (*f, optional(doc, f, &mut lossy))).collect();
    let tag_names = optional(doc, "tagNames", &mut lossy);
    refs.lossy_values += lossy.0;
    Ok(Channel {
        categories: ref_items(doc, "categories", "Channel.categories", refs),
        tags: ref_items(doc, "tags", "Channel.tags", refs),
        id,
        name,
        landing_url,
        extras,
        tag_names,
    })
}

pub fn decode_category(doc: &RawDocument, id: String, _refs: &mut RefReport) -> Result<Category, Rejection> {
    let name = required_str(doc, &id, "name")?;
    let (seq, seq_json) = required_num(doc, &id, "seq")?;
    // The readers type `subtitle` as string | null; other types become null.
    let subtitle = match field(doc, &id, "subtitle")? {
        Some(RawBsonRef::String(s)) => Some(s.to_string()),
        _ => None,
    };
    let status = field(doc, &id, "status")?;
    Ok(Category {
        active: num::is_one(status),
        status_json: status.map(render).unwrap_or_else(|| "null".into()),
        id,
        name,
        subtitle,
        seq,
        seq_json,
    })
}

pub fn decode_tag(doc: &RawDocument, id: String, _refs: &mut RefReport) -> Result<Tag, Rejection> {
    let name = required_str(doc, &id, "name")?;
    let (seq, seq_json) = required_num(doc, &id, "seq")?;
    let category_id = match field(doc, &id, "categoryId")?.map(read_id) {
        Some(IdValue::Usable(c)) => c,
        Some(IdValue::Unusable(_)) => {
            return Err(Rejection { id, reason: Reason::WrongType("categoryId") });
        }
        None => {
            return Err(Rejection { id, reason: Reason::Missing("categoryId") });
        }
    };
    let status = field(doc, &id, "status")?;
    Ok(Tag {
        active: num::is_one(status),
        status_json: status.map(render).unwrap_or_else(|| "null".into()),
        id,
        name,
        category_id,
        seq,
        seq_json,
    })
}

/// Accepts the documents of one collection in cursor order: checks ids,
/// refuses repeats, decodes, and counts every rejection.
#[derive(Debug, Default)]
pub struct Intake {
    seen: HashSet<String>,
    pub report: CollectionReport,
    pub refs: RefReport,
}

impl Intake {
    /// Checks the document's id and claims it. An id counts as seen even
    /// when the document is then rejected for a bad field, so a later
    /// document with the same id is a repeat either way.
    pub fn claim(&mut self, doc: &RawDocument) -> Result<String, Rejection> {
        self.report.read += 1;
        let id = doc_id(doc)?;
        if !self.seen.insert(id.clone()) {
            return Err(Rejection { id, reason: Reason::DuplicateId });
        }
        Ok(id)
    }

    /// Settles a document decoded elsewhere (in parallel): `id` is its
    /// [`doc_id`], `decoded` the decoder's result, `refs` what the decoder
    /// counted. Repeats are found here, in cursor order.
    pub fn admit<T>(
        &mut self,
        id: Result<String, Rejection>,
        decoded: Result<T, Rejection>,
        refs: RefReport,
    ) -> Option<T> {
        let mut seen = std::mem::take(&mut self.seen);
        let admitted = self.admit_by(id, decoded, refs, |id| seen.insert(id.to_string()));
        self.seen = seen;
        admitted
    }

    /// [`Intake::admit`] with the ids seen kept by the caller: `claim`
    /// claims an id and says whether it is new (false: a repeat).
    pub fn admit_by<T>(
        &mut self,
        id: Result<String, Rejection>,
        decoded: Result<T, Rejection>,
        refs: RefReport,
        claim: impl FnOnce(&str) -> bool,
    ) -> Option<T> {
        self.report.read += 1;
        let result =
            id.and_then(|id| if claim(&id) { decoded } else { Err(Rejection { id, reason: Reason::DuplicateId }) });
        match result {
            Ok(item) => {
                self.refs.merge(&refs);
                Some(item)
            }
            Err(rejection) => {
                tracing::debug!(id = %rejection.id, reason = %rejection.reason, "document rejected");
                self.report.reject(rejection);
                None
            }
        }
    }

    /// Claims and decodes one document, recording a rejection.
    pub fn accept<T>(
        &mut self,
        doc: &RawDocument,
        decode: impl FnOnce(&RawDocument, String, &mut RefReport) -> Result<T, Rejection>,
    ) -> Option<T> {
        let result = self.claim(doc).and_then(|id| decode(doc, id, &mut self.refs));
        match result {
            Ok(item) => Some(item),
            Err(rejection) => {
                tracing::debug!(id = %rejection.id, reason = %rejection.reason, "document rejected");
                self.report.reject(rejection);
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::bson::{Bson, RawDocumentBuf, doc, oid::ObjectId};

    fn raw(d: mongodb::bson::Document) -> RawDocumentBuf {
        RawDocumentBuf::from_document(&d).unwrap()
    }

    /// `Fields` answers every lookup and yields every element as walking
    /// the document does, on documents corrupted byte by byte (keys
    /// repeated, bad UTF-8, lengths that overrun, unknown types).
    #[test]
    fn one_walk_answers_as_the_document_does() {
        let base = raw(doc! {
            "_id": "v1", "title": "t", "listStatus": 1_i32, "title": 5_i32,
            "categoryIds": ["c1", "c2"], "addedTime": mongodb::bson::DateTime::from_millis(7),
            "nested": { "a": "b" }, "n": 2.5,
        });
        let names = ["_id", "title", "listStatus", "categoryIds", "addedTime", "nested", "n", "absent"];
        let bytes = base.as_bytes();
        let (mut whole, mut cut, mut plain) = (0, 0, 0);
        for (at, byte, corrupt) in
            crate::model::corrupted(bytes, &[0x00, 0x01, 0x02, 0x03, 0x04, 0x10, 0x7f, 0xc0, 0xff])
        {
            let doc = RawDocument::from_bytes(&corrupt).unwrap();
            let fields = Fields::read(doc);
            plain += usize::from(super::plain::each_element(doc, |_, _| Ok::<_, ()>(())) == Ok(true));
            for name in names {
                let walked = doc.get(name).map(|value| value.map(Val::of)).map_err(|_| Malformed);
                let kept = fields.get(name);
                assert_eq!(walked, kept, "{name} with byte {at} set to {byte:#x}");
            }
            let mut walked = doc.iter().map(|e| e.map(|(key, value)| (key, Val::of(value))).map_err(|_| Malformed));
            let visited = fields.each(
                || Malformed,
                |key, value| {
                    assert_eq!(walked.next(), Some(Ok((key, value))), "byte {at} set to {byte:#x}");
                    Ok(())
                },
            );
            if visited.is_err() {
                assert_eq!(walked.next(), Some(Err(Malformed)), "byte {at} set to {byte:#x}");
                cut += 1;
            } else {
                assert_eq!(walked.next(), None, "byte {at} set to {byte:#x}");
                whole += 1;
            }
        }
        // Both kinds were met: documents that still walk, and broken ones
        // (which the library's walk judges); and the plain walk took many.
        assert!(whole > 100 && cut > 100, "{whole} whole, {cut} cut");
        assert!(plain > 100, "{plain} walked the plain way of {whole} whole");
    }

    #[test]
    fn rejects_by_the_contract_rules() {
        let mut intake = Intake::default();
        let oid = ObjectId::parse_str("65a1b2c3d4e5f6a7b8c9d0e1").unwrap();
        let docs = [
            doc! { "_id": oid, "name": "a", "seq": 1_i32, "status": 1_i32 },
            doc! { "_id": "65a1b2c3d4e5f6a7b8c9d0e1", "name": "dup", "seq": 1_i32 },
            doc! { "_id": "bad id", "name": "x", "seq": 1 },
            doc! { "_id": "c2", "name": Bson::Null, "seq": 1 },
            doc! { "_id": "c3", "name": "x", "seq": "1" },
            doc! { "_id": "c4", "name": "", "seq": 2.5, "status": 1.0 },
            doc! { "name": "no id", "seq": 1 },
        ];
        let kept: Vec<Category> = docs.iter().filter_map(|d| intake.accept(&raw(d.clone()), decode_category)).collect();
        assert_eq!(kept.len(), 2);
        assert!(kept.iter().all(|c| c.active));
        let reasons: Vec<(Reason, u64)> = intake.report.rejected.iter().map(|(r, c)| (*r, c.count)).collect();
        assert_eq!(
            reasons,
            vec![
                (Reason::InvalidId, 2),
                (Reason::DuplicateId, 1),
                (Reason::Missing("name"), 1),
                (Reason::WrongType("seq"), 1),
            ]
        );
        assert_eq!(intake.report.read, 7);
        assert_eq!(intake.report.rejected[&Reason::InvalidId].samples, vec!["\"bad id\"", "<none>"]);
    }

    #[test]
    fn channel_ref_items_drop_unusable_elements() {
        let mut refs = RefReport::default();
        let d = raw(doc! {
            "_id": "ch1", "name": "n", "landingUrl": "",
            "categories": [ { "id": "c1", "name": "C", "extra": 1 }, { "id": "bad id" }, "c2", { "id": "c3" } ],
            "remark": [], "videoCdn": "", "clientName": Bson::Null,
        });
        let ch = decode_channel(&d, "ch1".into(), &mut refs).unwrap();
        assert_eq!(
            ch.categories,
            vec![RefItem { id: "c1".into(), name: Some("\"C\"".into()) }, RefItem { id: "c3".into(), name: None }]
        );
        assert_eq!(refs.unusable["Channel.categories"], 2);
        assert_eq!(ch.extras[0], ("videoCdn", Some("\"\"".into())));
        assert_eq!(ch.extras[2], ("clientName", None));
        assert_eq!(ch.extras[4], ("remark", None));
    }

    #[test]
    fn tags_need_a_usable_category_id() {
        let mut intake = Intake::default();
        let ok = raw(doc! { "_id": "t1", "name": "x", "seq": 1_i64, "categoryId": ObjectId::new(), "status": 1_i64 });
        let bad = raw(doc! { "_id": "t2", "name": "x", "seq": 1_i64, "categoryId": "a:b" });
        assert!(intake.accept(&ok, decode_tag).is_some());
        assert!(intake.accept(&bad, decode_tag).is_none());
        assert_eq!(intake.report.rejected[&Reason::WrongType("categoryId")].count, 1);
    }
}
