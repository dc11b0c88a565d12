//! Channel families: `channel:all`, `channel:by-id`,
//! `channel:with-categories`, `channel:with-tags`, `channel:categories`,
//! `channel:tags`.

use super::category::Derived;
use super::{CatalogScope, Op, PlanCtx, Value};
use crate::model::catalog::Catalog;
use crate::model::decode::{Channel, RefItem};
use crate::model::json::{self, ObjectWriter};
use crate::model::report::RefReport;
use crate::registry::FamilyId;
use std::collections::HashSet;

pub const SITE_CHANNEL_CATEGORIES: &str = "Channel.categories";
pub const SITE_CHANNEL_TAGS: &str = "Channel.tags";

/// Which form of a list field to write.
enum Embed<'a> {
    /// The channel's own `[{id,name}]`, omitted when empty.
    Own(&'a [RefItem]),
    /// Full payloads, always present.
    Full(&'a [&'a str]),
}

fn write_ref_items(out: &mut String, items: &[RefItem]) {
    out.push('[');
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let mut obj = ObjectWriter::new(out);
        obj.string("id", &item.id);
        obj.opt_raw("name", item.name.as_deref());
        obj.finish();
    }
    out.push(']');
}

fn write_list_field(obj: &mut ObjectWriter<'_>, key: &str, embed: Embed<'_>) {
    match embed {
        Embed::Own([]) => {}
        Embed::Own(items) => write_ref_items(obj.key(key), items),
        Embed::Full(payloads) => json::write_raw_array(obj.key(key), payloads.iter().copied()),
    }
}

/// `ChannelCachePayload` with the given forms of `categories` and `tags`.
fn channel_payload(ch: &Channel, categories: Embed<'_>, tags: Embed<'_>) -> String {
    let mut out = String::with_capacity(256);
    let mut obj = ObjectWriter::new(&mut out);
    obj.string("id", &ch.id);
    obj.string("name", &ch.name);
    obj.string("landingUrl", &ch.landing_url);
    for (name, value) in &ch.extras {
        obj.opt_raw(name, value.as_deref());
    }
    write_list_field(&mut obj, "categories", categories);
    write_list_field(&mut obj, "tags", tags);
    obj.opt_raw("tagNames", ch.tag_names.as_deref());
    obj.finish();
    out
}

/// The distinct referenced ids that resolve, in the channel's order; the
/// rest are counted as dangling.
fn resolve(
    items: &[RefItem],
    lookup: impl Fn(&str) -> Option<usize>,
    site: &'static str,
    refs: &mut RefReport,
) -> Vec<usize> {
    let mut seen = HashSet::new();
    let mut found = Vec::new();
    for item in items {
        if !seen.insert(item.id.as_str()) {
            continue;
        }
        match lookup(&item.id) {
            Some(i) => found.push(i),
            None => refs.dangling(site, 1),
        }
    }
    found
}

pub fn plan(
    catalog: &Catalog,
    derived: &Derived,
    ctx: &PlanCtx,
    scope: &CatalogScope,
    out: &mut Vec<Op>,
    refs: &mut RefReport,
) {
    let mut order: Vec<&Channel> = catalog.channels().iter().collect();
    order.sort_by(|a, b| a.name.as_bytes().cmp(b.name.as_bytes()).then_with(|| a.id.cmp(&b.id)));
    let with_all = scope.aggregate(FamilyId::ChannelAll) && ctx.families.contains(FamilyId::ChannelAll);
    let mut all = Vec::with_capacity(order.len());
    for ch in order {
        let selected = scope.channel(&ch.id);
        if !selected && !with_all {
            continue;
        }
        let own = channel_payload(ch, Embed::Own(&ch.categories), Embed::Own(&ch.tags));
        if !selected {
            all.push(own);
            continue;
        }
        let cats = resolve(&ch.categories, |id| catalog.active_category_index(id), SITE_CHANNEL_CATEGORIES, refs);
        let tags = resolve(&ch.tags, |id| catalog.active_tag_index(id), SITE_CHANNEL_TAGS, refs);

        let cat_payloads: Vec<&str> = cats.iter().filter_map(|&c| derived.category_json[c].as_deref()).collect();
        let tag_payloads: Vec<&str> = tags.iter().filter_map(|&t| derived.tag_json[t].as_deref()).collect();
        if ctx.families.contains(FamilyId::ChannelWithCategories) {
            let with = channel_payload(ch, Embed::Full(&cat_payloads), Embed::Own(&ch.tags));
            ctx.emit(out, FamilyId::ChannelWithCategories, &[&ch.id], Value::String(with));
        }
        if ctx.families.contains(FamilyId::ChannelWithTags) {
            let with = channel_payload(ch, Embed::Own(&ch.categories), Embed::Full(&tag_payloads));
            ctx.emit(out, FamilyId::ChannelWithTags, &[&ch.id], Value::String(with));
        }
        let cat_ids = cats.iter().map(|&c| catalog.categories()[c].id.clone()).collect();
        ctx.emit(out, FamilyId::ChannelCategories, &[&ch.id], Value::Set(cat_ids));
        let tag_ids = tags.iter().map(|&t| catalog.tags()[t].id.clone()).collect();
        ctx.emit(out, FamilyId::ChannelTags, &[&ch.id], Value::Set(tag_ids));
        ctx.emit(out, FamilyId::ChannelById, &[&ch.id], Value::String(own.clone()));
        all.push(own);
    }
    if with_all {
        let mut all_json = String::new();
        json::write_raw_array(&mut all_json, all.iter().map(String::as_str));
        ctx.emit(out, FamilyId::ChannelAll, &[], Value::String(all_json));
    }
}
