//! Video documents as the server sent them: whole cursor replies, read in
//! place. The driver's document cursor copies every document out of its
//! reply into an allocation of its own; the load and the rebuild decode
//! each document once and drop it, so they borrow it from the reply
//! instead (the copy and its allocation were an eighth of the watcher's
//! load CPU).

use super::{SourceError, read_error};
use mongodb::bson::RawDocument;
use mongodb::raw_batch_cursor::RawBatch;

/// Consecutive cursor replies, their documents in cursor order.
#[derive(Debug, Default)]
pub struct RawChunk {
    replies: Vec<RawBatch>,
    len: usize,
}

impl RawChunk {
    /// Adds the next reply, after checking that it holds a batch of
    /// documents (so [`RawChunk::docs`] meets nothing else).
    pub fn push(&mut self, reply: RawBatch, collection: &str) -> Result<(), SourceError> {
        let mut count = 0;
        let elements = reply.doc_slices().map_err(|source| read_error(collection, source))?;
        for element in elements {
            let element = element.map_err(|source| read_error(collection, source.into()))?;
            if element.as_document().is_none() {
                return Err(SourceError::Reply {
                    collection: collection.to_string(),
                    reason: "a batch holds a non-document",
                });
            }
            count += 1;
        }
        self.len += count;
        self.replies.push(reply);
        Ok(())
    }

    /// How many documents the chunk holds.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The documents, in cursor order.
    pub fn docs(&self) -> Vec<&RawDocument> {
        let mut docs = Vec::with_capacity(self.len);
        for reply in &self.replies {
            // `push` checked every element: nothing is skipped here.
            let elements = reply.doc_slices().into_iter().flatten();
            docs.extend(elements.filter_map(|element| element.ok()?.as_document()));
        }
        docs
    }
}
