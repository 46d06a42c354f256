//! Whether a data dir's commitlog held data, told before the store is opened (opening writes
//! the abort marker and starts the store thread, which a start refused for a missing epoch
//! file must not have done).

use std::io::Read;
use std::path::Path;

use crate::store::checkpoint::{CHECKPOINT_FILE, Checkpoint};
use crate::store::commitlog::COMMITLOG_DIR;
use crate::store::error::{Error, Result};
use crate::store::fs::FileSystem;
use crate::store::mapped_file::parse_file_name;

/// What says the commitlog under `data_dir` held data, or `None`: a segment file past offset 0
/// (the first one filled up), a first segment whose first record header is written (not all
/// zero: a record's size or a blank's), or a checkpoint that records flushed data (also one
/// that cannot be read: the store's open tells why).
pub(crate) fn evidence(fs: &dyn FileSystem, data_dir: &Path) -> Result<Option<String>> {
    let dir = data_dir.join(COMMITLOG_DIR);
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return checkpointed(fs, data_dir),
        Err(e) => return Err(Error::io("list", &dir, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| Error::io("list", &dir, e))?;
        let Some(offset) = entry.file_name().to_str().and_then(parse_file_name) else {
            continue;
        };
        let path = entry.path();
        if offset > 0 {
            return Ok(Some(format!("the commitlog has segment file {}", path.display())));
        }
        let mut head = [0u8; 4];
        let read = std::fs::File::open(&path).and_then(|mut f| f.read(&mut head));
        match read {
            Ok(_) if head != [0; 4] => {
                return Ok(Some(format!("the commitlog file {} holds data", path.display())));
            }
            Ok(_) => {}
            Err(e) => return Err(Error::io("read", &path, e)),
        }
    }
    checkpointed(fs, data_dir)
}

fn checkpointed(fs: &dyn FileSystem, data_dir: &Path) -> Result<Option<String>> {
    let path = data_dir.join(CHECKPOINT_FILE);
    Ok(match Checkpoint::load(fs, data_dir) {
        Ok(Some(cp)) if cp.flushed_offset > 0 => Some(format!(
            "the checkpoint {} records data up to offset {}",
            path.display(),
            cp.flushed_offset
        )),
        Ok(_) => None,
        Err(e) => Some(format!("the checkpoint {} exists ({e})", path.display())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::fs::StdFs;

    #[test]
    fn a_segment_with_a_record_or_a_segment_past_the_first_is_data_an_empty_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(evidence(&StdFs, dir.path()).unwrap(), None, "no commitlog at all");
        let log = dir.path().join(COMMITLOG_DIR);
        std::fs::create_dir_all(&log).unwrap();
        let first = log.join(crate::store::file_name(0));
        std::fs::write(&first, vec![0u8; 4096]).unwrap();
        assert_eq!(evidence(&StdFs, dir.path()).unwrap(), None, "a first segment, unwritten");
        let mut bytes = vec![0u8; 4096];
        bytes[..4].copy_from_slice(&100i32.to_be_bytes());
        std::fs::write(&first, &bytes).unwrap();
        assert!(evidence(&StdFs, dir.path()).unwrap().unwrap().contains("holds data"));
        std::fs::remove_file(&first).unwrap();
        std::fs::write(log.join(crate::store::file_name(1 << 20)), b"").unwrap();
        assert!(evidence(&StdFs, dir.path()).unwrap().unwrap().contains("segment file"));
    }
}
