//! One process per data directory: an exclusive advisory lock (`flock`) on
//! `<data-dir>/lock`, taken before anything else in the directory is read or written and held
//! for as long as the [`DataDirLock`] lives (`hasync serve` holds it for the life of the
//! process; the kernel releases it when the process ends, however it ends). A second process
//! asking for the same directory is refused at once, with the directory and the holder's pid
//! (the holder writes its pid into the file after locking).
//!
//! The lock is advisory: it keeps out hasync processes (and anything else that asks for it),
//! not a process that writes the files without asking. The file is never deleted: deleting a
//! locked file would let a second process lock a new file of the same name.

use std::fs::{File, OpenOptions};
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

/// The lock file's name inside the data directory.
pub const LOCK_FILE: &str = "lock";

/// Why the data directory could not be locked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LockError {
    /// Another process holds the lock.
    #[error(
        "data directory {} is in use by another process{} (lock file {}); one process per data \
         directory",
        dir.display(),
        holder.map(|p| format!(" (pid {p})")).unwrap_or_default(),
        dir.join(LOCK_FILE).display()
    )]
    Held {
        /// The data directory.
        dir: PathBuf,
        /// The holder's pid, when the lock file names one.
        holder: Option<u32>,
    },
    /// The directory or its lock file could not be created, opened, locked or written.
    #[error("cannot lock data directory {}: {what}", dir.display())]
    Io {
        /// The data directory.
        dir: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

/// An exclusive lock on a data directory, released when dropped (or when the process ends).
#[derive(Debug)]
pub struct DataDirLock {
    dir: PathBuf,
    /// Holds the lock: the `flock` belongs to this open file description.
    file: File,
}

impl DataDirLock {
    /// Creates `dir` if needed, then locks `dir/lock` without waiting and writes this
    /// process's pid into it.
    ///
    /// # Errors
    ///
    /// [`LockError::Held`] when another process (or another `DataDirLock` in this process)
    /// holds it; [`LockError::Io`] when the directory or file cannot be created or locked.
    pub fn acquire(dir: &Path) -> Result<Self, LockError> {
        let io = |what| move |source| LockError::Io { dir: dir.to_owned(), what, source };
        std::fs::create_dir_all(dir).map_err(io("creating the directory"))?;
        // Never through a symlink (its target would get the pid), and only a regular file.
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(dir.join(LOCK_FILE))
            .map_err(io("opening the lock file (it must be a regular file, not a symlink)"))?;
        let regular = file.metadata().map_err(io("reading the lock file's type"))?.is_file();
        if !regular {
            let source =
                std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file");
            return Err(io("opening the lock file")(source));
        }
        // flock(2), not std's File::try_lock: the crate's MSRV predates it (same lock).
        match rustix::fs::flock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(rustix::io::Errno::WOULDBLOCK) => {
                return Err(LockError::Held { dir: dir.to_owned(), holder: read_pid(&mut file) });
            }
            Err(e) => return Err(io("locking the lock file")(e.into())),
        }
        file.set_len(0).map_err(io("writing the lock file"))?;
        file.seek(SeekFrom::Start(0)).map_err(io("writing the lock file"))?;
        writeln!(file, "{}", std::process::id()).map_err(io("writing the lock file"))?;
        Ok(Self { dir: dir.to_owned(), file })
    }

    /// The locked directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The pid written into the lock file (this process's).
    pub fn pid(&self) -> Option<u32> {
        let mut f = self.file.try_clone().ok()?;
        read_pid(&mut f)
    }
}

/// The pid in a lock file, if it holds one.
fn read_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.seek(SeekFrom::Start(0)).ok()?;
    file.take(64).read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_naming_the_dir_and_pid_until_the_first_is_dropped() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("data");
        let first = DataDirLock::acquire(&dir).unwrap();
        assert_eq!(first.pid(), Some(std::process::id()));
        let err = DataDirLock::acquire(&dir).unwrap_err();
        assert!(
            matches!(&err, LockError::Held { holder: Some(p), .. } if *p == std::process::id()),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(text.contains(&dir.display().to_string()), "{text}");
        assert!(text.contains(&format!("pid {}", std::process::id())), "{text}");
        drop(first);
        let again = DataDirLock::acquire(&dir).unwrap();
        assert_eq!(again.dir(), dir);
    }
}
