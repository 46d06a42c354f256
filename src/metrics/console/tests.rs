//! The console's routes over a real socket (the metrics listener's own server, with a fake
//! feed): the page and its policy, the JSON document, the event stream, the switch.

use std::net::SocketAddr;

use axum::http::{HeaderMap, Request, StatusCode};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty};
use hyper::body::Incoming;

use super::*;

struct Server {
    addr: SocketAddr,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Server {
    /// The metrics listener's router (`/metrics` answers "metrics"), the console from `feed`.
    async fn start(feed: Option<Feed>, keepalive: Duration) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let render: crate::metrics::Render = Arc::new(|_| "metrics\n".to_owned());
        let app = Router::new()
            .route("/metrics", get(move || ready(render(crate::metrics::Format::Prometheus))))
            .merge(routes_with(feed, stop.clone(), keepalive));
        let serve = axum::serve(crate::metrics::listener::Limited::new(listener), app)
            .with_graceful_shutdown(stop.clone().cancelled_owned());
        let task = tokio::spawn(async move { serve.await });
        Self { addr, stop, task }
    }

    /// Stops the server; it must end within 5 s (open streams do not hold it).
    async fn stop(self) {
        self.stop.cancel();
        let ended = tokio::time::timeout(Duration::from_secs(5), self.task).await;
        assert!(matches!(ended, Ok(Ok(Ok(())))), "the server ended cleanly: {ended:?}");
    }
}

/// A feed whose producer has published `doc` (current: nothing waits for it).
fn feed(doc: &str) -> Feed {
    let feed = Feed::new(String::new());
    feed.publish(doc.to_owned());
    feed
}

/// A GET on its own connection: status, headers and the body still streaming.
async fn get_stream(addr: SocketAddr, path: &str) -> (StatusCode, HeaderMap, Incoming) {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let io = hyper_util::rt::TokioIo::new(stream);
    let (mut send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
    tokio::spawn(conn);
    let req = Request::get(path).header("host", "console").body(Empty::<Bytes>::new()).unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(5), send.send_request(req))
        .await
        .expect("an answer within 5 s")
        .unwrap();
    let (parts, body) = resp.into_parts();
    (parts.status, parts.headers, body)
}

/// A GET: status, headers, the whole body as text.
async fn get_text(addr: SocketAddr, path: &str) -> (StatusCode, HeaderMap, String) {
    let (status, headers, body) = get_stream(addr, path).await;
    let body = tokio::time::timeout(Duration::from_secs(5), body.collect())
        .await
        .expect("the whole body within 5 s")
        .unwrap()
        .to_bytes();
    (status, headers, String::from_utf8(body.to_vec()).unwrap())
}

/// Reads a stream's body until `text` holds a complete SSE block satisfying `done` (bounded).
async fn read_until(body: &mut Incoming, text: &mut String, done: impl Fn(&str) -> bool) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while !text.split("\n\n").any(&done) {
        let frame = tokio::time::timeout_at(deadline, body.frame())
            .await
            .unwrap_or_else(|_| panic!("no such event within 5 s; read so far:\n{text}"))
            .expect("the stream is open")
            .unwrap();
        if let Ok(data) = frame.into_data() {
            text.push_str(std::str::from_utf8(&data).unwrap());
        }
    }
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> &'a str {
    h.get(name).unwrap_or_else(|| panic!("no {name} header in {h:?}")).to_str().unwrap()
}

#[tokio::test]
async fn the_page_is_html_under_a_policy_and_refers_to_nothing_outside() {
    let s = Server::start(Some(feed(r#"{"groups":[]}"#)), KEEPALIVE).await;
    let (status, h, page) = get_text(s.addr, "/").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header(&h, "content-type"), "text/html; charset=utf-8");
    assert_eq!(header(&h, "content-security-policy"), CSP);
    assert!(CSP.starts_with("default-src 'none'") && CSP.contains("connect-src 'self'"));
    assert!(!CSP.contains("unsafe") && !CSP.contains("http"), "{CSP}");
    assert_eq!(header(&h, "x-content-type-options"), "nosniff");
    assert!(page.starts_with("<!doctype html>"), "{page}");
    // The JSON is linked; script and style are the page's own files.
    assert!(page.contains(r#"href="console/topology.json""#), "{page}");
    for (path, ty) in
        [("/console/console.js", "text/javascript"), ("/console/console.css", "text/css")]
    {
        let (status, h, body) = get_text(s.addr, path).await;
        assert_eq!((status, header(&h, "content-type")), (StatusCode::OK, ty), "{path}");
        assert!(page.contains(&format!("\"{}\"", &path[1..])), "the page loads {path}");
        assert!(body.len() > 1000, "{path}: {body}");
    }
    for (name, text) in [("page", PAGE), ("script", SCRIPT), ("style", STYLE)] {
        for outside in ["http://", "https://", "//cdn", "@import", "url("] {
            assert!(!text.contains(outside), "the {name} refers to {outside}");
        }
    }
    // No inline script or style for the policy to refuse, and no data written as HTML.
    assert!(!PAGE.contains("<script>") && !PAGE.contains("style="), "inline code in the page");
    for sink in ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("] {
        assert!(!SCRIPT.contains(sink), "the script uses {sink}");
    }
    assert!(SCRIPT.contains("textContent") && SCRIPT.contains(r#"new EventSource(EVENTS)"#));
    let (status, _, body) = get_text(s.addr, "/console/nothing").await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::NOT_FOUND, "not found; the console is at /\n")
    );
    s.stop().await;
}

#[tokio::test]
async fn the_json_url_answers_the_feeds_document() {
    let tx = feed("");
    let s = Server::start(Some(tx.clone()), KEEPALIVE).await;
    let (status, _, _) = get_text(s.addr, TOPOLOGY_PATH).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "no document yet");
    tx.publish(r#"{"node":"n1","groups":[{"group":"g1"}]}"#.into());
    let (status, h, body) = get_text(s.addr, TOPOLOGY_PATH).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header(&h, "content-type"), "application/json");
    assert_eq!(header(&h, "cache-control"), "no-store");
    assert_eq!(body, r#"{"node":"n1","groups":[{"group":"g1"}]}"#);
    tx.publish(r#"{"node":"n1","groups":[]}"#.into());
    assert_eq!(get_text(s.addr, TOPOLOGY_PATH).await.2, r#"{"node":"n1","groups":[]}"#);
    s.stop().await;
}

/// The producer works only while someone looks: a request or a new stream wakes an idle one
/// and is answered with its fresh document, not the one it left.
#[tokio::test]
async fn a_request_and_a_stream_wake_an_idle_producer_and_get_its_fresh_document() {
    let feed = Feed::new(r#"{"revision":1}"#.into());
    let s = Server::start(Some(feed.clone()), KEEPALIVE).await;
    let produce = |feed: Feed, doc: &'static str| {
        tokio::spawn(async move {
            feed.until_wanted().await;
            tokio::time::sleep(Duration::from_millis(100)).await;
            feed.publish(doc.into());
        })
    };
    let producer = produce(feed.clone(), r#"{"revision":2}"#);
    assert_eq!(get_text(s.addr, TOPOLOGY_PATH).await.2, r#"{"revision":2}"#);
    producer.await.unwrap();
    feed.idle();
    // A stream's first event is the woken producer's document, not the one it left (the
    // stream is open before the producer publishes).
    let (_, _, mut body) = get_stream(s.addr, EVENTS_PATH).await;
    let producer = produce(feed.clone(), r#"{"revision":3}"#);
    let mut text = String::new();
    read_until(&mut body, &mut text, |e| e.starts_with("event: topology")).await;
    assert!(text.starts_with("event: topology\ndata: {\"revision\":3}\n\n"), "{text}");
    producer.await.unwrap();
    drop(body);
    s.stop().await;
}

#[tokio::test]
async fn the_event_stream_sends_the_document_then_each_change_and_keeps_alive() {
    let tx = feed(r#"{"revision":1}"#);
    let s = Server::start(Some(tx.clone()), Duration::from_millis(200)).await;
    let (status, h, mut body) = get_stream(s.addr, EVENTS_PATH).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(header(&h, "content-type"), "text/event-stream");
    let mut text = String::new();
    read_until(&mut body, &mut text, |e| e == "event: topology\ndata: {\"revision\":1}").await;
    // A change arrives as one event, on one line even when the producer broke its lines.
    tx.publish("{\"revision\":2,\n\"groups\":[]}".into());
    let second = "event: topology\ndata: {\"revision\":2, \"groups\":[]}";
    read_until(&mut body, &mut text, |e| e == second).await;
    // Idle: a keepalive comment keeps the listener's idle timer from closing the stream.
    read_until(&mut body, &mut text, |e| e.ends_with(": keepalive")).await;
    let first = text.find("revision\":1").unwrap();
    assert!(first < text.find("revision\":2").unwrap(), "in order: {text}");
    assert_eq!(text.matches("revision\":1").count(), 1, "each document once: {text}");
    s.stop().await;
}

#[tokio::test]
async fn streams_beyond_the_limit_are_refused_and_a_stop_ends_the_open_ones() {
    let s = Server::start(Some(feed(r#"{"revision":7}"#)), KEEPALIVE).await;
    let mut open = Vec::new();
    for _ in 0..MAX_STREAMS {
        let (status, _, mut body) = get_stream(s.addr, EVENTS_PATH).await;
        assert_eq!(status, StatusCode::OK);
        let mut text = String::new();
        read_until(&mut body, &mut text, |e| e.contains("revision\":7")).await;
        open.push(body);
    }
    let (status, h, body) = get_text(s.addr, EVENTS_PATH).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(header(&h, "retry-after"), "10");
    assert!(body.contains(TOPOLOGY_PATH), "{body}");
    // /metrics still has room.
    assert_eq!(get_text(s.addr, "/metrics").await.0, StatusCode::OK);
    // A closed stream gives its slot back.
    drop(open.pop());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (status, _, body) = get_stream(s.addr, EVENTS_PATH).await;
        if status == StatusCode::OK {
            open.push(body);
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the slot came back within 5 s");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let stop = s.stop.clone();
    let task = s.task;
    stop.cancel();
    for mut body in open {
        let end = tokio::time::timeout(Duration::from_secs(5), async {
            while let Some(Ok(_)) = body.frame().await {}
        });
        end.await.expect("a stop ends every open stream");
    }
    let ended = tokio::time::timeout(Duration::from_secs(5), task).await;
    assert!(matches!(ended, Ok(Ok(Ok(())))), "{ended:?}");
}

#[tokio::test]
async fn without_a_feed_the_console_answers_404_naming_the_switch() {
    let s = Server::start(None, KEEPALIVE).await;
    for path in ["/", "/console", TOPOLOGY_PATH, EVENTS_PATH, "/console/console.js"] {
        let (status, _, body) = get_text(s.addr, path).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(body, OFF, "{path}");
    }
    assert!(OFF.contains("metrics.console = false"), "{OFF}");
    let (status, _, body) = get_text(s.addr, "/metrics").await;
    assert_eq!((status, body.as_str()), (StatusCode::OK, "metrics\n"));
    s.stop().await;
}

#[tokio::test]
async fn the_metrics_router_serves_the_console_beside_metrics() {
    let rx = feed(r#"{"revision":3}"#);
    let render: crate::metrics::Render = Arc::new(|_| "m 1\n".to_owned());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    let task = tokio::spawn(crate::metrics::serve_render(listener, render, Some(rx), stop.clone()));
    assert_eq!(get_text(addr, "/metrics").await.2, "m 1\n");
    assert_eq!(get_text(addr, TOPOLOGY_PATH).await.2, r#"{"revision":3}"#);
    assert_eq!(get_text(addr, "/").await.0, StatusCode::OK);
    let (status, _, body) = get_text(addr, "/other").await;
    assert_eq!(
        (status, body.as_str()),
        (StatusCode::NOT_FOUND, "not found; metrics are at /metrics\n")
    );
    stop.cancel();
    let ended = tokio::time::timeout(Duration::from_secs(5), task).await;
    assert!(matches!(ended, Ok(Ok(Ok(())))), "{ended:?}");
}
