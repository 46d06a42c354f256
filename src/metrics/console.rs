//! The cluster console: a read-only web page at `/` on the metrics listener, its script and
//! style under `/console/`, the document it shows at [`TOPOLOGY_PATH`] and its live updates
//! as server-sent events at [`EVENTS_PATH`]. No build step and no external asset: the three
//! files are compiled in (`console/index.html`, `console.js`, `console.css`) and the page's
//! Content-Security-Policy ([`CSP`]) lets it load nothing from another origin.
//!
//! The metrics layer does not know the coordinator: the page's data comes as a [`Feed`], the
//! latest document as JSON text, which the caller (`app::console`) produces while someone
//! looks and this module only passes on. Without a feed (`metrics.console = false`, or a
//! standalone controller) `/` and `/console/...` answer 404 with [`OFF`].
//!
//! The listener closes a connection idle for [`super::listener::IDLE_TIMEOUT`] and admits
//! [`super::listener::MAX_CONNECTIONS`]: an event stream sends a comment every [`KEEPALIVE`],
//! and at most [`MAX_STREAMS`] streams are open at once, so viewers leave Prometheus room.

use std::convert::Infallible;
use std::future::ready;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use super::feed::Feed;

/// Where the document is served, as JSON.
pub const TOPOLOGY_PATH: &str = "/console/topology.json";
/// Where the document and each change are served as server-sent events (`event: topology`).
pub const EVENTS_PATH: &str = "/console/events";

/// How long the JSON URL and a new event stream wait for the producer's current document
/// when it was idle (the last one it had is served after that).
pub(crate) const DOCUMENT_WAIT: Duration = Duration::from_secs(2);

/// The answer of `/` and `/console/...` without a feed.
pub(crate) const OFF: &str = "the cluster console is off on this server (metrics.console = false, or a standalone \
     controller, which has none); metrics are at /metrics\n";

/// The page's policy: its own origin only, no inline script or style, no frames, no forms.
pub(crate) const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
     frame-ancestors 'none'";

/// An event stream sends a comment after this long without an event (the listener closes a
/// connection idle for 20 s).
pub(crate) const KEEPALIVE: Duration = Duration::from_secs(5);

/// Most event streams open at once (each holds one of the listener's 16 connections for as
/// long as its page is open); more are answered 503, which the page retries later.
pub(crate) const MAX_STREAMS: usize = 8;

const PAGE: &str = include_str!("console/index.html");
const SCRIPT: &str = include_str!("console/console.js");
const STYLE: &str = include_str!("console/console.css");

/// The console's routes, to merge into the metrics router: the page and its data with a
/// feed, 404 with [`OFF`] without one. Event streams end when `cancel` fires.
pub(crate) fn routes(feed: Option<Feed>, cancel: CancellationToken) -> Router {
    routes_with(feed, cancel, KEEPALIVE)
}

/// [`routes`] with the event streams' keepalive interval (tests shorten it).
fn routes_with(feed: Option<Feed>, cancel: CancellationToken, keepalive: Duration) -> Router {
    let Some(feed) = feed else {
        let off = || async { (StatusCode::NOT_FOUND, OFF) };
        return Router::new()
            .route("/", get(off))
            .route("/console", get(off))
            .route("/console/{*rest}", get(off));
    };
    let streams = Arc::new(Semaphore::new(MAX_STREAMS));
    let json_feed = feed.clone();
    Router::new()
        .route("/", get(|| async { asset("text/html; charset=utf-8", PAGE) }))
        .route("/console/console.js", get(|| async { asset("text/javascript", SCRIPT) }))
        .route("/console/console.css", get(|| async { asset("text/css", STYLE) }))
        .route(TOPOLOGY_PATH, get(move || topology(json_feed.clone())))
        .route(
            EVENTS_PATH,
            get(move || ready(events(feed.clone(), &streams, keepalive, cancel.clone()))),
        )
        .route(
            "/console/{*rest}",
            get(|| async { (StatusCode::NOT_FOUND, "not found; the console is at /\n") }),
        )
}

/// Headers every console answer carries: not cached, not sniffed, no referrer, the policy.
fn common_headers() -> [(HeaderName, HeaderValue); 4] {
    [
        (header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(CSP)),
        (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
        (header::REFERRER_POLICY, HeaderValue::from_static("no-referrer")),
        (header::CACHE_CONTROL, HeaderValue::from_static("no-store")),
    ]
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (common_headers(), [(header::CONTENT_TYPE, content_type)], body).into_response()
}

/// The current document (waking the producer when it was idle), or 503 without one.
async fn topology(feed: Feed) -> Response {
    let doc = feed.document(DOCUMENT_WAIT).await;
    if doc.is_empty() {
        return (StatusCode::SERVICE_UNAVAILABLE, "no topology document yet; retry\n")
            .into_response();
    }
    let body = String::clone(&doc);
    (common_headers(), [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

/// The document at once, then each change, as `event: topology` (a slow reader gets the
/// latest, never a backlog); 503 when [`MAX_STREAMS`] are open.
fn events(
    feed: Feed,
    streams: &Arc<Semaphore>,
    keepalive: Duration,
    cancel: CancellationToken,
) -> Response {
    let Ok(slot) = Arc::clone(streams).try_acquire_owned() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "10")],
            format!(
                "{MAX_STREAMS} console event streams are open on this node; close one, or \
                 read {TOPOLOGY_PATH}\n"
            ),
        )
            .into_response();
    };
    // Subscribed here, so the producer starts at once (it works while someone looks).
    let docs = feed.subscribe();
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(forward(feed, docs, tx, slot, cancel));
    let sse = Sse::new(ReceiverStream::new(rx))
        .keep_alive(KeepAlive::new().interval(keepalive).text("keepalive"));
    // A proxy in front (nginx) must not buffer the stream.
    ([(HeaderName::from_static("x-accel-buffering"), "no")], common_headers(), sse).into_response()
}

/// Sends the feed's documents to one stream until the reader goes, or `cancel` (the server
/// stops: the stream ends, so the graceful stop is not held): first the current one (waiting
/// up to [`DOCUMENT_WAIT`] for an idle producer's), then each new one. A feed whose producer
/// ended keeps the stream open on its last document (the page would reconnect in a loop).
async fn forward(
    feed: Feed,
    mut docs: watch::Receiver<Arc<String>>,
    tx: mpsc::Sender<Result<Event, Infallible>>,
    _slot: OwnedSemaphorePermit,
    cancel: CancellationToken,
) {
    tokio::select! {
        _ = feed.document(DOCUMENT_WAIT) => {}
        () = cancel.cancelled() => return,
    }
    loop {
        let doc = Arc::clone(&docs.borrow_and_update());
        if !doc.is_empty() {
            tokio::select! {
                sent = tx.send(Ok(event(&doc))) => if sent.is_err() { return },
                () = cancel.cancelled() => return,
            }
        }
        tokio::select! {
            () = cancel.cancelled() => return,
            () = tx.closed() => return,
            changed = docs.changed() => if changed.is_err() {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tx.closed() => return,
                }
            },
        }
    }
}

/// One `event: topology` with the document on one line (a producer's line breaks, which JSON
/// allows only between tokens, become spaces).
fn event(doc: &str) -> Event {
    let data =
        if doc.contains(['\n', '\r']) { doc.replace(['\n', '\r'], " ") } else { doc.to_owned() };
    Event::default().event("topology").data(data)
}

#[cfg(test)]
mod tests;
