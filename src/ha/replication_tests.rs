//! The HA data plane end to end on 127.0.0.1: a real master and slaves over stores, and raw
//! peers that speak the wire bytes.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use crate::config::{EmptySlaveStart, ReplicaIdentity};
use crate::ha::status::CloseReason;
use crate::ha::test_peers::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slave_copy_is_byte_identical_across_several_files() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut o = master_opts();
    o.empty_slave_start = EmptySlaveStart::Earliest;
    let m = MasterNode::start(md.path(), o).await;
    put(&m.store, 100, 3000); // ~5 files
    assert!(m.store.max_offset() > 4 * SEG as u64);
    let s = SlaveNode::start(sd.path(), slave_opts(m.addr));
    wait_until(20, "slave catches up", || s.store.max_offset() == m.store.max_offset()).await;
    // Live appends keep flowing.
    put(&m.store, 30, 1000);
    wait_until(20, "slave catches up again", || s.store.max_offset() == m.store.max_offset()).await;
    assert_identical(&m.store, &s.store);
    assert_eq!(s.store.min_offset(), 0);
    assert_eq!(s.store.queue_offsets(), m.store.queue_offsets());
    wait_until(5, "ack recorded", || {
        m.master.replicas().first().is_some_and(|r| r.ack_offset == m.store.max_offset())
    })
    .await;
    let r = &m.master.replicas()[0];
    assert_eq!((r.lag_bytes, r.lag_millis), (0, 0));
    let link = s.slave.status();
    assert!(link.connected && link.last_error.is_none(), "{link:?}");
    assert_eq!(link.bytes_received, m.store.max_offset());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_slave_starts_at_the_masters_last_file() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let m = MasterNode::start(md.path(), master_opts()).await;
    put(&m.store, 60, 3000);
    let last_file = m.store.max_offset() - m.store.max_offset() % SEG as u64;
    assert!(last_file >= 2 * SEG as u64);
    let s = SlaveNode::start(sd.path(), slave_opts(m.addr));
    wait_until(20, "slave catches up", || s.store.max_offset() == m.store.max_offset()).await;
    assert_eq!(s.store.min_offset(), last_file, "only the last file, as upstream");
    assert_identical(&m.store, &s.store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_slave_resumes_at_its_own_offset_even_mid_record() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let m = MasterNode::start(md.path(), master_opts()).await;
    put(&m.store, 20, 1000);
    // The slave already holds a prefix that ends in the middle of a record.
    let slave_store = store_in(sd.path(), SEG);
    let cut = 5 * 1000 + 333;
    slave_store.append_at(0, &m.store.read(0, cut).unwrap().unwrap()).unwrap();
    let s = SlaveNode::start_with(slave_store, slave_opts(m.addr));
    wait_until(20, "slave catches up", || s.store.max_offset() == m.store.max_offset()).await;
    assert_identical(&m.store, &s.store);
    assert_eq!(m.master.replicas()[0].first_offset, cut as u64);
}

/// A raw peer: report, then read frames; every frame lies inside one segment file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frames_never_cross_a_file_and_match_the_wire_format() {
    let md = tempfile::tempdir().unwrap();
    let mut o = master_opts();
    o.empty_slave_start = EmptySlaveStart::Earliest;
    let m = MasterNode::start(md.path(), o).await;
    put(&m.store, 50, 3000);
    let mut c = TcpStream::connect(m.addr).await.unwrap();
    c.write_all(&[0, 0, 0, 0, 0, 0, 0, 0]).await.unwrap(); // report 0: empty slave
    let mut at = 0u64;
    let mut boundaries = 0;
    while at < m.store.max_offset() {
        let mut h = [0u8; 12];
        c.read_exact(&mut h).await.unwrap();
        let off = u64::from_be_bytes(h[..8].try_into().unwrap());
        let size = u32::from_be_bytes(h[8..].try_into().unwrap()) as u64;
        if size == 0 {
            continue; // heartbeat
        }
        assert_eq!(off, at);
        assert!(size <= 32 * 1024);
        assert_eq!(off / SEG as u64, (off + size - 1) / SEG as u64, "frame crosses a file");
        if (off + size).is_multiple_of(SEG as u64) {
            boundaries += 1;
        }
        let mut body = vec![0u8; size as usize];
        c.read_exact(&mut body).await.unwrap();
        assert_eq!(&body[..], &m.store.read(off, size as usize).unwrap().unwrap()[..]);
        at += size;
    }
    assert!(boundaries >= 2, "frames ended exactly at file boundaries");
    // The first frame's header, byte for byte: offset 0, size 32768.
    let mut c = TcpStream::connect(m.addr).await.unwrap();
    c.write_all(&hex("0000000000000000")).await.unwrap();
    let mut h = [0u8; 12];
    c.read_exact(&mut h).await.unwrap();
    assert_eq!(h.to_vec(), hex("000000000000000000008000"));
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeats_carry_the_next_offset() {
    let md = tempfile::tempdir().unwrap();
    let m = MasterNode::start(md.path(), master_opts()).await;
    let end = put(&m.store, 3, 100);
    let mut c = TcpStream::connect(m.addr).await.unwrap();
    c.write_all(&(end as i64).to_be_bytes()).await.unwrap(); // caught up
    let mut h = [0u8; 12];
    tokio::time::timeout(Duration::from_secs(3), c.read_exact(&mut h)).await.unwrap().unwrap();
    let mut expect = (end as i64).to_be_bytes().to_vec();
    expect.extend_from_slice(&[0, 0, 0, 0]);
    assert_eq!(h.to_vec(), expect, "heartbeat = [next offset][size 0]");
}

/// The slave's report on the wire: 8 bytes, its max offset, big-endian, sent at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slave_reports_its_max_offset_at_once() {
    let sd = tempfile::tempdir().unwrap();
    let store = store_in(sd.path(), SEG);
    store.append_at(0x1_4000_1000 - 0x1_4000_1000 % SEG as u64, &[7u8; 0x1000]).unwrap();
    let fake = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut o = slave_opts(fake.local_addr().unwrap());
    o.report_interval = Duration::from_secs(60); // only the on-connect report can arrive in time
    let s = SlaveNode::start_with(store, o);
    let (mut c, _) = fake.accept().await.unwrap();
    let mut r = [0u8; 8];
    tokio::time::timeout(Duration::from_millis(1000), c.read_exact(&mut r)).await.unwrap().unwrap();
    assert_eq!(r.to_vec(), hex("0000000140001000"));
    s.stop().await;
}

/// A fake master sending a frame at the wrong offset: the slave writes nothing, disconnects and
/// reconnects.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mismatched_frame_offset_disconnects_without_writing() {
    let sd = tempfile::tempdir().unwrap();
    let store = store_in(sd.path(), SEG);
    store.append_at(0, b"0123456789").unwrap();
    let fake = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let s = SlaveNode::start_with(store, slave_opts(fake.local_addr().unwrap()));
    for _ in 0..2 {
        let (mut c, _) = fake.accept().await.unwrap();
        let mut r = [0u8; 8];
        c.read_exact(&mut r).await.unwrap();
        assert_eq!(i64::from_be_bytes(r), 10);
        let mut frame = 12i64.to_be_bytes().to_vec(); // wrong: the slave is at 10
        frame.extend_from_slice(&4i32.to_be_bytes());
        frame.extend_from_slice(b"abcd");
        c.write_all(&frame).await.unwrap();
        let mut rest = Vec::new();
        let _ =
            tokio::time::timeout(Duration::from_secs(3), c.read_to_end(&mut rest)).await.unwrap();
    }
    assert_eq!(s.store.max_offset(), 10, "nothing written");
    let st = s.slave.status();
    assert!(st.reconnects >= 1, "{st:?}");
    assert!(st.last_error.as_deref().unwrap().contains("master pushed offset 12"), "{st:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_crossing_the_slaves_segment_is_a_segment_size_mismatch() {
    let sd = tempfile::tempdir().unwrap();
    let store = store_in(sd.path(), SEG);
    store.append_at(0, &vec![1u8; SEG - 10]).unwrap();
    let fake = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let s = SlaveNode::start_with(store, slave_opts(fake.local_addr().unwrap()));
    let (mut c, _) = fake.accept().await.unwrap();
    let mut r = [0u8; 8];
    c.read_exact(&mut r).await.unwrap();
    let mut frame = ((SEG - 10) as i64).to_be_bytes().to_vec();
    frame.extend_from_slice(&20i32.to_be_bytes());
    frame.extend_from_slice(&[2u8; 20]);
    c.write_all(&frame).await.unwrap();
    wait_until(5, "mismatch reported", || s.slave.status().last_error.is_some()).await;
    let err = s.slave.status().last_error.unwrap();
    assert!(err.contains("segment-size mismatch"), "{err}");
    assert_eq!(s.store.max_offset(), SEG as u64 - 10);
}

/// Garbage on the HA port, a backwards ack, an ack beyond what was sent, or silence: closed,
/// and never a replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rogue_clients_are_closed_and_never_counted() {
    let md = tempfile::tempdir().unwrap();
    let mut o = master_opts();
    o.housekeeping_interval = Duration::from_millis(500);
    let m = MasterNode::start(md.path(), o).await;
    let end = put(&m.store, 5, 100) as i64;
    // An HTTP request.
    let mut c = TcpStream::connect(m.addr).await.unwrap();
    c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.unwrap();
    assert!(closed(c).await);
    // A negative report.
    let mut c = TcpStream::connect(m.addr).await.unwrap();
    c.write_all(&(-5i64).to_be_bytes()).await.unwrap();
    assert!(closed(c).await);
    // A report beyond the master's max offset.
    let mut c = TcpStream::connect(m.addr).await.unwrap();
    c.write_all(&(end + 1000).to_be_bytes()).await.unwrap();
    assert!(closed(c).await);
    // An ack beyond what was sent (the slave is at `end`, nothing more was sent).
    let mut c = TcpStream::connect(m.addr).await.unwrap();
    c.write_all(&end.to_be_bytes()).await.unwrap();
    wait_until(5, "registered", || m.master.replicas().len() == 1).await;
    c.write_all(&(end + 1).to_be_bytes()).await.unwrap();
    assert!(closed(c).await);
    // A backwards ack.
    let mut c = TcpStream::connect(m.addr).await.unwrap();
    c.write_all(&end.to_be_bytes()).await.unwrap();
    wait_until(5, "registered", || m.master.replicas().len() == 1).await;
    c.write_all(&(end - 1).to_be_bytes()).await.unwrap();
    assert!(closed(c).await);
    // Silence.
    let c = TcpStream::connect(m.addr).await.unwrap();
    assert!(closed(c).await);
    wait_until(5, "all closed", || m.master.connection_count() == 0).await;
    assert!(m.master.replicas().is_empty());
    let counts = m.master.closed();
    assert_eq!(counts.get(&CloseReason::BadReport), Some(&3), "{counts:?}");
    assert_eq!(counts.get(&CloseReason::BadAck), Some(&2), "{counts:?}");
    // Issue 15: silence before the first report closes after twice the heartbeat interval.
    assert_eq!(counts.get(&CloseReason::NoReport), Some(&1), "{counts:?}");
}

/// Whether the master closes `c` within 5 s.
async fn closed(mut c: TcpStream) -> bool {
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), c.read_to_end(&mut rest)).await.is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_behind_its_slave_never_streams_over_the_slaves_bytes() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let m = MasterNode::start(md.path(), master_opts()).await;
    put(&m.store, 10, 500);
    // The slave holds everything the master has, and more (the master lost its tail).
    let slave_store = store_in(sd.path(), SEG);
    slave_store.append_at(0, &m.store.read(0, usize::MAX).unwrap().unwrap()).unwrap();
    slave_store.append_at(m.store.max_offset(), b"the slave's own tail").unwrap();
    // All of it in the first file, so one read returns every byte.
    assert!(slave_store.max_offset() < SEG as u64);
    let before = slave_store.read(0, usize::MAX).unwrap().unwrap().to_vec();
    let slave_store_end = slave_store.max_offset();
    let s = SlaveNode::start_with(slave_store, slave_opts(m.addr));
    wait_until(5, "refusal seen", || s.slave.status().last_error.is_some()).await;
    let err = s.slave.status().last_error.unwrap();
    assert!(err.contains("master is behind this slave"), "{err}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(s.store.max_offset(), slave_store_end, "slave bytes untouched");
    assert_eq!(
        s.store.read(0, usize::MAX).unwrap().unwrap().to_vec(),
        before,
        "slave bytes untouched"
    );
    assert!(m.master.replicas().is_empty());
    assert!(m.master.closed().contains_key(&CloseReason::BadReport));
}

async fn raw_slave_from(ip: &str, master: std::net::SocketAddr, report: i64) -> TcpStream {
    let sock = TcpSocket::new_v4().unwrap();
    sock.bind(format!("{ip}:0").parse().unwrap()).unwrap();
    let mut c = sock.connect(master).await.unwrap();
    c.write_all(&report.to_be_bytes()).await.unwrap();
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_identity_ip_counts_one_replica_per_host() {
    let md = tempfile::tempdir().unwrap();
    let mut o = master_opts();
    o.replica_identity = ReplicaIdentity::Ip;
    let m = MasterNode::start(md.path(), o).await;
    let end = put(&m.store, 3, 100) as i64;
    let _a = raw_slave_from("127.0.0.2", m.addr, end).await;
    let _b = raw_slave_from("127.0.0.3", m.addr, end).await;
    wait_until(5, "two replicas", || m.master.replicas().len() == 2).await;
    // A reconnect from 127.0.0.2 replaces its old connection: still two replicas.
    let _a2 = raw_slave_from("127.0.0.2", m.addr, end).await;
    wait_until(5, "old connection replaced", || {
        m.master.closed().get(&CloseReason::Replaced) == Some(&1)
    })
    .await;
    assert_eq!(m.master.connection_count(), 2);
    let reps = m.master.replicas();
    assert_eq!(reps.len(), 2, "{reps:?}");
    let ips: Vec<String> = reps.iter().map(|r| r.address.ip().to_string()).collect();
    assert!(ips.contains(&"127.0.0.2".to_owned()) && ips.contains(&"127.0.0.3".to_owned()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_limit_and_allow_list_hold() {
    let md = tempfile::tempdir().unwrap();
    let mut o = master_opts();
    o.max_connections = 2;
    o.allow_list = vec!["127.0.0.0/30".parse().unwrap()];
    let m = MasterNode::start(md.path(), o).await;
    let end = put(&m.store, 3, 100) as i64;
    let mut refused = raw_slave_from("127.0.0.9", m.addr, end).await;
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(3), refused.read_to_end(&mut rest))
        .await
        .unwrap()
        .ok();
    let _a = raw_slave_from("127.0.0.1", m.addr, end).await;
    let _b = raw_slave_from("127.0.0.2", m.addr, end).await;
    wait_until(5, "two replicas", || m.master.replicas().len() == 2).await;
    let mut over = raw_slave_from("127.0.0.3", m.addr, end).await;
    tokio::time::timeout(Duration::from_secs(3), over.read_to_end(&mut rest)).await.unwrap().ok();
    let counts = m.master.closed();
    assert_eq!(counts.get(&CloseReason::AllowList), Some(&1), "{counts:?}");
    assert_eq!(counts.get(&CloseReason::Limit), Some(&1), "{counts:?}");
    assert_eq!(m.master.replicas().len(), 2);
}

/// A slave whose segment size is a multiple of the master's: frames never cross its files, but
/// the master's blank records do not end at its file ends. Caught, nothing kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_larger_slave_segment_is_a_segment_size_mismatch() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut o = master_opts();
    o.empty_slave_start = EmptySlaveStart::Earliest;
    let m = MasterNode::start(md.path(), o).await;
    put(&m.store, 40, 3000);
    assert!(m.store.max_offset() > SEG as u64);
    let store = store_in(sd.path(), 2 * SEG);
    let s = SlaveNode::start_with(store, slave_opts(m.addr));
    wait_until(10, "mismatch reported", || {
        s.slave.status().last_error.is_some_and(|e| e.contains("segment-size"))
    })
    .await;
    assert!(s.store.max_offset() < SEG as u64, "the blank's bytes were not kept");
    assert!(s.store.records_from(0).all(|r| r.is_ok()));
}

/// A slave that crashed before its first bytes reached the disk keeps an empty first file at
/// 0; the master starts it elsewhere (its last file). It must take that offset, not loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_slave_with_a_leftover_empty_file_starts_where_the_master_says() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let m = MasterNode::start(md.path(), master_opts()).await;
    put(&m.store, 40, 3000);
    let last_file = m.store.max_offset() - m.store.max_offset() % SEG as u64;
    assert!(last_file > 0);
    {
        let store = store_in(sd.path(), SEG);
        store.append_at(0, b"x").unwrap();
    }
    // Simulate the crash: the byte never reached the disk; recovery keeps the empty file.
    let f = sd.path().join("commitlog").join(crate::store::mapped_file::file_name(0));
    std::fs::write(&f, vec![0u8; SEG]).unwrap();
    let store = store_in(sd.path(), SEG);
    assert!(store.is_empty() && store.file_at(0).is_some());
    let s = SlaveNode::start_with(store, slave_opts(m.addr));
    wait_until(10, "caught up", || s.store.max_offset() == m.store.max_offset()).await;
    assert_eq!(s.store.min_offset(), last_file);
    assert_identical(&m.store, &s.store);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slave_below_the_masters_min_offset_is_told_to_resync() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let m = MasterNode::start(md.path(), master_opts()).await;
    let slave_store = store_in(sd.path(), SEG);
    put(&m.store, 5, 1000);
    slave_store.append_at(0, &m.store.read(0, usize::MAX).unwrap().unwrap()).unwrap();
    put(&m.store, 60, 3000);
    let removed =
        m.store.run_retention(std::time::SystemTime::now() + Duration::from_secs(400_000)).unwrap();
    assert!(!removed.is_empty() && m.store.min_offset() > slave_store.max_offset());
    let before = slave_store.max_offset();
    let s = SlaveNode::start_with(slave_store, slave_opts(m.addr));
    wait_until(5, "refusal seen", || s.slave.status().last_error.is_some()).await;
    let err = s.slave.status().last_error.unwrap();
    assert!(err.contains("full resync"), "{err}");
    assert_eq!(s.store.max_offset(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_failure_is_fatal_for_the_connection_and_surfaced() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let m = MasterNode::start(md.path(), master_opts()).await;
    put(&m.store, 3, 100);
    let fs = std::sync::Arc::new(crate::store::fs::SimFs::new());
    fs.set_disk_full(true);
    let store = store_on(std::sync::Arc::clone(&fs) as _, sd.path(), SEG).unwrap();
    let s = SlaveNode::start_with(store, slave_opts(m.addr));
    wait_until(5, "append failure surfaced", || {
        s.slave
            .status()
            .last_error
            .is_some_and(|e| e.contains("append failed") && e.contains("disk full"))
    })
    .await;
    assert!(s.store.is_empty());
    fs.set_disk_full(false);
    wait_until(10, "recovers once there is room", || s.store.max_offset() == m.store.max_offset())
        .await;
}

/// A frame too large for the slave's read buffer is an error at once, not a livelock; a
/// heartbeat never creates a file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_frames_are_refused_and_heartbeats_create_nothing() {
    let sd = tempfile::tempdir().unwrap();
    let fake = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut o = slave_opts(fake.local_addr().unwrap());
    o.read_buffer_size = 64 * 1024;
    let s = SlaveNode::start(sd.path(), o);
    let (mut c, _) = fake.accept().await.unwrap();
    let mut r = [0u8; 8];
    c.read_exact(&mut r).await.unwrap();
    c.write_all(&crate::ha::codec::encode_heartbeat(3 * SEG as i64)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(s.store.is_empty() && s.store.file_at(3 * SEG as u64).is_none(), "no file");
    assert!(s.slave.status().last_error.is_none());
    c.write_all(&crate::ha::codec::encode_transfer_header(3 * SEG as i64, 64 * 1024))
        .await
        .unwrap();
    wait_until(5, "refused", || s.slave.status().last_error.is_some()).await;
    let err = s.slave.status().last_error.unwrap();
    assert!(err.contains("cannot fit"), "{err}");
}

/// `source-address` picks the slave's source IP: two real slaves from 127.0.0.2 and 127.0.0.3
/// are two replicas under `replica-identity = "ip"`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slaves_bind_their_source_address() {
    let (md, s1, s2) =
        (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut o = master_opts();
    o.replica_identity = ReplicaIdentity::Ip;
    let m = MasterNode::start(md.path(), o).await;
    put(&m.store, 5, 100);
    let mut slaves = Vec::new();
    for (dir, ip) in [(&s1, "127.0.0.2"), (&s2, "127.0.0.3")] {
        let mut so = slave_opts(m.addr);
        so.source_address = Some(ip.parse().unwrap());
        slaves.push(SlaveNode::start(dir.path(), so));
    }
    wait_until(10, "both caught up", || {
        slaves.iter().all(|s| s.store.max_offset() == m.store.max_offset())
    })
    .await;
    let mut ips: Vec<String> =
        m.master.replicas().iter().map(|r| r.address.ip().to_string()).collect();
    ips.sort();
    assert_eq!(ips, ["127.0.0.2", "127.0.0.3"]);
}

/// A master that closes the connection at accept (allow-list, connection limit) never accepted
/// the slave's report: that is a failure for the backoff (doubling), not a session that got as
/// far as its first report (which would reset the wait to its floor and retry at that pace
/// forever). With a 40 ms floor doubling to 640 ms, a slave makes at most 8 attempts in 1.5 s;
/// with a reset after every attempt it would make about 35. A slow machine only makes fewer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_refused_at_accept_does_not_reset_the_backoff() {
    let (md, sd) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut mo = master_opts();
    mo.allow_list = vec!["10.0.0.0/8".parse().unwrap()];
    let m = MasterNode::start(md.path(), mo).await;
    let mut so = slave_opts(m.addr);
    so.reconnect_backoff = Duration::from_millis(40);
    so.reconnect_backoff_max = Duration::from_millis(640);
    let s = SlaveNode::start(sd.path(), so);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let st = s.slave.status();
    assert!(st.reconnects <= 8, "{} reconnects in 1.5 s: the backoff was reset", st.reconnects);
    assert!(st.reconnects >= 1, "{st:?}");
    s.stop().await;
}

/// Every append is in the append clock: a replica that stops acking shows the age of its first
/// unacked byte in time, never more, and less by at most about one resolution (10 ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lag_in_time_of_a_stalled_replica_counts_every_append_and_never_reads_high() {
    let md = tempfile::tempdir().unwrap();
    let m = MasterNode::start(md.path(), master_opts()).await;
    let acked = put(&m.store, 1, 100) as i64;
    // Holds everything of the first put and never acks more.
    let _peer = raw_slave_from("127.0.0.1", m.addr, acked).await;
    wait_until(5, "replica registered", || m.master.replicas().len() == 1).await;
    let unacked_since = std::time::Instant::now();
    // 1 ms apart for about 40 ms: several appends in each 10 ms resolution.
    for _ in 0..40 {
        put(&m.store, 1, 100);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    let r = m.master.replicas().remove(0);
    let at_most = unacked_since.elapsed().as_millis() as u64;
    assert_eq!(r.ack_offset, acked as u64);
    assert!(r.lag_bytes > 0, "{r:?}");
    assert!(r.lag_millis <= at_most, "lag {} ms read high: at most {at_most} ms", r.lag_millis);
    // The last append is at least 150 ms old; the first unacked byte is older.
    assert!(r.lag_millis >= 100, "lag {} ms missed appends (at most {at_most} ms)", r.lag_millis);
}

/// Puts push their frames from their own task (`Master::push`, when everything sent is acked)
/// while the writer runs too (it alone fills the socket while the slave does not read for a
/// while, then puts come one by one and push): the stream stays one contiguous run of frames
/// holding the store's bytes, each heartbeat carries the offset the next frame starts at, and
/// pushes did write. (A push that leaves the rest of its frame to the writer is
/// `link::tests`'s.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushed_and_written_frames_make_one_contiguous_stream_and_idle_puts_push() {
    let md = tempfile::tempdir().unwrap();
    let mut o = master_opts();
    o.empty_slave_start = EmptySlaveStart::Earliest;
    o.heartbeat_interval = Duration::from_millis(20);
    let m = MasterNode::start(md.path(), o).await;
    let peer = TcpSocket::new_v4().unwrap();
    peer.set_recv_buffer_size(4096).unwrap();
    let mut c = peer.connect(m.addr).await.unwrap();
    c.write_all(&[0; 8]).await.unwrap(); // report 0: empty slave
    wait_until(10, "the stream starts", || m.master.replicas().len() == 1).await;
    let (store, master) = (std::sync::Arc::clone(&m.store), std::sync::Arc::clone(&m.master));
    let mut puts = tokio::spawn(async move {
        for i in 0..3000usize {
            put(&store, 1 + i % 3, 500 + (i % 7) * 300);
            master.push();
            // Fast at first (the socket fills), then paced: the link is idle between puts.
            if i % 200 == 0 || i >= 2800 {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        store.max_offset()
    });
    // Not reading for a while: the socket fills under the pushes.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut at = 0u64;
    let mut end = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while end.is_none_or(|e| at < e) {
        assert!(tokio::time::Instant::now() < deadline, "stream stalled at {at}");
        if end.is_none() && puts.is_finished() {
            end = Some((&mut puts).await.unwrap());
            continue;
        }
        let mut h = [0u8; 12];
        tokio::time::timeout(Duration::from_secs(10), c.read_exact(&mut h)).await.unwrap().unwrap();
        let off = u64::from_be_bytes(h[..8].try_into().unwrap());
        let size = u32::from_be_bytes(h[8..].try_into().unwrap()) as u64;
        assert_eq!(off, at, "a frame or heartbeat carries the offset where the last frame ended");
        let mut body = vec![0u8; size as usize];
        c.read_exact(&mut body).await.unwrap();
        if size > 0 {
            assert_eq!(&body[..], &m.store.read(off, size as usize).unwrap().unwrap()[..]);
            assert_eq!(off / SEG as u64, (off + size - 1) / SEG as u64, "frame crosses a file");
        }
        at += size;
        // Acked as a slave does: a put pushes only when everything sent is acked.
        c.write_all(&crate::ha::codec::encode_report(at as i64)).await.unwrap();
    }
    assert_eq!(Some(at), end);
    assert!(m.master.pushed_frames() > 0, "puts on an idle, acked link push their frames");
    assert!(at > 8 << 20, "more bytes than the socket buffers hold: {at}");
}
