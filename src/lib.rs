//! hasync: a RocketMQ-style commitlog kept in memory-mapped segment files, replicated from a
//! master broker to its slaves over RocketMQ's classic HA protocol (byte-compatible with stock
//! Java brokers), managed through a gRPC control plane.
//!
//! Module map. Layers, top to bottom: `bench_api > cli > app > controller > coordinator > control > node > metadata > ha > store > metrics > config`
//!
//! A module names only modules below it (a test in `tests/it/architecture.rs` enforces the
//! order read from the line above; `docs/architecture.md` states the same order):
//!
//! - `bench_api` (hidden from the docs): re-exports of the `ha` items the Criterion benches in
//!   `benches/` measure; nothing in the crate names it.
//! - [`cli`]: the `hasync` subcommands: `serve`, `quickstart` and `bench` start nodes through
//!   [`app`]; the client subcommands are thin clients of the gRPC API.
//! - [`app`]: the one way in: a configuration, bound listeners and the file-system seam in, a
//!   running node (data plane, control plane, metrics) with `shutdown()`/`wait()` out.
//! - [`controller`]: the failover controller (one active per cluster, an engine campaign): it
//!   watches the groups' records in the coordinator and fences and promotes through `control`.
//! - [`coordinator`]: the coordination engine ([`coordinator::Coordinator`]: leases,
//!   transactions, watches; etcd v3 first), the records hasync keeps there, and the node's
//!   member agent.
//! - [`control`]: the gRPC services (`hasync.v1`, generated types in `control::pb`), the one
//!   gRPC client builder, the protobuf form of the metadata, the one mapping of node errors to
//!   gRPC codes, and the implementations of the traits `node` and `metadata` define for
//!   reaching a master. It holds no state of its own.
//! - [`node`]: the role state machine with epochs, the put path, the status snapshot; it owns
//!   the store, the metadata and the data plane of its role, and names in `node::remote` what
//!   it needs of a master's API.
//! - [`metadata`]: versioned topic/offset/group tables, their files, and the slave's pull loop
//!   over a `metadata::pull::Source` it defines.
//! - [`ha`]: RocketMQ's classic HA protocol: the wire codec, replica progress, sync waiters,
//!   the master's connections and the slave's client. No gRPC.
//! - [`store`]: the record codec, mapped segment files, the commitlog, recovery, flush and
//!   the file-system seam every file write goes through. No networking.
//! - [`metrics`], [`config`]: leaves: metric handles, and plain configuration data.
//!
//! Public surface. Everything is `pub(crate)` unless a crate user (the binary, the integration
//! tests, operators' tools) needs it; what stays public:
//!
//! - [`app`]: [`app::App`], [`app::Listeners`], [`app::StartOptions`], [`app::validate`].
//! - [`config`]: the configuration tree (the config-file interface) and [`config::units`].
//! - [`control`]: the generated gRPC types [`control::pb`], the client builder
//!   [`control::client`], the health service name [`control::REPLICATION_SERVICE`].
//! - [`node`]: [`node::Node`]'s operations and read-only accessors, [`node::NodeStatus`],
//!   [`node::PutOutcome`], [`node::role::RoleRequest`], [`node::epoch::EpochHistory`] and the
//!   state-file names.
//! - [`store`]: [`store::CommitLog`]'s operations, [`store::StoreOptions`], the record codec
//!   [`store::record`], the file-system seam [`store::fs`], the file names
//!   ([`store::file_name`], [`store::checkpoint::CHECKPOINT_FILE`]).
//! - [`metadata`]: the table data types and [`metadata::MetadataStore`]'s operations.
//! - [`cli`]: [`cli::main`], the argument types, [`cli::client::EXIT_CODES`].
//! - [`metrics`]: the content types of a scrape and the HA counter handles.
//! - `bench_api`: `ha`'s wire codec, replica table and sync waiters, for `benches/` only (the
//!   items are `pub` in `ha` so that it can re-export them; not a stable interface).
//!
//! Invariants every module keeps:
//!
//! - Byte identity: the bytes a slave holds at offset X are the master's bytes at X.
//! - A record is written with `size + 8 <= remaining` so the end-of-file blank always fits.
//! - A reader never sees memory that is unmapped under it (slices hold an `Arc` of the mapping).
//! - Bad input is answered with an error that names the problem; it never takes the process down.

pub mod app;
#[doc(hidden)]
pub mod bench_api;
pub mod cli;
pub mod config;
pub mod control;
pub mod controller;
pub mod coordinator;
pub(crate) mod ha;
pub mod metadata;
pub mod metrics;
pub mod node;
pub mod store;
