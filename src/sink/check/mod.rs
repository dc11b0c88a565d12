//! Reading keys back for comparison: `verify`, `memory` and the drift
//! check.

pub mod compare;
pub mod inspect;
