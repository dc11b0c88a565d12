//! The decoded catalogue (channels, categories, tags) with id lookups.

use super::compact::{Wid, WidRef, hex12};
use super::decode::{Category, Channel, Tag};
use rustc_hash::FxHashMap as HashMap;
use std::collections::BTreeMap;

/// The entities are read through [`Catalog::channels`] and its siblings
/// and replaced only through [`Catalog::swap_in_place`]: the id lookups
/// and each tag's category place are derived from them, and an edit that
/// went around the swap would leave those stale.
#[derive(Debug, Default)]
pub struct Catalog {
    channels: Vec<Channel>,
    categories: Vec<Category>,
    tags: Vec<Tag>,
    channel_by_id: IdIndex,
    category_by_id: IdIndex,
    tag_by_id: IdIndex,
    /// Where each tag's category is (active or not); `None` when no
    /// category has its id. A video's tag check compares these positions
    /// instead of id texts (see [`Catalog::tag_category_index`]).
    tag_category: Vec<Option<u32>>,
}

/// Entities by their place in the catalogue.
pub type Placed<T> = BTreeMap<usize, T>;

/// Positions by id. An ObjectId's 24 lowercase hex digits are keyed by
/// their 12 bytes, held in the table itself: a lookup then reads one
/// bucket instead of following a pointer to the key's text, and the
/// rebuild looks up every reference of every video (they were a twelfth
/// of its profile). Any other id is keyed by its text. A text is in one
/// of the two forms only, so the two maps never disagree.
#[derive(Debug, Default)]
struct IdIndex {
    hex: HashMap<[u8; 12], u32>,
    text: HashMap<Box<str>, u32>,
}

impl IdIndex {
    /// Positions of `ids`; a repeated id is at its last place.
    fn new<'a>(ids: impl Iterator<Item = &'a str>) -> IdIndex {
        let mut index = IdIndex::default();
        for (i, id) in ids.enumerate() {
            let at = u32::try_from(i).expect("fewer than 2^32 catalogue entities");
            match hex12(id) {
                Some(bytes) => index.hex.insert(bytes, at),
                None => index.text.insert(id.into(), at),
            };
        }
        index
    }

    fn get(&self, id: &str) -> Option<usize> {
        match hex12(id) {
            Some(bytes) => self.get_ref(WidRef::Hex(&bytes)),
            None => self.get_ref(WidRef::Text(id)),
        }
    }

    /// [`IdIndex::get`] of an id already in its compact form: a `Wid`
    /// holds hex ids as their bytes and only other ids as text.
    fn get_wid(&self, id: &Wid) -> Option<usize> {
        self.get_ref(id.as_ref())
    }

    /// The one lookup: the form says which map holds the id.
    fn get_ref(&self, id: WidRef<'_>) -> Option<usize> {
        let at = match id {
            WidRef::Hex(bytes) => self.hex.get(bytes),
            WidRef::Text(text) => self.text.get(text),
        };
        at.map(|&i| i as usize)
    }
}

impl Catalog {
    pub fn new(channels: Vec<Channel>, categories: Vec<Category>, tags: Vec<Tag>) -> Catalog {
        let channel_by_id = IdIndex::new(channels.iter().map(|c| c.id.as_str()));
        let category_by_id = IdIndex::new(categories.iter().map(|c| c.id.as_str()));
        let tag_by_id = IdIndex::new(tags.iter().map(|t| t.id.as_str()));
        let tag_category = tags.iter().map(|t| category_by_id.get(&t.category_id).map(|c| c as u32)).collect();
        Catalog { channels, categories, tags, channel_by_id, category_by_id, tag_by_id, tag_category }
    }

    /// Puts each entity at its place, where one of the same id stands (the
    /// watcher edits its catalogue in place), and gives back the ones it
    /// replaced. The id lookups hold as they are; a replaced tag's
    /// category may have changed, so its place is looked up again.
    pub fn swap_in_place(
        &mut self,
        channels: Placed<Channel>,
        categories: Placed<Category>,
        tags: Placed<Tag>,
    ) -> (Placed<Channel>, Placed<Category>, Placed<Tag>) {
        let channels = swap(&mut self.channels, channels);
        let categories = swap(&mut self.categories, categories);
        let tags = swap(&mut self.tags, tags);
        for &t in tags.keys() {
            self.tag_category[t] = self.category_by_id.get(&self.tags[t].category_id).map(|c| c as u32);
        }
        (channels, categories, tags)
    }

    /// Channels in cursor order (the rejected left out).
    pub fn channels(&self) -> &[Channel] {
        &self.channels
    }

    /// Categories in cursor order, active or not.
    pub fn categories(&self) -> &[Category] {
        &self.categories
    }

    /// Tags in cursor order, active or not.
    pub fn tags(&self) -> &[Tag] {
        &self.tags
    }

    /// Whether the two hold entities of the same ids at the same places.
    pub fn same_places(&self, other: &Catalog) -> bool {
        let channels = self.channels.iter().map(|x| &x.id).eq(other.channels.iter().map(|x| &x.id));
        let categories = self.categories.iter().map(|x| &x.id).eq(other.categories.iter().map(|x| &x.id));
        channels && categories && self.tags.iter().map(|x| &x.id).eq(other.tags.iter().map(|x| &x.id))
    }

    /// The channel with this id.
    pub fn channel(&self, id: &str) -> Option<&Channel> {
        self.channel_by_id.get(id).map(|i| &self.channels[i])
    }

    /// Where the channel with this id is.
    pub fn channel_index(&self, id: &str) -> Option<usize> {
        self.channel_by_id.get(id)
    }

    /// The category with this id, active or not.
    pub fn category(&self, id: &str) -> Option<&Category> {
        self.category_by_id.get(id).map(|i| &self.categories[i])
    }

    /// Where the category with this id is, active or not.
    pub fn category_index(&self, id: &str) -> Option<usize> {
        self.category_by_id.get(id)
    }

    /// Where the tag with this id is, active or not.
    pub fn tag_index(&self, id: &str) -> Option<usize> {
        self.tag_by_id.get(id)
    }

    /// The tag with this id, active or not.
    pub fn tag(&self, id: &str) -> Option<&Tag> {
        self.tag_by_id.get(id).map(|i| &self.tags[i])
    }

    /// The active category with this id; `None` when missing, rejected or
    /// inactive.
    pub fn active_category(&self, id: &str) -> Option<&Category> {
        self.category_by_id.get(id).map(|i| &self.categories[i]).filter(|c| c.active)
    }

    pub fn active_category_index(&self, id: &str) -> Option<usize> {
        self.category_by_id.get(id).filter(|&i| self.categories[i].active)
    }

    /// The active tag with this id, whatever its category's state.
    pub fn active_tag(&self, id: &str) -> Option<&Tag> {
        self.tag_by_id.get(id).map(|i| &self.tags[i]).filter(|t| t.active)
    }

    pub fn active_tag_index(&self, id: &str) -> Option<usize> {
        self.tag_by_id.get(id).filter(|&i| self.tags[i].active)
    }

    /// [`Catalog::active_category_index`] of a reference as a video holds it.
    pub fn active_category_place(&self, id: &Wid) -> Option<usize> {
        self.category_by_id.get_wid(id).filter(|&i| self.categories[i].active)
    }

    /// [`Catalog::active_tag_index`] of a reference as a video holds it.
    pub fn active_tag_place(&self, id: &Wid) -> Option<usize> {
        self.tag_by_id.get_wid(id).filter(|&i| self.tags[i].active)
    }

    /// Where tag `t`'s category is, active or not: what
    /// [`Catalog::category_index`] gives for its `categoryId`, kept.
    pub fn tag_category_index(&self, t: usize) -> Option<usize> {
        self.tag_category[t].map(|c| c as usize)
    }

    /// Where tag `t`'s category is when that category is active: what
    /// [`Catalog::active_category_index`] gives for its `categoryId`,
    /// without hashing the id again.
    pub fn tag_active_category_index(&self, t: usize) -> Option<usize> {
        self.tag_category_index(t).filter(|&c| self.categories[c].active)
    }
}

/// Swaps each entity into its place; gives the replaced ones by place.
fn swap<T>(all: &mut [T], entities: Placed<T>) -> Placed<T> {
    entities
        .into_iter()
        .map(|(i, mut entity)| {
            std::mem::swap(&mut all[i], &mut entity);
            (i, entity)
        })
        .collect()
}
