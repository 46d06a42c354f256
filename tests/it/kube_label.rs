//! The pod role label's HTTPS client against a fake API server (issue 17): the PATCH, its
//! path, Content-Type, bearer token (read again at every request) and merge-patch body; a
//! refused PATCH (403) is logged and retried until the API server accepts it, and a change of
//! the wanted label is PATCHed too.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use hasync::coordinator::kube::{KubeClient, KubeError, KubeTarget, run_role_label};
use hasync::coordinator::view::{GroupView, RoleLabel, StateRole};
use tokio_util::sync::CancellationToken;
use tracing::instrument::WithSubscriber;

use crate::support::kube::FakeApiServer;

const FORBIDDEN: &str = r#"{"kind":"Status","apiVersion":"v1","status":"Failure","message":"pods \"hasync-0\" is forbidden: User \"system:serviceaccount:brokers:default\" cannot patch resource \"pods\"","reason":"Forbidden","code":403}"#;

fn client(api: &FakeApiServer, pod: &str) -> KubeClient {
    let target = KubeTarget::resolve(&api.kubernetes_config(pod), &|_| None).unwrap();
    KubeClient::new(target).unwrap()
}

#[tokio::test]
async fn the_label_patch_carries_the_token_and_a_merge_patch_to_the_pods_path() {
    let api = FakeApiServer::start("brokers", "tok-1").await;
    let c = client(&api, "hasync-0");
    c.set_role_label(RoleLabel::Master).await.unwrap();
    let seen = api.seen();
    assert_eq!(seen.len(), 1, "{seen:#?}");
    let r = &seen[0];
    assert_eq!(r.method, "PATCH");
    assert_eq!(r.path, "/api/v1/namespaces/brokers/pods/hasync-0");
    assert_eq!(r.header("content-type"), Some("application/merge-patch+json"));
    assert_eq!(r.header("authorization"), Some("Bearer tok-1"));
    assert_eq!(r.header("host"), Some(api.addr.to_string().as_str()));
    assert_eq!(r.json(), serde_json::json!({"metadata": {"labels": {"hasync.io/role": "master"}}}));

    // The token rotates (projected service account tokens do): the next request has the new one.
    api.set_token("tok-2");
    c.set_role_label(RoleLabel::Slave).await.unwrap();
    let r = &api.seen()[1];
    assert_eq!(r.header("authorization"), Some("Bearer tok-2"));
    assert_eq!(r.json()["metadata"]["labels"]["hasync.io/role"], "slave");
}

#[tokio::test]
async fn an_untrusted_api_server_or_a_refusal_is_an_error_naming_it() {
    let api = FakeApiServer::start("brokers", "tok").await;
    let c = client(&api, "hasync-0");
    api.answer_next(403, FORBIDDEN);
    let e = c.set_role_label(RoleLabel::Master).await.unwrap_err();
    assert!(matches!(e, KubeError::Refused { status: 403, .. }), "{e:?}");
    let shown = e.to_string();
    assert!(shown.contains("403") && shown.contains("cannot patch resource"), "{shown}");
    assert!(shown.contains("/api/v1/namespaces/brokers/pods/hasync-0"), "{shown}");

    // Another server's certificate as the CA: the handshake fails and no request is sent.
    let other = FakeApiServer::start("brokers", "tok").await;
    std::fs::copy(other.dir.path().join("ca.crt"), api.dir.path().join("ca.crt")).unwrap();
    let n = api.seen().len();
    let e = client(&api, "hasync-0").set_role_label(RoleLabel::Master).await.unwrap_err();
    assert!(e.to_string().contains("TLS handshake"), "{e}");
    assert_eq!(api.seen().len(), n, "a request went to an unverified server");
}

/// Collects formatted log lines.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn view(role: StateRole) -> GroupView {
    GroupView { role: Some(role), epoch: 1, master: Some("n1".into()), lease_until: None }
}

#[tokio::test]
async fn a_refused_patch_is_logged_and_retried_until_accepted() {
    let api = FakeApiServer::start("brokers", "tok").await;
    api.answer_next(403, FORBIDDEN);
    api.answer_next(403, FORBIDDEN);
    let (tx, rx) = tokio::sync::watch::channel(GroupView::default());
    let lines = Lines::default();
    let l = lines.clone();
    let subscriber = tracing_subscriber::fmt().with_writer(move || l.clone()).finish();
    // With exactly one scoped dispatcher alive, tracing-core registers a callsite first hit on
    // another thread (another test's warn!, with no subscriber there) against that thread's
    // default only, and caches "never" for everyone. A second one makes it ask all of them.
    let _second = tracing::Dispatch::new(tracing_subscriber::registry());
    let cancel = CancellationToken::new();
    let task = tokio::spawn(
        run_role_label(client(&api, "hasync-0"), rx, cancel.clone()).with_subscriber(subscriber),
    );

    // Nothing is known yet: no PATCH.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(api.seen().is_empty(), "{:#?}", api.seen());

    // Master: refused twice (waits of 500ms, then 1s), accepted the third time.
    tx.send_replace(view(StateRole::Master));
    let seen = api.wait_until(Duration::from_secs(10), |s| s.len() >= 3).await;
    assert!(seen.iter().all(|s| s.json()["metadata"]["labels"]["hasync.io/role"] == "master"));
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    assert_eq!(text.matches("cannot set the pod role label; retrying").count(), 2, "{text}");
    assert!(text.contains("403") && text.contains("cannot patch resource"), "{text}");
    // Accepted: no more requests while the label stays (the view changes every renewal).
    tx.send_replace(GroupView { epoch: 2, ..view(StateRole::Master) });
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(api.seen().len(), 3, "{:#?}", api.seen());

    // The node stops being the master of the state: slave.
    tx.send_replace(view(StateRole::Other));
    api.wait_until(Duration::from_secs(5), |s| s.len() >= 4).await;
    assert_eq!(api.last_label("hasync-0").as_deref(), Some("slave"));

    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(5), task).await.expect("stops").unwrap();
}

#[tokio::test]
async fn a_label_change_during_the_retry_wait_is_sent_at_once() {
    let api = FakeApiServer::start("brokers", "tok").await;
    for _ in 0..6 {
        api.answer_next(500, "overloaded");
    }
    let (tx, rx) = tokio::sync::watch::channel(view(StateRole::Master));
    let cancel = CancellationToken::new();
    let task = tokio::spawn(run_role_label(client(&api, "hasync-0"), rx, cancel.clone()));
    // Failing: waits 0.5s, 1s, 2s, 4s ... after 4 attempts the next wait is 8s.
    api.wait_until(Duration::from_secs(10), |s| s.len() >= 4).await;
    tx.send_replace(view(StateRole::Following));
    let t0 = std::time::Instant::now();
    api.wait_until(Duration::from_secs(3), |s| s.len() >= 5).await;
    assert!(t0.elapsed() < Duration::from_secs(3));
    assert_eq!(api.last_label("hasync-0").as_deref(), Some("slave"));
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(5), task).await.expect("stops").unwrap();
}
