//! The store's settings, built from the `[store]` section of the configuration, which owns
//! every default; and the one `[store]` rule only the store can check (the largest record and
//! the end-of-file blank must fit in a segment), reported with its config key.

use std::time::Duration;

use crate::config::units::ByteSize;
use crate::config::{self, FlushMode, StoreConfig, WarmLock};
use crate::store::error::Result;
use crate::store::record::{BLANK_HEADER_SIZE, MAX_RECORD_OVERHEAD};

/// How often the store thread runs retention. Not a config key.
pub(crate) const RETENTION_CHECK_INTERVAL: Duration = Duration::from_secs(10);

/// How appended data reaches the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FlushPolicy {
    /// A background flush every `flush_interval` (RocketMQ's ASYNC_FLUSH).
    #[default]
    Async,
    /// Puts wait for their bytes to be flushed; concurrent puts share one msync (SYNC_FLUSH).
    Sync,
}

/// The store's settings (from the `[store]` section of the configuration).
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// Size of every segment file.
    pub segment_size: usize,
    /// Largest message body accepted by `append`.
    pub max_message_size: usize,
    /// Async or sync flush.
    pub flush: FlushPolicy,
    /// Period of the background flush (and of checkpoints).
    pub flush_interval: Duration,
    /// How long a sync-flush put waits before FLUSH_DISK_TIMEOUT.
    pub sync_flush_timeout: Duration,
    /// Segment files older than this are deleted (never the one being written).
    pub file_reserved_time: Duration,
    /// Above this fraction of the disk in use, the oldest segment files are deleted.
    pub disk_max_used_ratio: f64,
    /// Period of the retention check.
    pub retention_check_interval: Duration,
    /// Truncate at corruption below the checkpoint instead of refusing to start.
    pub repair: bool,
    /// Fault the pages of the next segment in when it is allocated ahead of time.
    pub warm_segments: bool,
    /// Among which stores the warms take turns ([`crate::store::warm`]).
    pub warm_lock: WarmLock,
    /// Bytes per second the background scrub reads (0: no scrub).
    pub scrub_rate: u64,
    /// The nice value the store thread and the scrub run at (0: the process's priority).
    /// Under sync flush the store thread keeps the process's priority: puts wait for it.
    pub background_nice: u8,
    /// A slave's acks wait for this store's flushes (`slave.ack-mode = "flushed"`): the store
    /// thread keeps the process's priority (the scrub does not).
    pub acks_wait_for_flushes: bool,
    /// Tail files older than this are removed ([`crate::store::tails`]).
    pub truncated_retention: Duration,
    /// While the tail files hold more than this, the oldest are removed (never the newest).
    pub truncated_max_bytes: u64,
}

/// The options of the default `[store]` section ([`StoreConfig::default`]), no repair.
impl Default for StoreOptions {
    fn default() -> Self {
        Self::from_config(&StoreConfig::default()).expect("the default [store] section is valid")
    }
}

impl StoreOptions {
    /// The options the `[store]` section of the configuration sets (no repair; retention every
    /// [`RETENTION_CHECK_INTERVAL`]). Refuses a section whose largest record does not fit in a
    /// segment ([`StoreOptions::check_config`]).
    pub fn from_config(c: &StoreConfig) -> Result<Self> {
        Self::check_config(c)?;
        Ok(Self {
            segment_size: c.segment_size.0 as usize,
            max_message_size: c.max_message_size.0 as usize,
            flush: match c.flush {
                FlushMode::Async => FlushPolicy::Async,
                FlushMode::Sync => FlushPolicy::Sync,
            },
            flush_interval: c.flush_interval,
            sync_flush_timeout: c.sync_flush_timeout,
            file_reserved_time: c.file_reserved_time,
            disk_max_used_ratio: c.disk_max_used_ratio,
            retention_check_interval: RETENTION_CHECK_INTERVAL,
            repair: false,
            warm_segments: c.warm_segments,
            warm_lock: WarmLock::parse(&c.warm_lock).map_err(|reason| config::Error::Invalid {
                key: "store.warm-lock".to_owned(),
                value: format!("{:?}", c.warm_lock),
                reason: reason.to_owned(),
            })?,
            scrub_rate: c.scrub_rate.bytes(),
            background_nice: c.background_nice,
            acks_wait_for_flushes: false,
            truncated_retention: c.truncated_retention,
            truncated_max_bytes: c.truncated_max_bytes.bytes(),
        })
    }

    /// The `[store]` rule the store owns: the largest record (`store.max-message-size` plus
    /// [`MAX_RECORD_OVERHEAD`] bytes of header, topic and properties) and the end-of-file blank
    /// must fit in `store.segment-size`. Reported as an invalid `store.max-message-size`.
    /// [`crate::config::Config::validate_with`] runs it after the section's own rules.
    pub(crate) fn check_config(c: &StoreConfig) -> std::result::Result<(), config::Error> {
        let segment = c.segment_size.bytes();
        let blank = BLANK_HEADER_SIZE as u64;
        let overhead = MAX_RECORD_OVERHEAD as u64 + blank;
        let body = c.max_message_size.bytes();
        if body.saturating_add(overhead) <= segment {
            return Ok(());
        }
        Err(config::Error::Invalid {
            key: "store.max-message-size".to_owned(),
            value: format!("{:?}", c.max_message_size.to_string()),
            reason: format!(
                "the largest record ({body} + {MAX_RECORD_OVERHEAD} bytes of header, topic and \
                 properties) plus the {blank}-byte end-of-file blank must fit in \
                 `store.segment-size` ({}); at most {} here",
                c.segment_size,
                ByteSize(segment.saturating_sub(overhead)),
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_come_from_the_config_defaults() {
        let c = StoreConfig::default();
        let o = StoreOptions::default();
        assert_eq!(o.segment_size as u64, c.segment_size.bytes());
        assert_eq!(o.max_message_size as u64, c.max_message_size.bytes());
        assert_eq!(o.flush, FlushPolicy::Async);
        assert_eq!(o.flush_interval, c.flush_interval);
        assert_eq!(o.sync_flush_timeout, c.sync_flush_timeout);
        assert_eq!(o.file_reserved_time, c.file_reserved_time);
        assert_eq!(o.disk_max_used_ratio, c.disk_max_used_ratio);
        assert_eq!(o.warm_segments, c.warm_segments);
        assert_eq!(o.warm_lock, WarmLock::Process);
        assert_eq!(o.scrub_rate, c.scrub_rate.bytes());
        assert_eq!(o.background_nice, c.background_nice);
        assert!(!o.acks_wait_for_flushes);
        assert_eq!(o.truncated_retention, c.truncated_retention);
        assert_eq!(o.truncated_max_bytes, c.truncated_max_bytes.bytes());
        assert_eq!(o.retention_check_interval, RETENTION_CHECK_INTERVAL);
        assert!(!o.repair);
    }

    #[test]
    fn largest_record_must_fit_a_segment_named_by_its_key() {
        let limit = 65536 - MAX_RECORD_OVERHEAD as u64 - BLANK_HEADER_SIZE as u64;
        let mut c = StoreConfig { segment_size: ByteSize::kib(64), ..StoreConfig::default() };
        c.max_message_size = ByteSize(limit);
        StoreOptions::from_config(&c).unwrap();
        c.max_message_size = ByteSize(limit + 1);
        let err = StoreOptions::check_config(&c).unwrap_err();
        assert_eq!(err.keys(), ["store.max-message-size"]);
        let shown = err.to_string();
        assert!(shown.starts_with("invalid `store.max-message-size` = "), "{shown}");
        assert!(shown.contains("must fit in `store.segment-size` (64KiB)"), "{shown}");
        let err = StoreOptions::from_config(&c).unwrap_err();
        assert_eq!(err.to_string(), shown, "node start refuses it with the same words");
    }
}
