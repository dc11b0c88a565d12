//! Decoded source entities and the value rules the contract puts on them:
//! usable ids, numbers, JS-compatible JSON and BSON → JSON conversion.

pub mod bson_json;
pub mod catalog;
pub mod compact;
pub mod decode;
pub mod id;
pub mod json;
pub mod num;
pub mod plain;
pub mod report;
pub mod video;
