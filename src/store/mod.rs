//! The commitlog store: RocketMQ message records in fixed-size memory-mapped segment files.
//!
//! `store` knows nothing of networking or gRPC.

pub mod checkpoint;
pub(crate) mod commitlog;
pub(crate) mod confirm;
pub(crate) mod cut_intent;
pub(crate) mod data_dir_id;
pub mod disk;
pub(crate) mod error;
pub(crate) mod fence;
pub(crate) mod flush;
pub mod fs;
pub(crate) mod integrity;
pub mod lock;
pub(crate) mod mapped_file;
pub(crate) mod mapped_file_queue;
pub(crate) mod options;
pub(crate) mod prior_data;
pub mod record;
pub(crate) mod recovery;
mod replicated;
pub(crate) mod retention;
pub(crate) mod scan;
pub(crate) mod scrub;
pub(crate) mod state_file;
pub mod tails;
pub mod verify;
pub(crate) mod warm;

pub use commitlog::{
    AppendResult, AppendedRecord, CommitLog, FenceToken, FlushPolicy, StoreOptions, Writes,
};
pub use error::{Error, Result};
pub use flush::FlushTimeout;
pub use integrity::{Damage, Unreadable};
pub use lock::{DataDirLock, LockError};
pub use mapped_file::{MappedFile, file_name};
pub use recovery::RecoveryReport;
pub use scrub::{ScrubPass, ScrubStatus};
pub use state_file::StateFileError;
pub use tails::{KeptTail, TailCause, TailStatus};
