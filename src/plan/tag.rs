//! Tag families: `tag:all`, `tag:list`, `tag:search`.

use super::category::Derived;
use super::text::prefix_chars;
use super::{CatalogScope, Op, PlanCtx, Value};
use crate::model::catalog::Catalog;
use crate::model::json;
use crate::registry::FamilyId;
use std::collections::BTreeMap;

pub fn plan(catalog: &Catalog, derived: &Derived, ctx: &PlanCtx, scope: &CatalogScope, out: &mut Vec<Op>) {
    if scope.aggregate(FamilyId::TagAll) {
        let mut all = String::new();
        json::write_raw_array(&mut all, derived.active_tags.iter().filter_map(|&t| derived.tag_json[t].as_deref()));
        ctx.emit(out, FamilyId::TagAll, &[], Value::String(all));
    }

    for &c in derived.active_categories.iter().filter(|&&c| scope.category(&catalog.categories()[c].id)) {
        let items: Vec<String> = derived.tags_of[c].iter().filter_map(|&t| derived.tag_json[t].clone()).collect();
        ctx.emit(out, FamilyId::TagList, &[&catalog.categories()[c].id], Value::List(items));
    }

    if ctx.families.contains(FamilyId::TagSearch) && scope.any_prefix() {
        for (prefix, ids) in search_prefixes(catalog, derived, &ctx.search_lengths, scope) {
            ctx.emit(out, FamilyId::TagSearch, &[&prefix], Value::Set(ids));
        }
    }
}

/// Every search prefix in `scope` and the ids of the active tags whose
/// trimmed, lowercased name starts with it.
fn search_prefixes(
    catalog: &Catalog,
    derived: &Derived,
    lengths: &[usize],
    scope: &CatalogScope,
) -> BTreeMap<String, Vec<String>> {
    let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for &t in &derived.active_tags {
        let tag = &catalog.tags()[t];
        let name = derived.search_names[t].as_deref().unwrap_or_default();
        for &len in lengths {
            if let Some(prefix) = prefix_chars(name, len).filter(|p| scope.prefix(p)) {
                let ids = map.entry(prefix.to_string()).or_default();
                // Tag ids are distinct (the catalogue claims each once),
                // so a repeat can only be this tag under two lengths that
                // give one prefix: it is the last one pushed. (A search
                // of the whole list made a catalogue re-plan quadratic in
                // the tags sharing a short prefix.)
                if ids.last() != Some(&tag.id) {
                    ids.push(tag.id.clone());
                }
            }
        }
    }
    map
}
