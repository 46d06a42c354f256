//! The floor under `hasync bench grpc`'s PutStream rows: a Messages service that stores nothing.
//!
//! Its PutStream answers each put as soon as it is read, with an answer of the shape a real
//! put gets (status, one result, offsets, epoch), on a plain tonic server of tonic's defaults
//! in the bench's own process. The same client drives it with the same puts. What it costs per
//! put is what gRPC (tonic, h2, prost, the client) costs on this machine; what a PutStream row
//! costs beyond it and beyond the node API's row is hasync's own control plane (layers,
//! conversion, admission). It is a baseline only: no hasync node is behind it.

use std::net::SocketAddr;
use std::pin::Pin;

use futures_util::stream::{Stream, StreamExt as _};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use crate::control::pb;

/// The do-nothing service.
struct Echo;

/// The size of a record of a 1 KiB body, for answers' offsets of realistic sizes.
const RECORD: i32 = 1_116;

/// An answer of a real put's shape: one message stored and acknowledged.
fn answer(id: u64) -> pb::PutStreamResponse {
    let at = i64::try_from(id).unwrap_or(i64::MAX).saturating_mul(i64::from(RECORD));
    pb::PutStreamResponse {
        id,
        response: Some(pb::PutResponse {
            status: pb::PutStatus::PutOk as i32,
            stored: true,
            results: vec![pb::PutResult {
                offset: at,
                size: RECORD,
                queue_offset: at / i64::from(RECORD),
            }],
            end_offset: at.saturating_add(i64::from(RECORD)),
            detail: String::new(),
            epoch: 1,
        }),
        error_code: 0,
        error: String::new(),
        more: Vec::new(),
    }
}

#[tonic::async_trait]
impl pb::messages_server::Messages for Echo {
    async fn put(&self, _: Request<pb::PutRequest>) -> Result<Response<pb::PutResponse>, Status> {
        Err(Status::unimplemented("the bench's echo service answers PutStream only"))
    }

    type PutStreamStream =
        Pin<Box<dyn Stream<Item = Result<pb::PutStreamResponse, Status>> + Send + 'static>>;

    async fn put_stream(
        &self,
        request: Request<Streaming<pb::PutStreamRequest>>,
    ) -> Result<Response<Self::PutStreamStream>, Status> {
        let answers = request.into_inner().map(|put| {
            put.map(|p| pb::PutStreamResponse {
                more: p.more.iter().map(|q| answer(q.id)).collect(),
                ..answer(p.id)
            })
        });
        // Packs as large as a node with the default grpc.put-stream-max-in-flight takes.
        let most = crate::config::GrpcConfig::default().put_stream_max_in_flight;
        let mut response = Response::new(Box::pin(answers) as Self::PutStreamStream);
        response.metadata_mut().insert(crate::control::put_stream::PACKS_HEADER, most.into());
        Ok(response)
    }

    async fn read(
        &self,
        _: Request<pb::ReadRequest>,
    ) -> Result<Response<pb::ReadResponse>, Status> {
        Err(Status::unimplemented("the bench's echo service answers PutStream only"))
    }
}

/// A running echo server on loopback (an OS-assigned port); stopped on drop.
pub(crate) struct EchoServer {
    addr: SocketAddr,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl EchoServer {
    /// Starts it on 127.0.0.1.
    pub(crate) async fn start() -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        // As the node's control plane does (TCP_NODELAY on every accepted connection): else
        // an answer written behind an unacknowledged one waits for the client's delayed ACK.
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener).map(|conn| {
            conn.inspect(|stream| {
                let _ = stream.set_nodelay(true);
            })
        });
        let stop = CancellationToken::new();
        let router = tonic::transport::Server::builder()
            .add_service(pb::messages_server::MessagesServer::new(Echo));
        let until = stop.clone().cancelled_owned();
        let task = tokio::spawn(router.serve_with_incoming_shutdown(incoming, until));
        Ok(Self { addr, stop, task })
    }

    /// Its URL for a client.
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops it and waits for its end.
    pub(crate) async fn stop(mut self) -> anyhow::Result<()> {
        self.stop.cancel();
        (&mut self.task).await??;
        Ok(())
    }
}

impl Drop for EchoServer {
    /// A bench that ends early (an error) stops the server without waiting for it.
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_echo_answers_each_put_in_order_with_its_id_and_refuses_the_rest() {
        let server = EchoServer::start().await.unwrap();
        let (h, not_ok) = crate::cli::bench::stream_run(
            &server.url(),
            4,
            std::time::Duration::from_millis(50),
            64,
            false,
        )
        .await
        .unwrap();
        assert!(!h.is_empty(), "puts were answered");
        assert_eq!(not_ok, 0);
        let mut client = pb::messages_client::MessagesClient::connect(server.url()).await.unwrap();
        let refused = client.put(pb::PutRequest::default()).await.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unimplemented);
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let mut answers = client
            .put_stream(tokio_stream::wrappers::ReceiverStream::new(rx))
            .await
            .unwrap()
            .into_inner();
        for id in [7, 3, 11] {
            tx.send(pb::PutStreamRequest { id, ..Default::default() }).await.unwrap();
        }
        drop(tx);
        let mut ids = Vec::new();
        while let Some(a) = answers.message().await.unwrap() {
            ids.push(a.id);
        }
        assert_eq!(ids, [7, 3, 11]);
        server.stop().await.unwrap();
    }
}
