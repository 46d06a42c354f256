//! `hasync.v1.Metadata`: metadata writes on the master, Get for people and tools, Pull for
//! slaves (only the tables whose version differs, in chunks).

use std::pin::Pin;
use std::sync::Arc;

use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::control::metadata_wire::{self as wire, version_of, version_pb};
use crate::control::pb;
use crate::metadata::{DataVersion, MetadataError, MetadataStore, Table};
use crate::node::Node;

pub(crate) struct MetadataService {
    node: Arc<Node>,
}

impl MetadataService {
    pub(crate) fn new(node: Arc<Node>) -> Self {
        Self { node }
    }

    /// Runs a write on the master, off the async workers (it writes a file).
    async fn write(
        &self,
        f: impl FnOnce(&MetadataStore) -> Result<DataVersion, MetadataError> + Send + 'static,
    ) -> Result<Response<pb::WriteResponse>, Status> {
        // Held until the write ended, in the blocking task (a cancelled call does not release
        // it early): a role change waits for it after raising the fence.
        let admitted = self.node.check_metadata_write().await?;
        let store = Arc::clone(self.node.metadata());
        let version = tokio::task::spawn_blocking(move || {
            let _admitted = admitted;
            f(&store)
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map_err(Status::from)?;
        Ok(Response::new(pb::WriteResponse { version: Some(version_pb(version)) }))
    }

    fn stream(&self, wanted: Vec<(Table, Option<DataVersion>)>) -> ChunkStream {
        let store = self.node.metadata();
        let mut out = Vec::new();
        for (table, held) in wanted {
            match store.snapshot_if_changed(table, held) {
                None => out.push(pb::MetadataChunk {
                    table: wire::table_pb(table) as i32,
                    version: held.map(version_pb),
                    unchanged: true,
                    last: true,
                    ..Default::default()
                }),
                Some((version, data)) => out.extend(wire::chunks(version, &data)),
            }
        }
        Box::pin(tokio_stream::iter(out.into_iter().map(Ok)))
    }
}

type ChunkStream = Pin<Box<dyn Stream<Item = Result<pb::MetadataChunk, Status>> + Send>>;

fn required<T>(v: Option<T>, field: &str) -> Result<T, Status> {
    v.ok_or_else(|| Status::invalid_argument(format!("{field} is required")))
}

#[tonic::async_trait]
impl pb::metadata_server::Metadata for MetadataService {
    async fn upsert_topic(
        &self,
        r: Request<pb::UpsertTopicRequest>,
    ) -> Result<Response<pb::WriteResponse>, Status> {
        let topic = wire::topic_of(required(r.into_inner().topic, "topic")?);
        self.write(move |m| m.upsert_topic(topic)).await
    }

    async fn delete_topic(
        &self,
        r: Request<pb::DeleteTopicRequest>,
    ) -> Result<Response<pb::WriteResponse>, Status> {
        let name = r.into_inner().topic_name;
        self.write(move |m| m.delete_topic(&name)).await
    }

    async fn commit_consumer_offset(
        &self,
        r: Request<pb::CommitConsumerOffsetRequest>,
    ) -> Result<Response<pb::WriteResponse>, Status> {
        let o = required(r.into_inner().offset, "offset")?;
        self.write(move |m| m.commit_offset(&o.group, &o.topic, o.queue_id, o.offset)).await
    }

    async fn upsert_subscription_group(
        &self,
        r: Request<pb::UpsertSubscriptionGroupRequest>,
    ) -> Result<Response<pb::WriteResponse>, Status> {
        let g = wire::group_of(required(r.into_inner().group, "group")?);
        self.write(move |m| m.upsert_group(g)).await
    }

    async fn delete_subscription_group(
        &self,
        r: Request<pb::DeleteSubscriptionGroupRequest>,
    ) -> Result<Response<pb::WriteResponse>, Status> {
        let name = r.into_inner().group_name;
        self.write(move |m| m.delete_group(&name)).await
    }

    async fn set_delay_offset(
        &self,
        r: Request<pb::SetDelayOffsetRequest>,
    ) -> Result<Response<pb::WriteResponse>, Status> {
        let d = required(r.into_inner().offset, "offset")?;
        self.write(move |m| m.set_delay_offset(d.level, d.offset)).await
    }

    type GetStream = ChunkStream;

    async fn get(
        &self,
        r: Request<pb::GetMetadataRequest>,
    ) -> Result<Response<ChunkStream>, Status> {
        let t = r.into_inner().table;
        let tables: Vec<Table> = match wire::table_of(t) {
            Some(table) => vec![table],
            None if t == 0 => Table::ALL.to_vec(),
            None => return Err(Status::invalid_argument(format!("unknown table {t}"))),
        };
        Ok(Response::new(self.stream(tables.into_iter().map(|t| (t, None)).collect())))
    }

    type PullStream = ChunkStream;

    async fn pull(&self, r: Request<pb::PullRequest>) -> Result<Response<ChunkStream>, Status> {
        let req = r.into_inner();
        let held = |v: &Option<pb::DataVersion>| v.as_ref().map(version_of);
        Ok(Response::new(self.stream(vec![
            (Table::Topics, held(&req.topics)),
            (Table::ConsumerOffsets, held(&req.consumer_offsets)),
            (Table::DelayOffsets, held(&req.delay_offsets)),
            (Table::SubscriptionGroups, held(&req.subscription_groups)),
        ])))
    }
}
