//! Metadata files: one JSON file per table under `<data-dir>/config/`, with a format version,
//! written atomically (temporary file, fsync, previous file kept as `.bak`, rename, directory
//! fsync) and loaded with a fallback to `.bak`, all through the [`FileSystem`] seam.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::metadata::MetadataError;
use crate::store::fs::FileSystem;

/// The format version written into every file.
pub(crate) const FORMAT_VERSION: u32 = 1;

/// The `.bak` path of a file.
pub fn bak_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".bak");
    path.with_file_name(name)
}

/// Writes `value` to `path`: the new file is complete and fsynced before it replaces the old
/// one, and the old one is kept as `.bak`. A write that answers an error leaves the old content
/// in place: the rename of the new file into place can fail after it was done (the directory
/// fsync that follows it fails), so on that error the old file is put back from `.bak` (or,
/// on a first write, the new file removed), best effort, each with its own directory fsync. The
/// caller keeps the old table in memory, so memory and file agree (as far as a file system
/// whose directory fsync fails can be made to).
pub(crate) fn write<T: Serialize>(
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
    fs.write_file(&tmp, &text).map_err(|e| io("write", &tmp, e))?;
    let had_file = path.exists();
    if had_file {
        fs.rename(path, &bak_path(path)).map_err(|e| io("rename", path, e))?;
    }
    fs.rename(&tmp, path).map_err(|e| {
        undo_rename(fs, path, had_file);
        io("rename", &tmp, e)
    })
}

/// After a failed rename of the new file onto `path` (done or not): puts the old file back
/// from `.bak` (`had_file`), else removes what may have been renamed into place. Best effort:
/// the write's own error is what the caller hears; a failure here is logged.
fn undo_rename(fs: &dyn FileSystem, path: &Path, had_file: bool) {
    let undone = if had_file {
        // The old file is at .bak whether or not the new one was renamed into place.
        fs.rename(&bak_path(path), path)
    } else {
        match fs.remove(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    };
    if let Err(e) = undone {
        tracing::error!(file = %path.display(), error = %e,
            "a failed metadata write could not be undone: the file may hold the refused table");
    }
}

/// Reads `path` through `fs`, falling back to its `.bak`. `Ok(None)` when neither exists; an
/// error naming both files when neither parses.
pub(crate) fn read<T: DeserializeOwned>(
    fs: &dyn FileSystem,
    path: &Path,
) -> Result<Option<T>, MetadataError> {
    let bak = bak_path(path);
    let main = match fs.read(path) {
        Ok(bytes) => match serde_json::from_slice::<T>(&bytes) {
            Ok(v) => return Ok(Some(v)),
            Err(e) => Some(e.to_string()),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => Some(e.to_string()),
    };
    match fs.read(&bak) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::fs::SimFs;

    #[test]
    fn writes_and_reads_go_through_the_seam_and_a_failed_write_keeps_the_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("topics.json");
        let fs = SimFs::new();
        write(&fs, &path, &1u32).unwrap();
        write(&fs, &path, &2u32).unwrap();
        assert_eq!(read::<u32>(&fs, &path).unwrap(), Some(2));
        assert_eq!(read::<u32>(&fs, &bak_path(&path)).unwrap(), Some(1));
        // The temporary file cannot be written: nothing is renamed.
        let tmp = path.with_extension("json.tmp");
        fs.fail_writes(move |p| p == tmp);
        let err = write(&fs, &path, &3u32).unwrap_err();
        assert!(matches!(&err, MetadataError::Io { op: "write", .. }), "{err}");
        assert!(std::error::Error::source(&err).is_some());
        assert_eq!(read::<u32>(&fs, &path).unwrap(), Some(2));
        assert_eq!(read::<u32>(&fs, &bak_path(&path)).unwrap(), Some(1));
        // Moving the old file aside to .bak fails: it stays where it was.
        let main = path.clone();
        fs.fail_writes(move |p| p == main);
        assert!(write(&fs, &path, &4u32).is_err());
        assert_eq!(read::<u32>(&fs, &path).unwrap(), Some(2));
        fs.clear_write_failures();
        write(&fs, &path, &5u32).unwrap();
        assert_eq!(read::<u32>(&fs, &path).unwrap(), Some(5));
    }
}
