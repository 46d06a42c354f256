//! Metadata files: one JSON file per table under `<data-dir>/config/`, with a format version,
//! written atomically (temporary file, fsync, previous file kept as `.bak`, rename, directory
//! fsync) and loaded with a fallback to `.bak`.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::metadata::MetadataError;
use crate::store::fs::FileSystem;

/// The format version written into every file.
pub const FORMAT_VERSION: u32 = 1;

/// The `.bak` path of a file.
pub fn bak_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".bak");
    path.with_file_name(name)
}

/// Writes `value` to `path`: the new file is complete and fsynced before it replaces the old
/// one, and the old one is kept as `.bak`.
pub fn write<T: Serialize>(
    fs: &dyn FileSystem,
    path: &Path,
    value: &T,
) -> Result<(), MetadataError> {
    let io = |op: &'static str, p: &Path, e: std::io::Error| MetadataError::Io {
        op,
        path: p.to_path_buf(),
        source: e,
    };
    let text = serde_json::to_vec_pretty(value).expect("metadata serializes");
    let tmp = path.with_extension("json.tmp");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&tmp).map_err(|e| io("create", &tmp, e))?;
        f.write_all(&text).map_err(|e| io("write", &tmp, e))?;
        f.sync_all().map_err(|e| io("fsync", &tmp, e))?;
    }
    if path.exists() {
        std::fs::rename(path, bak_path(path)).map_err(|e| io("rename", path, e))?;
    }
    std::fs::rename(&tmp, path).map_err(|e| io("rename", &tmp, e))?;
    let dir = path.parent().unwrap_or(Path::new("."));
    fs.sync_dir(dir).map_err(|e| io("fsync", dir, e))
}

/// Reads `path`, falling back to its `.bak`. `Ok(None)` when neither exists; an error naming
/// both files when neither parses.
pub fn read<T: DeserializeOwned>(path: &Path) -> Result<Option<T>, MetadataError> {
    let bak = bak_path(path);
    let main = match std::fs::read(path) {
        Ok(bytes) => match serde_json::from_slice::<T>(&bytes) {
            Ok(v) => return Ok(Some(v)),
            Err(e) => Some(e.to_string()),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => Some(e.to_string()),
    };
    match std::fs::read(&bak) {
        Ok(bytes) => match serde_json::from_slice::<T>(&bytes) {
            Ok(v) => {
                if let Some(why) = &main {
                    tracing::warn!(file = %path.display(), %why, "metadata file unreadable; loaded its .bak");
                }
                Ok(Some(v))
            }
            Err(e) => Err(MetadataError::Corrupt {
                main: path.to_path_buf(),
                bak: bak.clone(),
                reason: format!(
                    "{}; {}: {e}",
                    main.unwrap_or_else(|| "missing".into()),
                    bak.display()
                ),
            }),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => match main {
            None => Ok(None),
            Some(why) => Err(MetadataError::Corrupt {
                main: path.to_path_buf(),
                bak: bak.clone(),
                reason: format!("{why}; no .bak"),
            }),
        },
        Err(e) => Err(MetadataError::Io { op: "read", path: bak, source: e }),
    }
}
