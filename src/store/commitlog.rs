//! The commitlog both roles use: the master appends RocketMQ records, a slave writes the
//! master's raw bytes at exactly the same offsets.
//!
//! One writer lock serializes appends; readers of bytes ([`CommitLog::read`], the iteration of
//! [`CommitLog::records_from`]) never take it (the queue-offset and dispatched-offset getters
//! do, briefly). The max offset is published (atomic + `watch`) after the bytes are in the
//! mapping, so a reader that sees an offset sees the bytes below it, and every task waiting for
//! new data wakes at once.
//!
//! The periodic and the sync-flush msyncs, the periodic checkpoints and retention run on a
//! dedicated store thread ([`crate::store::flush`]), which also prepares the next segment file
//! completely, so that a roll on the write path ([`CommitLog::append`], [`CommitLog::append_at`])
//! only moves the prepared file into the segment list. When the store thread has not prepared
//! it in time, the rolling writer waits for it, or creates the file itself, holding the writer
//! lock but no lock readers take: reads and status calls go on meanwhile (see
//! [`crate::store::mapped_file_queue`]). Readers never take the writer lock: the dispatched
//! offset that bounds [`CommitLog::records_from`] is mirrored in an atomic. Undoing a failed
//! write zeroes and msyncs on the caller's thread (bytes never published, so it waits for no
//! reader). [`CommitLog::truncate`], [`CommitLog::truncate_keeping`] (which first copies the
//! bytes it cuts into a tail file, [`crate::store::tails`]),
//! [`CommitLog::wipe`], [`CommitLog::close`] and the `*_blocking` methods block their caller
//! (the node runs them under `spawn_blocking`); a truncate waits until no reader holds a slice
//! of the bytes it rewrites ([`crate::store::mapped_file`]).

use std::collections::HashMap;
use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;

use crate::store::checkpoint::{ABORT_FILE, Checkpoint, QueueOffsets};
use crate::store::cut_intent::CutIntent;
use crate::store::error::{Error, Result};
use crate::store::fence::WriteHook;
pub use crate::store::fence::{FenceToken, Writes};
use crate::store::flush::{FlushTimeout, Flusher};
use crate::store::fs::FileSystem;
use crate::store::mapped_file::MappedFile;
use crate::store::mapped_file_queue::{Extent, MappedFileQueue};
pub use crate::store::options::{FlushPolicy, StoreOptions};
use crate::store::record::{self, BLANK_HEADER_SIZE, Message};
use crate::store::recovery::{self, RecoveryReport};
use crate::store::scan::{self, Step};
use crate::store::tails::keep::Tails;
use crate::store::tails::{KeptTail, TailCause, TailStatus};

/// The commitlog directory inside the data directory.
pub(crate) const COMMITLOG_DIR: &str = "commitlog";

/// Where one appended record landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendedRecord {
    /// The record's physical offset.
    pub offset: u64,
    /// The record's size in bytes.
    pub size: u32,
    /// The queue offset written into the record.
    pub queue_offset: i64,
}

/// The outcome of an append: every record, and the offset just past the last one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendResult {
    /// One entry per message, in order.
    pub records: Vec<AppendedRecord>,
    /// The end of the batch (where the next record will start).
    pub end_offset: u64,
}

/// State guarded by the writer lock.
#[derive(Debug, Default)]
pub(crate) struct WriterState {
    /// Next queue offset per (topic, queue id), accounting for every record below `dispatched`.
    pub(crate) queue_offsets: QueueOffsets,
    /// End of the last complete record (a slave's max offset may sit mid-record), or the end of
    /// the file whose end-of-file blank header has arrived: then it lies past the max offset
    /// until the rest of the blank's bytes arrive.
    pub(crate) dispatched: u64,
    /// A slave's stream failed to decode at this offset; dispatch stopped there.
    pub(crate) dispatch_error: Option<String>,
    /// The write fence: which writes are taken; the others are refused with
    /// [`Error::Fenced`]. Changed and checked only under the writer lock, so once
    /// [`CommitLog::set_writes`] returns no write of a closed path is in flight and none lands.
    pub(crate) writes: Writes,
    /// Bumped whenever [`CommitLog::set_writes`] changes `writes`: a write admitted with an older
    /// [`FenceToken`] is refused even when its path is open again (a fence raised and lowered
    /// while it waited).
    pub(crate) fence_generation: u64,
    /// The generation of the last cut whose intent was stored ([`crate::store::cut_intent`]),
    /// or of the checkpoint on disk at the start. Appends are refused while it is above
    /// [`Shared::checkpointed_generation`]: a restart would finish the cut over them.
    pub(crate) cut_generation: u64,
}

/// Shared between the commitlog handle and its store thread.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) data_dir: PathBuf,
    pub(crate) queue: MappedFileQueue,
    pub(crate) fs: Arc<dyn FileSystem>,
    pub(crate) writer: Mutex<WriterState>,
    /// `writer.dispatched` as of the last release of the writer lock (stored by
    /// [`WriterGuard`]'s drop), for readers that must not wait on the writer.
    pub(crate) dispatched: AtomicU64,
    /// `writer.writes` and `writer.fence_generation`, stored under the writer lock by
    /// [`CommitLog::set_writes`], for readers (status, health, a put's admission) that must not
    /// wait on a writer rolling a segment.
    pub(crate) writes: std::sync::Mutex<(Writes, u64)>,
    /// Bumped before every truncate or wipe rewrites the log: a [`RecordIter`] made before
    /// ends there instead of reading the rewritten log at offsets of the old one.
    pub(crate) cuts: AtomicU64,
    /// The count of cuts the checkpoint on disk no longer claims (see `flush::checkpoint_steps`).
    pub(crate) checkpointed_cuts: AtomicU64,
    /// The cut generation of the checkpoint on disk ([`crate::store::cut_intent`]).
    pub(crate) checkpointed_generation: AtomicU64,
    /// The generation of the cut intent file this store stored and has not removed yet (0:
    /// none). Changed under the writer lock.
    pub(crate) intent_on_disk: AtomicU64,
    pub(crate) max_offset: AtomicU64,
    pub(crate) max_tx: watch::Sender<u64>,
    pub(crate) flushed_tx: watch::Sender<u64>,
    /// Serializes checkpoint writes (the store thread and explicit checkpoints); true once the
    /// store is halted ([`CommitLog::halt`]): no checkpoint is written after.
    pub(crate) checkpoint_lock: Mutex<bool>,
    /// The confirm offset, never past the max offset ([`crate::store::confirm`]).
    pub(crate) confirm: Mutex<u64>,
    /// Told how long each flush that wrote something took (metrics).
    pub(crate) flush_observer: std::sync::OnceLock<FlushObserver>,
    /// Which kinds of write fail now ([`crate::store::disk`]).
    pub(crate) disk: crate::store::disk::DiskMonitor,
    /// The truncated tails kept aside ([`crate::store::tails`]).
    pub(crate) tails: Tails,
    /// Among which stores the warms take turns (`store.warm-lock`).
    pub(crate) warm_turns: crate::store::warm::WarmTurns,
    /// Tests: how many times the store thread went round its loop.
    #[cfg(test)]
    pub(crate) store_loops: std::sync::atomic::AtomicUsize,
    pub(crate) opts: StoreOptions,
}

/// The writer lock's guard; on release it mirrors the dispatched offset into
/// [`Shared::dispatched`].
#[derive(Debug)]
pub(crate) struct WriterGuard<'a> {
    state: MutexGuard<'a, WriterState>,
    mirror: &'a AtomicU64,
}

impl Deref for WriterGuard<'_> {
    type Target = WriterState;
    fn deref(&self) -> &WriterState {
        &self.state
    }
}

impl DerefMut for WriterGuard<'_> {
    fn deref_mut(&mut self) -> &mut WriterState {
        &mut self.state
    }
}

impl Drop for WriterGuard<'_> {
    fn drop(&mut self) {
        self.mirror.store(self.state.dispatched, Ordering::Release);
    }
}

impl Shared {
    pub(crate) fn writer(&self) -> WriterGuard<'_> {
        let state = self.writer.lock().unwrap_or_else(|e| e.into_inner());
        WriterGuard { state, mirror: &self.dispatched }
    }

    pub(crate) fn max_offset(&self) -> u64 {
        self.max_offset.load(Ordering::Acquire)
    }

    pub(super) fn publish_max(&self, offset: u64) {
        self.max_offset.store(offset, Ordering::Release);
        self.max_tx.send_replace(offset);
    }

    /// A cut of published bytes begins (under the writer lock): `cuts` is odd until the
    /// guard is dropped, once the flushed offset is lowered (or the cut failed), so that a
    /// flush that overlaps any part of it publishes nothing (see [`Shared::flush_files`]).
    /// The guard also ends it on a panic: an odd count left behind would stop every flush
    /// from publishing.
    pub(crate) fn begin_cut(&self) -> CutCount<'_> {
        self.cuts.fetch_add(1, Ordering::SeqCst);
        CutCount(&self.cuts)
    }

    /// A consistent snapshot for the checkpoint: the dispatched offset, its table, the number
    /// of cuts so far (a cut holds the writer lock) and the generation of the last cut whose
    /// intent was stored.
    pub(crate) fn checkpoint_snapshot(&self) -> (u64, QueueOffsets, u64, u64) {
        let w = self.writer();
        let cuts = self.cuts.load(Ordering::SeqCst);
        (w.dispatched, w.queue_offsets.clone(), cuts, w.cut_generation)
    }

    /// After a checkpoint of cut generation `generation` was stored: it is what the disk says
    /// now, and a cut intent file at or below it is done (removed; a removal that fails leaves
    /// a file the next start finds done too).
    pub(crate) fn checkpointed(&self, generation: u64) {
        self.checkpointed_generation.fetch_max(generation, Ordering::SeqCst);
        if self.intent_on_disk.load(Ordering::SeqCst) == 0 {
            return;
        }
        // Under the writer lock: a cut storing a newer intent meanwhile is not removed.
        let _w = self.writer();
        let on_disk = self.intent_on_disk.load(Ordering::SeqCst);
        if on_disk == 0 || on_disk > generation {
            return;
        }
        match CutIntent::remove(self.fs.as_ref(), &self.data_dir) {
            Ok(()) => self.intent_on_disk.store(0, Ordering::SeqCst),
            Err(e) => tracing::warn!(error = %e, "a finished cut's intent file could not be \
                removed; the next start finds it finished"),
        }
    }

    /// Stores a cut's `intent` under the writer lock `w` and counts its generation as the last
    /// cut's. An error may come after the file is in place (a failing directory fsync), so the
    /// file is removed again; when that fails too, the generation counts all the same (appends
    /// wait for a checkpoint that records it, which removes the file: a start would take it
    /// for an unfinished cut before). An error means the cut must not rely on it.
    pub(crate) fn store_intent(&self, w: &mut WriterState, intent: &CutIntent) -> Result<()> {
        let (fs, dir) = (self.fs.as_ref(), &self.data_dir);
        let Err(e) = intent.store(fs, dir) else {
            w.cut_generation = intent.generation;
            self.intent_on_disk.store(intent.generation, Ordering::SeqCst);
            return Ok(());
        };
        if let Err(gone) = CutIntent::remove(fs, dir) {
            tracing::error!(error = %gone, "a cut intent whose write failed may be on disk and \
                could not be removed; appends wait for a checkpoint past it");
            w.cut_generation = intent.generation;
            self.intent_on_disk.store(intent.generation, Ordering::SeqCst);
        }
        Err(e)
    }

    /// Refuses an append while a cut's checkpoint is owed (see [`WriterState::cut_generation`]).
    pub(crate) fn check_cut_checkpointed(&self, w: &WriterState) -> Result<()> {
        let checkpointed = self.checkpointed_generation.load(Ordering::SeqCst);
        if w.cut_generation <= checkpointed {
            return Ok(());
        }
        Err(Error::CutNotCheckpointed { offset: self.max_offset() })
    }

    /// Flushes every file from the one holding the flushed offset to the last; returns the new
    /// flushed offset. Blocking.
    pub(crate) fn flush_files(&self) -> Result<u64> {
        // What a cut owes the disk first: nothing counts as durable while it fails.
        self.queue.settle_for_flush()?;
        // Read before the target: odd while a cut runs (see `begin_cut`).
        let cuts = self.cuts.load(Ordering::SeqCst);
        let target = self.max_offset();
        let flushed = *self.flushed_tx.borrow();
        if target <= flushed {
            return Ok(flushed);
        }
        let started = std::time::Instant::now();
        for f in self.queue.files() {
            if f.end_offset() > flushed && f.from_offset() < target {
                f.flush()?;
            }
        }
        if let Some(observe) = self.flush_observer.get() {
            (observe.0)(started.elapsed());
        }
        let mut cut = false;
        self.flushed_tx.send_if_modified(|v| {
            // A cut that ran during any part of this flush lowered (or will lower) the
            // flushed offset to the cut: raised past it, bytes appended there later would
            // count as flushed, never synced.
            if cuts % 2 == 1 || self.cuts.load(Ordering::SeqCst) != cuts {
                cut = true;
                return false;
            }
            let grew = target > *v;
            *v = (*v).max(target);
            grew
        });
        if cut {
            return Ok(*self.flushed_tx.borrow());
        }
        Ok(target)
    }
}

/// A cut of published bytes in progress (see [`Shared::begin_cut`]); ends when dropped.
pub(crate) struct CutCount<'a>(&'a AtomicU64);

impl Drop for CutCount<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A callback told the duration of each flush (see [`CommitLog::set_flush_observer`]).
pub(crate) struct FlushObserver(Box<dyn Fn(Duration) + Send + Sync>);

impl std::fmt::Debug for FlushObserver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FlushObserver")
    }
}

/// The commitlog: segment files, the writer, the store thread.
#[derive(Debug)]
pub struct CommitLog {
    pub(crate) shared: Arc<Shared>,
    pub(super) flusher: Flusher,
    /// The background scrub of sealed segments ([`crate::store::scrub`]).
    pub(crate) scrub: crate::store::scrub::Scrubber,
    recovery: RecoveryReport,
    closed: std::sync::atomic::AtomicBool,
    /// A pause point for race tests (see [`CommitLog::set_write_hook`]).
    pub(crate) write_hook: WriteHook,
}

impl CommitLog {
    /// Opens (or creates) the store in `data_dir`: recovers the valid end of the log, writes the
    /// abort marker, starts the store thread. Refuses to start on corruption below the
    /// checkpoint unless `opts.repair`.
    pub fn open(fs: Arc<dyn FileSystem>, data_dir: &Path, opts: StoreOptions) -> Result<Self> {
        fs.create_dir_all(data_dir).map_err(|e| Error::io("create directory", data_dir, e))?;
        let abort = data_dir.join(ABORT_FILE);
        let clean = !abort.exists();
        let checkpoint = Checkpoint::load(fs.as_ref(), data_dir)?;
        let confirm = checkpoint.as_ref().map_or(0, |cp| cp.confirm_offset);
        let queue = MappedFileQueue::load(
            Arc::clone(&fs),
            &data_dir.join(COMMITLOG_DIR),
            opts.segment_size,
        )?;
        let checkpoint_file = data_dir.join(crate::store::checkpoint::CHECKPOINT_FILE);
        let checkpointed_generation = checkpoint.as_ref().map_or(0, |cp| cp.cut_generation);
        // A cut whose checkpoint never landed is finished by the recovery.
        let intent = match CutIntent::load(fs.as_ref(), data_dir) {
            Err(e @ Error::StateFile(_)) if opts.repair => {
                // A cut to an offset no longer known: the checkpoint is trusted only as far as
                // the segment files reach, and the repair cuts at damage below it. The start's
                // checkpoint then removes the file.
                tracing::warn!(error = %e, "repair: a damaged cut intent is taken for an \
                    unfinished cut to the end of the segment files");
                let end = queue.last().map_or(0, |f| f.end_offset());
                let generation = checkpointed_generation + 1;
                Some(CutIntent { offset: end, wipe: false, generation })
            }
            loaded => loaded?,
        };
        let unfinished = intent.filter(|i| i.generation > checkpointed_generation);
        let rec = recovery::recover(
            &queue,
            checkpoint,
            &checkpoint_file,
            clean,
            opts.repair,
            unfinished,
        )?;
        let max = rec.report.max_offset;
        let tails =
            Tails::open(fs.as_ref(), data_dir, opts.truncated_retention, opts.truncated_max_bytes)?;
        let warm_turns = crate::store::warm::WarmTurns::open(&opts.warm_lock)?;
        fs.write_atomic(&abort, b"").map_err(|e| Error::io("write", &abort, e))?;
        let shared = Arc::new(Shared {
            data_dir: data_dir.to_path_buf(),
            queue,
            fs,
            writer: Mutex::new(WriterState {
                queue_offsets: rec.queue_offsets,
                dispatched: rec.report.dispatched_offset,
                dispatch_error: None,
                writes: Writes::Any,
                fence_generation: 0,
                cut_generation: checkpointed_generation.max(intent.map_or(0, |i| i.generation)),
            }),
            dispatched: AtomicU64::new(rec.report.dispatched_offset),
            writes: std::sync::Mutex::new((Writes::Any, 0)),
            cuts: AtomicU64::new(0),
            checkpointed_cuts: AtomicU64::new(0),
            checkpointed_generation: AtomicU64::new(checkpointed_generation),
            intent_on_disk: AtomicU64::new(intent.map_or(0, |i| i.generation)),
            max_offset: AtomicU64::new(max),
            max_tx: watch::channel(max).0,
            flushed_tx: watch::channel(rec.flushed_offset).0,
            checkpoint_lock: Mutex::new(false),
            confirm: Mutex::new(confirm.min(max)),
            flush_observer: std::sync::OnceLock::new(),
            disk: Default::default(),
            tails,
            warm_turns,
            #[cfg(test)]
            store_loops: Default::default(),
            opts,
        });
        if let Some(i) = unfinished {
            tracing::warn!(offset = i.offset, wipe = i.wipe, report = ?rec.report,
                "finished a cut that a stop interrupted before its checkpoint");
            // Its checkpoint, now: the intent file goes with it.
            crate::store::flush::flush_and_checkpoint(&shared)?;
        } else if intent.is_some() {
            shared.checkpointed(checkpointed_generation);
        }
        let flusher = Flusher::start(Arc::clone(&shared))?;
        let scrub =
            crate::store::scrub::Scrubber::start(Arc::clone(&shared), shared.opts.scrub_rate)?;
        Ok(Self {
            shared,
            flusher,
            scrub,
            recovery: rec.report,
            closed: Default::default(),
            write_hook: WriteHook::default(),
        })
    }

    /// Which kinds of write fail now, and whether the disk is full.
    pub fn disk(&self) -> &crate::store::disk::DiskMonitor {
        &self.shared.disk
    }

    /// What recovery found at open.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.recovery
    }
    /// The store's options.
    pub fn options(&self) -> &StoreOptions {
        &self.shared.opts
    }
    /// The data directory.
    pub fn data_dir(&self) -> &Path {
        &self.shared.data_dir
    }
    /// The segment size.
    pub fn segment_size(&self) -> u64 {
        self.shared.opts.segment_size as u64
    }

    /// The lowest offset still stored (the first file's start); 0 for an empty store.
    pub fn min_offset(&self) -> u64 {
        self.shared.queue.min_offset().unwrap_or(0).min(self.max_offset())
    }
    /// The end of the valid data.
    pub fn max_offset(&self) -> u64 {
        self.shared.max_offset()
    }
    /// Everything below this offset is durable.
    pub fn flushed_offset(&self) -> u64 {
        *self.shared.flushed_tx.borrow()
    }
    /// The confirm offset the node knows (persisted with the checkpoint, never past the max
    /// offset; see [`crate::store::confirm`]).
    pub fn confirm_offset(&self) -> u64 {
        self.shared.confirm_offset()
    }
    /// Raises the confirm offset to `offset`, capped at the max offset; returns it.
    pub fn raise_confirm_offset(&self, offset: u64) -> u64 {
        self.shared.raise_confirm(offset)
    }
    /// Whether the store holds no bytes (no file yet, or only an empty one).
    pub fn is_empty(&self) -> bool {
        self.shared.queue.max_offset() == self.shared.queue.min_offset()
    }
    /// A receiver that sees every new max offset: tasks waiting for data wake at once.
    pub fn subscribe_max_offset(&self) -> watch::Receiver<u64> {
        self.shared.max_tx.subscribe()
    }
    /// A receiver that sees every new flushed offset.
    pub fn subscribe_flushed_offset(&self) -> watch::Receiver<u64> {
        self.shared.flushed_tx.subscribe()
    }
    /// The next queue offset of every (topic, queue id).
    pub fn queue_offsets(&self) -> QueueOffsets {
        self.shared.writer().queue_offsets.clone()
    }
    /// The next queue offset of one queue (0 when it has none yet).
    pub fn next_queue_offset(&self, topic: &str, queue_id: i32) -> i64 {
        let w = self.shared.writer();
        w.queue_offsets.get(topic).and_then(|q| q.get(&queue_id)).copied().unwrap_or(0)
    }
    /// The end of the last complete record.
    pub fn dispatched_offset(&self) -> u64 {
        self.shared.writer().dispatched
    }

    /// Appends one or more messages (the master's path). The batch is validated all-or-nothing
    /// and written contiguously; a record that does not fit (`size + 8 > remaining`) closes the
    /// file with the blank record and goes to the next file. Nothing is published until the
    /// whole batch is written; on an error (disk full) the batch is undone.
    pub fn append(&self, msgs: &[Message]) -> Result<AppendResult> {
        self.append_checked(msgs, None)
    }

    /// [`CommitLog::append`] for a writer admitted when the fence was `admitted`: refused with
    /// [`Error::Fenced`] if the fence changed since (raised, and maybe lowered again), so a
    /// put admitted before a role change never lands after it.
    pub fn append_admitted(&self, msgs: &[Message], admitted: FenceToken) -> Result<AppendResult> {
        self.append_checked(msgs, Some(admitted))
    }

    fn append_checked(
        &self,
        msgs: &[Message],
        admitted: Option<FenceToken>,
    ) -> Result<AppendResult> {
        let sizes = self.validate(msgs)?;
        self.run_write_hook();
        let mut w = self.shared.writer();
        self.check_open()?;
        let moved = admitted.is_some_and(|t| t.0 != w.fence_generation);
        if moved || !matches!(w.writes, Writes::Any | Writes::Appends) {
            return Err(Error::Fenced);
        }
        // Nothing is written past a cut whose durable half or checkpoint is owed (the first
        // retried here).
        if let Err(e) =
            self.shared.queue.settle().and_then(|()| self.shared.check_cut_checkpointed(&w))
        {
            let refused = Err(e);
            self.shared.disk.record(crate::store::disk::APPEND, &refused);
            return refused;
        }
        let start = self.max_offset();
        let appended = self.append_locked(&mut w, msgs, &sizes, start);
        self.shared.disk.record(crate::store::disk::APPEND, &appended);
        match appended {
            Ok((result, assigned)) => {
                debug_assert!(result.end_offset > start, "a batch appends at least one record");
                debug_assert_eq!(Some(result.end_offset), self.shared.queue.max_offset());
                for ((topic, qid), next) in assigned {
                    w.queue_offsets.entry(topic.to_owned()).or_default().insert(qid, next);
                }
                w.dispatched = result.end_offset;
                self.shared.publish_max(result.end_offset);
                Ok(result)
            }
            Err(e) => {
                debug_assert_eq!(self.max_offset(), start, "nothing of the batch is published");
                if let Err(undo) = self.shared.queue.truncate_unpublished(start) {
                    tracing::error!(%undo, offset = start, "could not undo a failed append");
                }
                Err(e)
            }
        }
    }

    fn validate(&self, msgs: &[Message]) -> Result<Vec<usize>> {
        let opts = &self.shared.opts;
        msgs.iter()
            .map(|m| {
                if m.body.len() > opts.max_message_size {
                    return Err(Error::MessageTooLarge {
                        size: m.body.len(),
                        max: opts.max_message_size,
                    });
                }
                let len = record::encoded_len(m)?;
                if len + BLANK_HEADER_SIZE > opts.segment_size {
                    return Err(Error::MessageTooLarge {
                        size: m.body.len(),
                        max: opts.segment_size - BLANK_HEADER_SIZE - (len - m.body.len()),
                    });
                }
                Ok(len)
            })
            .collect()
    }

    #[allow(clippy::type_complexity)]
    fn append_locked<'m>(
        &self,
        w: &mut WriterState,
        msgs: &'m [Message],
        sizes: &[usize],
        start: u64,
    ) -> Result<(AppendResult, HashMap<(&'m str, i32), i64>)> {
        let queue = &self.shared.queue;
        let mut file = queue.last_or_create(start)?;
        if file.wrote_pos() == 0 {
            // A segment the writer created (the store's first, or one after a full last file):
            // the store thread warms it and prepares the next one now, not at its next
            // interval's wake.
            self.flusher.prepare_next();
        }
        let mut assigned: HashMap<(&str, i32), i64> = HashMap::new();
        let mut records = Vec::with_capacity(msgs.len());
        for (m, &len) in msgs.iter().zip(sizes) {
            if len + BLANK_HEADER_SIZE > file.remaining() {
                file = roll(queue, &file)?;
                self.flusher.prepare_next();
            }
            let queue_offset = if record::is_transaction_prepared_or_rollback(m.sys_flag) {
                0
            } else {
                let key = (m.topic.as_str(), m.queue_id);
                let next = match assigned.get(&key) {
                    Some(n) => *n,
                    None => w
                        .queue_offsets
                        .get(&m.topic)
                        .and_then(|q| q.get(&m.queue_id))
                        .copied()
                        .unwrap_or(0),
                };
                assigned.insert(key, next + 1);
                next
            };
            let from = file.from_offset();
            let (pos, encoded) = file.append_with(len, |dst| {
                let offset = from + (file.wrote_pos() as u64);
                record::encode_into(m, queue_offset, offset as i64, dst)
            });
            encoded?;
            records.push(AppendedRecord {
                offset: from + pos as u64,
                size: len as u32,
                queue_offset,
            });
        }
        let end_offset = file.from_offset() + file.wrote_pos() as u64;
        Ok((AppendResult { records, end_offset }, assigned))
    }

    /// Cuts the log at `offset`, a record boundary at or below the end of the last complete
    /// record (a promoted slave's partial last record; a cut whose bytes are kept aside is
    /// [`CommitLog::truncate_keeping`]). The queue-offset table is rebuilt from the checkpoint
    /// (or the first file) by scanning up to `offset`; the cut is flushed and checkpointed
    /// before this returns. Blocking. The node stops the data plane first, but a reader may
    /// still hold slices of the cut range (a gRPC read in flight): the cut waits until it is
    /// dropped, at most [`crate::store::mapped_file::READER_WAIT`], and fails changing nothing
    /// after that. Once the readers are gone the log is cut even when the disk fails the cut's
    /// durable half (the zeroing's msync, a later file's unlink): the error is then that
    /// failure, with the max offset at the cut; every flush and append retries it, appends are
    /// refused until it works, and a repeat succeeds only once it is done (see
    /// [`crate::store::mapped_file_queue`], [`CommitLog::settle_cuts`]).
    pub fn truncate(&self, offset: u64) -> Result<()> {
        self.truncate_expecting(offset, None)
    }

    /// [`CommitLog::truncate`] that first keeps the bytes it removes, `[offset, max offset)`,
    /// aside in a tail file under `<data-dir>/truncated/` ([`crate::store::tails`]), described
    /// by `cause`, and counts it. A tail that cannot be kept (a full disk, a failing write)
    /// refuses the cut with [`Error::KeepTail`] naming the file: the log is as it was. The
    /// copy takes no lock a reader or a writer takes; the cut then refuses
    /// ([`Error::TailChanged`]) if the log moved meanwhile. Returns the tail kept (`None` when
    /// the cut removes no byte). Blocking.
    pub fn truncate_keeping(&self, offset: u64, cause: &TailCause) -> Result<Option<KeptTail>> {
        self.check_open()?;
        let (min, max) = (self.min_offset(), self.max_offset());
        if offset > max || offset < min {
            return Err(Error::OutOfRange { offset, min, max });
        }
        if offset == max {
            return self.truncate(offset).map(|()| None);
        }
        let tails = &self.shared.tails;
        let fs = self.shared.fs.as_ref();
        let mut book = tails.book();
        let read = |at: u64, len: usize| self.read(at, len);
        let kept = tails.keep(fs, &book, &read, (offset, max), cause)?;
        let generation = self.shared.writer().cut_generation;
        let cut = self.truncate_expecting(offset, Some(max));
        let stray = self.shared.writer().cut_generation != generation;
        if cut.is_ok() || self.max_offset() != max || stray {
            // Cut (a failing checkpoint after the cut still cut): the tail is the only copy. So
            // it is when the cut gave up leaving an intent it could not remove: a start before
            // the next checkpoint would finish that cut.
            tails.counted(fs, &mut book, &kept);
        } else {
            tails.discard(fs, &mut book, &kept);
        }
        cut.map(|()| Some(kept))
    }

    /// Finishes what earlier cuts owe the disk, if anything (the msync of a zeroed range, the
    /// unlink of a file out of the log; see [`crate::store::mapped_file_queue`]): flushed and
    /// checkpointed, so that no checkpoint on disk still claims the bytes cut. A slave's epoch
    /// check that keeps the log calls it before it adopts a history that builds on the cut (a
    /// role change's own checkpoint does the same). Blocking.
    pub fn settle_cuts(&self) -> Result<()> {
        let checkpointed = self.shared.checkpointed_cuts.load(Ordering::SeqCst);
        let intent_owed = self.shared.check_cut_checkpointed(&self.shared.writer()).is_err();
        if !self.shared.queue.owes()
            && self.shared.cuts.load(Ordering::SeqCst) <= checkpointed
            && !intent_owed
        {
            return Ok(());
        }
        crate::store::flush::flush_and_checkpoint(&self.shared).map(|_| ())
    }

    /// What the truncated tails kept aside amount to (never waits on a disk).
    pub fn tail_status(&self) -> TailStatus {
        self.shared.tails.status()
    }

    /// Runs the tails' retention once (the store thread does it every retention check); does
    /// nothing, returning no path, while a keep runs. Returns the removed tail files.
    pub fn run_tail_retention(&self, now: std::time::SystemTime) -> Result<Vec<PathBuf>> {
        self.shared.tails.try_retention(self.shared.fs.as_ref(), now)
    }

    /// [`CommitLog::truncate`]; with `expected`, refuses ([`Error::TailChanged`]) when the max
    /// offset is not that under the writer lock.
    fn truncate_expecting(&self, offset: u64, expected: Option<u64>) -> Result<()> {
        {
            let mut w = self.shared.writer();
            self.check_open()?;
            let (min, max) = (self.min_offset(), self.max_offset());
            if let Some(end) = expected.filter(|&e| e != max) {
                let reason = format!("the max offset is {max} now");
                return Err(Error::TailChanged { start: offset, end, reason });
            }
            if offset > max || offset < min {
                return Err(Error::OutOfRange { offset, min, max });
            }
            if offset == max && w.dispatched == max {
                // Cut already (a repeat): done once what the cut owes the disk is done.
                drop(w);
                return self.settle_cuts();
            }
            let table = self.rebuild_table(offset)?;
            let intent = CutIntent { offset, wipe: false, generation: w.cut_generation + 1 };
            let cut = self.shared.begin_cut();
            let removed = self
                .shared
                .queue
                .truncate_with_intent(offset, &mut || self.shared.store_intent(&mut w, &intent))?;
            tracing::warn!(from = max, to = offset, removed_files = ?removed, "commitlog truncated");
            w.queue_offsets = table;
            w.dispatched = offset;
            w.dispatch_error = None;
            self.shared.publish_max(offset);
            self.shared.clamp_confirm(offset);
            self.lower_flushed(offset);
            drop(cut);
        }
        crate::store::flush::flush_and_checkpoint(&self.shared).map(|_| ())
    }

    /// The queue-offset table as of `offset`, by scanning records from the checkpoint (when it
    /// lies at or below `offset`) or from the first file. Records carry their queue offsets, so
    /// the table is exact for every queue with a record left in the log.
    fn rebuild_table(&self, offset: u64) -> Result<QueueOffsets> {
        let min = self.min_offset();
        let checkpoint = Checkpoint::load(self.shared.fs.as_ref(), &self.shared.data_dir)?;
        let (pos, mut table) = match checkpoint {
            Some(cp) if cp.dispatched_offset <= offset && cp.dispatched_offset >= min => {
                (cp.dispatched_offset, cp.queue_offsets)
            }
            _ => (min, QueueOffsets::new()),
        };
        let walked = self.shared.queue.walk(pos, offset, Extent::Whole, |step| {
            if let Step::Record { view, .. } = step {
                recovery::apply_to_table(&mut table, view);
            }
        });
        if let Some((file, stop)) = walked.stop {
            return Err(stop.to_error(file.path()));
        }
        match walked.end {
            end if end < offset => Err(Error::OutOfRange { offset: end, min, max: offset }),
            end if end > offset => Err(Error::OutOfRange { offset, min, max: end }),
            _ => Ok(table),
        }
    }

    /// Empties the store (every segment file removed, queue offsets cleared): a slave's
    /// `force_resync`. Blocking.
    pub fn wipe(&self) -> Result<()> {
        {
            let mut w = self.shared.writer();
            self.check_open()?;
            let intent = CutIntent { offset: 0, wipe: true, generation: w.cut_generation + 1 };
            // A wipe goes on without it (a full disk is a reason to wipe): a crash before its
            // checkpoint then leaves an empty log with the old queue offsets.
            if let Err(e) = self.shared.store_intent(&mut w, &intent) {
                tracing::warn!(error = %e, "the wipe's intent could not be stored; wiping \
                    without it");
            }
            let cut_generation = w.cut_generation;
            let cut = self.shared.begin_cut();
            let removed = self.shared.queue.remove_all()?;
            tracing::warn!(files = removed.len(), "commitlog wiped for a full resync");
            *w = WriterState {
                writes: w.writes,
                fence_generation: w.fence_generation,
                cut_generation,
                ..WriterState::default()
            };
            self.shared.publish_max(0);
            self.shared.clamp_confirm(0);
            self.lower_flushed(0);
            drop(cut);
        }
        crate::store::flush::flush_and_checkpoint(&self.shared).map(|_| ())
    }

    /// Why the slave's dispatch stopped, if it did (replicated bytes that are not records).
    pub fn dispatch_error(&self) -> Option<String> {
        self.shared.writer().dispatch_error.clone()
    }

    /// A zero-copy slice of `[offset, ...)`: at most `max_bytes`, never past the end of the
    /// segment file holding `offset` nor past the max offset. `Ok(None)` at the max offset.
    pub fn read(&self, offset: u64, max_bytes: usize) -> Result<Option<Bytes>> {
        let max = self.max_offset();
        if offset == max {
            return Ok(None);
        }
        let min = self.min_offset();
        let out_of_range = || Error::OutOfRange { offset, min, max };
        if offset < min || offset > max {
            return Err(out_of_range());
        }
        let file = self.shared.queue.find(offset).ok_or_else(out_of_range)?;
        let limit = ((max - offset) as usize).min(max_bytes);
        Ok(file.read((offset - file.from_offset()) as usize, limit))
    }

    /// The segment file holding `offset`, for callers that stream whole files.
    pub fn file_at(&self, offset: u64) -> Option<Arc<MappedFile>> {
        self.shared.queue.find(offset)
    }

    /// Iterates the complete records from `offset` (a record boundary) to the max offset.
    /// Takes no lock a writer holds: the end is the dispatched offset as of the writer's last
    /// release, at most the max offset.
    pub fn records_from(&self, offset: u64) -> RecordIter<'_> {
        let dispatched = self.shared.dispatched.load(Ordering::Acquire);
        let cuts = self.shared.cuts.load(Ordering::SeqCst);
        RecordIter { log: self, offset, end: dispatched.min(self.max_offset()), cuts }
    }

    /// Starts a flush now and waits until everything below `offset` is durable, at most
    /// `sync_flush_timeout`.
    pub async fn wait_flushed(&self, offset: u64) -> std::result::Result<(), FlushTimeout> {
        self.flusher.request(offset);
        let mut rx = self.shared.flushed_tx.subscribe();
        let timeout = self.shared.opts.sync_flush_timeout;
        match tokio::time::timeout(timeout, rx.wait_for(|f| *f >= offset)).await {
            Ok(Ok(_)) => Ok(()),
            _ => Err(FlushTimeout { offset, timeout }),
        }
    }

    /// Lowers the flushed offset to a cut at `offset` (a truncate, a wipe, a refused record's
    /// cut), and what the store thread was asked to flush with it: bytes past the cut are gone,
    /// and a request past them would never be met (the thread then woke at once, again and
    /// again, until the log grew past it: a loop at full CPU). Puts still waiting for those
    /// bytes time out as before (FLUSH_DISK_TIMEOUT).
    pub(crate) fn lower_flushed(&self, offset: u64) {
        self.shared.flushed_tx.send_if_modified(|f| {
            let cut = *f > offset;
            *f = (*f).min(offset);
            cut
        });
        self.flusher.clamp_requested(offset);
    }

    /// Asks the store thread to flush up to `offset` soon, without waiting.
    pub fn request_flush(&self, offset: u64) {
        self.flusher.request(offset);
    }

    /// Flushes everything now, blocking the calling thread (not for async contexts).
    pub fn flush_blocking(&self) -> Result<u64> {
        self.shared.flush_files()
    }

    /// Writes a checkpoint now (after flushing what it covers). Blocking.
    pub fn checkpoint_blocking(&self) -> Result<()> {
        crate::store::flush::flush_and_checkpoint(&self.shared).map(|_| ())
    }

    /// Runs retention once: deletes whole segment files older than `file_reserved_time`, or
    /// the oldest while the disk is fuller than `disk_max_used_ratio`; never the file being
    /// written. Returns the removed paths.
    pub fn run_retention(&self, now: std::time::SystemTime) -> Result<Vec<PathBuf>> {
        crate::store::retention::run(&self.shared, now)
    }

    /// Calls `observe` with the duration of every flush that wrote something (the store
    /// thread's and the final one). Only the first observer set is kept.
    pub fn set_flush_observer(&self, observe: impl Fn(Duration) + Send + Sync + 'static) {
        let _ = self.shared.flush_observer.set(FlushObserver(Box::new(observe)));
    }

    /// Stops the store cleanly: final flush, checkpoint, abort marker removed. Later writes
    /// are refused with [`Error::Closed`]; reads still work. A second call does nothing.
    pub fn close(&self) -> Result<()> {
        {
            // Taking the writer lock waits for an append in progress and fences later ones.
            let _w = self.shared.writer();
            if self.closed.swap(true, Ordering::SeqCst) {
                return Ok(());
            }
        }
        self.flusher.stop();
        self.scrub.stop();
        crate::store::flush::flush_and_checkpoint(&self.shared)?;
        let abort = self.shared.data_dir.join(ABORT_FILE);
        self.shared.fs.remove(&abort).map_err(|e| Error::io("remove", &abort, e))
    }

    /// Stops the store as kill -9 stops a process: its threads (flushes, checkpoints, segment
    /// preparation, retention, scrub) end without a final flush or checkpoint, the abort
    /// marker stays (the next open recovers), and later writes are refused with
    /// [`Error::Closed`]; reads still work. For an in-process crash: a store that outlives its
    /// node must not write into a data directory a restarted node now owns.
    pub fn halt(&self) {
        {
            let _w = self.shared.writer();
            self.closed.store(true, Ordering::SeqCst);
        }
        self.flusher.stop();
        self.scrub.stop();
        // Last: a checkpoint in progress (a role change's, a truncation's) ends first, and
        // none starts after.
        *self.shared.checkpoint_lock.lock().unwrap_or_else(|e| e.into_inner()) = true;
    }

    pub(super) fn check_open(&self) -> Result<()> {
        if self.closed.load(Ordering::SeqCst) { Err(Error::Closed) } else { Ok(()) }
    }
}

fn roll(queue: &MappedFileQueue, file: &Arc<MappedFile>) -> Result<Arc<MappedFile>> {
    let remaining = file.remaining();
    debug_assert!(remaining >= BLANK_HEADER_SIZE, "every record leaves room for the blank");
    file.close_with(BLANK_HEADER_SIZE, |dst| record::encode_blank(remaining as i32, dst));
    queue.create(file.end_offset())
}

/// A record read back from the store.
#[derive(Debug, Clone)]
pub struct StoredRecord {
    /// The record's physical offset.
    pub offset: u64,
    /// The record's bytes (zero-copy).
    pub bytes: Bytes,
}

/// Iterator over complete records; see [`CommitLog::records_from`].
#[derive(Debug)]
pub struct RecordIter<'a> {
    log: &'a CommitLog,
    offset: u64,
    end: u64,
    /// The log's cut count when the iterator was made: it ends once a cut happened.
    cuts: u64,
}

impl RecordIter<'_> {
    /// Where the next record would start (past any end-of-file blank already crossed).
    pub fn offset(&self) -> u64 {
        self.offset
    }
}

impl Iterator for RecordIter<'_> {
    type Item = Result<StoredRecord>;

    fn next(&mut self) -> Option<Self::Item> {
        while self.offset < self.end {
            let file = self.log.shared.queue.find(self.offset)?;
            let bytes = file.read(0, usize::MAX)?;
            // Checked after the slice is counted: a cut that starts later waits for the slice,
            // so these bytes are the log the iterator was made on; one that started before is
            // seen here, and the iterator ends rather than read the rewritten log at offsets of
            // the old one (a prefix of the old log has been returned).
            if self.log.shared.cuts.load(Ordering::SeqCst) != self.cuts {
                return None;
            }
            let at = (self.offset - file.from_offset()) as usize;
            match scan::step(&bytes, file.from_offset(), file.size(), at)? {
                Step::Record { offset, view } => {
                    let size = view.total_size as usize;
                    self.offset += size as u64;
                    return Some(Ok(StoredRecord { offset, bytes: bytes.slice(at..at + size) }));
                }
                Step::EndOfFile { .. } => self.offset = file.end_offset(),
                Step::Stop(stop) => {
                    self.offset = self.end;
                    return Some(Err(stop.to_error(file.path())));
                }
            }
        }
        None
    }
}
