//! The closed set of family identifiers the planners know, and the value
//! types a family declaration uses.

use serde::Deserialize;
use std::fmt;

macro_rules! families {
    ($($variant:ident => $name:literal,)*) => {
        /// One key family. Every variant has a planner and a declaration in
        /// `builders/`; the registry tests hold both directions.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum FamilyId { $($variant,)* }

        impl FamilyId {
            pub const ALL: &'static [FamilyId] = &[$(FamilyId::$variant,)*];

            /// The family's name as declared in `builders/` and used by `--only`.
            pub fn name(self) -> &'static str {
                match self { $(FamilyId::$variant => $name,)* }
            }

            pub fn from_name(name: &str) -> Option<FamilyId> {
                match name { $($name => Some(FamilyId::$variant),)* _ => None }
            }
        }
    };
}

families! {
    ChannelAll => "channel:all",
    ChannelById => "channel:by-id",
    ChannelWithCategories => "channel:with-categories",
    ChannelWithTags => "channel:with-tags",
    ChannelCategories => "channel:categories",
    ChannelTags => "channel:tags",
    CategoryAll => "category:all",
    CategoryById => "category:by-id",
    CategoryWithTags => "category:with-tags",
    CategoryVideoCount => "category:video:count",
    CategoryTagnamesFlat => "category:tagnames:flat",
    TagAll => "tag:all",
    TagList => "tag:list",
    TagSearch => "tag:search",
    VideoDetail => "video:detail",
    VideoCategories => "video:categories",
    VideoCategoryIndex => "video:category:index",
    VideoCategoryList => "video:category:list",
    VideoTagList => "video:tag:list",
    VideoListHome => "video:list:home",
}

impl FamilyId {
    /// Whether the family's keys depend on VideoMedia documents.
    pub fn needs_videos(self) -> bool {
        matches!(
            self,
            FamilyId::CategoryVideoCount
                | FamilyId::VideoDetail
                | FamilyId::VideoCategories
                | FamilyId::VideoCategoryIndex
                | FamilyId::VideoCategoryList
                | FamilyId::VideoTagList
                | FamilyId::VideoListHome
        )
    }
}

impl fmt::Display for FamilyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What a family's keys are recomputed by when something changes, as the
/// watcher files and expands them. `global`: the catalogue as a whole
/// (its keys are re-planned from the catalogue and diffed); `video`: one
/// video (its own keys, written with it); `category`, `tag`, `channel`:
/// the entity its placeholder at the same position names, whose members
/// a change recomputes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    Global,
    Video,
    Category,
    Tag,
    Channel,
}

impl Scope {
    /// The placeholder a scope by entity binds; `None` for the others.
    pub fn placeholder(self) -> Option<&'static str> {
        match self {
            Scope::Category => Some("categoryId"),
            Scope::Tag => Some("tagId"),
            Scope::Channel => Some("channelId"),
            Scope::Global | Scope::Video => None,
        }
    }
}

/// The Redis type a family's keys hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RedisType {
    String,
    Set,
    List,
    Zset,
}

impl RedisType {
    pub fn as_str(self) -> &'static str {
        match self {
            RedisType::String => "string",
            RedisType::Set => "set",
            RedisType::List => "list",
            RedisType::Zset => "zset",
        }
    }
}

/// A TTL tier; its seconds come from configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    Count,
    Index,
    Detail,
    Catalog,
}

impl Tier {
    pub const ALL: [Tier; 4] = [Tier::Count, Tier::Index, Tier::Detail, Tier::Catalog];

    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Count => "count",
            Tier::Index => "index",
            Tier::Detail => "detail",
            Tier::Catalog => "catalog",
        }
    }

    /// The contract's default seconds for the tier.
    pub fn default_seconds(self) -> u64 {
        match self {
            Tier::Count => 3600,
            Tier::Index => 7200,
            Tier::Detail => 86_400,
            Tier::Catalog => 604_800,
        }
    }
}
