//! The key registry: every key family the service writes, loaded from the
//! declarative files in `builders/` (embedded at build time).
//!
//! Nothing outside this module and [`crate::keys`] knows a key pattern. The
//! registry gives the typed constructors their patterns, the sweep its scan
//! globs and matchers, and `cachewright keys` its table.

mod family;
mod pattern;

pub use family::{FamilyId, RedisType, Scope, Tier};
use pattern::Parts;
pub use pattern::{Args, Pattern, Segment, SegmentKind};

use serde::Deserialize;
use std::sync::OnceLock;

/// The registry files, one per source collection, embedded at build time.
const SPEC_FILES: &[(&str, &str)] = &[
    ("builders/channel.toml", include_str!("../../builders/channel.toml")),
    ("builders/category.toml", include_str!("../../builders/category.toml")),
    ("builders/tag.toml", include_str!("../../builders/tag.toml")),
    ("builders/video.toml", include_str!("../../builders/video.toml")),
];

/// One registered key family.
#[derive(Debug, Clone)]
pub struct Family {
    pub id: FamilyId,
    pub collection: String,
    pub pattern: Pattern,
    pub redis_type: RedisType,
    pub tier: Tier,
    /// What recomputes the family's keys (see [`Scope`]): by entity, the
    /// n-th scope binds the n-th placeholder.
    pub scope: Vec<Scope>,
    pub meaning: String,
    /// The value's shape, for the readers' docs.
    pub payload: String,
    /// Which source changes touch this family's keys.
    pub invalidated_by: Vec<String>,
}

impl Family {
    pub fn name(&self) -> &'static str {
        self.id.name()
    }
}

/// A home section declared in `builders/video.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HomeSection {
    pub name: String,
    pub kind: HomeSectionKind,
    pub limit: usize,
}

/// What a home section selects. `latest` is the only kind the readers know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HomeSectionKind {
    Latest,
}

/// All families, in `FamilyId` order, and the declared home sections.
#[derive(Debug)]
pub struct Registry {
    families: Vec<Family>,
    home_sections: Vec<HomeSection>,
}

#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("{file}: {source}")]
    Parse {
        file: &'static str,
        #[source]
        source: toml::de::Error,
    },
    #[error("{file}: family `{name}` is not known to any planner")]
    UnknownFamily { file: &'static str, name: String },
    #[error("family `{0}` is declared twice")]
    Duplicate(String),
    #[error("family `{0}` has no declaration in builders/")]
    Undeclared(&'static str),
    #[error("{file}: family `{name}`: {reason}")]
    BadPattern { file: &'static str, name: String, reason: String },
    #[error("families `{0}` and `{1}` can match the same key")]
    Overlap(&'static str, &'static str),
    #[error("{file}: family `{name}`: scope {reason}")]
    BadScope { file: &'static str, name: String, reason: String },
    #[error("home section `{0}` is invalid: names are id segments and limits are positive")]
    BadSection(String),
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    collection: String,
    #[serde(default)]
    family: Vec<RawFamily>,
    #[serde(default)]
    home_section: Vec<HomeSection>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFamily {
    name: String,
    pattern: String,
    #[serde(rename = "type")]
    redis_type: RedisType,
    tier: Tier,
    scope: Vec<Scope>,
    meaning: String,
    payload: String,
    invalidated_by: Vec<String>,
}

impl Registry {
    /// Returns the registry built from the embedded spec files.
    ///
    /// The files are part of the binary, so a failure here is a build defect
    /// that the registry tests catch; it is reported, not silently patched.
    pub fn get() -> &'static Registry {
        static REGISTRY: OnceLock<Registry> = OnceLock::new();
        REGISTRY.get_or_init(|| {
            Registry::load(SPEC_FILES).unwrap_or_else(|err| panic!("invalid builders/ registry: {err}"))
        })
    }

    /// Parses and checks a set of spec files.
    pub fn load(files: &[(&'static str, &str)]) -> Result<Registry, RegistryError> {
        let mut slots: Vec<Option<Family>> = vec![None; FamilyId::ALL.len()];
        let mut home_sections = Vec::new();
        for &(file, text) in files {
            let spec: RawSpec = toml::from_str(text).map_err(|source| RegistryError::Parse { file, source })?;
            for raw in spec.family {
                let id = FamilyId::from_name(&raw.name)
                    .ok_or_else(|| RegistryError::UnknownFamily { file, name: raw.name.clone() })?;
                let pattern = Pattern::parse(&raw.pattern).map_err(|reason| RegistryError::BadPattern {
                    file,
                    name: raw.name.clone(),
                    reason,
                })?;
                check_scope(&raw.scope, &pattern).map_err(|reason| RegistryError::BadScope {
                    file,
                    name: raw.name.clone(),
                    reason,
                })?;
                let slot = &mut slots[id as usize];
                if slot.is_some() {
                    return Err(RegistryError::Duplicate(raw.name));
                }
                *slot = Some(Family {
                    id,
                    collection: spec.collection.clone(),
                    pattern,
                    redis_type: raw.redis_type,
                    tier: raw.tier,
                    scope: raw.scope,
                    meaning: raw.meaning,
                    payload: raw.payload,
                    invalidated_by: raw.invalidated_by,
                });
            }
            home_sections.extend(spec.home_section);
        }
        let mut families = Vec::with_capacity(slots.len());
        for (slot, id) in slots.into_iter().zip(FamilyId::ALL) {
            families.push(slot.ok_or(RegistryError::Undeclared(id.name()))?);
        }
        for (i, a) in families.iter().enumerate() {
            for b in &families[i + 1..] {
                if a.pattern.overlaps(&b.pattern) {
                    return Err(RegistryError::Overlap(a.name(), b.name()));
                }
            }
        }
        for section in &home_sections {
            if !crate::model::id::is_usable_id(&section.name) || section.limit == 0 {
                return Err(RegistryError::BadSection(section.name.clone()));
            }
        }
        Ok(Registry { families, home_sections })
    }

    pub fn families(&self) -> &[Family] {
        &self.families
    }

    pub fn family(&self, id: FamilyId) -> &Family {
        &self.families[id as usize]
    }

    pub fn home_sections(&self) -> &[HomeSection] {
        &self.home_sections
    }

    /// Finds the family a key (with the data prefix already stripped)
    /// belongs to, if any. Keys of no family are never touched.
    pub fn classify(&self, rest: &str) -> Option<FamilyId> {
        self.parse(rest).map(|(family, _)| family)
    }

    /// A key's family (data prefix stripped) and its placeholder values,
    /// from one split of the key.
    pub fn parse<'k>(&self, rest: &'k str) -> Option<(FamilyId, Args<'k>)> {
        let parts = Parts::split(rest)?;
        self.families.iter().find_map(|f| Some((f.id, f.pattern.captures_parts(&parts)?)))
    }
}

/// A scope is `global` or `video` alone, or entities whose placeholders
/// come first in the pattern, in the same order.
fn check_scope(scope: &[Scope], pattern: &Pattern) -> Result<(), String> {
    let by_entity = scope.iter().all(|s| s.placeholder().is_some());
    match scope {
        [] => return Err("is empty: declare what recomputes the keys".into()),
        [Scope::Global | Scope::Video] => return Ok(()),
        _ if !by_entity => return Err("mixes `global` or `video` with other scopes".into()),
        _ => {}
    }
    let names: Vec<&str> = pattern.placeholders().map(|(name, _)| name).collect();
    for (i, s) in scope.iter().enumerate() {
        if names.get(i).copied() != s.placeholder() {
            return Err(format!("{s:?} must bind placeholder {} `{{{}}}`", i + 1, s.placeholder().unwrap_or("")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spec_file_loads() {
        for &(file, text) in SPEC_FILES {
            let spec: Result<RawSpec, _> = toml::from_str(text);
            assert!(spec.is_ok(), "{file} does not parse: {:?}", spec.err());
        }
        Registry::load(SPEC_FILES).expect("registry loads");
    }

    #[test]
    fn every_planner_family_is_declared_and_every_declaration_has_a_planner() {
        let reg = Registry::get();
        assert_eq!(reg.families().len(), FamilyId::ALL.len());
        for (family, id) in reg.families().iter().zip(FamilyId::ALL) {
            assert_eq!(family.id, *id);
            assert_eq!(family.pattern.to_string(), family.pattern.raw());
        }
        let extra = "collection = \"x\"\n[[family]]\nname = \"x:y\"\npattern = \"x:y\"\ntype = \"string\"\ntier = \"count\"\nscope = [\"global\"]\nmeaning = \"m\"\npayload = \"p\"\ninvalidated_by = []\n";
        let err = Registry::load(&[("extra.toml", extra)]).unwrap_err();
        assert!(matches!(err, RegistryError::UnknownFamily { .. }), "{err}");
    }

    #[test]
    fn no_two_patterns_can_match_the_same_key() {
        let reg = Registry::get();
        for a in reg.families() {
            for b in reg.families() {
                if a.id != b.id {
                    assert!(!a.pattern.overlaps(&b.pattern), "{} ~ {}", a.name(), b.name());
                }
            }
        }
    }

    #[test]
    fn overlapping_declarations_are_refused() {
        let video = include_str!("../../builders/video.toml")
            .replace("pattern = \"video:categories:{videoId}\"", "pattern = \"video:detail:{videoId}\"");
        let mut files: Vec<(&'static str, &str)> =
            SPEC_FILES.iter().filter(|(f, _)| !f.ends_with("video.toml")).copied().collect();
        files.push(("builders/video.toml", &video));
        let err = Registry::load(&files).unwrap_err();
        assert!(matches!(err, RegistryError::Overlap("video:detail", "video:categories")), "{err}");
    }

    #[test]
    fn every_data_family_has_a_ttl_tier() {
        for family in Registry::get().families() {
            assert!(Tier::ALL.contains(&family.tier), "{}", family.name());
            assert!(!family.payload.is_empty() && !family.invalidated_by.is_empty(), "{} lacks docs", family.name());
        }
    }

    #[test]
    fn every_family_declares_its_scope() {
        for family in Registry::get().families() {
            assert!(!family.scope.is_empty(), "{} has no scope", family.name());
        }
        let with_video = |video: &str| {
            let mut files: Vec<(&'static str, &str)> =
                SPEC_FILES.iter().filter(|(f, _)| !f.ends_with("video.toml")).copied().collect();
            files.push(("builders/video.toml", video));
            Registry::load(&files).map(|_| ())
        };
        let video = include_str!("../../builders/video.toml");
        let err = with_video(&video.replacen("scope = [\"video\"]\n", "", 1)).unwrap_err();
        assert!(matches!(err, RegistryError::Parse { .. }) && err.to_string().contains("scope"), "{err}");
        for (from, to) in [("[\"category\", \"tag\"]", "[\"tag\"]"), ("[\"channel\"]", "[\"global\", \"channel\"]")] {
            let err = with_video(&video.replacen(from, to, 1)).unwrap_err();
            assert!(matches!(err, RegistryError::BadScope { .. }), "{from} -> {to}: {err}");
        }
    }

    #[test]
    fn default_home_section_is_latest_500() {
        let sections = Registry::get().home_sections();
        assert_eq!(sections.len(), 1);
        assert_eq!(sections[0].name, "latest");
        assert_eq!(sections[0].limit, 500);
    }

    #[test]
    fn classify_ignores_unregistered_keys() {
        let reg = Registry::get();
        assert_eq!(reg.classify("video:detail:abc"), Some(FamilyId::VideoDetail));
        assert_eq!(reg.classify("session:x"), None);
        assert_eq!(reg.classify("video:detail:a:b"), None);
        assert_eq!(reg.classify("video:detail:"), None);
        assert_eq!(reg.classify("video:detail:bad!id"), None);
        assert_eq!(reg.classify("tag:search:a%20b"), Some(FamilyId::TagSearch));
        assert_eq!(reg.classify("tag:search:a b"), None);
        assert_eq!(reg.classify("video:category:index:c1:videos"), Some(FamilyId::VideoCategoryIndex));
        assert_eq!(reg.classify("v2:channel:all"), None);
    }
}
