//! hasync: a RocketMQ-style commitlog kept in memory-mapped segment files, replicated from a
//! master broker to its slaves over RocketMQ's classic HA protocol (byte-compatible with stock
//! Java brokers), managed through a gRPC control plane.
//!
//! Module map (dependencies point one way: `control` -> `node` -> `ha` -> `store` -> `config`):
//!
//! - [`config`]: the configuration tree (kebab-case TOML, human sizes and durations), defaults
//!   and `validate()`.
//! - [`store`]: the RocketMQ record codec, mapped segment files, the file-system seam.
//! - [`control`]: the generated gRPC types (`hasync.v1`).
//! - [`cli`]: the `hasync` subcommands.
//!
//! Invariants every module keeps:
//!
//! - Byte identity: the bytes a slave holds at offset X are the master's bytes at X.
//! - A record is written with `size + 8 <= remaining` so the end-of-file blank always fits.
//! - A reader never sees memory that is unmapped under it (slices hold an `Arc` of the mapping).
//! - Bad input is answered with an error that names the problem; it never takes the process down.

pub mod app;
pub mod cli;
pub mod config;
pub mod control;
pub mod ha;
pub mod metadata;
pub mod metrics;
pub mod node;
pub mod store;
