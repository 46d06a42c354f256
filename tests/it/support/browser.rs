//! The cluster console in a real headless browser: `tests/browser/console.mjs` (playwright-core
//! driving Debian's chromium, no browser download) as a child process in a process group of
//! its own, killed with its browser when dropped (a failing test too), with a fresh
//! user-data-dir removed with it. Without node, chromium or the npm package (`npm ci --prefix
//! tests/browser`, which .ci/run does) a test fails under CI and is skipped loudly otherwise.

use std::io::BufRead as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::mpsc;

/// Where Debian's `chromium` package puts the browser (`CHROMIUM` overrides).
const CHROMIUM: &str = "/usr/bin/chromium";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn chromium() -> PathBuf {
    std::env::var_os("CHROMIUM").filter(|p| !p.is_empty()).map_or(CHROMIUM.into(), PathBuf::from)
}

fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
}

/// Why the browser test cannot run here, if it cannot.
fn missing() -> Option<String> {
    if !on_path("node") {
        return Some("node is not on PATH (Debian: apt-get install nodejs npm)".into());
    }
    let chromium = chromium();
    if !chromium.is_file() {
        return Some(format!(
            "{} is missing (Debian: apt-get install chromium; or set CHROMIUM)",
            chromium.display()
        ));
    }
    let pw = root().join("tests/browser/node_modules/playwright-core/package.json");
    if !pw.is_file() {
        return Some("playwright-core is not installed: npm ci --prefix tests/browser".into());
    }
    None
}

/// Whether the browser test can run: true, or (no CI) false after saying loudly why not; under
/// CI (`CI` set) a missing tool fails the test.
pub fn usable(test: &str) -> bool {
    let Some(why) = missing() else { return true };
    assert!(std::env::var_os("CI").is_none(), "{test}: {why} (CI is set, so this fails)");
    eprintln!("SKIPPED {test}: {why}");
    false
}

/// The directory a test's screenshots go to, where a person can look at them:
/// `<target>/test-output/console/<test>` (kept after the run).
pub fn output_dir(test: &str) -> PathBuf {
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).parent().expect("the target dir");
    let dir = target.join("test-output/console").join(test);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The console script running `steps` against `url`; read its reports with [`Browser::step`].
pub struct Browser {
    child: Child,
    /// The script's stdout, line by line (read by a thread of its own).
    lines: mpsc::UnboundedReceiver<String>,
    /// The browser's user-data-dir, fresh, removed on drop.
    _profile: tempfile::TempDir,
    /// Every report read so far (printed when a step fails).
    pub reports: Vec<Value>,
}

impl Browser {
    /// Starts the script: it opens `url` and runs `steps` (see tests/browser/console.mjs),
    /// each bounded by `step_timeout`.
    pub fn start(url: &str, out: &Path, steps: &[String], step_timeout: Duration) -> Self {
        let profile = tempfile::Builder::new().prefix("hasync-chromium-").tempdir().unwrap();
        let mut cmd = Command::new("node");
        cmd.arg(root().join("tests/browser/console.mjs"))
            .arg(url)
            .arg(out)
            .args(steps)
            .arg("--timeout-ms")
            .arg(step_timeout.as_millis().to_string())
            .arg("--profile")
            .arg(profile.path())
            .env("CHROMIUM", chromium())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            // node and chromium in a group of their own: killed together on drop.
            .process_group(0);
        let mut child = cmd.spawn().expect("spawn node tests/browser/console.mjs");
        let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self { child, lines, _profile: profile, reports: Vec::new() }
    }

    /// The next step's report (bounded by `within`); panics when the step failed or the
    /// script ended, with what the page showed.
    pub async fn step(&mut self, name: &str, within: Duration) -> Value {
        let line = tokio::time::timeout(within, self.lines.recv())
            .await
            .unwrap_or_else(|_| panic!("no report of step {name} within {within:?}"));
        let Some(line) = line else {
            let status = self.child.wait();
            panic!("the console script ended ({status:?}) before step {name}: {:#?}", self.reports);
        };
        let report: Value = serde_json::from_str(&line)
            .unwrap_or_else(|e| panic!("not a JSON report ({e}): {line}"));
        println!("console {name}: {line}");
        self.reports.push(report.clone());
        assert_eq!(report["step"], name, "{report:#}");
        assert_eq!(report["ok"], true, "step {name} failed: {report:#}");
        report
    }

    /// Waits (bounded) for the script to exit 0 after its last step.
    pub async fn finish(mut self) {
        // The script closes its stdout when it exits.
        let end = tokio::time::timeout(Duration::from_secs(15), async {
            while let Some(line) = self.lines.recv().await {
                println!("console (after the last step): {line}");
            }
        });
        end.await.expect("the console script exits after its last step");
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the console script failed: {status:?}: {:#?}", self.reports);
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // The whole group: node and every chromium process it started (a group outlives its
        // leader, so this holds after the script exited too).
        let pid = i32::try_from(self.child.id()).ok().and_then(rustix::process::Pid::from_raw);
        if let Some(pid) = pid {
            let _ = rustix::process::kill_process_group(pid, rustix::process::Signal::KILL);
        }
        let _ = self.child.wait();
    }
}

/// The card of `group` in a report's `seen`.
pub fn card<'a>(report: &'a Value, group: &str) -> &'a Value {
    report["seen"]["groups"]
        .as_array()
        .and_then(|g| g.iter().find(|c| c["group"] == group))
        .unwrap_or_else(|| panic!("no card for {group}: {report:#}"))
}
