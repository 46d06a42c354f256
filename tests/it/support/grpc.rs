//! Nodes with their gRPC control plane on 127.0.0.1, and clients for them.

use std::sync::Arc;

use hasync::config::Config;
use hasync::control::ControlPlane;
use hasync::control::pb::messages_client::MessagesClient;
use hasync::control::pb::replication_client::ReplicationClient;
use hasync::node::Node;
use tonic::transport::Channel;

/// A node serving the API.
pub struct ApiNode {
    pub node: Arc<Node>,
    pub control: Option<ControlPlane>,
    pub url: String,
}

impl ApiNode {
    pub async fn start(config: Config) -> Self {
        let node = Arc::new(Node::start(config, false).await.unwrap());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let control = ControlPlane::start(Arc::clone(&node), listener).await.unwrap();
        let url = format!("http://{}", control.local_addr());
        Self { node, control: Some(control), url }
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
    pub async fn stop(mut self) {
        let control = self.control.take().unwrap();
        control.set_not_serving().await;
        self.node.shutdown().await.unwrap();
        control.stop().await;
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
