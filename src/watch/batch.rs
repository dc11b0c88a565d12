//! One batch of stream items sorted out (events, look-ups by id, the
//! newest token per stream), and whether the streams have caught up with
//! a load.

use super::model::{Coll, Event, id_key};
use super::stream::{self, Item};
use super::{Restart, WatchMetrics};
use crate::config::Collections;
use mongodb::change_stream::event::{OperationType, ResumeToken};
use std::collections::HashMap;

/// Whether each stream has passed the cluster time of a load.
#[derive(Debug, Clone)]
pub(super) struct CatchUp {
    until: Option<mongodb::bson::Timestamp>,
    done: [bool; 4],
}

impl CatchUp {
    pub(super) fn until(time: mongodb::bson::Timestamp) -> CatchUp {
        CatchUp { until: Some(time), done: [false; 4] }
    }

    pub(super) fn done() -> CatchUp {
        CatchUp { until: None, done: [true; 4] }
    }

    /// A stream has passed the load when it delivers a later event, or
    /// has nothing left to deliver.
    pub(super) fn see(&mut self, item: &Item) {
        let Some(until) = self.until else { return };
        match item {
            Item::Idle(coll, _) => self.done[*coll as usize] = true,
            Item::Event(coll, event, ..)
                if event.cluster_time.is_some_and(|t| (t.time, t.increment) > (until.time, until.increment)) =>
            {
                self.done[*coll as usize] = true;
            }
            _ => {}
        }
    }

    pub(super) fn is_done(&self) -> bool {
        self.done.iter().all(|d| *d)
    }
}

/// One batch of stream items, sorted out.
#[derive(Default)]
pub(super) struct Batch {
    pub(super) events: Vec<Event>,
    /// Documents to read by id: their events could not be used whole.
    pub(super) lookups: Vec<(Coll, mongodb::bson::Bson)>,
    pub(super) tokens: HashMap<Coll, ResumeToken>,
    pub(super) newest_cluster_time: u32,
    pub(super) per_collection: [u64; 4],
}

impl Batch {
    /// Takes one item; gives a restart when the streams must be reopened
    /// or the cache rebuilt.
    pub(super) fn add(&mut self, names: &Collections, item: Item, metrics: &WatchMetrics) -> Option<Restart> {
        match item {
            Item::Unresumable(_, reason) => return Some(Restart::Rebuild(reason)),
            Item::Failed(coll, err) if stream::is_history_lost(&err) => {
                return Some(Restart::Rebuild(format!("{} stream: {err}", coll.name(names))));
            }
            Item::Failed(coll, err) => {
                tracing::warn!(collection = coll.name(names), error = %err, "change stream failed");
                metrics.stream_error();
                return Some(Restart::Reopen);
            }
            Item::Idle(coll, token) => {
                self.tokens.insert(coll, token);
            }
            Item::Event(coll, event, _, decoded) => {
                if let Some(t) = event.cluster_time {
                    self.newest_cluster_time = self.newest_cluster_time.max(t.time);
                }
                let key = event.document_key.as_ref().and_then(|k| k.get("_id")).cloned();
                match (&event.operation_type, key) {
                    (OperationType::Insert | OperationType::Update | OperationType::Replace, Some(id)) => {
                        self.events.push(match event.full_document {
                            Some(doc) => Event::Upsert { coll, key: id_key(&id), raw_id: id, doc, decoded },
                            // Looked up after it was deleted: gone now.
                            None => Event::Remove { coll, key: id_key(&id), raw_id: id },
                        });
                    }
                    (OperationType::Delete, Some(id)) => {
                        self.events.push(Event::Remove { coll, key: id_key(&id), raw_id: id })
                    }
                    (op, _) => {
                        return Some(Restart::Rebuild(format!("{:?} on {}", op, coll.name(names))));
                    }
                }
                self.per_collection[coll as usize] += 1;
                self.tokens.insert(coll, event.id);
            }
            Item::Poison(coll, id, token, reason) => {
                // The event itself could not be used (too large, not
                // decodable): the document is read again by its id.
                tracing::warn!(collection = coll.name(names), reason = %reason, "change event unusable; reading the document again");
                metrics.poison(coll, &sample_id(&id), &reason);
                self.lookups.push((coll, id));
                self.per_collection[coll as usize] += 1;
                self.tokens.insert(coll, token);
            }
        }
        None
    }
}

/// A document's id as a sample in metrics and status: its written id,
/// or for an unusable one only its BSON type, never the value (which may
/// be any document).
pub(super) fn sample_id(id: &mongodb::bson::Bson) -> String {
    crate::model::id::written_id(id).unwrap_or_else(|| format!("(unusable {:?} id)", id.element_type()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mongodb::change_stream::event::ResumeToken;

    fn token(data: &str) -> ResumeToken {
        serde_json::from_value(serde_json::json!({ "_data": data })).expect("token")
    }

    #[test]
    fn an_unusable_event_becomes_a_lookup_by_id_and_moves_the_token() {
        let names = crate::config::Config::from_raw(crate::config::RawConfig::default()).unwrap().collections;
        let metrics = WatchMetrics::default();
        let mut batch = Batch::default();
        let item = Item::Poison(Coll::Video, mongodb::bson::Bson::String("v9".into()), token("0A"), "too large".into());
        assert!(batch.add(&names, item, &metrics).is_none(), "no restart for one unusable event");
        assert_eq!(batch.lookups, vec![(Coll::Video, mongodb::bson::Bson::String("v9".into()))]);
        assert!(batch.events.is_empty());
        assert_eq!(serde_json::to_string(&batch.tokens[&Coll::Video]).unwrap(), r#"{"_data":"0A"}"#);
        let problems = metrics.problems_json();
        assert_eq!(problems[0]["collection"], "VideoMedia");
        assert_eq!(problems[0]["samples"][0], "v9");
        assert_eq!(problems[0]["count"], 1);
    }

    #[test]
    fn resume_tokens_round_trip_through_json() {
        let token: ResumeToken = serde_json::from_str(r#"{"_data":"3C0000001273004A5401"}"#).expect("parses");
        let text = serde_json::to_string(&token).unwrap();
        let back: ResumeToken = serde_json::from_str(&text).expect("round trip");
        assert_eq!(serde_json::to_string(&back).unwrap(), text, "{text}");
    }
}
