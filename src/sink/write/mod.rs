//! Writing: atomic units built from operations, stages for collections too
//! big for one unit, the rebuild's writer task, and the sweep.

pub mod dump;
pub mod pipeline;
pub mod stage;
pub mod sweep;
pub mod unit;
pub mod writer;
