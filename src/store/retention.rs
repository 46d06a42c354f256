//! Retention: whole segment files are deleted when older than `file-reserved-time` (by their
//! modification time, as upstream) or, oldest first, while the disk is fuller than
//! `disk-max-used-ratio`. The file being written is never deleted; the min offset moves to the
//! start of the first remaining file.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use crate::store::commitlog::Shared;
use crate::store::error::{Error, Result};

/// Fraction of the file system holding `dir` in use, as `df` computes it.
pub(crate) fn disk_used_ratio(dir: &Path) -> Result<f64> {
    let st = rustix::fs::statvfs(dir).map_err(|e| Error::io("statvfs", dir, e.into()))?;
    let total = st.f_blocks as f64;
    if total == 0.0 {
        return Ok(0.0);
    }
    let used = (st.f_blocks - st.f_bfree) as f64;
    let avail = st.f_bavail as f64;
    Ok(used / (used + avail))
}

pub(crate) fn run(shared: &Shared, now: SystemTime) -> Result<Vec<PathBuf>> {
    let opts = &shared.opts;
    let mut removed = Vec::new();
    loop {
        let files = shared.queue.files();
        let Some(first) = files.first() else { break };
        if files.len() < 2 {
            break;
        }
        let modified = std::fs::metadata(first.path())
            .and_then(|m| m.modified())
            .map_err(|e| Error::io("stat", first.path(), e))?;
        let expired = now.duration_since(modified).is_ok_and(|age| age > opts.file_reserved_time);
        let disk_full = disk_used_ratio(shared.queue.dir())? > opts.disk_max_used_ratio;
        if !(expired || disk_full) {
            break;
        }
        match shared.queue.remove_first()? {
            Some(path) => {
                tracing::info!(file = %path.display(), expired, disk_full, "retention removed a segment file");
                removed.push(path);
            }
            None => break,
        }
    }
    Ok(removed)
}
