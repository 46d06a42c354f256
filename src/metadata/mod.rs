//! Broker metadata: topic configs, consumer offsets, delay offsets and subscription groups,
//! each with a data version (as upstream's DataVersion) that every change on the master bumps.
//!
//! A master changes the tables through the write methods; a slave adopts the master's tables
//! whole, with their versions verbatim (never bumping its own), and persists only tables whose
//! version changed, so an unchanged pass writes nothing (upstream #9777). Topics, groups and
//! delay offsets are written when they change; consumer offsets, which change constantly, at
//! most every `consumer-offset-persist-interval` and at shutdown.

pub mod names;
mod persist;
pub(crate) mod pull;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::{Deserialize, Serialize};

use crate::store::fs::FileSystem;

use persist::FORMAT_VERSION;
pub use persist::bak_path;
pub use pull::PullStatus;

/// The directory of the metadata files inside the data directory.
pub(crate) const CONFIG_DIR: &str = "config";

/// Why a metadata call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MetadataError {
    /// A request argument is invalid.
    #[error("invalid {field}: {reason}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// Why.
        reason: String,
    },
    /// A topic or group to delete does not exist.
    #[error("{0} not found")]
    NotFound(String),
    /// A metadata file could not be read or written.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A topic or group name breaks the naming rule ([`names`]).
    #[error(transparent)]
    Name(#[from] names::NameError),
    /// Both a metadata file and its `.bak` are unreadable.
    #[error("metadata file {} and its backup {} are both unreadable: {reason}", main.display(), bak.display())]
    Corrupt {
        /// The main file.
        main: PathBuf,
        /// The backup.
        bak: PathBuf,
        /// What is wrong with each.
        reason: String,
    },
}

/// Upstream's DataVersion.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DataVersion {
    /// State version (the master's epoch in controller mode; 0 here).
    pub state_version: i64,
    /// When the version was made, Unix ms.
    pub timestamp_unix_ms: i64,
    /// Bumped on every change.
    pub counter: i64,
}

impl DataVersion {
    fn next(self) -> Self {
        Self {
            state_version: self.state_version,
            timestamp_unix_ms: crate::ha::status::now_millis(),
            counter: self.counter + 1,
        }
    }
}

/// A topic's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TopicConfig {
    /// Name.
    pub topic_name: String,
    /// Read queues.
    pub read_queue_nums: u32,
    /// Write queues.
    pub write_queue_nums: u32,
    /// Permission bits: 2 write, 4 read (6 both).
    pub perm: u32,
    /// "SINGLE_TAG" or "MULTI_TAG".
    pub topic_filter_type: String,
    /// Topic system flags.
    pub topic_sys_flag: u32,
    /// Ordered topic.
    pub order: bool,
}

/// A subscription group's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubscriptionGroupConfig {
    /// Name.
    pub group_name: String,
    /// Whether the group may consume.
    pub consume_enable: bool,
    /// Broadcast consumption.
    pub consume_broadcast_enable: bool,
    /// Retry queues.
    pub retry_queue_nums: u32,
    /// Most retries.
    pub retry_max_times: u32,
    /// Broker to consume from.
    pub broker_id: u64,
    /// Broker to consume from when consumption is slow.
    pub which_broker_when_consume_slowly: u64,
    /// Notify consumers when the group's consumer ids change.
    pub notify_consumer_ids_changed_enable: bool,
}

/// The four tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Table {
    /// Topic configs.
    Topics,
    /// `group@topic` -> queue id -> offset.
    ConsumerOffsets,
    /// Delay level -> offset.
    DelayOffsets,
    /// Subscription group configs.
    SubscriptionGroups,
}

impl Table {
    /// All tables.
    pub const ALL: [Table; 4] =
        [Table::Topics, Table::ConsumerOffsets, Table::DelayOffsets, Table::SubscriptionGroups];

    /// The file name under `config/`.
    pub fn file_name(self) -> &'static str {
        match self {
            Table::Topics => "topics.json",
            Table::ConsumerOffsets => "consumerOffset.json",
            Table::DelayOffsets => "delayOffset.json",
            Table::SubscriptionGroups => "subscriptionGroup.json",
        }
    }
}

/// Consumer offsets: `group@topic` -> queue id -> offset.
pub type ConsumerOffsets = BTreeMap<String, BTreeMap<i32, i64>>;

/// The data of one table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TableData {
    /// Topic configs by name.
    Topics(BTreeMap<String, TopicConfig>),
    /// Consumer offsets.
    ConsumerOffsets(ConsumerOffsets),
    /// Delay offsets by level.
    DelayOffsets(BTreeMap<i32, i64>),
    /// Groups by name.
    SubscriptionGroups(BTreeMap<String, SubscriptionGroupConfig>),
}

impl TableData {
    /// Which table this is.
    pub fn table(&self) -> Table {
        match self {
            TableData::Topics(_) => Table::Topics,
            TableData::ConsumerOffsets(_) => Table::ConsumerOffsets,
            TableData::DelayOffsets(_) => Table::DelayOffsets,
            TableData::SubscriptionGroups(_) => Table::SubscriptionGroups,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct File<T> {
    format_version: u32,
    data_version: DataVersion,
    table: T,
}

#[derive(Debug, Default)]
struct Tables {
    topics: (DataVersion, BTreeMap<String, TopicConfig>),
    offsets: (DataVersion, ConsumerOffsets),
    delay: (DataVersion, BTreeMap<i32, i64>),
    groups: (DataVersion, BTreeMap<String, SubscriptionGroupConfig>),
}

impl Tables {
    fn versions(&self) -> [(Table, DataVersion); 4] {
        [
            (Table::Topics, self.topics.0),
            (Table::ConsumerOffsets, self.offsets.0),
            (Table::DelayOffsets, self.delay.0),
            (Table::SubscriptionGroups, self.groups.0),
        ]
    }
}

/// The table lock; its drop publishes the versions to [`MetadataStore::versions`] (a leaf lock
/// taken under the table lock).
struct TablesGuard<'a> {
    tables: MutexGuard<'a, Tables>,
    mirror: &'a Mutex<[(Table, DataVersion); 4]>,
}

impl std::ops::Deref for TablesGuard<'_> {
    type Target = Tables;
    fn deref(&self) -> &Tables {
        &self.tables
    }
}

impl std::ops::DerefMut for TablesGuard<'_> {
    fn deref_mut(&mut self) -> &mut Tables {
        &mut self.tables
    }
}

impl Drop for TablesGuard<'_> {
    fn drop(&mut self) {
        *self.mirror.lock().unwrap_or_else(|e| e.into_inner()) = self.tables.versions();
    }
}

/// The metadata of one node.
#[derive(Debug)]
pub struct MetadataStore {
    dir: PathBuf,
    fs: Arc<dyn FileSystem>,
    tables: Mutex<Tables>,
    /// The tables' versions as of the last release of the table lock (stored by
    /// [`TablesGuard`]'s drop): status and health read them without waiting for a write that
    /// holds the table lock across its file write and fsync.
    versions: Mutex<[(Table, DataVersion); 4]>,
    offsets_dirty: AtomicBool,
    files_written: AtomicU64,
}

fn load<T: serde::de::DeserializeOwned + Default>(
    fs: &dyn FileSystem,
    dir: &Path,
    table: Table,
) -> Result<(DataVersion, T), MetadataError> {
    let path = dir.join(table.file_name());
    match persist::read::<File<T>>(fs, &path)? {
        Some(f) if f.format_version == FORMAT_VERSION => Ok((f.data_version, f.table)),
        Some(f) => Err(MetadataError::Corrupt {
            main: path.clone(),
            bak: bak_path(&path),
            reason: format!("unknown format version {}", f.format_version),
        }),
        None => Ok((DataVersion::default(), T::default())),
    }
}

fn invalid(field: &'static str, reason: impl Into<String>) -> MetadataError {
    MetadataError::Invalid { field, reason: reason.into() }
}

impl MetadataStore {
    /// Loads the four tables from `<data_dir>/config/` (each falling back to its `.bak`).
    pub fn open(fs: Arc<dyn FileSystem>, data_dir: &Path) -> Result<Self, MetadataError> {
        let dir = data_dir.join(CONFIG_DIR);
        fs.create_dir_all(&dir).map_err(|e| MetadataError::Io {
            op: "create directory",
            path: dir.clone(),
            source: e,
        })?;
        let tables = Tables {
            topics: load(fs.as_ref(), &dir, Table::Topics)?,
            offsets: load(fs.as_ref(), &dir, Table::ConsumerOffsets)?,
            delay: load(fs.as_ref(), &dir, Table::DelayOffsets)?,
            groups: load(fs.as_ref(), &dir, Table::SubscriptionGroups)?,
        };
        Ok(Self {
            dir,
            fs,
            versions: Mutex::new(tables.versions()),
            tables: Mutex::new(tables),
            offsets_dirty: AtomicBool::new(false),
            files_written: AtomicU64::new(0),
        })
    }

    fn lock(&self) -> TablesGuard<'_> {
        let tables = self.tables.lock().unwrap_or_else(|e| e.into_inner());
        TablesGuard { tables, mirror: &self.versions }
    }

    /// How many metadata files were written since open (tests and metrics).
    pub fn files_written(&self) -> u64 {
        self.files_written.load(Ordering::Relaxed)
    }

    /// The version of every table.
    /// Never waits for a write in flight: the versions as of the last completed one.
    pub fn versions(&self) -> [(Table, DataVersion); 4] {
        *self.versions.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The version of one table.
    pub fn version(&self, table: Table) -> DataVersion {
        self.versions().into_iter().find(|(t, _)| *t == table).map(|(_, v)| v).unwrap_or_default()
    }

    /// A copy of one table with its version.
    pub fn snapshot(&self, table: Table) -> (DataVersion, TableData) {
        let t = self.lock();
        match table {
            Table::Topics => (t.topics.0, TableData::Topics(t.topics.1.clone())),
            Table::ConsumerOffsets => {
                (t.offsets.0, TableData::ConsumerOffsets(t.offsets.1.clone()))
            }
            Table::DelayOffsets => (t.delay.0, TableData::DelayOffsets(t.delay.1.clone())),
            Table::SubscriptionGroups => {
                (t.groups.0, TableData::SubscriptionGroups(t.groups.1.clone()))
            }
        }
    }

    /// A copy of the table when its version differs from `held`; `None` when unchanged (one
    /// version comparison, no copy).
    pub fn snapshot_if_changed(
        &self,
        table: Table,
        held: Option<DataVersion>,
    ) -> Option<(DataVersion, TableData)> {
        if held.is_some_and(|h| h == self.version(table)) {
            return None;
        }
        Some(self.snapshot(table))
    }

    /// Writes `v` as `table`'s file (temporary file, fsync, rename): durable when it returns.
    fn write_table<T: Serialize>(
        &self,
        table: Table,
        v: &(DataVersion, T),
    ) -> Result<(), MetadataError> {
        let path = self.dir.join(table.file_name());
        persist::write(self.fs.as_ref(), &path, &file_of(v))?;
        self.files_written.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Creates or replaces a topic. Blocking (writes the file). Applied (table and version)
    /// only once the new table is durable; a failed write changes nothing.
    pub fn upsert_topic(&self, cfg: TopicConfig) -> Result<DataVersion, MetadataError> {
        names::check_topic(&cfg.topic_name)?;
        if cfg.read_queue_nums == 0 || cfg.write_queue_nums == 0 {
            return Err(invalid(
                "queue counts",
                "read_queue_nums and write_queue_nums must be at least 1",
            ));
        }
        if cfg.read_queue_nums > 1024 || cfg.write_queue_nums > 1024 {
            return Err(invalid("queue counts", "at most 1024 queues"));
        }
        if cfg.perm & !6 != 0 || cfg.perm == 0 {
            return Err(invalid(
                "perm",
                format!("{}: use 2 (write), 4 (read) or 6 (both)", cfg.perm),
            ));
        }
        if !matches!(cfg.topic_filter_type.as_str(), "SINGLE_TAG" | "MULTI_TAG") {
            return Err(invalid("topic_filter_type", "SINGLE_TAG or MULTI_TAG"));
        }
        let mut t = self.lock();
        if t.topics.1.get(&cfg.topic_name) == Some(&cfg) {
            return Ok(t.topics.0);
        }
        let mut next = (t.topics.0.next(), t.topics.1.clone());
        next.1.insert(cfg.topic_name.clone(), cfg);
        self.write_table(Table::Topics, &next)?;
        t.topics = next;
        Ok(t.topics.0)
    }

    /// Deletes a topic. Blocking; applied only once durable.
    pub fn delete_topic(&self, name: &str) -> Result<DataVersion, MetadataError> {
        let mut t = self.lock();
        if !t.topics.1.contains_key(name) {
            // A name outside the rule is refused as such; one held already (from a build with
            // a looser rule) can still be deleted.
            names::check_topic(name)?;
            return Err(MetadataError::NotFound(format!("topic {name:?}")));
        }
        let mut next = (t.topics.0.next(), t.topics.1.clone());
        next.1.remove(name);
        self.write_table(Table::Topics, &next)?;
        t.topics = next;
        Ok(t.topics.0)
    }

    /// Records a consumer offset; the group must exist. Applied in memory at once (the
    /// documented exception): persisted by [`MetadataStore::persist_offsets_if_dirty`].
    pub fn commit_offset(
        &self,
        group: &str,
        topic: &str,
        queue_id: i32,
        offset: i64,
    ) -> Result<DataVersion, MetadataError> {
        names::check_topic(topic)?;
        if queue_id < 0 {
            return Err(invalid("queue_id", format!("{queue_id} is negative")));
        }
        if offset < 0 {
            return Err(invalid("offset", format!("{offset} is negative")));
        }
        let mut t = self.lock();
        if !t.groups.1.contains_key(group) {
            return Err(invalid(
                "group",
                format!("unknown subscription group {group:?} (create it first)"),
            ));
        }
        t.offsets.1.entry(format!("{group}@{topic}")).or_default().insert(queue_id, offset);
        t.offsets.0 = t.offsets.0.next();
        self.offsets_dirty.store(true, Ordering::Release);
        Ok(t.offsets.0)
    }

    /// Creates or replaces a subscription group. Blocking; applied only once durable.
    pub fn upsert_group(&self, cfg: SubscriptionGroupConfig) -> Result<DataVersion, MetadataError> {
        names::check_group(&cfg.group_name)?;
        let mut t = self.lock();
        if t.groups.1.get(&cfg.group_name) == Some(&cfg) {
            return Ok(t.groups.0);
        }
        let mut next = (t.groups.0.next(), t.groups.1.clone());
        next.1.insert(cfg.group_name.clone(), cfg);
        self.write_table(Table::SubscriptionGroups, &next)?;
        t.groups = next;
        Ok(t.groups.0)
    }

    /// Deletes a subscription group (applied only once durable) and its consumer offsets (in
    /// memory at once, as every consumer-offset change; written now, and if that write fails,
    /// by the next persist). A name not held and outside the rule is refused as such
    /// (INVALID_ARGUMENT), as [`MetadataStore::delete_topic`] does.
    pub fn delete_group(&self, name: &str) -> Result<DataVersion, MetadataError> {
        let mut t = self.lock();
        if !t.groups.1.contains_key(name) {
            // As DeleteTopic: a name outside the rule is refused as such.
            names::check_group(name)?;
            return Err(MetadataError::NotFound(format!("subscription group {name:?}")));
        }
        let mut next = (t.groups.0.next(), t.groups.1.clone());
        next.1.remove(name);
        self.write_table(Table::SubscriptionGroups, &next)?;
        t.groups = next;
        let prefix = format!("{name}@");
        let before = t.offsets.1.len();
        t.offsets.1.retain(|k, _| !k.starts_with(&prefix));
        if t.offsets.1.len() != before {
            t.offsets.0 = t.offsets.0.next();
            if let Err(e) = self.write_table(Table::ConsumerOffsets, &t.offsets) {
                self.offsets_dirty.store(true, Ordering::Release);
                tracing::error!(error = %e, group = name, "writing the consumer offsets of a deleted group failed; the next persist retries");
            }
        }
        Ok(t.groups.0)
    }

    /// Sets a delay level's offset. Blocking; applied only once durable.
    pub fn set_delay_offset(&self, level: i32, offset: i64) -> Result<DataVersion, MetadataError> {
        if !(1..=64).contains(&level) {
            return Err(invalid("level", format!("{level}: delay levels are 1..=64")));
        }
        if offset < 0 {
            return Err(invalid("offset", format!("{offset} is negative")));
        }
        let mut t = self.lock();
        let mut next = (t.delay.0.next(), t.delay.1.clone());
        next.1.insert(level, offset);
        self.write_table(Table::DelayOffsets, &next)?;
        t.delay = next;
        Ok(t.delay.0)
    }

    /// Writes the consumer offsets if they changed since the last write. Blocking. A failed
    /// write leaves them dirty: the next call retries.
    pub fn persist_offsets_if_dirty(&self) -> Result<bool, MetadataError> {
        if !self.offsets_dirty.swap(false, Ordering::AcqRel) {
            return Ok(false);
        }
        let t = self.lock();
        if let Err(e) = self.write_table(Table::ConsumerOffsets, &t.offsets) {
            self.offsets_dirty.store(true, Ordering::Release);
            return Err(e);
        }
        Ok(true)
    }

    /// A slave adopts a table pulled from its master, version verbatim: it persists it first
    /// and adopts it only once durable (a failed write keeps the old table and version, so the
    /// next pull asks again); an equal version changes and writes nothing. Returns whether it
    /// changed. Blocking.
    pub fn adopt(&self, version: DataVersion, data: TableData) -> Result<bool, MetadataError> {
        let table = data.table();
        let mut t = self.lock();
        if self_version(&t, table) == version {
            return Ok(false);
        }
        match data {
            TableData::Topics(d) => {
                let next = (version, d);
                self.write_table(table, &next)?;
                t.topics = next;
            }
            TableData::ConsumerOffsets(d) => {
                let next = (version, d);
                self.write_table(table, &next)?;
                t.offsets = next;
            }
            TableData::DelayOffsets(d) => {
                let next = (version, d);
                self.write_table(table, &next)?;
                t.delay = next;
            }
            TableData::SubscriptionGroups(d) => {
                let next = (version, d);
                self.write_table(table, &next)?;
                t.groups = next;
            }
        }
        Ok(true)
    }
}

fn self_version(t: &Tables, table: Table) -> DataVersion {
    match table {
        Table::Topics => t.topics.0,
        Table::ConsumerOffsets => t.offsets.0,
        Table::DelayOffsets => t.delay.0,
        Table::SubscriptionGroups => t.groups.0,
    }
}

fn file_of<T>(v: &(DataVersion, T)) -> File<&T> {
    File { format_version: FORMAT_VERSION, data_version: v.0, table: &v.1 }
}
