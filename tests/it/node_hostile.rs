//! Requests and bad luck that must not wedge a node or leave it lying (issue 15): metadata
//! writes on a full disk change nothing anywhere, one topic rule at every entry point, a
//! replication mode no put can satisfy is refused, and a deleted epoch file is not a fresh
//! history.

use std::sync::Arc;
use std::time::Duration;

use hasync::config::Role;
use hasync::control::pb;
use hasync::control::pb::metadata_client::MetadataClient;
use hasync::metadata::{MetadataStore, Table, TableData};
use hasync::store::fs::{SimFs, StdFs};
use tonic::Code;

use crate::support::grpc::{ApiNode, pb_msg};
use crate::support::ha::{node_config, slave_node_config, wait_until};
use crate::support::node::TestNode;

/// The rule as every refusal states it.
const RULE: &str = "1 to 127 characters of letters, digits, _ - % |";

fn topic(name: &str) -> pb::TopicConfig {
    pb::TopicConfig {
        topic_name: name.into(),
        read_queue_nums: 4,
        write_queue_nums: 4,
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

fn topic_names(m: &MetadataStore) -> Vec<String> {
    match m.snapshot(Table::Topics).1 {
        TableData::Topics(t) => t.into_keys().collect(),
        other => panic!("{other:?}"),
    }
}

fn group_names(m: &MetadataStore) -> Vec<String> {
    match m.snapshot(Table::SubscriptionGroups).1 {
        TableData::SubscriptionGroups(t) => t.into_keys().collect(),
        other => panic!("{other:?}"),
    }
}

/// What the files under the data dir hold: a fresh load of them.
fn on_disk(dir: &std::path::Path) -> MetadataStore {
    MetadataStore::open(Arc::new(StdFs), dir).unwrap()
}

fn same_as_disk(live: &MetadataStore, dir: &std::path::Path) {
    let disk = on_disk(dir);
    for t in Table::ALL {
        assert_eq!(live.snapshot(t), disk.snapshot(t), "{t:?}: memory and disk differ");
    }
}

async fn start_on(config: hasync::config::Config, fs: Arc<SimFs>) -> ApiNode {
    ApiNode::from(TestNode::start_with_fs(config, fs).await)
}

async fn slave_of(dir: &std::path::Path, m: &ApiNode, fs: Arc<SimFs>) -> ApiNode {
    let mut c = slave_node_config(dir, m.node.ha_addr().unwrap());
    c.slave.master_grpc = m.url.trim_start_matches("http://").to_owned();
    c.metadata.sync_interval = Duration::from_millis(100);
    start_on(c, fs).await
}

fn pulls(n: &ApiNode) -> (u64, u64) {
    let p = n.node.status().metadata_pull.unwrap_or_default();
    (p.pulls_ok, p.pulls_failed)
}

/// Waits for `n` more completed pulls of the slave.
async fn more_pulls(s: &ApiNode, n: u64) {
    let (ok, _) = pulls(s);
    wait_until(10, "slave pulls", || pulls(s).0 >= ok + n).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_metadata_write_that_fails_on_a_full_disk_changes_nothing_anywhere() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (mfs, sfs) = (Arc::new(SimFs::new()), Arc::new(SimFs::new()));
    let m = start_on(node_config(md.path(), Role::Master), Arc::clone(&mfs)).await;
    let s = slave_of(sd.path(), &m, sfs).await;
    let mut c = MetadataClient::new(m.channel().await);
    c.upsert_topic(pb::UpsertTopicRequest { topic: Some(topic("Kept")) }).await.unwrap();
    let g0 = pb::UpsertSubscriptionGroupRequest { group: Some(group("G0")) };
    c.upsert_subscription_group(g0).await.unwrap();
    wait_until(10, "slave has the tables", || {
        topic_names(s.node.metadata()) == ["Kept"] && group_names(s.node.metadata()) == ["G0"]
    })
    .await;
    let versions = m.node.metadata().versions();

    mfs.set_disk_full(true);
    let e = c.upsert_topic(pb::UpsertTopicRequest { topic: Some(topic("New")) }).await;
    assert_eq!(e.unwrap_err().code(), Code::Internal);
    let g1 = pb::UpsertSubscriptionGroupRequest { group: Some(group("G1")) };
    assert_eq!(c.upsert_subscription_group(g1).await.unwrap_err().code(), Code::Internal);
    let delay = pb::DelayOffset { level: 2, offset: 9 };
    let e = c.set_delay_offset(pb::SetDelayOffsetRequest { offset: Some(delay) }).await;
    assert_eq!(e.unwrap_err().code(), Code::Internal);
    let e = c.delete_topic(pb::DeleteTopicRequest { topic_name: "Kept".into() }).await;
    assert_eq!(e.unwrap_err().code(), Code::Internal);
    let del = pb::DeleteSubscriptionGroupRequest { group_name: "G0".into() };
    assert_eq!(c.delete_subscription_group(del).await.unwrap_err().code(), Code::Internal);

    // Nothing changed: not the tables, not the versions slaves pull by, not the files.
    let live = m.node.metadata();
    assert_eq!(topic_names(live), ["Kept"], "a failed upsert or delete is not applied");
    assert_eq!(group_names(live), ["G0"]);
    assert_eq!(live.versions(), versions, "no version bumped by a failed write");
    same_as_disk(live, md.path());
    more_pulls(&s, 2).await;
    for t in Table::ALL {
        assert_eq!(s.node.metadata().snapshot(t), live.snapshot(t), "{t:?} on the slave");
    }

    // Space again: the same writes apply, everywhere.
    mfs.set_disk_full(false);
    c.upsert_topic(pb::UpsertTopicRequest { topic: Some(topic("New")) }).await.unwrap();
    assert_eq!(topic_names(live), ["Kept", "New"]);
    same_as_disk(live, md.path());
    wait_until(10, "slave adopts", || topic_names(s.node.metadata()) == ["Kept", "New"]).await;
    s.stop().await;
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slave_adopts_a_pulled_table_only_once_it_is_durable() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let sfs = Arc::new(SimFs::new());
    let m = start_on(node_config(md.path(), Role::Master), Arc::new(SimFs::new())).await;
    let s = slave_of(sd.path(), &m, Arc::clone(&sfs)).await;
    more_pulls(&s, 1).await;
    let held = s.node.metadata().versions();
    sfs.set_disk_full(true);
    let mut c = MetadataClient::new(m.channel().await);
    c.upsert_topic(pb::UpsertTopicRequest { topic: Some(topic("T2")) }).await.unwrap();
    let (_, failed) = pulls(&s);
    wait_until(10, "a pull fails to persist", || pulls(&s).1 > failed).await;
    assert!(topic_names(s.node.metadata()).is_empty(), "adopted before it was durable");
    assert_eq!(
        s.node.metadata().versions(),
        held,
        "the held versions make the next pull ask again"
    );
    same_as_disk(s.node.metadata(), sd.path());
    sfs.set_disk_full(false);
    wait_until(10, "slave adopts once it can persist", || topic_names(s.node.metadata()) == ["T2"])
        .await;
    same_as_disk(s.node.metadata(), sd.path());
    s.stop().await;
    m.stop().await;
}

/// Bad names: a path, a control character, an emoji, one character too long.
fn bad_topics() -> Vec<String> {
    vec!["a b/../c".into(), "a\u{1}b".into(), "tea\u{1F375}".into(), "t".repeat(128)]
}

fn refused_naming_the_rule(s: &tonic::Status, what: &str) {
    assert_eq!(s.code(), Code::InvalidArgument, "{what}: {s:?}");
    assert!(s.message().contains(RULE), "{what}: the rule in {:?}", s.message());
    assert!(!s.message().chars().any(char::is_control), "{what}: escaped: {:?}", s.message());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_entry_point_refuses_a_topic_outside_the_rule() {
    let md = tempfile::tempdir().unwrap();
    let m = ApiNode::start(node_config(md.path(), Role::Master)).await;
    let mut msgs = m.messages().await;
    let mut c = MetadataClient::new(m.channel().await);
    let g = pb::UpsertSubscriptionGroupRequest { group: Some(group("G")) };
    c.upsert_subscription_group(g).await.unwrap();
    for bad in bad_topics() {
        let put = pb::PutRequest { messages: vec![pb_msg(&bad, b"x")] };
        refused_naming_the_rule(&msgs.put(put).await.unwrap_err(), "Put");
        let up = pb::UpsertTopicRequest { topic: Some(topic(&bad)) };
        refused_naming_the_rule(&c.upsert_topic(up).await.unwrap_err(), "UpsertTopic");
        let del = pb::DeleteTopicRequest { topic_name: bad.clone() };
        refused_naming_the_rule(&c.delete_topic(del).await.unwrap_err(), "DeleteTopic");
        let off =
            pb::ConsumerOffset { group: "G".into(), topic: bad.clone(), queue_id: 0, offset: 1 };
        let commit = pb::CommitConsumerOffsetRequest { offset: Some(off) };
        refused_naming_the_rule(&c.commit_consumer_offset(commit).await.unwrap_err(), "Commit");
    }
    // A bad topic in a batch refuses the whole batch; nothing was stored.
    let batch = pb::PutRequest { messages: vec![pb_msg("Good", b"x"), pb_msg("a b", b"y")] };
    refused_naming_the_rule(&msgs.put(batch).await.unwrap_err(), "Put batch");
    assert_eq!(m.node.store().max_offset(), 0);
    let ok = pb::PutRequest { messages: vec![pb_msg(&"t".repeat(127), b"x")] };
    msgs.put(ok).await.unwrap();
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_put_refuses_a_bad_topic_before_sending() {
    // Nothing listens there: a refusal that connected first would say so.
    let out = tokio::task::spawn_blocking(|| {
        std::process::Command::new(assert_cmd::cargo::cargo_bin("hasync"))
            .args(["put", "--grpc", "127.0.0.1:9", "--topic", "a b/../c", "--body", "x"])
            .env_remove("HASYNC_GRPC")
            .env_remove("HASYNC_TOKEN")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains(RULE) && stderr.contains("\"a b/../c\""), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slave_stores_what_its_master_sent_whatever_the_topic() {
    // Replication is not an entry point: bytes a (Java) master stored with a topic outside the
    // rule reach the slave verbatim. The store's own append stands in for such a master.
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let m = ApiNode::start(node_config(md.path(), Role::Master)).await;
    m.node.store().append(&[crate::support::msg("a b/../c", 0, b"java")]).unwrap();
    let s = ApiNode::start(slave_node_config(sd.path(), m.node.ha_addr().unwrap())).await;
    let end = m.node.store().max_offset();
    wait_until(10, "slave replicated", || s.node.store().max_offset() == end).await;
    s.stop().await;
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_replication_mode_refuses_more_acks_than_ha_connections() {
    let md = tempfile::tempdir().unwrap();
    let mut config = node_config(md.path(), Role::Master);
    config.ha.max_connections = 3;
    let max = config.ha.max_connections;
    let m = ApiNode::start(config).await;
    let before = m.node.replication();
    let mut r = m.replication().await;
    for k in [u32::MAX, max + 1] {
        let req = pb::SetReplicationModeRequest {
            mode: pb::ReplicationMode::Sync as i32,
            sync_ack_replicas: Some(k),
        };
        let e = r.set_replication_mode(req).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{k}: {e:?}");
        assert!(e.message().contains("ha.max-connections"), "{e:?}");
        assert_eq!(m.node.replication(), before, "nothing changed");
    }
    let req = pb::SetReplicationModeRequest {
        mode: pb::ReplicationMode::Sync as i32,
        sync_ack_replicas: Some(max),
    };
    r.set_replication_mode(req).await.unwrap();
    assert_eq!(m.node.replication().sync_ack_replicas, max as usize);
    m.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_epoch_file_with_data_in_the_log_refuses_to_start() {
    let md = tempfile::tempdir().unwrap();
    let config = node_config(md.path(), Role::Master);
    let m = ApiNode::start(config.clone()).await;
    let put = pb::PutRequest { messages: vec![pb_msg("T", b"x")] };
    m.messages().await.put(put).await.unwrap();
    m.stop().await;
    let epoch = md.path().join(hasync::node::epoch::EPOCH_FILE);
    let _ = std::fs::remove_file(&epoch);
    let e = TestNode::try_start(config, Arc::new(StdFs)).await.err().expect("refused to start");
    let text = format!("{e:#}");
    assert!(text.contains(&epoch.display().to_string()), "names the file: {text}");
    assert!(text.contains("allow-missing-epoch-history"), "says how to proceed: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_epoch_file_starts_a_fresh_history_only_when_told() {
    let md = tempfile::tempdir().unwrap();
    let mut config = node_config(md.path(), Role::Master);
    let epoch = md.path().join(hasync::node::epoch::EPOCH_FILE);
    // A truly first start (empty data dir) starts, and writes the history it starts with.
    let m = ApiNode::start(config.clone()).await;
    assert!(epoch.exists(), "the first start writes the epoch file");
    let put = pb::PutRequest { messages: vec![pb_msg("T", b"x")] };
    m.messages().await.put(put).await.unwrap();
    m.stop().await;
    std::fs::remove_file(&epoch).unwrap();
    config.node.allow_missing_epoch_history = true;
    let m = ApiNode::start(config.clone()).await;
    assert_eq!(m.node.epoch_history().entries().len(), 1, "a fresh history");
    assert!(epoch.exists(), "and it is written: the next start needs no flag");
    m.stop().await;
    config.node.allow_missing_epoch_history = false;
    ApiNode::start(config).await.stop().await;
}

#[test]
fn serve_has_a_flag_for_a_missing_epoch_file() {
    use clap::Parser;
    let cli =
        hasync::cli::Cli::try_parse_from(["hasync", "serve", "--allow-missing-epoch-history"])
            .unwrap();
    let hasync::cli::Command::Serve(args) = cli.command else { panic!("not serve") };
    assert!(args.effective_config().unwrap().node.allow_missing_epoch_history);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_consumer_offset_persist_is_retried_and_reported() {
    let md = tempfile::tempdir().unwrap();
    let fs = Arc::new(SimFs::new());
    let mut config = node_config(md.path(), Role::Master);
    config.metadata.consumer_offset_persist_interval = Duration::from_millis(50);
    let m = start_on(config, Arc::clone(&fs)).await;
    let mut c = MetadataClient::new(m.channel().await);
    let g = pb::UpsertSubscriptionGroupRequest { group: Some(group("G")) };
    c.upsert_subscription_group(g).await.unwrap();
    fs.set_disk_full(true);
    let off = pb::ConsumerOffset { group: "G".into(), topic: "T".into(), queue_id: 0, offset: 5 };
    c.commit_consumer_offset(pb::CommitConsumerOffsetRequest { offset: Some(off) }).await.unwrap();
    wait_until(10, "the persist failure is reported", || {
        m.node.status().disk.failing.iter().any(|f| f == "consumer-offset persist")
    })
    .await;
    assert!(m.node.status().disk.full);
    fs.set_disk_full(false);
    wait_until(10, "the retry persists", || {
        on_disk(md.path()).snapshot(Table::ConsumerOffsets)
            == m.node.metadata().snapshot(Table::ConsumerOffsets)
    })
    .await;
    wait_until(10, "and the report clears", || m.node.status().disk.failing.is_empty()).await;
    m.stop().await;
}

/// 9h: a start refused for a missing epoch file must not have opened the store (abort marker
/// written, store thread and scrub started, never closed): the next start, with the flag,
/// would take the last (clean) stop for an unclean one (a full recovery scan; with
/// `node.fence-on-unclean-start` a master starts fenced).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_refused_for_a_missing_epoch_file_leaves_the_clean_stop_clean() {
    let md = tempfile::tempdir().unwrap();
    let mut config = node_config(md.path(), Role::Master);
    let m = ApiNode::start(config.clone()).await;
    let put = pb::PutRequest { messages: vec![pb_msg("T", b"x")] };
    m.messages().await.put(put).await.unwrap();
    m.stop().await;
    std::fs::remove_file(md.path().join(hasync::node::epoch::EPOCH_FILE)).unwrap();
    let refused = TestNode::try_start(config.clone(), Arc::new(StdFs)).await;
    assert!(refused.is_err(), "refused to start");
    config.node.allow_missing_epoch_history = true;
    config.node.fence_on_unclean_start = true;
    let m = ApiNode::start(config).await;
    let clean = m.node.store().recovery_report().clean;
    let fenced = m.node.status().fenced;
    m.stop().await;
    assert!(clean, "the refused start made the last (clean) stop look unclean");
    assert!(!fenced, "a master fenced after a clean stop");
}

/// 9h, the upgrade: builds before the epoch-file rule wrote the epoch file only at a role
/// change or a slave's first check against its master, so a node that never did either has
/// data and no epoch file; its history was the implicit (0, 0). Without the marker this build
/// writes with the epoch file, such a data dir starts (with a warning) and gets both files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_dir_from_before_the_epoch_file_rule_starts_and_gets_its_epoch_file() {
    use hasync::node::epoch::{EPOCH_FILE, EPOCH_REQUIRED_FILE};
    let md = tempfile::tempdir().unwrap();
    let config = node_config(md.path(), Role::Master);
    let m = ApiNode::start(config.clone()).await;
    assert!(md.path().join(EPOCH_REQUIRED_FILE).exists(), "a first start writes the marker");
    let put = pb::PutRequest { messages: vec![pb_msg("T", b"x")] };
    m.messages().await.put(put).await.unwrap();
    m.stop().await;
    // What an older build leaves: data, neither file.
    std::fs::remove_file(md.path().join(EPOCH_FILE)).unwrap();
    std::fs::remove_file(md.path().join(EPOCH_REQUIRED_FILE)).unwrap();
    let m = ApiNode::start(config.clone()).await;
    assert_eq!(m.node.epoch_history().entries().len(), 1, "the implicit history");
    assert!(m.node.store().recovery_report().clean, "and nothing else changed");
    m.stop().await;
    assert!(md.path().join(EPOCH_FILE).exists(), "the epoch file is written");
    assert!(md.path().join(EPOCH_REQUIRED_FILE).exists(), "and the marker");
    // From now on this data dir is one of this build's: a lost epoch file is refused.
    std::fs::remove_file(md.path().join(EPOCH_FILE)).unwrap();
    assert!(TestNode::try_start(config, Arc::new(StdFs)).await.is_err());
}

/// The real file system, except that while `fail` is set a rename onto `topics.json` is done
/// and then reports the directory fsync's failure (EIO), as `rename` + `sync_dir` can.
#[derive(Debug, Default)]
struct DirSyncFails {
    fail: std::sync::atomic::AtomicBool,
}

impl hasync::store::fs::FileSystem for DirSyncFails {
    fn create(&self, path: &std::path::Path, len: u64) -> std::io::Result<std::fs::File> {
        StdFs.create(path, len)
    }
    fn open(&self, path: &std::path::Path) -> std::io::Result<std::fs::File> {
        StdFs.open(path)
    }
    fn flush(
        &self,
        path: &std::path::Path,
        map: &memmap2::MmapRaw,
        from: usize,
        to: usize,
    ) -> std::io::Result<()> {
        StdFs.flush(path, map, from, to)
    }
    fn remove(&self, path: &std::path::Path) -> std::io::Result<()> {
        StdFs.remove(path)
    }
    fn write_atomic(&self, path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
        StdFs.write_atomic(path, bytes)
    }
    fn write_file(&self, path: &std::path::Path, bytes: &[u8]) -> std::io::Result<()> {
        StdFs.write_file(path, bytes)
    }
    fn sync_dir(&self, dir: &std::path::Path) -> std::io::Result<()> {
        StdFs.sync_dir(dir)
    }
    fn rename(&self, from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
        StdFs.rename(from, to)?;
        if self.fail.load(std::sync::atomic::Ordering::SeqCst) && to.ends_with("topics.json") {
            return Err(std::io::Error::from_raw_os_error(5));
        }
        Ok(())
    }
}

/// Defect 3: a write that fails after its file was renamed into place (the directory fsync
/// fails) answers an error and is not applied in memory; the file must not hold it either,
/// or the next start has a topic the node refused.
#[test]
fn a_metadata_write_that_answered_an_error_is_not_in_the_file() {
    use hasync::store::fs::FileSystem;
    let dir = tempfile::tempdir().unwrap();
    let fs = Arc::new(DirSyncFails::default());
    let live = MetadataStore::open(fs.clone() as Arc<dyn FileSystem>, dir.path()).unwrap();
    let config = |name: &str| hasync::metadata::TopicConfig {
        topic_name: name.into(),
        read_queue_nums: 4,
        write_queue_nums: 4,
        perm: 6,
        topic_filter_type: "SINGLE_TAG".into(),
        topic_sys_flag: 0,
        order: false,
    };
    live.upsert_topic(config("Kept")).unwrap();
    fs.fail.store(true, std::sync::atomic::Ordering::SeqCst);
    let e = live.upsert_topic(config("Refused"));
    assert!(e.is_err(), "{e:?}");
    assert_eq!(topic_names(&live), ["Kept"]);
    assert_eq!(topic_names(&on_disk(dir.path())), ["Kept"], "a write that failed is in the file");
    // The first write of a table that fails the same way leaves no file either.
    let fresh = tempfile::tempdir().unwrap();
    let live = MetadataStore::open(fs.clone() as Arc<dyn FileSystem>, fresh.path()).unwrap();
    assert!(live.upsert_topic(config("Refused")).is_err());
    assert!(topic_names(&on_disk(fresh.path())).is_empty(), "a failed first write is in the file");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_subscription_group_refuses_a_name_outside_the_rule_as_delete_topic_does() {
    let md = tempfile::tempdir().unwrap();
    let m = ApiNode::start(node_config(md.path(), Role::Master)).await;
    let mut c = MetadataClient::new(m.channel().await);
    for bad in ["a b/../c".to_owned(), "a\u{1}b".into(), "g".repeat(256), String::new()] {
        let del = pb::DeleteSubscriptionGroupRequest { group_name: bad.clone() };
        let e = c.delete_subscription_group(del).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{bad:?}: {e:?}");
        assert!(e.message().contains("subscription group name is 1 to 255"), "{e:?}");
        let del = pb::DeleteTopicRequest { topic_name: bad.clone() };
        let e = c.delete_topic(del).await.unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{bad:?}: {e:?}");
    }
    let absent = pb::DeleteSubscriptionGroupRequest { group_name: "nobody".into() };
    assert_eq!(c.delete_subscription_group(absent).await.unwrap_err().code(), Code::NotFound);
    m.stop().await;
}

/// A start refused after the store was opened (here: a damaged metadata file) closes the store
/// again: once the file is fixed, the next start finds the last stop clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_refused_for_a_damaged_metadata_file_leaves_the_clean_stop_clean() {
    let md = tempfile::tempdir().unwrap();
    let mut config = node_config(md.path(), Role::Master);
    let m = ApiNode::start(config.clone()).await;
    let put = pb::PutRequest { messages: vec![pb_msg("T", b"x")] };
    m.messages().await.put(put).await.unwrap();
    m.stop().await;
    let topics = md.path().join("config").join("topics.json");
    std::fs::write(&topics, b"not json").unwrap();
    let refused = TestNode::try_start(config.clone(), Arc::new(StdFs)).await;
    assert!(refused.is_err(), "refused to start");
    std::fs::remove_file(&topics).unwrap();
    config.node.fence_on_unclean_start = true;
    let m = ApiNode::start(config).await;
    let clean = m.node.store().recovery_report().clean;
    let fenced = m.node.status().fenced;
    m.stop().await;
    assert!(clean, "the refused start made the last (clean) stop look unclean");
    assert!(!fenced, "a master fenced after a clean stop");
}
