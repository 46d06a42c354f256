//! The commitlog store: RocketMQ message records in fixed-size memory-mapped segment files.
//!
//! `store` knows nothing of networking or gRPC.

pub mod checkpoint;
pub mod commitlog;
pub mod error;
pub mod flush;
pub mod fs;
pub mod mapped_file;
pub mod mapped_file_queue;
pub mod options;
pub mod record;
pub mod recovery;
pub mod retention;
pub mod scan;
pub mod state_file;

pub use commitlog::{AppendResult, AppendedRecord, CommitLog, FlushPolicy, StoreOptions};
pub use error::{Error, Result};
