//! A small tmpfs mounted for one test (a full disk that is really full), unmounted on drop,
//! also when the test fails. Needs root; without it the test fails saying so.

use std::path::Path;
use std::process::Command;

/// A small tmpfs mounted for the test, unmounted on drop (also when the test fails).
pub struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    pub fn mount(size: &str) -> Self {
        let id = Command::new("id").arg("-u").output().expect("run id -u");
        let uid = String::from_utf8_lossy(&id.stdout).trim().to_owned();
        assert_eq!(uid, "0", "this test mounts a small tmpfs and needs root (uid {uid})");
        let dir = tempfile::tempdir().unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .status()
            .expect("run mount");
        assert!(ok.success(), "mount -t tmpfs failed: {ok}");
        Self { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn resize(&self, size: &str) {
        let ok = Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(self.path())
            .status()
            .unwrap();
        assert!(ok.success(), "remount failed: {ok}");
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.dir.path()).status();
    }
}
