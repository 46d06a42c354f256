//! The configuration tree: defaults file, validation rules naming their keys, parse errors,
//! and the precedence defaults < file < `HASYNC_*` environment < flags.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;
use hasync::cli::{Cli, Command};
use hasync::config::*;

fn parse(text: &str) -> Config {
    Config::from_toml_str(text).unwrap_or_else(|e| panic!("{text}\n{e}"))
}

/// Every rule, the store's included (what `hasync config check` and `serve` run).
fn validate(c: &Config) -> Result<(), Error> {
    hasync::app::validate(c)
}

/// Asserts that `text` parses but fails validation with an error naming `key`.
#[track_caller]
fn assert_invalid(text: &str, key: &str) -> String {
    let err = validate(&parse(text)).expect_err(text);
    let shown = err.to_string();
    assert!(shown.contains(&format!("`{key}`")), "{key} not named in: {shown}");
    assert!(err.keys().contains(&key), "{key} not in keys {:?}", err.keys());
    shown
}

#[track_caller]
fn assert_valid(text: &str) {
    if let Err(e) = validate(&parse(text)) {
        panic!("{text}\n{e}");
    }
}

// ---- the documented defaults ----------------------------------------------------------------

#[test]
fn defaults_file_parses_back_to_the_defaults() {
    assert_eq!(Config::from_toml_str(DEFAULTS_TOML).unwrap(), Config::default());
}

#[test]
fn defaults_are_valid() {
    validate(&Config::default()).unwrap();
}

#[test]
fn an_empty_file_means_the_defaults() {
    assert_eq!(parse(""), Config::default());
}

/// Every key of the tree, as `(section, key)`, from serializing the defaults.
fn all_keys() -> Vec<(String, String)> {
    let text = Config::default().to_toml_string().unwrap();
    let table: toml::Table = toml::from_str(&text).unwrap();
    let mut keys = Vec::new();
    for (section, value) in &table {
        let inner = value.as_table().unwrap_or_else(|| panic!("`{section}` is not a section"));
        for (key, value) in inner {
            assert!(!value.is_table(), "nested table {section}.{key}: extend this test");
            keys.push((section.clone(), key.clone()));
        }
    }
    keys
}

/// The uncommented `key = ` lines of the defaults file, as `(section, key)`.
fn documented_keys() -> BTreeSet<(String, String)> {
    let mut section = String::new();
    let mut keys = BTreeSet::new();
    for line in DEFAULTS_TOML.lines() {
        if let Some(header) = line.strip_prefix('[') {
            section = header.trim_end_matches(']').to_owned();
        } else if let Some((key, _)) = line.split_once(" = ")
            && !key.starts_with('#')
        {
            keys.insert((section.clone(), key.to_owned()));
        }
    }
    keys
}

#[test]
fn defaults_file_mentions_every_key_in_its_section_with_a_comment() {
    let documented = documented_keys();
    let keys = all_keys();
    assert!(keys.len() > 30, "only {} keys", keys.len());
    for (section, key) in &keys {
        assert!(
            documented.contains(&(section.clone(), key.clone())),
            "defaults.toml lacks `{key} = ` in [{section}]"
        );
    }
    assert_eq!(documented.len(), keys.len(), "defaults.toml has keys the tree does not");
    // Each key line is preceded by a comment.
    let lines: Vec<&str> = DEFAULTS_TOML.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        if line.contains(" = ") && !line.starts_with('#') {
            assert!(lines[i - 1].starts_with('#'), "no comment above {line:?}");
        }
    }
}

#[test]
fn printed_config_round_trips() {
    let mut config = Config::default();
    config.ha.allow_list = vec!["10.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()];
    config.slave.source_address = Some("10.0.0.5".parse().unwrap());
    config.store.flush_interval = Duration::from_millis(1500);
    config.store.segment_size = ByteSize::kib(1028);
    let text = config.to_toml_string().unwrap();
    assert_eq!(parse(&text), config, "{text}");
}

// ---- values in the file ---------------------------------------------------------------------

#[test]
fn file_values_parse_into_the_tree() {
    let config = parse(
        r#"
        [node]
        role = "slave"
        [store]
        segment-size = "64 kib"
        max-message-size = 4096
        flush = "sync"
        file-reserved-time = "1m 30s"
        [ha]
        empty-slave-start = "earliest"
        replica-identity = "ip"
        allow-list = ["10.0.0.0/8", "192.168.1.7", "fd00::1"]
        [slave]
        master-ha = "master-0.hasync:10912"
        source-address = "10.0.0.5"
        ack-mode = "flushed"
        [log]
        format = "json"
        "#,
    );
    assert_eq!(config.node.role, Role::Slave);
    assert_eq!(config.store.segment_size, ByteSize(65536));
    assert_eq!(config.store.max_message_size, ByteSize(4096));
    assert_eq!(config.store.flush, FlushMode::Sync);
    assert_eq!(config.store.file_reserved_time, Duration::from_secs(90));
    assert_eq!(config.ha.empty_slave_start, EmptySlaveStart::Earliest);
    assert_eq!(config.ha.replica_identity, ReplicaIdentity::Ip);
    let nets: Vec<String> = config.ha.allow_list.iter().map(ToString::to_string).collect();
    assert_eq!(nets, ["10.0.0.0/8", "192.168.1.7/32", "fd00::1/128"]);
    assert_eq!(config.slave.source_address, Some("10.0.0.5".parse().unwrap()));
    assert_eq!(config.slave.ack_mode, AckMode::Flushed);
    assert_eq!(config.log.format, LogFormat::Json);
    assert_eq!(config.replication, ReplicationConfig::default());
}

// ---- parse errors name the key --------------------------------------------------------------

#[track_caller]
fn assert_parse_error(text: &str, key: &str, also: &str) {
    let err = Config::from_toml_str(text).expect_err(text);
    let shown = err.to_string();
    assert!(shown.contains(&format!("`{key}`")), "{key} not named in: {shown}");
    assert!(shown.contains(also), "{also:?} not in: {shown}");
    assert!(!shown.contains('\n'), "not one line: {shown}");
    assert!(matches!(err, Error::Parse { key: Some(ref k), .. } if k == key), "{err:?}");
}

#[test]
fn unknown_keys_are_errors_naming_the_key() {
    assert_parse_error("[store]\nsegment-sise = \"1GiB\"\n", "store.segment-sise", "line 2");
    assert_parse_error("[stor]\nsegment-size = \"1GiB\"\n", "stor", "unknown field");
    assert_parse_error("store.bogus = 1\n", "store.bogus", "unknown field `bogus`");
}

#[test]
fn bad_values_are_errors_naming_the_key() {
    assert_parse_error("[store]\nsegment-size = \"12XB\"\n", "store.segment-size", "\"12XB\"");
    assert_parse_error("[store]\nsegment-size = \"1.5GiB\"\n", "store.segment-size", "fraction");
    assert_parse_error(
        "[ha]\nheartbeat-interval = \"5 parsecs\"\n",
        "ha.heartbeat-interval",
        "5 parsecs",
    );
    assert_parse_error("[ha]\nheartbeat-interval = 5\n", "ha.heartbeat-interval", "duration");
    assert_parse_error("[node]\nrole = \"leader\"\n", "node.role", "leader");
    assert_parse_error("[ha]\nlisten = \"10912\"\n", "ha.listen", "line 2");
    assert_parse_error("[slave]\nsource-address = \"host\"\n", "slave.source-address", "host");
    assert_parse_error(
        "[ha]\nallow-list = [\n  \"10.0.0.0/8\",\n  \"10.0.0.0/40\",\n]\n",
        "ha.allow-list",
        "10.0.0.0/40",
    );
    assert_parse_error(
        "# comment\n[replication]\n# sync-ack-replicas = 2\nsync-ack-replicas = -1\n",
        "replication.sync-ack-replicas",
        "line 4",
    );
}

#[test]
fn load_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("hasync.toml");
    let err = Config::load(&path).unwrap_err();
    assert!(matches!(err, Error::Read { .. }), "{err:?}");
    assert!(err.to_string().contains("hasync.toml"), "{err}");
    std::fs::write(&path, "[store]\nflush = \"sometimes\"\n").unwrap();
    let err = Config::load(&path).unwrap_err().to_string();
    assert!(err.contains("hasync.toml") && err.contains("`store.flush`"), "{err}");
}

// ---- validation rules name their key --------------------------------------------------------

#[test]
fn segment_size_rules() {
    let shown = assert_invalid("[store]\nsegment-size = \"1000B\"", "store.segment-size");
    let page = rustix::param::page_size() as u64;
    assert!(shown.starts_with(&format!(
        "invalid `store.segment-size` = \"1000B\": must be a multiple of the page size ({page})"
    )));
    assert_invalid("[store]\nsegment-size = 0", "store.segment-size");
    assert_invalid("[store]\nsegment-size = \"2GiB\"", "store.segment-size");
    assert_invalid("[store]\nsegment-size = \"4GiB\"", "store.segment-size");
    // The largest accepted: 2GiB less one page.
    assert_valid(&format!("[store]\nsegment-size = {}", (2u64 << 30) - page));
}

#[test]
fn max_message_size_must_fit_in_a_segment() {
    // 64KiB segment: body + MAX_RECORD_OVERHEAD + 8 <= 65536.
    let limit = 65536 - hasync::store::record::MAX_RECORD_OVERHEAD as u64 - 8;
    let base = "[store]\nsegment-size = \"64KiB\"\n";
    assert_valid(&format!("{base}max-message-size = {limit}"));
    assert_invalid(&format!("{base}max-message-size = {}", limit + 1), "store.max-message-size");
    assert_invalid("[store]\nsegment-size = \"64KiB\"", "store.max-message-size");
    assert_invalid("[store]\nmax-message-size = 0", "store.max-message-size");
}

/// The fit of a record in a segment is the store's rule (config imports nothing of the store):
/// `Config::validate` alone does not know it; the full check reports it in key order with
/// the others, and the store refuses such options itself.
#[test]
fn record_fit_is_the_stores_rule_reported_in_key_order() {
    let text = "[node]\nname = \"\"\n[store]\nsegment-size = \"64KiB\"\n[ha]\nmax-connections = 0";
    let c = parse(text);
    assert_eq!(c.validate().unwrap_err().keys(), ["node.name", "ha.max-connections"]);
    let err = validate(&c).unwrap_err();
    assert_eq!(err.keys(), ["node.name", "store.max-message-size", "ha.max-connections"]);
    let store = hasync::store::StoreOptions::from_config(&c.store).unwrap_err();
    assert!(
        store.to_string().starts_with("invalid `store.max-message-size` = \"4MiB\""),
        "{store}"
    );
    // A segment size that breaks its own rule is reported alone, not twice.
    let err = validate(&parse("[store]\nsegment-size = \"1000B\"")).unwrap_err();
    assert_eq!(err.keys(), ["store.segment-size"]);
}

#[test]
fn store_ratio_and_durations() {
    for ratio in ["0.0", "1.01", "-0.5", "nan"] {
        assert_invalid(
            &format!("[store]\ndisk-max-used-ratio = {ratio}"),
            "store.disk-max-used-ratio",
        );
    }
    assert_valid("[store]\ndisk-max-used-ratio = 1.0");
    for key in ["flush-interval", "sync-flush-timeout", "file-reserved-time", "truncated-retention"]
    {
        assert_invalid(&format!("[store]\n{key} = \"0s\""), &format!("store.{key}"));
    }
    assert_valid("[store]\ntruncated-retention = \"1h\"\ntruncated-max-bytes = \"0B\"");
}

#[test]
fn node_worker_threads_are_bounded() {
    let shown = assert_invalid("[node]\nworker-threads = 1025", "node.worker-threads");
    assert!(shown.contains("to 1024"), "{shown}");
    for n in ["0", "1", "1024"] {
        assert_valid(&format!("[node]\nworker-threads = {n}"));
    }
}

#[test]
fn store_background_nice_is_a_nice_value() {
    let shown = assert_invalid("[store]\nbackground-nice = 20", "store.background-nice");
    assert!(shown.contains("0 to 19"), "{shown}");
    for nice in ["0", "19"] {
        assert_valid(&format!("[store]\nbackground-nice = {nice}"));
    }
    let err = Config::from_toml_str("[store]\nbackground-nice = -1").unwrap_err().to_string();
    assert!(err.contains("background-nice"), "{err}");
}

#[test]
fn store_warm_lock_is_none_process_or_an_absolute_path() {
    for bad in ["host", "", "run/lock/hasync-warm.lock"] {
        let shown = assert_invalid(&format!("[store]\nwarm-lock = {bad:?}"), "store.warm-lock");
        assert!(shown.contains("\"none\", \"process\" or the absolute path"), "{shown}");
    }
    for good in ["none", "process", "/run/lock/hasync-warm.lock"] {
        assert_valid(&format!("[store]\nwarm-lock = {good:?}"));
    }
}

/// A lock file that cannot be opened stops the store at start, naming the key and the path,
/// rather than leaving warms that never take turns with the other processes.
#[test]
fn a_warm_lock_file_that_cannot_be_opened_stops_the_store_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let c = StoreConfig {
        warm_lock: dir.path().join("no-such-dir/warm.lock").display().to_string(),
        ..StoreConfig::default()
    };
    let opts = hasync::store::StoreOptions::from_config(&c).unwrap();
    let err = hasync::store::CommitLog::open(
        std::sync::Arc::new(hasync::store::fs::StdFs),
        &dir.path().join("data"),
        opts,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("store.warm-lock") && err.contains("no-such-dir"), "{err}");
}

#[test]
fn replication_rules() {
    assert_invalid("[replication]\nsync-ack-replicas = 0", "replication.sync-ack-replicas");
    assert_invalid(
        "[replication]\nsync-ack-replicas = 3\n[ha]\nmax-connections = 2",
        "replication.sync-ack-replicas",
    );
    assert_invalid("[replication]\nslave-timeout = \"0ms\"", "replication.slave-timeout");
    assert_invalid("[replication]\nmax-gap-not-in-sync = 0", "replication.max-gap-not-in-sync");
}

#[test]
fn ha_rules() {
    assert_invalid("[ha]\ntransfer-batch-size = 0", "ha.transfer-batch-size");
    let java_max = (4u64 << 20) - 12;
    let big = "[slave]\nread-buffer-size = \"16MiB\"\n[ha]\ntransfer-batch-size = ";
    assert_valid(&format!("{big}{java_max}"));
    assert_invalid(&format!("{big}{}", java_max + 1), "ha.transfer-batch-size");
    let small = "[slave]\nread-buffer-size = \"64KiB\"\n[ha]\ntransfer-batch-size = ";
    assert_valid(&format!("{small}{}", 65536 - 12));
    assert_invalid(&format!("{small}{}", 65536 - 11), "ha.transfer-batch-size");
    assert_invalid(
        "[ha]\nheartbeat-interval = \"20s\"\nhousekeeping-interval = \"20s\"",
        "ha.housekeeping-interval",
    );
    assert_invalid("[ha]\nheartbeat-interval = \"0s\"", "ha.heartbeat-interval");
    assert_invalid("[ha]\nmax-connections = 0", "ha.max-connections");
}

#[test]
fn slave_rules() {
    assert_invalid("[slave]\nread-buffer-size = \"32KiB\"", "slave.read-buffer-size");
    assert_invalid(
        "[slave]\nreconnect-backoff = \"61s\"\nreconnect-backoff-max = \"60s\"",
        "slave.reconnect-backoff-max",
    );
    assert_invalid("[slave]\nconnect-timeout = \"0s\"", "slave.connect-timeout");
    assert_invalid("[slave]\nreconnect-backoff = \"0s\"", "slave.reconnect-backoff");
}

#[test]
fn slave_role_needs_a_master_address() {
    assert_invalid("[node]\nrole = \"slave\"", "slave.master-ha");
    assert_valid("[node]\nrole = \"slave\"\n[slave]\nmaster-ha = \"10.0.0.1:10912\"");
    for bad in ["10.0.0.1", "master:0", "::1:10912", ":10912"] {
        assert_invalid(&format!("[slave]\nmaster-ha = \"{bad}\""), "slave.master-ha");
        assert_invalid(&format!("[slave]\nmaster-grpc = \"{bad}\""), "slave.master-grpc");
    }
    assert_valid("[slave]\nmaster-ha = \"[::1]:10912\"\nmaster-grpc = \"master-0:10920\"");
}

#[test]
fn node_and_log_rules() {
    assert_invalid("[node]\nname = \"\"", "node.name");
    assert_invalid("[node]\nname = \"my node\"", "node.name");
    assert_invalid("[node]\ndata-dir = \"\"", "node.data-dir");
    assert_invalid("[log]\nfilter = \" \"", "log.filter");
}

#[test]
fn listeners_must_not_share_a_port() {
    assert_invalid("[grpc]\nlisten = \"127.0.0.1:10912\"", "grpc.listen");
    assert_invalid("[metrics]\nlisten = \"0.0.0.0:10920\"", "metrics.listen");
    assert_valid(
        "[ha]\nlisten = \"127.0.0.1:0\"\n[grpc]\nlisten = \"127.0.0.1:0\"\n\
         [metrics]\nlisten = \"127.0.0.1:0\"",
    );
}

#[test]
fn kubernetes_rules() {
    let coordinated = "[node]\nname = \"n1\"\nadvertise-ha = \"n1:10912\"\n\
                       advertise-grpc = \"n1:10920\"\n[coordinator]\n\
                       endpoints = [\"etcd:2379\"]\ncluster = \"c\"\ngroup = \"g\"\n";
    let shown = assert_invalid("[kubernetes]\nrole-label = true", "kubernetes.role-label");
    assert!(shown.contains("needs coordinator mode"), "{shown}");
    assert_valid(&format!("{coordinated}[kubernetes]\nrole-label = true"));
    assert_invalid("[kubernetes]\npod-name = \"Hasync_0\"", "kubernetes.pod-name");
    assert_invalid("[kubernetes]\nnamespace = \"a.b\"", "kubernetes.namespace");
    let shown = assert_invalid(
        "[kubernetes]\napi-server = \"http://10.0.0.1:443\"",
        "kubernetes.api-server",
    );
    assert!(shown.contains("https://"), "{shown}");
    assert_invalid("[kubernetes]\napi-server = \"https://h:443/api\"", "kubernetes.api-server");
    assert_invalid("[kubernetes]\ntimeout = \"0s\"", "kubernetes.timeout");
    assert_invalid(
        &format!("{coordinated}[kubernetes]\nrole-label = true\nservice-account-dir = \"\""),
        "kubernetes.service-account-dir",
    );
    assert_valid(
        "[kubernetes]\npod-name = \"hasync-0\"\nnamespace = \"brokers\"\n\
         api-server = \"https://[fd00::1]:6443\"\nservice-account-dir = \"/sa\"\ntimeout = \"1s\"",
    );
}

#[test]
fn all_problems_are_reported_together() {
    let err =
        validate(&parse("[node]\nname = \"\"\n[ha]\nmax-connections = 0\n[log]\nfilter = \"\""))
            .unwrap_err();
    assert!(matches!(err, Error::Many(ref all) if all.len() == 3), "{err:?}");
    assert_eq!(err.keys(), ["node.name", "ha.max-connections", "log.filter"]);
    assert!(!err.to_string().contains('\n'));
}

// ---- flags and environment ------------------------------------------------------------------

fn serve_args(args: &[&str]) -> hasync::cli::ServeArgs {
    let argv = ["hasync", "serve"].iter().chain(args);
    match Cli::try_parse_from(argv).unwrap_or_else(|e| panic!("{args:?}: {e}")).command {
        Command::Serve(serve) => *serve,
        other => panic!("{other:?}"),
    }
}

#[test]
fn every_flag_sets_its_key() {
    let args = serve_args(&[
        "--name=n1",
        "--data-dir=/var/lib/hasync",
        "--segment-size=64KiB",
        "--role=slave",
        "--ha-listen=127.0.0.1:1",
        "--grpc-listen=127.0.0.1:2",
        "--metrics-listen=127.0.0.1:3",
        "--master-ha=m:10912",
        "--master-grpc=m:10920",
        "--advertise-ha=n1.hasync:10912",
        "--advertise-grpc=n1.hasync:10920",
        "--mode=sync",
        "--sync-ack-replicas=2",
        "--slave-timeout=3s",
        "--flush=sync",
        "--metadata-sync-interval=1m",
        "--log-format=json",
    ]);
    let mut config = Config::default();
    config.apply_overrides(&args.overrides);
    assert_eq!(config.node.name, "n1");
    assert_eq!(config.node.data_dir, PathBuf::from("/var/lib/hasync"));
    assert_eq!(config.store.segment_size, ByteSize::kib(64));
    assert_eq!(config.node.role, Role::Slave);
    assert_eq!(config.ha.listen.port(), 1);
    assert_eq!(config.grpc.listen.port(), 2);
    assert_eq!(config.metrics.listen.port(), 3);
    assert_eq!(config.slave.master_ha, "m:10912");
    assert_eq!(config.slave.master_grpc, "m:10920");
    assert_eq!(config.node.advertise_ha, "n1.hasync:10912");
    assert_eq!(config.node.advertise_grpc, "n1.hasync:10920");
    assert_eq!(config.replication.mode, ReplicationMode::Sync);
    assert_eq!(config.replication.sync_ack_replicas, 2);
    assert_eq!(config.replication.slave_timeout, Duration::from_secs(3));
    assert_eq!(config.store.flush, FlushMode::Sync);
    assert_eq!(config.metadata.sync_interval, Duration::from_secs(60));
    assert_eq!(config.log.format, LogFormat::Json);
    assert_eq!(args.overrides.set_keys().len(), 17);
}

#[test]
fn flags_override_the_file_and_absent_flags_keep_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(
        dir.path(),
        "[store]\nsegment-size = \"128KiB\"\nmax-message-size = \"16KiB\"\n\
        [replication]\nmode = \"sync\"\n",
    );
    let file = path.to_str().unwrap();
    let config = serve_args(&["--config", file, "--segment-size", "256KiB"]).effective_config();
    let config = config.unwrap();
    assert_eq!(config.store.segment_size, ByteSize::kib(256));
    assert_eq!(config.store.max_message_size, ByteSize::kib(16));
    assert_eq!(config.replication.mode, ReplicationMode::Sync);
}

#[test]
fn bad_flag_values_are_refused_naming_the_flag_or_the_key() {
    let err = Cli::try_parse_from(["hasync", "serve", "--segment-size", "12XB"]).unwrap_err();
    assert!(err.to_string().contains("--segment-size"), "{err}");
    let err = Cli::try_parse_from(["hasync", "serve", "--slave-timeout", "soon"]).unwrap_err();
    assert!(err.to_string().contains("--slave-timeout"), "{err}");
    let err = serve_args(&["--segment-size", "1000B"]).effective_config().unwrap_err();
    let shown = err.to_string();
    assert!(shown.contains("`store.segment-size`") && shown.contains("--segment-size"), "{shown}");
}

/// `serve` refuses a record that does not fit in a segment (the store's rule) with the key
/// name, both in its effective configuration and when the node starts without that check.
#[tokio::test]
async fn serve_refuses_a_record_that_does_not_fit_a_segment() {
    let err = serve_args(&["--segment-size", "64KiB"]).effective_config().unwrap_err();
    assert!(err.to_string().contains("`store.max-message-size`"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config::default();
    config.node.data_dir = dir.path().to_path_buf();
    config.store.segment_size = ByteSize::kib(64);
    let fs = std::sync::Arc::new(hasync::store::fs::StdFs);
    let Err(err) = crate::support::node::TestNode::try_start(config, fs).await else {
        panic!("start must be refused");
    };
    assert!(err.to_string().contains("invalid `store.max-message-size`"), "{err}");
}

fn write(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("hasync.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// The binary with no `HASYNC_*` variable inherited from the test's environment.
fn hasync() -> assert_cmd::Command {
    let mut cmd = assert_cmd::Command::cargo_bin("hasync").unwrap();
    for (name, _) in std::env::vars() {
        if name.starts_with("HASYNC_") {
            cmd.env_remove(name);
        }
    }
    cmd
}

fn printed_config(cmd: &mut assert_cmd::Command) -> Config {
    let out = cmd.assert().success().get_output().stdout.clone();
    parse(&String::from_utf8(out).unwrap())
}

#[test]
fn precedence_defaults_file_env_flag() {
    let dir = tempfile::tempdir().unwrap();
    let path =
        write(dir.path(), "[store]\nsegment-size = \"128KiB\"\nmax-message-size = \"16KiB\"\n");
    let defaults = printed_config(hasync().args(["serve", "--print-config"]));
    assert_eq!(defaults, Config::default());

    let file =
        printed_config(hasync().args(["serve", "--print-config"]).env("HASYNC_CONFIG", &path));
    assert_eq!(file.store.segment_size, ByteSize::kib(128));

    let env = printed_config(
        hasync()
            .args(["serve", "--print-config"])
            .env("HASYNC_CONFIG", &path)
            .env("HASYNC_SEGMENT_SIZE", "64KiB")
            .env("HASYNC_SLAVE_TIMEOUT", "3s")
            .env("HASYNC_ROLE", "slave")
            .env("HASYNC_MASTER_HA", "127.0.0.1:10912"),
    );
    assert_eq!(env.store.segment_size, ByteSize::kib(64));
    assert_eq!(env.store.max_message_size, ByteSize::kib(16));
    assert_eq!(env.replication.slave_timeout, Duration::from_secs(3));
    assert_eq!(env.node.role, Role::Slave);

    let flag = printed_config(
        hasync()
            .args(["serve", "--print-config", "--segment-size", "256KiB", "--config"])
            .arg(&path)
            .env("HASYNC_SEGMENT_SIZE", "64KiB"),
    );
    assert_eq!(flag.store.segment_size, ByteSize::kib(256));
}

#[test]
fn print_config_refuses_an_invalid_result() {
    let out = hasync()
        .args(["serve", "--print-config"])
        .env("HASYNC_SEGMENT_SIZE", "1000B")
        .assert()
        .failure()
        .get_output()
        .clone();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.starts_with("error: ") && stderr.contains("`store.segment-size`"), "{stderr}");
    assert!(out.stdout.is_empty());
}

// ---- hasync config ... ----------------------------------------------------------------------

#[test]
fn config_check_accepts_a_good_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = write(dir.path(), "[node]\nrole = \"slave\"\n[slave]\nmaster-ha = \"m:10912\"\n");
    let out = hasync().args(["config", "check"]).arg(&path).assert().success().get_output().clone();
    assert_eq!(String::from_utf8(out.stdout).unwrap(), format!("ok: {}\n", path.display()));
}

#[test]
fn config_check_rejects_a_bad_file_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    for (text, key) in [
        ("[ha]\nheartbeat-interval = \"30s\"\n", "`ha.housekeeping-interval`"),
        ("[store]\nsegment-size = \"12XB\"\n", "`store.segment-size`"),
        // The store's own rule, checked by the store but still reported by `config check`.
        ("[store]\nsegment-size = \"64KiB\"\n", "`store.max-message-size`"),
        ("[slave]\nmaster = \"m:1\"\n", "`slave.master`"),
    ] {
        let path = write(dir.path(), text);
        let out =
            hasync().args(["config", "check"]).arg(&path).assert().code(1).get_output().clone();
        let stderr = String::from_utf8(out.stderr).unwrap();
        assert!(stderr.starts_with("error: ") && stderr.contains(key), "{stderr}");
        assert!(stderr.contains("hasync.toml"), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(out.stdout.is_empty());
    }
    let missing = dir.path().join("missing.toml");
    let out =
        hasync().args(["config", "check"]).arg(&missing).assert().code(1).get_output().clone();
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.contains("missing.toml") && stderr.contains("No such file"), "{stderr}");
}

#[test]
fn config_defaults_prints_the_documented_defaults() {
    let out = hasync().args(["config", "defaults"]).assert().success().get_output().clone();
    let text = String::from_utf8(out.stdout).unwrap();
    assert_eq!(text, DEFAULTS_TOML);
    assert_eq!(parse(&text), Config::default());
}

#[test]
fn coordinator_mode_asks_for_its_keys_and_refuses_what_cannot_work() {
    let base = "[coordinator]\nendpoints = [\"127.0.0.1:2379\"]\n";
    // A node name, the cluster and the group are required with endpoints.
    let e = assert_invalid(base, "node.name");
    assert!(e.contains("explicitly"), "{e}");
    assert_invalid(&format!("[node]\nname = \"n1\"\n{base}"), "coordinator.cluster");
    let ok = "[node]\nname = \"n1\"\nadvertise-ha = \"10.0.0.1:10912\"\n\
              advertise-grpc = \"10.0.0.1:10920\"\n\
              [coordinator]\nendpoints = [\"127.0.0.1:2379\", \"https://etcd:2379\"]\n\
              cluster = \"c\"\ngroup = \"g\"\n";
    assert_valid(ok);
    // Wildcard listeners need advertised addresses.
    let no_adv = "[node]\nname = \"n1\"\n[coordinator]\nendpoints = [\"127.0.0.1:2379\"]\n\
                  cluster = \"c\"\ngroup = \"g\"\n";
    assert_invalid(no_adv, "node.advertise-ha");
    assert_invalid(
        &format!("{ok}[ha]\nreplica-identity = \"connection\"\n"),
        "ha.replica-identity",
    );
    assert_invalid(&ok.replace("127.0.0.1:2379", "nowhere"), "coordinator.endpoints[0]");
    assert_invalid(&format!("{ok}ttl = \"1s\"\n"), "coordinator.ttl");
    assert_invalid(&format!("{ok}renew-interval = \"6s\"\n"), "coordinator.renew-interval");
    assert_invalid(&format!("{ok}user = \"root\"\n"), "coordinator.user");
    assert_invalid(
        &format!("{ok}cert-file = \"/c.pem\"\nkey-file = \"/k.pem\"\n"),
        "coordinator.cert-file",
    );
    // Without endpoints nothing of this is asked.
    assert_valid("[coordinator]\ncluster = \"\"\n");
}
