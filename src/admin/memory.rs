//! `cachewright memory`: per family key count and bytes (MEMORY USAGE on a
//! random sample, extrapolated), Redis `used_memory`, the hit rate, and the
//! planning estimates for the 58K catalogue side by side.

use crate::keys::Keys;
use crate::plan::FamilySet;
use crate::registry::FamilyId;
use crate::sink::{Sink, SinkError};
use serde::Serialize;
use std::collections::BTreeMap;

#[derive(Debug, Clone, Serialize)]
pub struct FamilyMemory {
    pub family: String,
    pub keys: u64,
    pub sampled: u64,
    pub avg_bytes: u64,
    pub total_bytes: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct GroupEstimate {
    pub group: &'static str,
    pub families: Vec<&'static str>,
    pub estimate: &'static str,
    pub measured_bytes: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct MemoryReport {
    pub families: Vec<FamilyMemory>,
    pub total_bytes: u64,
    pub used_memory: Option<u64>,
    pub hit_rate: Option<f64>,
    pub estimates: Vec<GroupEstimate>,
}

/// The planning estimates for the 58K catalogue, by family group.
const ESTIMATES: &[(&str, &[FamilyId], &str)] = &[
    ("video details", &[FamilyId::VideoDetail], "38.9 MB (58,000 × ~670 B)"),
    ("category-video index", &[FamilyId::VideoCategoryIndex, FamilyId::VideoCategoryList], "12.2 MB"),
    ("video-categories sets", &[FamilyId::VideoCategories], "7.5 MB"),
    ("tag search", &[FamilyId::TagSearch], "0.5–1 MB"),
    ("tagnames flat", &[FamilyId::CategoryTagnamesFlat], "0.4 MB"),
    ("categories", &[FamilyId::CategoryAll, FamilyId::CategoryById, FamilyId::CategoryWithTags], "0.4 MB"),
    ("tags", &[FamilyId::TagAll, FamilyId::TagList], "0.6 MB"),
    ("counts", &[FamilyId::CategoryVideoCount], "80 KB"),
    (
        "channels",
        &[
            FamilyId::ChannelAll,
            FamilyId::ChannelById,
            FamilyId::ChannelWithCategories,
            FamilyId::ChannelWithTags,
            FamilyId::ChannelCategories,
            FamilyId::ChannelTags,
        ],
        "12.5 KB",
    ),
    ("not estimated", &[FamilyId::VideoTagList, FamilyId::VideoListHome], "–"),
];

pub async fn measure(sink: &Sink, keys: &Keys, sample: usize) -> Result<MemoryReport, SinkError> {
    // Counted whole, measured on a random draw of each family: memory
    // for the draw, whatever the number of keys.
    let mut drawn = sink.draw_existing(keys, FamilySet::all(), sample.max(1)).await?;
    let mut families = Vec::new();
    let mut measured: BTreeMap<FamilyId, u64> = BTreeMap::new();
    for family in FamilyId::ALL {
        let (count, picked) = drawn.remove(family).map_or((0, Vec::new()), |r| (r.offered(), r.into_kept()));
        let mut bytes = 0u64;
        for chunk in picked.chunks(200) {
            bytes += sink.memory_usage(chunk).await?.iter().sum::<u64>();
        }
        let avg = if picked.is_empty() { 0 } else { bytes / picked.len() as u64 };
        let total = avg * count;
        measured.insert(*family, total);
        families.push(FamilyMemory {
            family: family.name().to_string(),
            keys: count,
            sampled: picked.len() as u64,
            avg_bytes: avg,
            total_bytes: total,
        });
    }
    let used_memory = sink.info_field("memory", "used_memory").await?.and_then(|v| v.parse().ok());
    let hits: Option<f64> = sink.info_field("stats", "keyspace_hits").await?.and_then(|v| v.parse().ok());
    let misses: Option<f64> = sink.info_field("stats", "keyspace_misses").await?.and_then(|v| v.parse().ok());
    let hit_rate = match (hits, misses) {
        (Some(h), Some(m)) if h + m > 0.0 => Some(h / (h + m)),
        _ => None,
    };
    let estimates = ESTIMATES
        .iter()
        .map(|(group, fams, estimate)| GroupEstimate {
            group,
            families: fams.iter().map(|f| f.name()).collect(),
            estimate,
            measured_bytes: fams.iter().map(|f| measured.get(f).copied().unwrap_or(0)).sum(),
        })
        .collect();
    Ok(MemoryReport { total_bytes: measured.values().sum(), families, used_memory, hit_rate, estimates })
}

fn mb(bytes: u64) -> String {
    format!("{:.2} MB", bytes as f64 / 1_000_000.0)
}

impl MemoryReport {
    pub fn render(&self) -> String {
        let rows: Vec<Vec<String>> = self
            .families
            .iter()
            .map(|f| {
                vec![
                    f.family.clone(),
                    f.keys.to_string(),
                    f.sampled.to_string(),
                    f.avg_bytes.to_string(),
                    mb(f.total_bytes),
                ]
            })
            .collect();
        let mut out = crate::table::render(&["family", "keys", "sampled", "avg bytes", "total"], &rows, &[1, 2, 3, 4]);
        out.push('\n');
        let rows: Vec<Vec<String>> = self
            .estimates
            .iter()
            .map(|e| vec![e.group.to_string(), e.estimate.to_string(), mb(e.measured_bytes)])
            .collect();
        out.push_str(&crate::table::render(&["group", "58K estimate", "measured"], &rows, &[2]));
        out.push_str(&format!(
            "\nkeys total (measured): {}  (estimate for 58K: 77–82 MB)\nredis used_memory: {}\ncache hit rate: {}\n",
            mb(self.total_bytes),
            self.used_memory.map(mb).unwrap_or_else(|| "?".into()),
            self.hit_rate.map(|r| format!("{:.1}%", r * 100.0)).unwrap_or_else(|| "no reads yet".into()),
        ));
        out
    }
}
