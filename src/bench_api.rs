//! What the Criterion benches (`benches/`, an external crate) need of the crate-private `ha`
//! module: its pure wire codec, the replica table and the sync waiters. Re-exports only; no code.
//!
//! Not a public interface: hidden from the docs, it may change with any commit. Nothing in the
//! crate names this module (it heads the layer order in `lib.rs`, so the architecture test
//! refuses any module naming it). The record codec needs no entry here: `store::record` is
//! public.

/// The HA wire codec (`ha::codec`): report and transfer-header encoders and decoders.
pub use crate::ha::codec::{
    CodecError, REPORT_SIZE, TRANSFER_HEADER_SIZE, TransferDecoder, TransferHeader, decode_reports,
    encode_report, encode_transfer_header,
};
/// The sync waiters (`ha::group_transfer`): the pure queue and its async owner.
pub use crate::ha::group_transfer::{
    Admission, Completion, GroupTransfer, SyncWaiters, TransferStatus, TransferWait, WaiterId,
};
/// The replica table (`ha::progress`).
pub use crate::ha::progress::{AckTable, ProgressError, ReplicaId, ReplicaView, StreamStart};
