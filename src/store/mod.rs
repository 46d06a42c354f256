//! The commitlog store: RocketMQ message records in fixed-size memory-mapped segment files.
//!
//! `store` knows nothing of networking or gRPC.

pub mod error;
pub mod fs;
pub mod mapped_file;
pub mod mapped_file_queue;
pub mod record;

pub use error::{Error, Result};
