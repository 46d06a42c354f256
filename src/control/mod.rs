//! The gRPC control plane. For now only the generated `hasync.v1` types live here.

/// Code generated from `proto/hasync/v1/*.proto` by build.rs.
pub mod pb {
    #![allow(missing_docs, clippy::all, clippy::pedantic)]
    tonic::include_proto!("hasync.v1");

    /// Encoded file descriptor set of `hasync.v1`, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("hasync_descriptor");
}
