//! Nodes with their gRPC control plane on 127.0.0.1, and clients for them.

use std::sync::Arc;

use hasync::config::Config;
use hasync::control::pb::messages_client::MessagesClient;
use hasync::control::pb::replication_client::ReplicationClient;
use hasync::node::Node;
use tonic::transport::Channel;

use crate::support::node::TestNode;

/// A node serving the API.
pub struct ApiNode {
    pub node: Arc<Node>,
    pub running: TestNode,
    pub url: String,
}

impl ApiNode {
    pub async fn start(config: Config) -> Self {
        Self::from(TestNode::start(config).await)
    }

    pub fn from(running: TestNode) -> Self {
        Self { node: Arc::clone(running.node()), url: running.url(), running }
    }

    pub async fn channel(&self) -> Channel {
        Channel::from_shared(self.url.clone()).unwrap().connect().await.unwrap()
    }

    pub async fn replication(&self) -> ReplicationClient<Channel> {
        ReplicationClient::new(self.channel().await)
    }

    pub async fn messages(&self) -> MessagesClient<Channel> {
        MessagesClient::new(self.channel().await)
    }

    /// Graceful stop: health NOT_SERVING, node shutdown, then the server.
    pub async fn stop(self) {
        self.running.shutdown().await.unwrap();
    }
}

/// A gRPC request with a bearer token.
pub fn with_token<T>(msg: T, token: &str) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    r
}

/// A message for Put.
pub fn pb_msg(topic: &str, body: &[u8]) -> hasync::control::pb::Message {
    hasync::control::pb::Message {
        topic: topic.into(),
        queue_id: 1,
        tags: "TagA".into(),
        keys: "k1 k2".into(),
        properties: [("color".to_owned(), "blue".to_owned())].into_iter().collect(),
        body: bytes::Bytes::copy_from_slice(body),
        flag: 7,
    }
}

/// A master config with TLS on its gRPC port: a self-signed certificate for `names`, written
/// into `dir` with its key. Returns the config and the certificate's file (the CA to trust).
pub fn tls_master_config(dir: &std::path::Path, names: &[&str]) -> (Config, std::path::PathBuf) {
    let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    let ck = rcgen::generate_simple_self_signed(names).unwrap();
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    let mut c = crate::support::ha::node_config(&dir.join("data"), hasync::config::Role::Master);
    c.grpc.tls_cert_file = cert.clone();
    c.grpc.tls_key_file = key;
    (c, cert)
}
