//! Issue 17: the truncated tail of an old master is not destroyed silently. A demotion (and a
//! slave's epoch check) keeps the bytes it cuts in a tail file under `<data-dir>/truncated/`
//! with their range, epochs and cause, counts them in status and metrics, and `hasync read
//! --tail-file` prints their records; a tail that cannot be kept (a full disk) refuses the cut,
//! and nothing is lost.

use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;

use hasync::config::Role;
use hasync::store::fs::{FileSystem, SimFs};
use hasync::store::tails::{self, TAILS_DIR, TailFile};
use serde_json::Value;

use crate::role_change::{
    Diverged, assert_resumed, demote_failing_at, demotion, diverged, grpc_addr, status,
};
use crate::support::all_bytes;
use crate::support::grpc::ApiNode;
use crate::support::ha::wait_until;
use crate::support::node::TestNode;

/// Runs the built `hasync` with `args`.
async fn hasync(args: Vec<String>) -> Output {
    tokio::task::spawn_blocking(move || {
        std::process::Command::new(assert_cmd::cargo::cargo_bin("hasync"))
            .args(&args)
            .env("NO_COLOR", "1")
            .output()
            .unwrap()
    })
    .await
    .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The tail files under `data_dir`.
fn tail_files(data_dir: &Path) -> Vec<PathBuf> {
    tails::list(&data_dir.join(TAILS_DIR)).unwrap().into_iter().map(|l| l.path).collect()
}

fn a_dir(d: &Diverged) -> PathBuf {
    d.a_config.node.data_dir.clone()
}

/// A's records from `from` on: offset and first body byte.
fn records_from(d: &Diverged, from: u64) -> Vec<(u64, u8)> {
    d.a.node
        .store()
        .records_from(from)
        .map(|r| {
            let r = r.unwrap();
            let Ok(hasync::store::record::Decoded::Message(v)) =
                hasync::store::record::decode(&r.bytes, r.offset as i64)
            else {
                panic!("a record at {}", r.offset)
            };
            (r.offset, v.body[0])
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t17_a_demoted_master_keeps_its_divergent_tail_counts_it_and_read_prints_it() {
    let d = diverged(Arc::new(SimFs::new())).await;
    let (cut, a_max) = (d.cut, d.a.node.store().max_offset());
    let min = d.a.node.store().min_offset();
    let divergent = all_bytes(d.a.node.store())[(cut - min) as usize..].to_vec();
    let records = records_from(&d, cut);
    assert_eq!(records.len(), 5, "the five puts B never got");
    assert_eq!(
        d.a.node.change_role(demotion(&d, grpc_addr(&d.b))).await.unwrap(),
        (Role::Slave, 1)
    );
    assert_eq!(d.a.node.store().max_offset(), cut, "A was cut to B's log");

    // The tail file: its name and header say what it holds; its data is the bytes cut.
    let files = tail_files(&a_dir(&d));
    assert_eq!(files.len(), 1, "{files:?}");
    let name = files[0].file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        name.starts_with(&format!("epoch-0000000000000000-from-{cut:020}-to-{a_max:020}-")),
        "{name}"
    );
    let f = TailFile::open(&files[0]).unwrap();
    f.verify().unwrap();
    let m = f.meta();
    assert_eq!((m.start_offset, m.end_offset, m.seq), (cut, a_max, 1));
    assert_eq!(m.cause.reason, "demotion");
    assert_eq!((m.cause.master.as_str(), m.cause.master_epoch), (&*grpc_addr(&d.b), 1));
    assert_eq!(m.cause.epochs, [0], "A wrote them as master of epoch 0");
    assert_eq!(m.cause.data_dir_id, d.a.node.status().data_dir_id);
    let raw = std::fs::read(&files[0]).unwrap();
    assert_eq!(&raw[raw.len() - divergent.len()..], &divergent[..], "the bytes cut, unchanged");

    // Counted in the status and the metrics.
    let s = status(&d.a).await;
    assert_eq!((s.truncated_bytes, s.truncated_files), (a_max - cut, 1));
    let scraped = crate::metrics::scrape(d.a.running.metrics_addr()).await;
    assert_eq!(scraped.value("hasync_truncated_bytes_total", &[]), (a_max - cut) as f64);
    assert_eq!(scraped.value("hasync_truncated_files", &[]), 1.0);
    let shown = hasync(vec!["status".into(), "--grpc".into(), grpc_addr(&d.a)]).await;
    assert!(stdout(&shown).contains("1 tail file(s)"), "{}", stdout(&shown));

    // `hasync read --tail-file` prints the records at the offsets they had.
    let path = files[0].to_string_lossy().into_owned();
    let out =
        hasync(vec!["read".into(), "--tail-file".into(), path.clone(), "--json".into()]).await;
    assert!(out.status.success(), "{}", stderr(&out));
    let j: Value = serde_json::from_str(&stdout(&out)).unwrap();
    let printed: Vec<(u64, u8)> = j["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let body = m["body_text"].as_str().unwrap().as_bytes()[0];
            (m["physical_offset"].as_u64().unwrap(), body)
        })
        .collect();
    assert_eq!(printed, records, "every cut record, at its offset, with its body: {j}");
    assert_eq!(j["meta"]["reason"], "demotion");
    let out = hasync(vec!["read".into(), "--tail-file".into(), path.clone()]).await;
    let text = stdout(&out);
    assert!(
        text.contains(&format!("range         [{cut}, {a_max}): {} bytes", a_max - cut)),
        "{text}"
    );
    assert!(
        text.contains(&format!("{:>12}", records[0].0)) && text.contains("5 message(s)"),
        "{text}"
    );
    let dir = a_dir(&d).to_string_lossy().into_owned();
    let out = hasync(vec!["read".into(), "--tail-dir".into(), dir.clone()]).await;
    assert!(out.status.success() && stdout(&out).contains(&name), "{}", stdout(&out));

    // A damaged tail file is an error naming it.
    let mut damaged = raw.clone();
    *damaged.last_mut().unwrap() ^= 0x10;
    std::fs::write(&files[0], &damaged).unwrap();
    let out = hasync(vec!["read".into(), "--tail-file".into(), path.clone()]).await;
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stderr(&out).contains(&path) && stderr(&out).contains("data checksum"),
        "{}",
        stderr(&out)
    );
    let out = hasync(vec!["read".into(), "--tail-dir".into(), dir]).await;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        stdout(&out).contains("DAMAGED") && stderr(&out).contains("1 damaged tail file(s)"),
        "{out:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t17_a_demotion_that_cannot_keep_its_tail_on_a_full_disk_is_refused_and_loses_nothing() {
    let fs = Arc::new(SimFs::new());
    let d = diverged(Arc::clone(&fs)).await;
    let (before, a_max) = (all_bytes(d.a.node.store()), d.a.node.store().max_offset());
    // No room for the tail file (its directory's quota is used up); other writes still work.
    fs.set_disk_full_for(|p| p.components().any(|c| c.as_os_str() == TAILS_DIR));
    let req =
        demote_failing_at(&d, grpc_addr(&d.b), "truncate", "cannot keep the truncated tail").await;
    let rc = status(&d.a).await.role_change.unwrap();
    assert!(rc.error.contains("disk full") && rc.error.contains("nothing was truncated"), "{rc:?}");
    assert!(
        rc.error.contains(&format!("truncated/epoch-0000000000000000-from-{:020}", d.cut)),
        "{rc:?}"
    );
    assert_eq!(d.a.node.store().max_offset(), a_max, "the truncate was refused");
    assert_eq!(all_bytes(d.a.node.store()), before, "nothing lost");
    assert!(tail_files(&a_dir(&d)).is_empty());
    assert_eq!(status(&d.a).await.truncated_bytes, 0);

    // Room again: the exact repeat keeps the tail, then cuts and follows B.
    fs.clear_disk_full_for();
    assert_resumed(&d, req).await;
    let files = tail_files(&a_dir(&d));
    assert_eq!(files.len(), 1, "{files:?}");
    let f = TailFile::open(&files[0]).unwrap();
    f.verify().unwrap();
    assert_eq!((f.meta().start_offset, f.meta().end_offset), (d.cut, a_max));
    assert_eq!(status(&d.a).await.truncated_bytes, a_max - d.cut);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn t17_a_slave_whose_epoch_check_cuts_a_divergent_tail_keeps_it() {
    let d = diverged(Arc::new(SimFs::new())).await;
    let a_max = d.a.node.store().max_offset();
    // A restarts as B's slave from its configuration (no ChangeRole): its epoch check before
    // the first connect cuts what B never had.
    // The dirs bound first, so dropped last: after the nodes, also when the test fails.
    let Diverged { _dirs, _proxy, a, mut a_config, b, cut } = d;
    a.stop().await;
    a_config.node.role = Role::Slave;
    a_config.slave.master_ha = b.node.ha_addr().unwrap().to_string();
    a_config.slave.master_grpc = grpc_addr(&b);
    let a = ApiNode::from(
        TestNode::start_with_fs(a_config.clone(), Arc::new(SimFs::new()) as Arc<dyn FileSystem>)
            .await,
    );
    wait_until(10, "A's epoch check ran", || {
        a.node.status().master_link.is_some_and(|l| l.epoch_check.contains("truncated"))
    })
    .await;
    let link = a.node.status().master_link.unwrap();
    assert!(
        link.epoch_check.contains("kept in") && link.epoch_check.contains(TAILS_DIR),
        "{link:?}"
    );
    let files = tail_files(&a_config.node.data_dir);
    assert_eq!(files.len(), 1, "{files:?}");
    let f = TailFile::open(&files[0]).unwrap();
    f.verify().unwrap();
    assert_eq!((f.meta().start_offset, f.meta().end_offset), (cut, a_max));
    assert_eq!(f.meta().cause.reason, "epoch check");
    assert_eq!(status(&a).await.truncated_files, 1);
    a.stop().await;
    b.stop().await;
}
