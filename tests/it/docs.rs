//! The docs cannot rot: every command after a `$ ` prompt in a ```sh block of docs/*.md runs
//! here, in document order, with `sh -c` against live nodes started in this process, and must
//! exit as the example says (`# exit N`: code N; `# until Ctrl-C`: still running after its first
//! output, then SIGINT; otherwise 0). Placeholders are environment variables of the shell:
//! `$GRPC` (a master, ASYNC, with one slave), `$SLAVE_GRPC` (that slave) and `$SECURE_GRPC` (a
//! master with `grpc.token = "s3cret"`).
//!
//! `buf curl` examples need `buf`: env `HASYNC_BUF`, `.ci/node` (npm `@bufbuild/buf`) or PATH.
//! Without it they are skipped with a note, and the test fails when `CI` is set. `hasync serve`
//! examples use the default ports; when those are taken they are skipped the same way.
//!
//! The docs are also checked against the code: every configuration key with its default, every
//! exit code, every RPC of proto/.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use hasync::config::units::ByteSize;
use hasync::config::{Config, Role};

use crate::support::grpc::ApiNode;
use crate::support::ha::{node_config, slave_node_config, wait_until};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read_doc(name: &str) -> String {
    std::fs::read_to_string(root().join("docs").join(name)).unwrap()
}

/// What an example must do.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expect {
    Exit(i32),
    UntilCtrlC,
}

/// One runnable example.
#[derive(Debug, Clone)]
struct Example {
    line: usize,
    command: String,
    expect: Expect,
}

/// The runnable examples of a markdown text; panics on a fenced block that is neither a runnable
/// `sh` block (with at least one `$ ` command) nor one of the plain kinds.
fn examples(name: &str, text: &str) -> Vec<Example> {
    const PLAIN: &[&str] = &["text", "toml", "json", "proto"];
    let mut out = Vec::new();
    let mut lines = text.lines().enumerate().peekable();
    let mut block: Option<(usize, String, usize)> = None; // (line, language, commands)
    while let Some((i, line)) = lines.next() {
        if let Some(info) = line.trim_start().strip_prefix("```") {
            match block.take() {
                Some((at, lang, n)) => {
                    assert!(lang != "sh" || n > 0, "{name}:{at}: a sh block without `$ ` commands")
                }
                None => {
                    let lang = info.trim().to_owned();
                    assert!(
                        lang == "sh" || PLAIN.contains(&lang.as_str()),
                        "{name}:{}: fenced block `{lang}`: use sh (runnable `$ ` examples) or \
                         one of {PLAIN:?}",
                        i + 1
                    );
                    block = Some((i + 1, lang, 0));
                }
            }
            continue;
        }
        let Some((_, lang, n)) = block.as_mut() else { continue };
        let Some(first) = line.strip_prefix("$ ").filter(|_| lang == "sh") else { continue };
        let mut command = first.to_owned();
        while command.ends_with('\\') {
            let (_, next) = lines.next().unwrap_or_else(|| panic!("{name}:{}: dangling \\", i + 1));
            command.push('\n');
            command.push_str(next);
        }
        *n += 1;
        let expect = marker(&command);
        out.push(Example { line: i + 1, command, expect });
    }
    assert!(block.is_none(), "{name}: unclosed fenced block");
    out
}

/// `# exit N` or `# until Ctrl-C` at the end of a command.
fn marker(command: &str) -> Expect {
    let last = command.lines().last().unwrap_or_default();
    let Some((_, comment)) = last.rsplit_once(" # ") else { return Expect::Exit(0) };
    let comment = comment.trim();
    if comment == "until Ctrl-C" {
        return Expect::UntilCtrlC;
    }
    match comment.strip_prefix("exit ") {
        Some(n) => Expect::Exit(n.parse().unwrap_or_else(|_| panic!("bad marker in {command}"))),
        None => Expect::Exit(0),
    }
}

/// The native `buf` binary (the npm package's `bin/buf` is a node wrapper that does not pass
/// SIGINT on), from HASYNC_BUF, .ci/node or PATH.
fn find_buf() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("HASYNC_BUF").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "HASYNC_BUF={} is not a file", p.display());
        return Some(p);
    }
    let npm = root().join(".ci/node/node_modules/@bufbuild");
    if let Ok(dir) = std::fs::read_dir(&npm) {
        for e in dir.flatten() {
            let native = e.path().join("bin/buf");
            if e.file_name().to_string_lossy().starts_with("buf-") && native.is_file() {
                return Some(native);
            }
        }
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join("buf")).find(|p| p.is_file())
}

/// Whether a tool an example needs is missing: skip locally, fail in CI.
fn missing(what: &str, why: &str, skipped: &mut Vec<String>) {
    assert!(std::env::var_os("CI").is_none(), "{what}: {why} (CI is set, so this fails)");
    skipped.push(format!("{what}: {why}"));
}

/// The nodes the examples talk to.
struct Nodes {
    master: ApiNode,
    slave: ApiNode,
    slave_ha: std::net::SocketAddr,
    secure: ApiNode,
    _dirs: [tempfile::TempDir; 3],
}

impl Nodes {
    async fn start() -> Self {
        let dirs = [
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        ];
        let sized = |mut c: Config, name: &str| {
            c.node.name = name.into();
            c.store.segment_size = ByteSize::mib(4);
            c.store.max_message_size = ByteSize::kib(64);
            c
        };
        let master =
            ApiNode::start(sized(node_config(dirs[0].path(), Role::Master), "master")).await;
        let ha = master.node.ha_addr().unwrap();
        let mut sc = sized(slave_node_config(dirs[1].path(), ha), "slave");
        // A fixed HA port for the slave, so the failover runbook can name it before the
        // promotion binds it.
        sc.ha.listen = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        sc.slave.master_grpc = master.url.trim_start_matches("http://").to_owned();
        let slave_ha = sc.ha.listen;
        let slave = ApiNode::start(sc).await;
        let mut tc = sized(node_config(dirs[2].path(), Role::Master), "secure");
        tc.grpc.token = "s3cret".into();
        let secure = ApiNode::start(tc).await;
        wait_until(10, "slave in sync", || master.node.status().in_sync_replicas == 1).await;
        Self { master, slave, slave_ha, secure, _dirs: dirs }
    }

    async fn stop(self) {
        self.slave.stop().await;
        self.master.stop().await;
        self.secure.stop().await;
    }
}

/// The shell every example runs in: PATH with the built `hasync` (and `buf`), the address
/// variables, no HASYNC_* settings of the test's own environment, a scratch directory.
fn shell(command: &str, nodes: &Nodes, path: &str, cwd: &Path) -> Command {
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(command).current_dir(cwd).stdin(Stdio::null());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("HASYNC_") {
            cmd.env_remove(k);
        }
    }
    let addr = |n: &ApiNode| n.url.trim_start_matches("http://").to_owned();
    cmd.env("PATH", path)
        .env("GRPC", addr(&nodes.master))
        .env("SLAVE_GRPC", addr(&nodes.slave))
        .env("SECURE_GRPC", addr(&nodes.secure))
        .env("SLAVE_HA", nodes.slave_ha.to_string())
        .env("NO_COLOR", "1");
    cmd
}

/// Runs one example to its end on a blocking thread (the nodes keep serving); killed after 60 s.
async fn run_to_end(mut cmd: Command) -> std::process::Output {
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let pid = child.id().to_string();
    let wait = tokio::task::spawn_blocking(move || child.wait_with_output());
    match tokio::time::timeout(Duration::from_secs(60), wait).await {
        Ok(out) => out.unwrap().unwrap(),
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", &pid]).status();
            panic!("example did not finish within 60 s");
        }
    }
}

/// Starts a long-running example in its own process group, checks it is still running once it
/// printed something (or after 2 s), then interrupts the group. Returns its output.
async fn run_until_ctrl_c(mut cmd: Command, cwd: &Path, label: &str) -> String {
    use std::os::unix::process::CommandExt;
    let out_path = cwd.join(format!("until-ctrl-c-{}.out", std::process::id()));
    let out = std::fs::File::create(&out_path).unwrap();
    let mut child =
        cmd.stdout(out.try_clone().unwrap()).stderr(out).process_group(0).spawn().unwrap();
    let started = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let printed = std::fs::metadata(&out_path).map(|m| m.len() > 0).unwrap_or(false);
        if let Some(status) = child.try_wait().unwrap() {
            let text = std::fs::read_to_string(&out_path).unwrap_or_default();
            panic!("{label}: ended by itself ({status}) instead of running until Ctrl-C:\n{text}");
        }
        if (printed && started.elapsed() >= Duration::from_millis(1500))
            || started.elapsed() >= Duration::from_secs(10)
        {
            break;
        }
    }
    let group = format!("-{}", child.id());
    let _ = Command::new("kill").args(["-INT", "--", &group]).status();
    let waited = tokio::task::spawn_blocking(move || child.wait());
    let status = match tokio::time::timeout(Duration::from_secs(20), waited).await {
        Ok(s) => s.unwrap().unwrap(),
        Err(_) => {
            let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
            panic!("{label}: did not stop within 20 s of SIGINT");
        }
    };
    let text = std::fs::read_to_string(&out_path).unwrap_or_default();
    assert!(!text.is_empty(), "{label}: printed nothing");
    if label_is_hasync(label) {
        assert!(status.success(), "{label}: SIGINT should end it with success ({status}):\n{text}");
    }
    text
}

fn label_is_hasync(label: &str) -> bool {
    label.contains(": hasync ")
}

/// Whether the default ports of `hasync serve` examples are free.
fn default_ports_free() -> bool {
    [10912, 10920, 10921, 10930, 10931]
        .iter()
        .all(|p| std::net::TcpListener::bind(("0.0.0.0", *p)).is_ok())
}

/// Runs every example of `name`; returns the commands run.
async fn run_doc(name: &str) -> Vec<String> {
    run_doc_min(name, 10).await
}

async fn run_doc_min(name: &str, min_examples: usize) -> Vec<String> {
    let text = read_doc(name);
    let all = examples(name, &text);
    assert!(all.len() >= min_examples, "{name}: only {} runnable examples", all.len());
    let bin_dir = assert_cmd::cargo::cargo_bin("hasync").parent().unwrap().to_owned();
    let tools = tempfile::tempdir().unwrap();
    let buf = find_buf();
    if let Some(b) = &buf {
        std::os::unix::fs::symlink(b, tools.path().join("buf")).unwrap();
    }
    let path = std::env::join_paths(
        [bin_dir, tools.path().to_owned()]
            .into_iter()
            .chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
    )
    .unwrap()
    .into_string()
    .unwrap();
    let cwd = tempfile::tempdir().unwrap();
    let nodes = Nodes::start().await;
    let (mut ran, mut skipped) = (Vec::new(), Vec::new());
    for ex in &all {
        let label = format!("{name}:{}: {}", ex.line, ex.command);
        if ex.command.starts_with("buf ") && buf.is_none() {
            let why = "no buf binary in HASYNC_BUF, .ci/node or PATH (install it with `npm \
                       install --no-save --prefix .ci/node @bufbuild/buf@1.75.0`)";
            missing(&label, why, &mut skipped);
            continue;
        }
        let serves =
            ex.command.starts_with("hasync serve") && !ex.command.contains("--print-config");
        if serves && !default_ports_free() {
            missing(
                &label,
                "the default ports 10912/10920/10921/10930/10931 are taken",
                &mut skipped,
            );
            continue;
        }
        match ex.expect {
            Expect::UntilCtrlC => {
                // exec: the command itself gets SIGINT and its exit status is the example's.
                let exec = format!("exec {}", ex.command);
                run_until_ctrl_c(shell(&exec, &nodes, &path, cwd.path()), cwd.path(), &label).await;
            }
            Expect::Exit(code) => {
                let out = run_to_end(shell(&ex.command, &nodes, &path, cwd.path())).await;
                let (so, se) =
                    (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
                assert_eq!(
                    out.status.code(),
                    Some(code),
                    "{label}\nexpected exit {code}\nstdout:\n{so}\nstderr:\n{se}"
                );
                if code != 0 && ex.command.starts_with("hasync ") && code != 2 {
                    assert_eq!(se.lines().count(), 1, "{label}: one line on stderr: {se}");
                }
            }
        }
        ran.push(ex.command.clone());
    }
    nodes.stop().await;
    for s in &skipped {
        eprintln!("skipped {s}");
    }
    ran
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operations_md_examples_run() {
    let ran = run_doc("operations.md").await;
    for sub in ["status", "mode", "put", "read", "health", "config", "serve"] {
        let prefix = format!("hasync {sub} ");
        assert!(ran.iter().any(|c| c.starts_with(&prefix)), "an example of `hasync {sub}` ran");
    }
    assert!(ran.iter().any(|c| c.contains("--watch")), "a --watch example ran");
}

/// The failover runbook, run for real: promote the slave, demote the old master with the same
/// epoch, check convergence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_md_examples_run() {
    let ran = run_doc_min("failover.md", 6).await;
    for step in ["hasync role master", "hasync role slave", "hasync epochs", "hasync status"] {
        assert!(ran.iter().any(|c| c.starts_with(step)), "a `{step}` example ran");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_md_examples_run() {
    let ran = run_doc("api.md").await;
    if find_buf().is_none() {
        return; // skipped with a note (and failed under CI) by run_doc
    }
    for (service, method) in rpcs() {
        let path = format!("/{service}/{method}");
        assert!(
            ran.iter().any(|c| c.starts_with("buf curl") && c.contains(&path)),
            "a `buf curl` example of {path} ran"
        );
    }
}

/// (package-qualified service, method) of every RPC in proto/hasync/v1.
fn rpcs() -> Vec<(String, String)> {
    let mut out = Vec::new();
    let dir = root().join("proto/hasync/v1");
    let mut files: Vec<_> = std::fs::read_dir(dir).unwrap().flatten().map(|e| e.path()).collect();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let mut service = None;
        for line in text.lines().map(str::trim) {
            if let Some(rest) = line.strip_prefix("service ") {
                service = rest.split_whitespace().next().map(|s| format!("hasync.v1.{s}"));
            } else if let (Some(rest), Some(s)) = (line.strip_prefix("rpc "), &service) {
                let method = rest.split('(').next().unwrap().trim().to_owned();
                out.push((s.clone(), method));
            }
        }
    }
    assert!(out.len() >= 7, "{out:?}");
    out
}

#[test]
fn api_md_documents_every_rpc() {
    let doc = read_doc("api.md");
    let mut services: Vec<String> = Vec::new();
    for (service, method) in rpcs() {
        if !services.contains(&service) {
            assert!(doc.contains(&format!("\n## {service}\n")), "api.md: a `## {service}` section");
            services.push(service.clone());
        }
        assert!(doc.contains(&format!("\n### {method}\n")), "api.md: a `### {method}` section");
    }
    for s in ["grpc.health.v1.Health", "Server reflection"] {
        assert!(doc.contains(&format!("\n## {s}\n")), "api.md: a `## {s}` section");
    }
}

#[test]
fn operations_md_lists_every_config_key_with_its_default() {
    let doc = read_doc("operations.md");
    let defaults: toml::Table = toml::from_str(hasync::config::DEFAULTS_TOML).unwrap();
    let mut n = 0;
    for (section, keys) in &defaults {
        for (key, value) in keys.as_table().unwrap() {
            let row = format!("| `{section}.{key}` | `{value}` |");
            assert!(doc.contains(&row), "operations.md lacks the row {row}");
            n += 1;
        }
    }
    assert!(n >= 40, "{n} keys");
}

#[test]
fn operations_md_lists_every_exit_code() {
    let doc = read_doc("operations.md");
    for (code, meaning) in hasync::cli::client::EXIT_CODES {
        let row = format!("| {code} | {meaning} |");
        assert!(doc.contains(&row), "operations.md lacks the row {row}");
    }
}

#[test]
fn toml_examples_are_valid_configurations() {
    for name in ["operations.md", "api.md"] {
        let text = read_doc(name);
        let mut in_toml = None;
        let mut body = String::new();
        for (i, line) in text.lines().enumerate() {
            match (line.trim_start().strip_prefix("```"), in_toml) {
                (Some("toml"), None) => in_toml = Some(i + 1),
                (Some(_), Some(at)) => {
                    let c =
                        Config::from_toml_str(&body).unwrap_or_else(|e| panic!("{name}:{at}: {e}"));
                    // a standalone controller's file follows the controller's rules
                    if body.starts_with("# hasync controller") {
                        hasync::cli::controller::validate(&c)
                            .unwrap_or_else(|e| panic!("{name}:{at}: {e}"));
                    } else {
                        hasync::app::validate(&c).unwrap_or_else(|e| panic!("{name}:{at}: {e}"));
                    }
                    (in_toml, body) = (None, String::new());
                }
                (None, Some(_)) => {
                    body.push_str(line);
                    body.push('\n');
                }
                _ => {}
            }
        }
    }
}

#[test]
fn example_markers_parse() {
    let text = "```sh\n$ a  # exit 6\nout\n$ b \\\n  c  # until Ctrl-C\n$ d # note\n```\n```text\n$ not run\n```\n";
    let ex = examples("t.md", text);
    let got: Vec<_> = ex.iter().map(|e| (e.line, e.command.as_str(), e.expect.clone())).collect();
    assert_eq!(
        got,
        vec![
            (2, "a  # exit 6", Expect::Exit(6)),
            (4, "b \\\n  c  # until Ctrl-C", Expect::UntilCtrlC),
            (6, "d # note", Expect::Exit(0)),
        ]
    );
}

/// docs/testing.md lists every scenario of the fault harness (tests/chaos/chaos/scenarios.py's
/// SCENARIOS table), and names no scenario that does not exist.
#[test]
fn testing_md_lists_every_chaos_scenario() {
    let src = std::fs::read_to_string(root().join("tests/chaos/chaos/scenarios.py")).unwrap();
    let table = src.split("SCENARIOS = {").nth(1).expect("scenarios.py has a SCENARIOS table");
    let table = table.split("\n}\n").next().unwrap();
    let names: Vec<&str> = table
        .lines()
        .filter_map(|l| l.strip_prefix("    \""))
        .filter_map(|l| l.split_once("\": dict(").map(|(name, _)| name))
        .collect();
    assert!(names.len() >= 10, "scenarios found: {names:?}");
    let doc = read_doc("testing.md");
    for name in &names {
        assert!(doc.contains(&format!("| `{name}` |")), "testing.md lacks the scenario {name}");
    }
    // a scenario row's second column is "MODE, k = N"
    let rows = doc.lines().filter(|l| l.starts_with("| `") && l.contains(", k = ")).count();
    assert_eq!(rows, names.len(), "testing.md lists a scenario that does not exist");
}
