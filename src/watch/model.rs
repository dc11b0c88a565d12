//! Change events as the watcher sees them: which collection, which
//! document (by its `_id` as BSON), and its new state.

use crate::config::Collections;
use crate::model::report::{RefReport, Rejection};
use crate::model::video::VideoDoc;
use mongodb::bson::{Bson, RawDocument, RawDocumentBuf};

/// A document's identity: its `_id` as BSON (an ObjectId and a string of
/// the same hex are different documents that write the same id). An
/// ObjectId, the common case, is its 12 bytes; any other value is its
/// debug text, which tells types apart.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum IdKey {
    Oid([u8; 12]),
    Other(Box<str>),
}

impl IdKey {
    /// The `_id` itself, when the key alone gives it back (an ObjectId).
    pub fn object_id(&self) -> Option<Bson> {
        match self {
            IdKey::Oid(bytes) => Some(Bson::ObjectId(mongodb::bson::oid::ObjectId::from_bytes(*bytes))),
            IdKey::Other(_) => None,
        }
    }
}

pub fn id_key(id: &Bson) -> IdKey {
    match id {
        Bson::ObjectId(oid) => IdKey::Oid(oid.bytes()),
        other => IdKey::Other(format!("{other:?}").into()),
    }
}

pub fn raw_id_key(doc: &RawDocument) -> Option<IdKey> {
    let raw = doc.get("_id").ok().flatten()?;
    let bson: Bson = raw.to_raw_bson().try_into().ok()?;
    Some(id_key(&bson))
}

/// The four watched collections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Coll {
    Channel,
    Category,
    Tag,
    Video,
}

impl Coll {
    pub const ALL: [Coll; 4] = [Coll::Channel, Coll::Category, Coll::Tag, Coll::Video];

    pub fn name(self, names: &Collections) -> &str {
        match self {
            Coll::Channel => &names.channel,
            Coll::Category => &names.category,
            Coll::Tag => &names.tag,
            Coll::Video => &names.video,
        }
    }
}

/// One document's new state.
#[derive(Debug, Clone)]
pub enum Event {
    /// `decoded`, when present, is [`decode`] of `doc`, done before the
    /// batch (a video's, by the stream task as the event arrived).
    Upsert {
        coll: Coll,
        key: IdKey,
        raw_id: Bson,
        doc: RawDocumentBuf,
        decoded: Option<Box<Decoded>>,
    },
    Remove {
        coll: Coll,
        key: IdKey,
        raw_id: Bson,
    },
}

/// A video document decoded (its detail payload rendered), or why it is
/// rejected.
pub type Decoded = Result<VideoDoc, Rejection>;

/// Decodes a video document with the rebuild's decoder. It needs nothing
/// but the document, so it runs where the event arrives, beside the
/// engine writing the batch before, rather than in the batch's serial
/// path.
pub fn decode(doc: &RawDocument) -> Decoded {
    crate::model::decode::doc_id(doc)
        .and_then(|id| crate::model::video::decode_video(doc, id, &mut RefReport::default(), true))
}

/// What the stream task decodes of an event's document as it arrives: a
/// video's (the catalogue's are assembled with the batch).
pub fn decode_on_arrival(coll: Coll, doc: Option<&RawDocumentBuf>) -> Option<Box<Decoded>> {
    match (coll, doc) {
        (Coll::Video, Some(doc)) => Some(Box::new(decode(doc))),
        _ => None,
    }
}
