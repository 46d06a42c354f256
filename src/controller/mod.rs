//! The controller: one active per cluster (an engine campaign), the others standing by. It
//! watches every group's records and acts only through compare-and-swap on the state record:
//! failover when a master's lease expires, switchover and the manual override on request.
//! The pure rules are in [`decision`]; the rest runs them against the engine and the nodes.
//!
//! [`cluster_api`] is the Cluster service's view of the records (status, history, the
//! operator's requests and pause switches); any node with a coordinator serves it.

pub mod cluster_api;
