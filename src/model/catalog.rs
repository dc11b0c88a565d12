//! The decoded catalogue (channels, categories, tags) with id lookups.

use super::decode::{Category, Channel, Tag};
use rustc_hash::FxHashMap as HashMap;

#[derive(Debug, Default)]
pub struct Catalog {
    pub channels: Vec<Channel>,
    pub categories: Vec<Category>,
    pub tags: Vec<Tag>,
    channel_by_id: HashMap<String, usize>,
    category_by_id: HashMap<String, usize>,
    tag_by_id: HashMap<String, usize>,
}

impl Catalog {
    pub fn new(channels: Vec<Channel>, categories: Vec<Category>, tags: Vec<Tag>) -> Catalog {
        let channel_by_id = channels.iter().enumerate().map(|(i, c)| (c.id.clone(), i)).collect();
        let category_by_id = categories.iter().enumerate().map(|(i, c)| (c.id.clone(), i)).collect();
        let tag_by_id = tags.iter().enumerate().map(|(i, t)| (t.id.clone(), i)).collect();
        Catalog { channels, categories, tags, channel_by_id, category_by_id, tag_by_id }
    }

    /// Whether the two hold entities of the same ids at the same places.
    pub fn same_places(&self, other: &Catalog) -> bool {
        let channels = self.channels.iter().map(|x| &x.id).eq(other.channels.iter().map(|x| &x.id));
        let categories = self.categories.iter().map(|x| &x.id).eq(other.categories.iter().map(|x| &x.id));
        channels && categories && self.tags.iter().map(|x| &x.id).eq(other.tags.iter().map(|x| &x.id))
    }

    /// The channel with this id.
    pub fn channel(&self, id: &str) -> Option<&Channel> {
        self.channel_by_id.get(id).map(|&i| &self.channels[i])
    }

    /// Where the channel with this id is.
    pub fn channel_index(&self, id: &str) -> Option<usize> {
        self.channel_by_id.get(id).copied()
    }

    /// The category with this id, active or not.
    pub fn category(&self, id: &str) -> Option<&Category> {
        self.category_by_id.get(id).map(|&i| &self.categories[i])
    }

    /// Where the category with this id is, active or not.
    pub fn category_index(&self, id: &str) -> Option<usize> {
        self.category_by_id.get(id).copied()
    }

    /// Where the tag with this id is, active or not.
    pub fn tag_index(&self, id: &str) -> Option<usize> {
        self.tag_by_id.get(id).copied()
    }

    /// The tag with this id, active or not.
    pub fn tag(&self, id: &str) -> Option<&Tag> {
        self.tag_by_id.get(id).map(|&i| &self.tags[i])
    }

    /// The active category with this id; `None` when missing, rejected or
    /// inactive.
    pub fn active_category(&self, id: &str) -> Option<&Category> {
        self.category_by_id.get(id).map(|&i| &self.categories[i]).filter(|c| c.active)
    }

    pub fn active_category_index(&self, id: &str) -> Option<usize> {
        self.category_by_id.get(id).copied().filter(|&i| self.categories[i].active)
    }

    /// The active tag with this id, whatever its category's state.
    pub fn active_tag(&self, id: &str) -> Option<&Tag> {
        self.tag_by_id.get(id).map(|&i| &self.tags[i]).filter(|t| t.active)
    }

    pub fn active_tag_index(&self, id: &str) -> Option<usize> {
        self.tag_by_id.get(id).copied().filter(|&i| self.tags[i].active)
    }
}
