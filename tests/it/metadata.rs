//! Metadata replication: writes on the master reach slaves within one pull, with the master's
//! versions; unchanged pulls write nothing; files survive restarts and fall back to `.bak`.

use std::time::Duration;

use hasync::config::Role;
use hasync::control::pb::metadata_client::MetadataClient;
use hasync::control::pb::{self, MetadataTable};
use hasync::metadata::{MetadataStore, Table};
use tonic::Code;
use tonic::transport::Channel;

use crate::support::grpc::ApiNode;
use crate::support::ha::{node_config, slave_node_config, wait_until};

async fn pair(md: &std::path::Path, sd: &std::path::Path) -> (ApiNode, ApiNode) {
    let m = ApiNode::start(node_config(md, Role::Master)).await;
    let s = start_slave(sd, &m).await;
    (m, s)
}

async fn start_slave(sd: &std::path::Path, m: &ApiNode) -> ApiNode {
    let mut c = slave_node_config(sd, m.node.ha_addr().unwrap());
    c.slave.master_grpc = m.url.trim_start_matches("http://").to_owned();
    c.metadata.sync_interval = Duration::from_millis(200);
    ApiNode::start(c).await
}

async fn client(n: &ApiNode) -> MetadataClient<Channel> {
    MetadataClient::new(n.channel().await)
}

fn topic(name: &str, queues: u32) -> pb::TopicConfig {
    pb::TopicConfig {
        topic_name: name.into(),
        read_queue_nums: queues,
        write_queue_nums: queues,
        perm: 6,
        topic_filter_type: "SINGLE_TAG".into(),
        topic_sys_flag: 0,
        order: false,
    }
}

fn group(name: &str) -> pb::SubscriptionGroupConfig {
    pb::SubscriptionGroupConfig {
        group_name: name.into(),
        consume_enable: true,
        retry_queue_nums: 1,
        retry_max_times: 16,
        ..Default::default()
    }
}

async fn write_all(c: &mut MetadataClient<Channel>) {
    c.upsert_topic(pb::UpsertTopicRequest { topic: Some(topic("TopicA", 8)) }).await.unwrap();
    c.upsert_topic(pb::UpsertTopicRequest { topic: Some(topic("TopicB", 4)) }).await.unwrap();
    c.upsert_subscription_group(pb::UpsertSubscriptionGroupRequest { group: Some(group("G1")) })
        .await
        .unwrap();
    let off =
        pb::ConsumerOffset { group: "G1".into(), topic: "TopicA".into(), queue_id: 3, offset: 42 };
    c.commit_consumer_offset(pb::CommitConsumerOffsetRequest { offset: Some(off) }).await.unwrap();
    c.set_delay_offset(pb::SetDelayOffsetRequest {
        offset: Some(pb::DelayOffset { level: 3, offset: 7 }),
    })
    .await
    .unwrap();
}

fn same_tables(a: &MetadataStore, b: &MetadataStore) -> bool {
    Table::ALL.iter().all(|t| a.snapshot(*t) == b.snapshot(*t))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_write_reaches_the_slave_within_one_pull_and_survives_its_restart() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (m, s) = pair(md.path(), sd.path()).await;
    let mut c = client(&m).await;
    write_all(&mut c).await;
    wait_until(10, "slave holds the master's tables", || {
        same_tables(m.node.metadata(), s.node.metadata())
    })
    .await;
    assert_eq!(
        m.node.metadata().versions(),
        s.node.metadata().versions(),
        "versions adopted verbatim"
    );
    // A delete propagates (whole tables travel).
    c.delete_topic(pb::DeleteTopicRequest { topic_name: "TopicB".into() }).await.unwrap();
    wait_until(10, "delete propagated", || same_tables(m.node.metadata(), s.node.metadata())).await;
    let (_, t) = s.node.metadata().snapshot(Table::Topics);
    let hasync::metadata::TableData::Topics(t) = t else { panic!() };
    assert!(t.contains_key("TopicA") && !t.contains_key("TopicB"));
    // Status shows the pull.
    let st = s.node.status();
    let p = st.metadata_pull.unwrap();
    assert!(p.last_success_unix_ms > 0 && p.last_error.is_none() && p.pulls_ok >= 1);
    // Restart the slave: the tables come back from its files.
    let versions = s.node.metadata().versions();
    s.stop().await;
    let reopened =
        MetadataStore::open(std::sync::Arc::new(hasync::store::fs::StdFs), sd.path()).unwrap();
    assert_eq!(reopened.versions(), versions);
    assert!(same_tables(&reopened, m.node.metadata()));
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unchanged_pull_writes_no_file() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (m, s) = pair(md.path(), sd.path()).await;
    write_all(&mut client(&m).await).await;
    wait_until(10, "in sync", || same_tables(m.node.metadata(), s.node.metadata())).await;
    let pull = || s.node.status().metadata_pull.unwrap();
    // The pull that adopted the tables may not have recorded itself yet: wait for the next.
    let first = pull().pulls_ok;
    wait_until(10, "one more pull", || pull().pulls_ok > first).await;
    let written = s.node.metadata().files_written();
    let (ok, changed) = (pull().pulls_ok, pull().tables_changed);
    wait_until(10, "three more pulls", || pull().pulls_ok >= ok + 3).await;
    assert_eq!(s.node.metadata().files_written(), written, "unchanged pulls wrote files");
    assert_eq!(pull().tables_changed, changed, "unchanged pulls adopted no table");
    s.stop().await;
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_that_is_down_leaves_the_slave_serving_its_last_copy() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (m, s) = pair(md.path(), sd.path()).await;
    write_all(&mut client(&m).await).await;
    wait_until(10, "in sync", || same_tables(m.node.metadata(), s.node.metadata())).await;
    let before = s.node.metadata().snapshot(Table::Topics);
    m.stop().await;
    wait_until(10, "error reported", || {
        s.node.status().metadata_pull.is_some_and(|p| p.last_error.is_some())
    })
    .await;
    assert_eq!(s.node.metadata().snapshot(Table::Topics), before, "last copy kept");
    // Reads on the slave still serve it.
    let mut chunks = client(&s)
        .await
        .get(pb::GetMetadataRequest { table: MetadataTable::Topics as i32 })
        .await
        .unwrap()
        .into_inner();
    let chunk = chunks.message().await.unwrap().unwrap();
    assert_eq!(chunk.topics.len(), 2);
    let st = s.replication().await.get_status(pb::GetStatusRequest {}).await.unwrap().into_inner();
    let ms = st.metadata_sync.unwrap();
    assert!(!ms.last_error.is_empty() && ms.pulls_failed >= 1, "{ms:?}");
    assert_eq!(ms.versions.len(), 4);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_on_a_slave_are_refused_and_bad_input_changes_nothing() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (m, s) = pair(md.path(), sd.path()).await;
    let e = client(&s)
        .await
        .upsert_topic(pb::UpsertTopicRequest { topic: Some(topic("X", 1)) })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains(&m.node.ha_addr().unwrap().to_string()), "{}", e.message());
    let mut c = client(&m).await;
    let before = m.node.metadata().versions();
    let bad_perm = pb::TopicConfig { perm: 1, ..topic("T", 1) };
    let unknown_group =
        pb::ConsumerOffset { group: "nobody".into(), topic: "T".into(), queue_id: 0, offset: 1 };
    let errors = vec![
        c.upsert_topic(pb::UpsertTopicRequest { topic: Some(topic("", 4)) }).await.unwrap_err(),
        c.upsert_topic(pb::UpsertTopicRequest { topic: Some(topic("T", 0)) }).await.unwrap_err(),
        c.upsert_topic(pb::UpsertTopicRequest { topic: Some(topic("bad name!", 1)) })
            .await
            .unwrap_err(),
        c.upsert_topic(pb::UpsertTopicRequest { topic: Some(bad_perm) }).await.unwrap_err(),
        c.upsert_topic(pb::UpsertTopicRequest { topic: None }).await.unwrap_err(),
        c.commit_consumer_offset(pb::CommitConsumerOffsetRequest { offset: Some(unknown_group) })
            .await
            .unwrap_err(),
        c.upsert_subscription_group(pb::UpsertSubscriptionGroupRequest { group: Some(group("")) })
            .await
            .unwrap_err(),
        c.set_delay_offset(pb::SetDelayOffsetRequest {
            offset: Some(pb::DelayOffset { level: 0, offset: 1 }),
        })
        .await
        .unwrap_err(),
    ];
    for e in errors {
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(!e.message().is_empty());
    }
    let e =
        c.delete_topic(pb::DeleteTopicRequest { topic_name: "absent".into() }).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert_eq!(m.node.metadata().versions(), before, "nothing changed");
    assert_eq!(m.node.metadata().files_written(), 0);
    s.stop().await;
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_writes_need_the_token_when_one_is_set() {
    let md = tempfile::tempdir().unwrap();
    let mut cfg = node_config(md.path(), Role::Master);
    cfg.grpc.token = "tok".into();
    let m = ApiNode::start(cfg).await;
    let e = client(&m)
        .await
        .upsert_topic(pb::UpsertTopicRequest { topic: Some(topic("T", 1)) })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated);
    let req = crate::support::grpc::with_token(
        pb::UpsertTopicRequest { topic: Some(topic("T", 1)) },
        "tok",
    );
    client(&m).await.upsert_topic(req).await.unwrap();
    m.stop().await;
}

#[test]
fn a_corrupt_file_loads_from_bak_and_both_corrupt_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let fs = std::sync::Arc::new(hasync::store::fs::StdFs);
    let cfg = |n: &str| crate::support::topic_config(n, 4);
    {
        let m = MetadataStore::open(fs.clone(), dir.path()).unwrap();
        m.upsert_topic(cfg("A")).unwrap();
        m.upsert_topic(cfg("B")).unwrap(); // topics.json has A and B; topics.json.bak has A
    }
    let main = dir.path().join("config/topics.json");
    let bak = hasync::metadata::bak_path(&main);
    assert!(bak.exists());
    std::fs::write(&main, b"{ not json").unwrap();
    let m = MetadataStore::open(fs.clone(), dir.path()).unwrap();
    let (v, _) = m.snapshot(Table::Topics);
    assert_eq!(v.counter, 1, "the .bak (one topic) was loaded");
    drop(m);
    std::fs::write(&bak, b"garbage").unwrap();
    let err = MetadataStore::open(fs, dir.path()).unwrap_err().to_string();
    assert!(err.contains("topics.json") && err.contains("topics.json.bak"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_tables_pull_in_chunks() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let m = ApiNode::start(node_config(md.path(), Role::Master)).await;
    let store = m.node.metadata().clone();
    tokio::task::spawn_blocking(move || {
        store
            .upsert_group(hasync::metadata::SubscriptionGroupConfig {
                group_name: "G".into(),
                consume_enable: true,
                consume_broadcast_enable: false,
                retry_queue_nums: 1,
                retry_max_times: 16,
                broker_id: 0,
                which_broker_when_consume_slowly: 1,
                notify_consumer_ids_changed_enable: true,
            })
            .unwrap();
        let mut topics = std::collections::BTreeMap::new();
        let mut offsets = std::collections::BTreeMap::new();
        for i in 0..10_000 {
            let name = format!("Topic{i:05}");
            topics.insert(name.clone(), crate::support::topic_config(&name, 8));
            let q: std::collections::BTreeMap<i32, i64> =
                (0..10).map(|q| (q, i64::from(q) * 1000)).collect();
            offsets.insert(format!("G@{name}"), q);
        }
        // Bulk-load through adopt (a master never adopts; this is only test set-up).
        let v =
            hasync::metadata::DataVersion { state_version: 0, timestamp_unix_ms: 1, counter: 100 };
        store.adopt(v, hasync::metadata::TableData::Topics(topics)).unwrap();
        store.adopt(v, hasync::metadata::TableData::ConsumerOffsets(offsets)).unwrap();
    })
    .await
    .unwrap();
    let s = start_slave(sd.path(), &m).await;
    wait_until(60, "10k topics and 100k offsets pulled", || {
        same_tables(m.node.metadata(), s.node.metadata())
    })
    .await;
    s.stop().await;
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_offsets_are_persisted_lazily_and_at_shutdown() {
    let md = tempfile::tempdir().unwrap();
    let mut cfg = node_config(md.path(), Role::Master);
    cfg.metadata.consumer_offset_persist_interval = Duration::from_secs(3600);
    let m = ApiNode::start(cfg).await;
    let mut c = client(&m).await;
    c.upsert_subscription_group(pb::UpsertSubscriptionGroupRequest { group: Some(group("G1")) })
        .await
        .unwrap();
    let written = m.node.metadata().files_written();
    for i in 0..50 {
        let off =
            pb::ConsumerOffset { group: "G1".into(), topic: "T".into(), queue_id: 0, offset: i };
        c.commit_consumer_offset(pb::CommitConsumerOffsetRequest { offset: Some(off) })
            .await
            .unwrap();
    }
    assert_eq!(m.node.metadata().files_written(), written, "50 commits, no file write yet");
    m.stop().await;
    let reopened =
        MetadataStore::open(std::sync::Arc::new(hasync::store::fs::StdFs), md.path()).unwrap();
    let (v, data) = reopened.snapshot(Table::ConsumerOffsets);
    assert_eq!(v.counter, 50);
    let hasync::metadata::TableData::ConsumerOffsets(o) = data else { panic!() };
    assert_eq!(o["G1@T"][&0], 49, "written at shutdown");
}
