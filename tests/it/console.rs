//! The cluster console (`/` on the metrics listener) in a real headless browser (Debian's
//! chromium driven by playwright-core, tests/browser/console.mjs): fed a document by hand, it
//! shows the groups with every name as text, follows a change without a reload, says when its
//! node lost etcd and when its event stream dropped; on a 2-group cluster with a real etcd it
//! shows both groups and a failover; `metrics.console = false` turns it off.
//! Screenshots go to `<target>/test-output/console/<test>/`, printed by each test.

use std::sync::Arc;
use std::time::Duration;

use hasync::app::StartOptions;
use hasync::config::Role;
use hasync::metrics::feed::Feed;
use hasync::store::fs::StdFs;
use serde_json::{Value, json};

use crate::metrics::http_get;
use crate::support::browser::{self, Browser, card};
use crate::support::group::Group;
use crate::support::ha::node_config;
use crate::support::node::TestNode;

/// A group's part of the document, as the topology producer writes it.
fn group(name: &str, epoch: u64, master: &str, members: &[&str]) -> Value {
    let member = |m: &&str| {
        let role = if *m == master { "master" } else { "slave" };
        json!({
            "name": m, "live": true, "voter": true, "role": role, "epoch": epoch,
            "max_offset": 4096, "readable_end": 4000, "lag_bytes": if role == "master" { 0 } else { 96 },
            "lag_ms": 0, "in_sync": true, "promised_epoch": epoch, "fenced": false,
            "lease_age_ms": 300, "last_record_epoch": epoch, "confirm_offset": 4000,
            "never_promote": false, "priority": 0, "advertise_grpc": "127.0.0.1:1",
            "advertise_ha": "127.0.0.1:2", "following": "", "master_frame_age_ms": null
        })
    };
    json!({
        "group": name, "bootstrapped": true, "epoch": epoch, "master": master,
        "phase": "stable", "voters": members, "k": 1, "mode": "sync", "leader": master,
        "leader_epoch": epoch, "failover_possible": true, "blocked_reason": null,
        "paused": false, "last_decision": format!("bootstrap at epoch {epoch}"),
        "last_controller": "n1", "confirm_offset": 4000, "chosen": null, "pending_request": null,
        "members": members.iter().map(member).collect::<Vec<_>>(),
        "recent_decisions": [{
            "epoch": epoch, "kind": "bootstrap", "old_master": null, "new_master": master,
            "rule": "SYNC k=1", "fencing": "", "blocked_reason": null, "loss_bound_bytes": null,
            "controller": "n1", "time_unix_ms": hasync::coordinator::unix_ms() - 60_000
        }]
    })
}

fn document(groups: Vec<Value>, connected: bool) -> String {
    let doc = json!({
        "node": "n1", "cluster": "c1", "coordinated": true, "connected": connected,
        "coordinator_error": if connected { Value::Null } else { json!("etcd unreachable: deadline") },
        "revision": 7, "time_unix_ms": hasync::coordinator::unix_ms(), "controller": "n1",
        "paused": false, "groups": groups
    });
    doc.to_string()
}

/// A feed as a producer leaves it: its document published (current).
fn feed(doc: String) -> Feed {
    let feed = Feed::new(String::new());
    feed.publish(doc);
    feed
}

/// A group name as hostile as etcd could hold: it must show as text, never as markup.
const HOSTILE: &str = "<img src=x onerror=alert(1)>";

/// A static master whose console is fed by hand (and its data dir).
async fn node_with_feed(console: bool, feed: Feed) -> (TestNode, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut c = node_config(dir.path(), Role::Master);
    c.metrics.console = console;
    let opts = StartOptions { console: Some(feed), ..StartOptions::default() };
    let node = TestNode::try_start_with(c, Arc::new(StdFs), opts).await.expect("start node");
    (node, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_shows_its_feed_as_text_live_and_says_when_it_is_stale() {
    const TEST: &str = "the_console_shows_its_feed_as_text_live_and_says_when_it_is_stale";
    if !browser::usable(TEST) {
        return;
    }
    let first = vec![group("g1", 3, "n1", &["n1", "n2"]), group(HOSTILE, 1, "h1", &["h1"])];
    let tx = feed(document(first, true));
    let (node, _dir) = node_with_feed(true, tx.clone()).await;
    let out = browser::output_dir(TEST);
    let steps = [
        format!("groups=g1,{HOSTILE}"),
        "master=g1:n1".into(),
        "banner=stale".into(),
        "banner=reconnecting".into(),
        "screenshot=console".into(),
    ];
    let url = format!("http://{}/", node.metrics_addr());
    let mut b = Browser::start(&url, &out, &steps, Duration::from_secs(20));

    let seen = b.step("groups", Duration::from_secs(40)).await;
    let g1 = card(&seen, "g1");
    assert_eq!((g1["master"].as_str(), g1["epoch"].as_u64()), (Some("n1"), Some(3)), "{g1:#}");
    let roles: Vec<_> = g1["members"].as_array().unwrap().iter().map(|m| &m["role"]).collect();
    assert_eq!(roles, ["master", "slave"], "the master first: {g1:#}");
    let slave = &g1["members"][1]["cells"];
    let row = ["n2", "slave", "3", "4,096", "4,000", "96 B", "0 ms", "yes", "300 ms"];
    assert_eq!(*slave, json!(row), "offsets, lag in bytes and time, in sync, lease");
    assert_eq!(g1["failover_text"], "possible now");
    assert_eq!(card(&seen, HOSTILE)["title"], HOSTILE, "the name as text");
    assert_eq!(seen["seen"]["images"], 0, "no markup from the document: {seen:#}");
    assert_eq!(seen["seen"]["json_link"], "console/topology.json");
    assert_eq!(seen["seen"]["stream"], "live");
    assert_eq!(seen["outside"], json!([]), "nothing fetched from another origin");
    assert_eq!(seen["errors"], json!([]), "no script error, no policy violation");

    // A failover: the card follows without a reload (the script checks that too).
    let mut after = group("g1", 4, "n2", &["n1", "n2"]);
    after["failover_possible"] = json!(false);
    after["blocked_reason"] = json!("hold_down");
    tx.publish(document(vec![after.clone(), group(HOSTILE, 1, "h1", &["h1"])], true));
    let seen = b.step("master", Duration::from_secs(30)).await;
    let g1 = card(&seen, "g1");
    assert_eq!((g1["master"].as_str(), g1["epoch"].as_u64()), (Some("n2"), Some(4)), "{g1:#}");
    let why = g1["failover_text"].as_str().unwrap();
    assert!(why.starts_with("not possible: ") && why.contains("(hold_down)"), "{why}");
    assert_eq!(seen["loads"], 1);

    // The node lost etcd: the banner says so, with the error.
    tx.publish(document(vec![after, group(HOSTILE, 1, "h1", &["h1"])], false));
    let seen = b.step("banner", Duration::from_secs(30)).await;
    let stale = seen["seen"]["banners"]["stale"].as_str().unwrap();
    assert!(stale.starts_with("This node lost etcd: the view may be stale since"), "{stale}");
    assert!(stale.contains("etcd unreachable: deadline"), "{stale}");

    // The node stops: the stream drops and the page says it is reconnecting.
    node.shutdown().await.unwrap();
    let seen = b.step("banner", Duration::from_secs(30)).await;
    assert_eq!(seen["seen"]["stream"], "reconnecting", "{seen:#}");
    assert_eq!(card(&seen, "g1")["master"], "n2", "the last view stays");
    let shot = b.step("screenshot", Duration::from_secs(30)).await;
    println!("console screenshot: {}", shot["path"].as_str().unwrap());
    b.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_console_false_turns_the_console_off() {
    let doc = document(vec![group("g1", 1, "n1", &["n1"])], true);
    let (off, _off_dir) = node_with_feed(false, feed(doc.clone())).await;
    for path in ["/", "/console/topology.json", "/console/events"] {
        let (status, _, body) = http_get(off.metrics_addr(), path, None).await;
        assert_eq!(status, 404, "{path}");
        assert!(body.contains("metrics.console = false"), "{path}: {body}");
    }
    let (status, _, body) = http_get(off.metrics_addr(), "/metrics", None).await;
    assert!(status == 200 && body.contains("hasync_build_info"), "{status} {body}");
    off.shutdown().await.unwrap();
    // On (the default), the same feed is served.
    let (on, _on_dir) = node_with_feed(true, feed(doc.clone())).await;
    let (status, headers, body) = http_get(on.metrics_addr(), "/console/topology.json", None).await;
    assert_eq!((status, headers["content-type"].as_str()), (200, "application/json"));
    assert_eq!(body, doc);
    let (status, headers, _) = http_get(on.metrics_addr(), "/", None).await;
    assert_eq!((status, headers["content-type"].as_str()), (200, "text/html; charset=utf-8"));
    on.shutdown().await.unwrap();
}

/// A running 2-group cluster on a real etcd, seen from g2's master: both groups show with
/// their masters; g1's master is killed and the page shows its failover (the new master, the
/// decision, the old master without a live record) without a reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_console_shows_a_two_group_cluster_and_follows_a_failover() {
    const TEST: &str = "the_console_shows_a_two_group_cluster_and_follows_a_failover";
    if !browser::usable(TEST) {
        return;
    }
    let mut a = Group::start(2).await;
    let b = a.another_with("g2", 2, |_| {}).await;
    let a0 = a.wait_stable_master(None, Duration::from_secs(20)).await;
    let b0 = b.wait_stable_master(None, Duration::from_secs(20)).await;
    assert_eq!((a0.master.as_deref(), b0.master.as_deref()), (Some("n1"), Some("g2-n1")));
    let out = browser::output_dir(TEST);
    let steps = [
        "groups=g1,g2".to_owned(),
        "master=g1:n1".into(),
        "decision=g1:failover".into(),
        "screenshot=console".into(),
    ];
    let url = format!("http://{}/", b.node("g2-n1").metrics_addr());
    let mut page = Browser::start(&url, &out, &steps, Duration::from_secs(40));

    let seen = page.step("groups", Duration::from_secs(60)).await;
    let g1 = card(&seen, "g1");
    assert_eq!(g1["master"], "n1", "{g1:#}");
    assert_eq!(g1["epoch"].as_u64(), Some(a0.epoch), "{g1:#}");
    let names: Vec<&str> =
        g1["members"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["n1", "n2"], "master first: {g1:#}");
    assert_eq!(card(&seen, "g2")["master"], "g2-n1");
    assert_eq!(seen["seen"]["node"], "g2-n1");
    assert_eq!(seen["seen"]["connected"], "true");
    assert_eq!(seen["outside"], json!([]), "nothing fetched from another origin");

    a.crash("n1").await;
    let a1 = a.wait_stable_master(Some("n1"), Duration::from_secs(40)).await;
    let seen = page.step("master", Duration::from_secs(60)).await;
    let g1 = card(&seen, "g1");
    assert_eq!(g1["master"].as_str(), a1.master.as_deref(), "{g1:#}");
    assert_eq!(g1["master"], "n2");
    assert!(g1["epoch"].as_u64() > Some(a0.epoch), "{g1:#}");
    assert_eq!(seen["loads"], 1, "no reload");
    let seen = page.step("decision", Duration::from_secs(60)).await;
    let failover = card(&seen, "g1")["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["kind"] == "failover")
        .cloned()
        .unwrap();
    assert_eq!(failover["epoch"].as_u64(), Some(a1.epoch), "{failover:#}");
    assert!(failover["text"].as_str().unwrap().contains("n1 → n2"), "{failover:#}");
    assert_eq!(card(&seen, "g2")["master"], "g2-n1", "g2 untouched");
    let shot = page.step("screenshot", Duration::from_secs(30)).await;
    let n1 = card(&shot, "g1")["members"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "n1")
        .cloned()
        .expect("the dead voter is still listed");
    assert_eq!(n1["live"], false, "{n1:#}");
    println!("console screenshot: {}", shot["path"].as_str().unwrap());
    page.finish().await;
}
