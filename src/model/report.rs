//! What a run found wrong in its sources: rejected documents per collection
//! and reason (with sample ids), and dropped references.

use std::collections::BTreeMap;
use std::fmt;

/// How many sample ids a report keeps per collection and reason.
pub const SAMPLES: usize = 5;

/// Why a document was skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Reason {
    /// `_id` missing, or not an ObjectId or a usable string.
    InvalidId,
    /// Its id (as written) repeats an earlier document's.
    DuplicateId,
    /// A required field is absent or null.
    Missing(&'static str),
    /// A required field has the wrong BSON type (or is an unusable id).
    WrongType(&'static str),
    /// The document's BSON could not be walked.
    MalformedBson,
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::InvalidId => f.write_str("invalid _id"),
            Reason::DuplicateId => f.write_str("duplicate id"),
            Reason::Missing(field) => write!(f, "missing {field}"),
            Reason::WrongType(field) => write!(f, "wrong type: {field}"),
            Reason::MalformedBson => f.write_str("malformed BSON"),
        }
    }
}

/// A rejected document: its printable id and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub id: String,
    pub reason: Reason,
}

/// Counts for one reason, with the first few ids seen.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReasonCount {
    pub count: u64,
    pub samples: Vec<String>,
}

/// One collection's read and reject counts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CollectionReport {
    pub read: u64,
    pub rejected: BTreeMap<Reason, ReasonCount>,
}

impl CollectionReport {
    pub fn reject(&mut self, rejection: Rejection) {
        let entry = self.rejected.entry(rejection.reason).or_default();
        entry.count += 1;
        if entry.samples.len() < SAMPLES {
            entry.samples.push(rejection.id);
        }
    }

    pub fn rejected_total(&self) -> u64 {
        self.rejected.values().map(|r| r.count).sum()
    }

    pub fn merge(&mut self, other: CollectionReport) {
        self.read += other.read;
        for (reason, count) in other.rejected {
            let entry = self.rejected.entry(reason).or_default();
            entry.count += count.count;
            for id in count.samples {
                if entry.samples.len() < SAMPLES {
                    entry.samples.push(id);
                }
            }
        }
    }
}

/// Where a reference sits, e.g. `VideoMedia.categoryIds`.
pub type RefSite = &'static str;

/// Dropped references: unusable ones (gone from payloads too) and dangling
/// ones (to a missing, inactive or rejected document; gone from indexes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RefReport {
    pub unusable: BTreeMap<RefSite, u64>,
    pub dangling: BTreeMap<RefSite, u64>,
    /// BSON values written as their text (no JSON form).
    pub lossy_values: u64,
}

impl RefReport {
    pub fn unusable(&mut self, site: RefSite, n: u64) {
        if n > 0 {
            *self.unusable.entry(site).or_default() += n;
        }
    }

    pub fn dangling(&mut self, site: RefSite, n: u64) {
        if n > 0 {
            *self.dangling.entry(site).or_default() += n;
        }
    }

    pub fn merge(&mut self, other: &RefReport) {
        for (site, n) in &other.unusable {
            self.unusable(site, *n);
        }
        for (site, n) in &other.dangling {
            self.dangling(site, *n);
        }
        self.lossy_values += other.lossy_values;
    }

    pub fn unusable_total(&self) -> u64 {
        self.unusable.values().sum()
    }

    pub fn dangling_total(&self) -> u64 {
        self.dangling.values().sum()
    }
}
