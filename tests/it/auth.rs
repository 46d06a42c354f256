//! The token check fails closed: every method in the descriptor sets the server registers
//! (hasync.v1, health, reflection), and any path that is not one, is called without a token
//! on a live server that has one. Only the documented read-only methods (and health and
//! reflection) may answer anything but UNAUTHENTICATED, and with `grpc.token-for-reads` only
//! health and reflection may.

use std::str::FromStr as _;

use bytes::{Buf as _, BufMut as _};
use hasync::config::Role;
use tonic::Code;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::Channel;

use crate::support::grpc::ApiNode;
use crate::support::ha::node_config;

/// What docs/api.md promises: callable without the token while reads are open.
const READ_ONLY: &[&str] = &[
    "/hasync.v1.Replication/GetStatus",
    "/hasync.v1.Replication/WatchStatus",
    "/hasync.v1.Replication/GetEpochHistory",
    "/hasync.v1.Messages/Read",
    "/hasync.v1.Metadata/Get",
    "/hasync.v1.Metadata/Pull",
    "/hasync.v1.Cluster/GetClusterStatus",
    "/hasync.v1.Cluster/GetHistory",
    "/hasync.v1.Cluster/WatchTopology",
];
/// Never need the token (probes and tools).
const ALWAYS_OPEN: &[&str] = &[
    "/grpc.health.v1.Health/Check",
    "/grpc.health.v1.Health/Watch",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
];

// The parts of descriptor.proto this test reads.
#[derive(Clone, PartialEq, prost::Message)]
struct FileDescriptorSet {
    #[prost(message, repeated, tag = "1")]
    file: Vec<FileDescriptorProto>,
}
#[derive(Clone, PartialEq, prost::Message)]
struct FileDescriptorProto {
    #[prost(string, tag = "2")]
    package: String,
    #[prost(message, repeated, tag = "6")]
    service: Vec<ServiceDescriptorProto>,
}
#[derive(Clone, PartialEq, prost::Message)]
struct ServiceDescriptorProto {
    #[prost(string, tag = "1")]
    name: String,
    #[prost(message, repeated, tag = "2")]
    method: Vec<MethodDescriptorProto>,
}
#[derive(Clone, PartialEq, prost::Message)]
struct MethodDescriptorProto {
    #[prost(string, tag = "1")]
    name: String,
}

/// Every method path (`/package.Service/Method`) of the descriptor sets the server serves.
fn every_method() -> Vec<String> {
    let sets = [
        hasync::control::pb::FILE_DESCRIPTOR_SET,
        tonic_health::pb::FILE_DESCRIPTOR_SET,
        tonic_reflection::pb::v1::FILE_DESCRIPTOR_SET,
        tonic_reflection::pb::v1alpha::FILE_DESCRIPTOR_SET,
    ];
    let mut out = Vec::new();
    for set in sets {
        let set = <FileDescriptorSet as prost::Message>::decode(set).unwrap();
        for file in set.file {
            for svc in file.service {
                for m in svc.method {
                    out.push(format!("/{}.{}/{}", file.package, svc.name, m.name));
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Raw protobuf bytes in and out: one empty message (every field at its default) fits every
/// method's request type.
#[derive(Debug, Clone, Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        let n = src.remaining();
        Ok(Some(src.copy_to_bytes(n).to_vec()))
    }
}

/// Calls `path` with one empty message and no token: the code of the answer (OK when the
/// call started answering, e.g. a stream).
async fn call(channel: &Channel, path: &str, token: Option<&str>) -> Code {
    let mut grpc = tonic::client::Grpc::new(channel.clone());
    grpc.ready().await.unwrap();
    let mut req = tonic::Request::new(tokio_stream::once(Vec::new()));
    if let Some(t) = token {
        req.metadata_mut().insert("authorization", format!("Bearer {t}").parse().unwrap());
    }
    let path = PathAndQuery::from_str(path).unwrap();
    match grpc.streaming(req, path, Raw).await {
        Ok(_) => Code::Ok,
        Err(status) => status.code(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_method_but_the_read_only_ones_needs_the_token() {
    let methods = every_method();
    for m in READ_ONLY.iter().chain(ALWAYS_OPEN) {
        assert!(methods.iter().any(|x| x == m), "{m} is not in the descriptor sets");
    }
    assert!(methods.len() > READ_ONLY.len() + ALWAYS_OPEN.len(), "{methods:?}");
    // Paths no service has yet (a method added later, a service added later) need it too.
    let future = ["/hasync.v1.Replication/NotYetWritten", "/hasync.v2.Future/Anything"];

    for reads_too in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let mut c = node_config(dir.path(), Role::Master);
        c.grpc.token = "s3cret".into();
        c.grpc.token_for_reads = reads_too;
        let node = ApiNode::start(c).await;
        let ch = node.channel().await;
        let mut wrong = Vec::new();
        for m in methods.iter().map(String::as_str).chain(future) {
            let open = ALWAYS_OPEN.contains(&m) || (!reads_too && READ_ONLY.contains(&m));
            let code = call(&ch, m, None).await;
            if open == (code == Code::Unauthenticated) {
                wrong.push(format!("{m}: {code:?} without a token (token-for-reads {reads_too})"));
            }
            if !open {
                let code = call(&ch, m, Some("s3cre")).await;
                if code != Code::Unauthenticated {
                    wrong.push(format!("{m}: {code:?} with a wrong token"));
                }
            }
        }
        assert!(wrong.is_empty(), "{}", wrong.join("\n"));
        // The right token is accepted (a read, so nothing changes).
        assert_eq!(call(&ch, "/hasync.v1.Replication/GetStatus", Some("s3cret")).await, Code::Ok);
        node.stop().await;
    }
}
