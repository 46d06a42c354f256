//! Keeping a tail aside, counting the tails and their retention.
//!
//! A keep copies the log's bytes of the range into a tail file through the [`FileSystem`]
//! seam in two passes of [`CHUNK`]s, never holding the range in memory: the first computes the
//! CRC for the header, the second writes the header and the data to a temporary file and
//! computes the CRC again (they must agree: the bytes did not change between the passes), then
//! the file is fsynced and renamed into place (the directory fsynced). Only then does the
//! commitlog cut ([`crate::store::CommitLog::truncate_keeping`]); a keep that fails refuses
//! the cut.
//!
//! The totals (bytes and files kept since the data directory exists) are persisted in
//! `truncated/totals` (a state file) after each cut; every tail file carries its number
//! (`seq`), so a start that finds a tail the totals do not count yet (the process stopped
//! between the cut and the totals' write) counts it then. Retention removes tail files older
//! than `store.truncated-retention`, and the oldest while the files present hold more than
//! `store.truncated-max-bytes` (never the newest one that way), at start and from the store
//! thread.
//!
//! Locks: the book (the totals) is held across a keep, the cut that follows it and a
//! retention run, never by a reader; the status mirror is a leaf that status and metrics read.

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::{CHUNK, TAILS_DIR, TailCause, TailMeta, list};
use crate::store::error::{Error, Result};
use crate::store::fs::FileSystem;
use crate::store::state_file;

/// The totals' file inside `truncated/`.
pub(crate) const TOTALS_FILE: &str = "totals";
/// The totals' state-file kind.
const TOTALS_KIND: &str = "tail-totals";
/// The ending of a keep's temporary file.
const TMP_SUFFIX: &str = ".tmp";

/// Reads `[offset, offset + len)` of the log, at most to the end of a segment.
pub(crate) type ReadLog<'a> = &'a dyn Fn(u64, usize) -> Result<Option<Bytes>>;

/// What the tails directory holds, for status and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TailStatus {
    /// Bytes kept aside since the data directory exists (files removed since included).
    pub bytes_total: u64,
    /// Tails kept since the data directory exists.
    pub files_total: u64,
    /// Tail files present now.
    pub files: u64,
    /// Bytes of the tail files present now (their data).
    pub bytes: u64,
}

/// A tail written and renamed into place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptTail {
    /// The tail file.
    pub path: PathBuf,
    /// Its header.
    pub meta: TailMeta,
}

/// The persisted totals.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Totals {
    bytes_total: u64,
    files_total: u64,
}

/// The tails of one data directory.
#[derive(Debug)]
pub(crate) struct Tails {
    data_dir: PathBuf,
    dir: PathBuf,
    retention: Duration,
    max_bytes: u64,
    /// Held across a keep and the cut after it, and across a retention run.
    book: Mutex<Totals>,
    /// What status reads (a leaf).
    mirror: Mutex<TailStatus>,
}

fn now_unix_ms(now: SystemTime) -> i64 {
    now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

impl Tails {
    /// The tails of `data_dir`: loads the totals (a damaged totals file refuses the start,
    /// naming it), counts a tail they miss, removes temporary files a keep left, and runs
    /// retention once.
    pub(crate) fn open(
        fs: &dyn FileSystem,
        data_dir: &Path,
        retention: Duration,
        max_bytes: u64,
    ) -> Result<Self> {
        let dir = data_dir.join(TAILS_DIR);
        let never = |_: &[u8]| Err("not a tail totals file".to_owned());
        let totals = state_file::load(fs, TOTALS_KIND, &dir.join(TOTALS_FILE), never)?;
        let tails = Self {
            data_dir: data_dir.to_path_buf(),
            dir,
            retention,
            max_bytes,
            book: Mutex::new(totals.unwrap_or_default()),
            mirror: Mutex::default(),
        };
        {
            let mut book = tails.book();
            tails.reconcile(fs, &mut book)?;
            tails.retention_locked(fs, &mut book, SystemTime::now())?;
        }
        Ok(tails)
    }

    /// The book's lock (see the module docs).
    pub(crate) fn book(&self) -> MutexGuard<'_, Totals> {
        self.book.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The directory's state as of the last keep or retention run (never waits on a disk).
    pub(crate) fn status(&self) -> TailStatus {
        *self.mirror.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts the tails present that the totals miss, and removes temporary files.
    fn reconcile(&self, fs: &dyn FileSystem, book: &mut Totals) -> Result<()> {
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for e in entries.flatten() {
                if e.file_name().to_str().is_some_and(|n| n.ends_with(TMP_SUFFIX)) {
                    let path = e.path();
                    match fs.remove(&path) {
                        Ok(()) => {
                            tracing::info!(
                                file = %path.display(),
                                "removed the temporary file of a tail keep that did not finish"
                            )
                        }
                        Err(e) => {
                            tracing::warn!(
                                file = %path.display(),
                                error = %e,
                                "cannot remove the temporary file of a tail keep"
                            )
                        }
                    }
                }
            }
        }
        let listed = list(&self.dir).map_err(|e| Error::io("list", &self.dir, e))?;
        let before = *book;
        for l in &listed {
            match &l.file {
                Ok(f) if f.meta.seq > before.files_total => {
                    book.bytes_total += f.meta.len_bytes();
                    book.files_total = book.files_total.max(f.meta.seq);
                }
                Ok(_) => {}
                Err(e) => tracing::warn!(error = %e, "a tail file cannot be read"),
            }
        }
        if *book != before {
            tracing::warn!(
                counted = book.files_total - before.files_total,
                "tail files the totals missed are counted"
            );
            self.store_totals(fs, book);
        }
        Ok(())
    }

    /// Writes the totals; a failure is logged (the next keep writes them again, and a start
    /// counts what they miss from the files' numbers).
    fn store_totals(&self, fs: &dyn FileSystem, book: &Totals) {
        let path = self.dir.join(TOTALS_FILE);
        if let Err(e) = state_file::store(fs, TOTALS_KIND, &path, book) {
            tracing::warn!(error = %e, "cannot write the tail totals");
        }
    }

    /// Copies `[start, end)` of the log (read through `read`) into a new tail file (see the
    /// module docs). Does not count it: the caller does once the log is cut
    /// ([`Tails::counted`]), or removes it when the cut did not happen ([`Tails::discard`]).
    pub(crate) fn keep(
        &self,
        fs: &dyn FileSystem,
        book: &Totals,
        read: ReadLog<'_>,
        (start, end): (u64, u64),
        cause: &TailCause,
    ) -> Result<KeptTail> {
        assert!(start < end, "a tail holds at least one byte");
        let data_crc32 = crc_of(read, start, end)?;
        let meta = TailMeta {
            seq: book.files_total + 1,
            start_offset: start,
            end_offset: end,
            data_crc32,
            time_unix_ms: now_unix_ms(SystemTime::now()),
            cause: cause.clone(),
        };
        let path = self.dir.join(meta.file_name());
        let tmp = self.dir.join(format!("{}{TMP_SUFFIX}", meta.file_name()));
        let fail = |source: Error| Error::KeepTail {
            path: path.clone(),
            start,
            end,
            source: Box::new(source),
        };
        self.ensure_dir(fs).map_err(fail)?;
        let header = meta.encode_header();
        let written = fs.write_file_with(&tmp, &mut |w: &mut dyn Write| {
            w.write_all(&header)?;
            let mut crc = crc32fast::Hasher::new();
            for_chunks(read, start, end, |chunk| {
                crc.update(chunk);
                w.write_all(chunk)
            })?;
            match crc.finalize() {
                c if c == data_crc32 => Ok(()),
                c => Err(io::Error::other(format!(
                    "the log's bytes changed while they were copied (CRC {data_crc32:#010x}, \
                     then {c:#010x})"
                ))),
            }
        });
        let renamed = written
            .map_err(|e| Error::io("write", &tmp, e))
            .and_then(|()| fs.rename(&tmp, &path).map_err(|e| Error::io("rename", &path, e)));
        if let Err(e) = renamed {
            let _ = fs.remove(&tmp);
            return Err(fail(e));
        }
        tracing::warn!(file = %path.display(), start, end, "truncated tail kept aside");
        Ok(KeptTail { path, meta })
    }

    /// Creates `truncated/` (and makes its entry in the data directory durable) if needed.
    fn ensure_dir(&self, fs: &dyn FileSystem) -> Result<()> {
        if self.dir.is_dir() {
            return Ok(());
        }
        fs.create_dir_all(&self.dir).map_err(|e| Error::io("create directory", &self.dir, e))?;
        fs.sync_dir(&self.data_dir).map_err(|e| Error::io("fsync", &self.data_dir, e))
    }

    /// Counts a kept tail once the log was cut.
    pub(crate) fn counted(&self, fs: &dyn FileSystem, book: &mut Totals, kept: &KeptTail) {
        debug_assert_eq!(kept.meta.seq, book.files_total + 1, "tails are counted in order");
        book.bytes_total += kept.meta.len_bytes();
        book.files_total = kept.meta.seq;
        self.store_totals(fs, book);
        let mut m = self.mirror.lock().unwrap_or_else(|e| e.into_inner());
        (m.bytes_total, m.files_total) = (book.bytes_total, book.files_total);
        m.files += 1;
        m.bytes += kept.meta.len_bytes();
    }

    /// Removes a kept tail whose cut did not happen (the log still holds its bytes, and a
    /// repeat keeps them again); one that cannot be removed is counted instead.
    pub(crate) fn discard(&self, fs: &dyn FileSystem, book: &mut Totals, kept: &KeptTail) {
        match fs.remove(&kept.path) {
            Ok(()) => {
                tracing::info!(
                    file = %kept.path.display(),
                    "the log was not cut: its tail file is removed"
                )
            }
            Err(e) => {
                tracing::warn!(
                    file = %kept.path.display(),
                    error = %e,
                    "the log was not cut and its tail file cannot be removed: counted"
                );
                self.counted(fs, book, kept);
            }
        }
    }

    /// Runs retention unless a keep holds the book now (then the next run does it).
    pub(crate) fn try_retention(
        &self,
        fs: &dyn FileSystem,
        now: SystemTime,
    ) -> Result<Vec<PathBuf>> {
        match self.book.try_lock() {
            Ok(mut book) => self.retention_locked(fs, &mut book, now),
            Err(std::sync::TryLockError::Poisoned(p)) => {
                self.retention_locked(fs, &mut p.into_inner(), now)
            }
            Err(std::sync::TryLockError::WouldBlock) => Ok(Vec::new()),
        }
    }

    /// Removes the tail files retention says (see the module docs) and refreshes the mirror.
    fn retention_locked(
        &self,
        fs: &dyn FileSystem,
        book: &mut Totals,
        now: SystemTime,
    ) -> Result<Vec<PathBuf>> {
        let mut listed = list(&self.dir).map_err(|e| Error::io("list", &self.dir, e))?;
        listed.sort_by_key(|l| l.time_unix_ms());
        let data_len =
            |l: &super::Listed| l.file.as_ref().map_or(l.file_len, |f| f.meta.len_bytes());
        let cutoff = now_unix_ms(now) - self.retention.as_millis() as i64;
        let mut present: u64 = listed.iter().map(data_len).sum();
        let mut removed = Vec::new();
        let mut keep = Vec::new();
        let count = listed.len();
        for (i, l) in listed.into_iter().enumerate() {
            let expired = l.time_unix_ms() < cutoff;
            let over = present > self.max_bytes && i + 1 < count;
            if !(expired || over) {
                keep.push(l);
                continue;
            }
            match fs.remove(&l.path) {
                Ok(()) => {
                    tracing::info!(
                        file = %l.path.display(),
                        expired,
                        over_max_bytes = over,
                        "retention removed a tail file"
                    );
                    present -= data_len(&l);
                    removed.push(l.path);
                }
                Err(e) => {
                    tracing::warn!(
                        file = %l.path.display(),
                        error = %e,
                        "retention cannot remove a tail file"
                    );
                    keep.push(l);
                }
            }
        }
        *self.mirror.lock().unwrap_or_else(|e| e.into_inner()) = TailStatus {
            bytes_total: book.bytes_total,
            files_total: book.files_total,
            files: keep.len() as u64,
            bytes: present,
        };
        Ok(removed)
    }
}

/// Calls `each` with the log's bytes of `[start, end)` in order, at most [`CHUNK`] at a time.
fn for_chunks(
    read: ReadLog<'_>,
    start: u64,
    end: u64,
    mut each: impl FnMut(&[u8]) -> io::Result<()>,
) -> io::Result<()> {
    let mut at = start;
    while at < end {
        let want = ((end - at) as usize).min(CHUNK);
        let chunk = match read(at, want) {
            Ok(Some(c)) if !c.is_empty() => c,
            Ok(_) => {
                return Err(io::Error::other(format!(
                    "the log holds no bytes at offset {at} (copying [{start}, {end}))"
                )));
            }
            Err(e) => return Err(io::Error::other(e.to_string())),
        };
        debug_assert!(chunk.len() <= want);
        each(&chunk)?;
        at += chunk.len() as u64;
    }
    Ok(())
}

/// The CRC32 of the log's bytes of `[start, end)`.
fn crc_of(read: ReadLog<'_>, start: u64, end: u64) -> Result<u32> {
    let mut crc = crc32fast::Hasher::new();
    for_chunks(read, start, end, |chunk| {
        crc.update(chunk);
        Ok(())
    })
    .map_err(|e| Error::TailChanged { start, end, reason: e.to_string() })?;
    Ok(crc.finalize())
}
