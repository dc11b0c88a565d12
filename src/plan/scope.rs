//! Which catalogue keys a plan covers: every one (a rebuild), or those of
//! a few entities (a watcher batch that changed a few catalogue
//! documents). A catalogue key is a function of the entity its
//! placeholder names and what that entity embeds, so a batch plans the
//! keys of the entities whose inputs it changed and the aggregates
//! (`channel:all`, `category:all`, `tag:all`) whose members did, instead
//! of all ~7,500 keys of a 12,000-document catalogue.

use crate::registry::{FamilyId, Registry};
use std::collections::HashSet;

/// The entity a catalogue family's keys are computed per, read off its
/// pattern's placeholder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatalogArg {
    /// No placeholder: one key over the whole collection.
    Aggregate,
    Category,
    Channel,
    /// A tag-search prefix.
    Prefix,
}

impl CatalogArg {
    /// `None` for a family whose keys are not one of these (a video
    /// family, or a catalogue family no scoped plan knows: it is then
    /// planned whole).
    pub fn of(family: FamilyId) -> Option<CatalogArg> {
        if family.needs_videos() {
            return None;
        }
        let pattern = &Registry::get().family(family).pattern;
        let names: Vec<&str> = pattern.placeholders().map(|(name, _)| name).collect();
        match names.as_slice() {
            [] => Some(CatalogArg::Aggregate),
            ["categoryId"] => Some(CatalogArg::Category),
            ["channelId"] => Some(CatalogArg::Channel),
            ["prefix"] => Some(CatalogArg::Prefix),
            _ => None,
        }
    }
}

/// The entities whose catalogue keys a scoped plan covers.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CatalogKeys {
    pub channels: HashSet<String>,
    pub categories: HashSet<String>,
    pub prefixes: HashSet<String>,
    /// The aggregates to plan, by family.
    pub aggregates: HashSet<FamilyId>,
}

/// Which catalogue keys to plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CatalogScope {
    All,
    Some(CatalogKeys),
}

impl CatalogScope {
    fn covers(&self, within: impl FnOnce(&CatalogKeys) -> bool) -> bool {
        match self {
            CatalogScope::All => true,
            CatalogScope::Some(keys) => within(keys),
        }
    }

    pub fn channel(&self, id: &str) -> bool {
        self.covers(|k| k.channels.contains(id))
    }

    pub fn category(&self, id: &str) -> bool {
        self.covers(|k| k.categories.contains(id))
    }

    pub fn prefix(&self, prefix: &str) -> bool {
        self.covers(|k| k.prefixes.contains(prefix))
    }

    pub fn aggregate(&self, family: FamilyId) -> bool {
        self.covers(|k| k.aggregates.contains(&family))
    }

    /// Whether any tag-search key is in scope (the prefix map is then
    /// built).
    pub fn any_prefix(&self) -> bool {
        self.covers(|k| !k.prefixes.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_catalogue_family_has_a_scoped_argument() {
        // A catalogue family added with another placeholder would be
        // planned by no scoped plan: it must be taught here first.
        for &family in FamilyId::ALL.iter().filter(|f| !f.needs_videos()) {
            assert!(CatalogArg::of(family).is_some(), "{family} has no catalogue argument");
        }
        assert_eq!(CatalogArg::of(FamilyId::TagSearch), Some(CatalogArg::Prefix));
        assert_eq!(CatalogArg::of(FamilyId::TagList), Some(CatalogArg::Category));
        assert_eq!(CatalogArg::of(FamilyId::CategoryAll), Some(CatalogArg::Aggregate));
        assert_eq!(CatalogArg::of(FamilyId::VideoDetail), None);
    }

    #[test]
    fn the_whole_scope_covers_everything_and_a_partial_one_its_entities() {
        let all = CatalogScope::All;
        assert!(all.channel("x") && all.category("y") && all.prefix("ab") && all.aggregate(FamilyId::TagAll));
        let some = CatalogScope::Some(CatalogKeys {
            categories: ["c1".to_string()].into(),
            aggregates: [FamilyId::CategoryAll].into(),
            ..Default::default()
        });
        assert!(some.category("c1") && !some.category("c2") && !some.channel("c1"));
        assert!(some.aggregate(FamilyId::CategoryAll) && !some.aggregate(FamilyId::TagAll) && !some.any_prefix());
    }
}
