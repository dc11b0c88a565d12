//! Topology and connections: one node, a cluster (slots, the router,
//! per-master scripts and scans) or Sentinel; the permission and
//! eviction-policy preflight.

pub mod acl;
pub mod cluster;
pub mod cluster_io;
pub mod conn;
pub mod router;
pub mod sentinel;
