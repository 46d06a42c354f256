//! The Cluster service over a real server with the token check, against a fake
//! [`ClusterApi`]: calls reach the implementation, its errors keep their codes, the read-only
//! methods go without the token and the requests need it, and a node without a coordinator
//! answers FAILED_PRECONDITION.

use std::sync::Mutex;

use tonic::Code;
use tonic::transport::Channel;

use super::*;
use crate::control::auth::AuthLayer;
use crate::control::pb::cluster_client::ClusterClient;

/// Answers from fixed values and records the calls.
#[derive(Debug, Default)]
struct FakeApi {
    calls: Mutex<Vec<String>>,
}

impl FakeApi {
    fn call(&self, what: String) {
        self.calls.lock().unwrap().push(what);
    }
}

impl ClusterApi for FakeApi {
    fn status<'a>(&'a self, group: Option<&'a str>) -> ClusterFuture<'a, pb::ClusterStatus> {
        self.call(format!("status {group:?}"));
        Box::pin(async move {
            if group == Some("nope") {
                return Err(ClusterError::NotFound("group nope has no records".into()));
            }
            let g = pb::GroupStatus { group: "g1".into(), epoch: 3, ..Default::default() };
            Ok(pb::ClusterStatus { groups: vec![g], ..Default::default() })
        })
    }

    fn history<'a>(
        &'a self,
        group: &'a str,
        limit: usize,
    ) -> ClusterFuture<'a, pb::GetHistoryResponse> {
        self.call(format!("history {group} {limit}"));
        Box::pin(async move { Ok(pb::GetHistoryResponse { group: group.into(), entries: vec![] }) })
    }

    fn switchover(&self, r: pb::SwitchoverRequest) -> ClusterFuture<'_, pb::OperatorOutcome> {
        self.call(format!("switchover {} {}", r.group, r.to));
        Box::pin(async move {
            if r.to == "slow" {
                return Err(ClusterError::Timeout("request r1 is still pending".into()));
            }
            Ok(pb::OperatorOutcome { id: "r1".into(), done: true, epoch: 4, ..Default::default() })
        })
    }

    fn failover(&self, r: pb::FailoverRequest) -> ClusterFuture<'_, pb::OperatorOutcome> {
        self.call(format!("failover {} {} {}", r.group, r.to, r.accept_data_loss));
        Box::pin(async move { Ok(pb::OperatorOutcome { id: "r2".into(), ..Default::default() }) })
    }

    fn pause<'a>(&'a self, group: Option<&'a str>) -> ClusterFuture<'a, pb::PauseState> {
        self.call(format!("pause {group:?}"));
        Box::pin(
            async move { Ok(pb::PauseState { paused: true, changed: true, ..Default::default() }) },
        )
    }

    fn resume<'a>(&'a self, group: Option<&'a str>) -> ClusterFuture<'a, pb::PauseState> {
        self.call(format!("resume {group:?}"));
        Box::pin(async move { Ok(pb::PauseState::default()) })
    }

    fn change_group(&self, r: pb::ChangeGroupRequest) -> ClusterFuture<'_, pb::ChangeGroupOutcome> {
        self.call(format!("change {} {:?}", r.group, r.k));
        Box::pin(async move { Ok(pb::ChangeGroupOutcome { done: true, ..Default::default() }) })
    }

    fn watch_topology(
        &self,
        r: pb::WatchTopologyRequest,
    ) -> ClusterFuture<'_, crate::control::cluster::TopologyStream> {
        self.call(format!("watch {}", r.from_revision));
        Box::pin(async move {
            let (tx, rx) = tokio::sync::mpsc::channel(1);
            tx.send(pb::TopologyUpdate { revision: 7, ..Default::default() }).await.unwrap();
            Ok(rx)
        })
    }

    fn remove_group<'a>(&'a self, group: &'a str) -> ClusterFuture<'a, pb::RemoveGroupResponse> {
        self.call(format!("remove {group}"));
        Box::pin(async move {
            if group == "live" {
                let live = "group live has live members: n1; stop them first".into();
                return Err(ClusterError::FailedPrecondition(live));
            }
            Ok(pb::RemoveGroupResponse { group: group.into(), removed_keys: 3, revision: 9 })
        })
    }
}

/// Serves the Cluster service (behind the token check with `token`) on 127.0.0.1:0.
async fn serve(
    api: Option<Arc<dyn ClusterApi>>,
    token: &str,
) -> (Channel, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let router = tonic::transport::Server::builder()
        .layer(AuthLayer::new(token, false))
        .add_service(pb::cluster_server::ClusterServer::new(ClusterService::new(
            api,
            None,
            tokio_util::sync::CancellationToken::new(),
        )));
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let task = tokio::spawn(async move {
        router.serve_with_incoming(incoming).await.unwrap();
    });
    let channel = Channel::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    (channel, task)
}

fn with_token<T>(msg: T, token: &str) -> Request<T> {
    let mut r = Request::new(msg);
    r.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
    r
}

fn unauthenticated<T>(r: Result<T, Status>) {
    let e = r.map(drop).unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
}

fn check<T>(r: Result<T, Status>) {
    let e = r.map(drop).unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert_eq!(e.message(), NO_COORDINATOR);
}

#[tokio::test]
async fn calls_reach_the_api_and_its_errors_keep_their_codes() {
    let api = Arc::new(FakeApi::default());
    let (channel, task) = serve(Some(Arc::clone(&api) as Arc<dyn ClusterApi>), "").await;
    let mut c = ClusterClient::new(channel);
    let all = c.get_cluster_status(pb::GetClusterStatusRequest::default()).await.unwrap();
    assert_eq!(all.into_inner().groups[0].epoch, 3);
    let one = pb::GetClusterStatusRequest { group: "nope".into() };
    assert_eq!(c.get_cluster_status(one).await.unwrap_err().code(), Code::NotFound);
    let h = pb::GetHistoryRequest { group: String::new(), limit: 0 };
    let e = c.get_history(h).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    c.get_history(pb::GetHistoryRequest { group: "g1".into(), limit: 5 }).await.unwrap();
    let s = pb::SwitchoverRequest { group: "g1".into(), to: "n2".into(), timeout_ms: 0 };
    assert_eq!(c.switchover(s).await.unwrap().into_inner().epoch, 4);
    let slow = pb::SwitchoverRequest { group: "g1".into(), to: "slow".into(), timeout_ms: 0 };
    let e = c.switchover(slow).await.unwrap_err();
    assert_eq!(e.code(), Code::DeadlineExceeded);
    assert!(e.message().contains("still pending"), "{e:?}");
    c.pause(pb::PauseRequest { group: " ".into() }).await.unwrap();
    c.resume(pb::ResumeRequest { group: "g1".into() }).await.unwrap();
    let calls = api.calls.lock().unwrap().clone();
    assert_eq!(
        calls,
        [
            "status None",
            "status Some(\"nope\")",
            "history g1 5",
            "switchover g1 n2",
            "switchover g1 slow",
            "pause None",
            "resume Some(\"g1\")"
        ]
    );
    task.abort();
}

#[tokio::test]
async fn reads_go_without_the_token_and_requests_need_it() {
    let api = Arc::new(FakeApi::default());
    let (channel, task) = serve(Some(Arc::clone(&api) as Arc<dyn ClusterApi>), "s3cret").await;
    let mut c = ClusterClient::new(channel);
    c.get_cluster_status(pb::GetClusterStatusRequest::default()).await.unwrap();
    c.get_history(pb::GetHistoryRequest { group: "g1".into(), limit: 0 }).await.unwrap();
    let s = pb::SwitchoverRequest { group: "g1".into(), ..Default::default() };
    unauthenticated(c.switchover(s.clone()).await);
    let f = pb::FailoverRequest {
        group: "g1".into(),
        to: "n2".into(),
        accept_data_loss: true,
        timeout_ms: 0,
    };
    unauthenticated(c.failover(f.clone()).await);
    unauthenticated(c.pause(pb::PauseRequest::default()).await);
    unauthenticated(c.resume(pb::ResumeRequest::default()).await);
    assert_eq!(api.calls.lock().unwrap().len(), 2, "no refused call reached the api");
    c.switchover(with_token(s, "s3cret")).await.unwrap();
    c.failover(with_token(f, "s3cret")).await.unwrap();
    c.pause(with_token(pb::PauseRequest::default(), "s3cret")).await.unwrap();
    c.resume(with_token(pb::ResumeRequest::default(), "s3cret")).await.unwrap();
    assert_eq!(api.calls.lock().unwrap().len(), 6);
    task.abort();
}

#[tokio::test]
async fn without_a_coordinator_every_call_is_failed_precondition() {
    let (channel, task) = serve(None, "").await;
    let mut c = ClusterClient::new(channel);
    check(c.get_cluster_status(pb::GetClusterStatusRequest::default()).await);
    check(c.get_history(pb::GetHistoryRequest { group: "g".into(), limit: 0 }).await);
    check(c.switchover(pb::SwitchoverRequest::default()).await);
    check(c.failover(pb::FailoverRequest::default()).await);
    check(c.pause(pb::PauseRequest::default()).await);
    check(c.resume(pb::ResumeRequest::default()).await);
    task.abort();
}

#[tokio::test]
async fn remove_group_needs_the_token_and_a_group_and_keeps_its_codes() {
    let api = Arc::new(FakeApi::default());
    let (channel, task) = serve(Some(Arc::clone(&api) as Arc<dyn ClusterApi>), "s3cret").await;
    let mut c = ClusterClient::new(channel);
    let g1 = pb::RemoveGroupRequest { group: "g1".into() };
    unauthenticated(c.remove_group(g1.clone()).await);
    let empty = pb::RemoveGroupRequest { group: " ".into() };
    let e = c.remove_group(with_token(empty, "s3cret")).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let done = c.remove_group(with_token(g1, "s3cret")).await.unwrap().into_inner();
    assert_eq!((done.group.as_str(), done.removed_keys), ("g1", 3));
    let live = pb::RemoveGroupRequest { group: "live".into() };
    let e = c.remove_group(with_token(live, "s3cret")).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("n1"), "{e:?}");
    assert_eq!(*api.calls.lock().unwrap(), ["remove g1", "remove live"]);
    task.abort();
    let (channel, task) = serve(None, "").await;
    check(ClusterClient::new(channel).remove_group(pb::RemoveGroupRequest::default()).await);
    task.abort();
}
