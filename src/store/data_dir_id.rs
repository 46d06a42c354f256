//! The data directory's identity: a random 128-bit id (32 hex digits), created with the data
//! directory and kept in `<data-dir>/data-dir-id` in the common state-file format. A slave
//! registers it with its master (`Replication.RegisterReplica`), so that its connections count
//! as one replica whatever address they come from. A data directory from before this file
//! existed gets its id at its next start; a wiped commitlog keeps it.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::store::fs::FileSystem;
use crate::store::state_file::{self, StateFileError};

/// The file's name inside the data directory.
pub const DATA_DIR_ID_FILE: &str = "data-dir-id";
/// The state-file kind.
const KIND: &str = "data-dir-id";
/// Hex digits in an id.
const ID_LEN: usize = 32;

#[derive(Debug, Serialize, Deserialize)]
struct Payload {
    id: String,
}

/// The id of the data directory `dir`, read through `fs`; a new random one is created and
/// written atomically when the file does not exist.
///
/// # Errors
///
/// A [`StateFileError`] naming the file when it cannot be read or written, is damaged, or does
/// not hold 32 lowercase hex digits.
pub(crate) fn load_or_create(fs: &dyn FileSystem, dir: &Path) -> Result<String, StateFileError> {
    let path = dir.join(DATA_DIR_ID_FILE);
    let legacy = |_: &[u8]| Err("not a data-dir id file".to_owned());
    if let Some(Payload { id }) = state_file::load(fs, KIND, &path, legacy)? {
        if !is_id(&id) {
            return Err(StateFileError::Corrupt {
                kind: KIND,
                path,
                reason: format!("{id:?} is not {ID_LEN} lowercase hex digits"),
            });
        }
        return Ok(id);
    }
    let id = format!("{:032x}", rand::random::<u128>());
    debug_assert!(is_id(&id));
    state_file::store(fs, KIND, &path, &Payload { id: id.clone() })?;
    tracing::info!(data_dir_id = %id, "new data directory id");
    Ok(id)
}

fn is_id(s: &str) -> bool {
    s.len() == ID_LEN && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::fs::{SimFs, StdFs};

    #[test]
    fn an_id_is_created_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let id = load_or_create(&StdFs, dir.path()).unwrap();
        assert!(is_id(&id), "{id}");
        assert_eq!(load_or_create(&StdFs, dir.path()).unwrap(), id);
        let other = tempfile::tempdir().unwrap();
        assert_ne!(load_or_create(&StdFs, other.path()).unwrap(), id, "random per data dir");
        let text = std::fs::read_to_string(dir.path().join(DATA_DIR_ID_FILE)).unwrap();
        assert!(text.starts_with("hasync-state data-dir-id v1 ") && text.contains(&id), "{text}");
    }

    #[test]
    fn a_damaged_or_failed_id_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(DATA_DIR_ID_FILE);
        std::fs::write(&path, "something else").unwrap();
        let err = load_or_create(&StdFs, dir.path()).unwrap_err();
        assert!(err.to_string().contains("data-dir-id"), "{err}");
        state_file::store(&StdFs, KIND, &path, &Payload { id: "XYZ".into() }).unwrap();
        let err = load_or_create(&StdFs, dir.path()).unwrap_err();
        assert!(matches!(err, StateFileError::Corrupt { .. }) && err.to_string().contains("hex"));
        let fs = SimFs::new();
        fs.fail_writes(|p| p.ends_with(DATA_DIR_ID_FILE));
        let fresh = tempfile::tempdir().unwrap();
        let err = load_or_create(&fs, fresh.path()).unwrap_err();
        assert!(matches!(err, StateFileError::Io { op: "write", .. }), "{err}");
    }
}
