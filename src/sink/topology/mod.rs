//! Topology and connections: the seam ([`conn::Topology`]) and its three
//! implementations, one node, a cluster (slots, the router, per-master
//! scripts and scans) and Sentinel; the permission and eviction-policy
//! preflight.

pub mod acl;
pub mod cluster;
pub mod cluster_io;
pub mod conn;
pub mod router;
pub mod script_args;
pub mod sentinel;
pub mod single;
