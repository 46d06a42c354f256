//! The process's log destination (stderr), written so that no log line can stop the node.
//!
//! Every event is formatted on the thread that logs it and handed to a bounded queue
//! ([`QUEUE_LINES`]) without waiting; one thread of its own writes the queue to stderr. So:
//!
//! - a write that fails (a pipe whose reader went away: EPIPE, SIGPIPE being ignored as Rust
//!   does by default; a full disk or `/dev/full`: ENOSPC) loses that line and counts it in
//!   `hasync_log_write_errors_total`; nothing panics and nothing retries;
//! - a destination that blocks (a pipe whose reader is alive but not reading) stalls only the
//!   writer thread: once the queue is full, new lines are dropped and counted in
//!   `hasync_log_dropped_total`, and no task of the node ever waits for the log.
//!
//! The filter is `RUST_LOG` when it is set and not empty, else `log.filter`; either is parsed
//! strictly: a directive that does not parse is an error naming its source, not a silent
//! "log nothing".

use std::io::Write as _;
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, LazyLock, Mutex};
use std::time::Duration;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

use crate::config::LogFormat;
use crate::metrics::log_counters;

/// Lines the queue holds before new ones are dropped.
pub(crate) const QUEUE_LINES: usize = 4096;

/// A filter that does not parse, named by where it came from.
#[derive(Debug, thiserror::Error)]
#[error("invalid log filter {source_name} = {value:?}: {reason}")]
pub(crate) struct FilterError {
    /// `RUST_LOG` or `log.filter`.
    pub(crate) source_name: &'static str,
    /// The directives as given.
    pub(crate) value: String,
    /// The parser's message.
    pub(crate) reason: String,
}

/// `RUST_LOG`, when it is set and not empty (then it wins over `log.filter`).
fn rust_log() -> Option<String> {
    std::env::var("RUST_LOG").ok().filter(|v| !v.trim().is_empty())
}

/// Checks `RUST_LOG` when it is set (`config check` and `serve` refuse a bad one).
pub(crate) fn check_rust_log() -> Result<(), FilterError> {
    rust_log().map_or(Ok(()), |v| parse_filter("RUST_LOG", &v).map(drop))
}

fn parse_filter(source_name: &'static str, value: &str) -> Result<EnvFilter, FilterError> {
    crate::config::parse_log_filter(value).map_err(|reason| FilterError {
        source_name,
        value: value.to_owned(),
        reason,
    })
}

/// Installs the global tracing subscriber writing through the lossy queue. A second call (a
/// process that runs more than one thing) keeps the first subscriber.
pub(crate) fn init(format: LogFormat, filter: &str) -> Result<(), FilterError> {
    let filter = match rust_log() {
        Some(v) => parse_filter("RUST_LOG", &v)?,
        None => parse_filter("log.filter", filter)?,
    };
    // Colours only on a terminal: journald, kubectl logs and grep get plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(LossyStderr)
        .log_internal_errors(false)
        .with_ansi(ansi);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    Ok(())
}

/// Waits at most `limit` for the queued lines to be written (before the process exits: the
/// last lines of a stop are worth a short wait, never a hang on a stalled destination).
pub(crate) fn flush(limit: Duration) {
    let queue = &*QUEUE;
    let pending = queue.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let _ = queue.drained.wait_timeout_while(pending, limit, |n| *n > 0);
}

/// The queue to the writer thread.
struct Queue {
    tx: SyncSender<Vec<u8>>,
    /// Lines queued and not yet written (or failed).
    pending: Mutex<usize>,
    drained: Condvar,
}

static QUEUE: LazyLock<Arc<Queue>> = LazyLock::new(|| {
    let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE_LINES);
    let queue = Arc::new(Queue { tx, pending: Mutex::new(0), drained: Condvar::new() });
    let q = Arc::clone(&queue);
    // Without a writer thread the receiver is gone: every line is dropped and counted.
    let _ = std::thread::Builder::new().name("hasync-log".into()).spawn(move || write(&q, rx));
    queue
});

fn write(queue: &Queue, rx: Receiver<Vec<u8>>) {
    for line in rx {
        if std::io::stderr().write_all(&line).is_err() {
            log_counters().write_errors.inc();
        }
        let mut pending = queue.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        *pending = pending.saturating_sub(1);
        if *pending == 0 {
            queue.drained.notify_all();
        }
    }
}

/// The [`MakeWriter`] of the subscriber: each event becomes one queued line.
struct LossyStderr;

impl<'a> MakeWriter<'a> for LossyStderr {
    type Writer = Line;
    fn make_writer(&'a self) -> Line {
        Line
    }
}

/// One event's bytes: tracing's fmt layer formats an event into a buffer and writes it with
/// one `write_all`, so each `write` here is one whole line.
struct Line;

impl std::io::Write for Line {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let queue = &*QUEUE;
        {
            let mut pending =
                queue.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            *pending += 1;
        }
        if let Err(e) = queue.tx.try_send(buf.to_vec()) {
            debug_assert!(matches!(e, TrySendError::Full(_) | TrySendError::Disconnected(_)));
            log_counters().dropped.inc();
            let mut pending =
                queue.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            *pending = pending.saturating_sub(1);
        }
        // Always "written": a lost line is counted, never an error the logger would report.
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Writes `text` to stdout, ignoring a broken stdout (`hasync config defaults | head`): output
/// nobody reads is no reason to fail.
pub(crate) fn print_out(text: &str) {
    let _ = std::io::stdout().write_all(text.as_bytes());
}

/// How long [`print_err`] waits for stderr to take its line.
const PRINT_ERR_WAIT: Duration = Duration::from_secs(2);

/// Writes one line to stderr, ignoring a broken stderr (the exit code still tells), and waits
/// at most [`PRINT_ERR_WAIT`] for it: a full pipe whose reader is alive but not reading must
/// not keep a refused start from exiting. The write runs on a thread of its own, which the
/// process's exit ends if stderr never takes the line.
pub(crate) fn print_err(line: &str) {
    let text = format!("{line}\n");
    let (done, wait) = std::sync::mpsc::channel();
    let write = move || {
        let _ = std::io::stderr().write_all(text.as_bytes());
        let _ = done.send(());
    };
    if std::thread::Builder::new().name("hasync-stderr".into()).spawn(write).is_ok() {
        let _ = wait.recv_timeout(PRINT_ERR_WAIT);
    }
}
