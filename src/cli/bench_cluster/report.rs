//! The figures of `hasync bench cluster`: samples of etcd's counters and of the processes'
//! CPU and memory, the rates between two samples, one size's figures, and the table of every
//! size with the per-group figures set against the smallest size's (the same run's baseline).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::probe::{EtcdMetrics, ProcStat};

/// etcd's counters and the three processes' CPU and memory at one instant.
#[derive(Debug, Clone)]
pub(super) struct Sample {
    pub(super) at: Instant,
    pub(super) etcd: EtcdMetrics,
    pub(super) etcd_proc: ProcStat,
    pub(super) controller: ProcStat,
    /// This process: every node of the bench.
    pub(super) members: ProcStat,
}

/// What happened between two samples, per second; gauges as of the second one.
#[derive(Debug, Clone, Default)]
pub(super) struct Rates {
    pub(super) requests: f64,
    pub(super) by_method: BTreeMap<String, f64>,
    pub(super) writes: f64,
    pub(super) renewals: f64,
    pub(super) received_bytes: f64,
    pub(super) sent_bytes: f64,
    pub(super) fsyncs: f64,
    /// Mean WAL fsync in the window (ms); 0 without one.
    pub(super) fsync_ms: f64,
    pub(super) watchers: f64,
    /// Growth of the part of etcd's database in use (the revisions kept until a compaction).
    pub(super) db_growth_bytes: f64,
    pub(super) etcd_cpu_pct: f64,
    pub(super) etcd_rss: u64,
    pub(super) controller_cpu_pct: f64,
    pub(super) controller_rss: u64,
    pub(super) members_cpu_pct: f64,
    pub(super) members_rss: u64,
}

impl Rates {
    /// The rates from `a` to `b` (`b` later).
    pub(super) fn between(a: &Sample, b: &Sample) -> Self {
        let secs = b.at.saturating_duration_since(a.at).as_secs_f64().max(1e-3);
        let per_s = |x: f64, y: f64| (y - x).max(0.0) / secs;
        let cpu = |x: &ProcStat, y: &ProcStat| 100.0 * per_s(x.cpu_s, y.cpu_s);
        let by_method = b
            .etcd
            .handled
            .iter()
            .map(|(m, v)| (m.clone(), per_s(a.etcd.handled.get(m).copied().unwrap_or(0.0), *v)))
            .filter(|(_, r)| *r > 0.0)
            .collect();
        let fsyncs = b.etcd.fsyncs - a.etcd.fsyncs;
        Self {
            requests: per_s(a.etcd.requests(), b.etcd.requests()),
            by_method,
            writes: per_s(a.etcd.proposals, b.etcd.proposals),
            renewals: per_s(a.etcd.renewals, b.etcd.renewals),
            received_bytes: per_s(a.etcd.received_bytes, b.etcd.received_bytes),
            sent_bytes: per_s(a.etcd.sent_bytes, b.etcd.sent_bytes),
            fsyncs: per_s(a.etcd.fsyncs, b.etcd.fsyncs),
            fsync_ms: if fsyncs > 0.0 {
                1000.0 * (b.etcd.fsync_seconds - a.etcd.fsync_seconds) / fsyncs
            } else {
                0.0
            },
            watchers: b.etcd.watchers,
            db_growth_bytes: per_s(a.etcd.db_in_use_bytes, b.etcd.db_in_use_bytes),
            etcd_cpu_pct: cpu(&a.etcd_proc, &b.etcd_proc),
            etcd_rss: b.etcd_proc.rss_bytes,
            controller_cpu_pct: cpu(&a.controller, &b.controller),
            controller_rss: b.controller.rss_bytes,
            members_cpu_pct: cpu(&a.members, &b.members),
            members_rss: b.members.rss_bytes,
        }
    }

    /// The calls by method, busiest first: `Txn 25.0, Range 20.0, ...`.
    pub(super) fn methods(&self) -> String {
        let mut m: Vec<(&String, &f64)> = self.by_method.iter().collect();
        m.sort_by(|a, b| b.1.total_cmp(a.1));
        let parts: Vec<String> = m.iter().map(|(k, v)| format!("{k} {v:.1}")).collect();
        parts.join(", ")
    }
}

/// One failover scenario: each failed group's times from the crash of its master.
#[derive(Debug, Clone, Default)]
pub(super) struct Failovers {
    pub(super) groups: usize,
    /// Crash to the leader key's deletion (the lease's expiry).
    pub(super) expire: Vec<Duration>,
    /// Crash to the epoch opened (the controller's decision to fail over).
    pub(super) detect: Vec<Duration>,
    /// Epoch opened to the new master chosen (the voters fenced).
    pub(super) fence: Vec<Duration>,
    /// The new master chosen to it stable (its ChangeRole, the state's CAS).
    pub(super) promote: Vec<Duration>,
    /// Crash to the new master stable.
    pub(super) total: Vec<Duration>,
    /// etcd had the promotion to the topology stream's CHANGE for it.
    pub(super) topology: Vec<Duration>,
    /// Promotions the topology stream did not report in time.
    pub(super) topology_missing: usize,
}

/// Everything measured at one size.
#[derive(Debug, Clone, Default)]
pub(super) struct Figures {
    pub(super) groups: usize,
    pub(super) nodes: usize,
    pub(super) start: Duration,
    pub(super) formed: Duration,
    /// At rest, no topology stream open.
    pub(super) rest: Rates,
    /// At rest with one topology stream open.
    pub(super) watched: Rates,
    /// What that stream's client received, per second.
    pub(super) stream_updates: f64,
    pub(super) stream_bytes: f64,
    /// The stream's first update (every group).
    pub(super) snapshot_bytes: usize,
    /// Keys under the cluster's root, keys in etcd, etcd's database file.
    pub(super) cluster_keys: usize,
    /// The cluster's keys by kind (`state`, `members`, `history` ...) after the failovers:
    /// count and value bytes.
    pub(super) kinds: BTreeMap<String, (usize, usize)>,
    pub(super) etcd_keys: f64,
    pub(super) db_bytes: f64,
    /// Open file descriptors of this process at rest.
    pub(super) open_files: usize,
    pub(super) one: Option<Failovers>,
    pub(super) many: Option<Failovers>,
    pub(super) controller_rss_peak: u64,
}

/// p50 and max of `v` (zeros when empty).
pub(super) fn p50_max(v: &[Duration]) -> (Duration, Duration) {
    let mut s = v.to_vec();
    s.sort();
    match s.len() {
        0 => (Duration::ZERO, Duration::ZERO),
        n => (s[(n - 1) / 2], s[n - 1]),
    }
}

fn mib(b: u64) -> f64 {
    b as f64 / f64::from(1u32 << 20)
}

/// The lines printed after one size was measured.
pub(super) fn size_lines(f: &Figures) -> Vec<String> {
    let r = &f.rest;
    let mut out = vec![
        format!(
            "N = {} groups ({} nodes): started in {:.2} s, every group stable and formed \
             {:.2} s later",
            f.groups,
            f.nodes,
            f.start.as_secs_f64(),
            f.formed.as_secs_f64()
        ),
        format!(
            "  at rest: etcd {:.1} requests/s ({}), {:.1} writes/s, {:.1} renewals/s, \
             {:.1} fsyncs/s ({:.2} ms each)",
            r.requests,
            r.methods(),
            r.writes,
            r.renewals,
            r.fsyncs,
            r.fsync_ms
        ),
        format!(
            "  at rest: etcd received {:.1} KiB/s, sent {:.1} KiB/s; {} watchers; {} keys \
             ({} of the cluster), db {:.1} MiB; {} open files in the bench",
            r.received_bytes / 1024.0,
            r.sent_bytes / 1024.0,
            r.watchers,
            f.etcd_keys,
            f.cluster_keys,
            f.db_bytes / f64::from(1u32 << 20),
            f.open_files
        ),
        format!(
            "  at rest: etcd's database in use grew {:.1} KiB/s ({:.0} bytes per write); \
             keys after the failovers: {}",
            r.db_growth_bytes / 1024.0,
            if r.writes > 0.0 { r.db_growth_bytes / r.writes } else { 0.0 },
            kinds(&f.kinds)
        ),
        format!(
            "  with one WatchTopology stream: etcd sent {:.1} KiB/s ({:+.1}), {} watchers; \
             the client got a {:.1} KiB snapshot, then {:.2} updates/s, {:.1} KiB/s",
            f.watched.sent_bytes / 1024.0,
            (f.watched.sent_bytes - r.sent_bytes) / 1024.0,
            f.watched.watchers,
            f.snapshot_bytes as f64 / 1024.0,
            f.stream_updates,
            f.stream_bytes / 1024.0
        ),
    ];
    for fo in [&f.one, &f.many].into_iter().flatten() {
        let ms = |v: &[Duration]| {
            let (p, m) = p50_max(v);
            format!("{:.2}/{:.2} s", p.as_secs_f64(), m.as_secs_f64())
        };
        let (tp, tm) = p50_max(&fo.topology);
        out.push(format!(
            "  failover of {} group(s) at once (p50/max): lease gone {}, epoch opened {}, \
             stable {} after the crash; fence {}, promote {}; topology stream +{:.1}/{:.1} ms{}",
            fo.groups,
            ms(&fo.expire),
            ms(&fo.detect),
            ms(&fo.total),
            ms(&fo.fence),
            ms(&fo.promote),
            tp.as_secs_f64() * 1000.0,
            tm.as_secs_f64() * 1000.0,
            match fo.topology_missing {
                0 => String::new(),
                n => format!(" ({n} not reported)"),
            }
        ));
    }
    out
}

/// `state 10 x 512 B, members 20 x 640 B, ...`: count and mean value size per kind of key.
fn kinds(k: &BTreeMap<String, (usize, usize)>) -> String {
    let parts: Vec<String> = k
        .iter()
        .map(|(kind, (n, bytes))| format!("{kind} {n} x {} B", bytes / (*n).max(1)))
        .collect();
    parts.join(", ")
}

/// One row of the table: a label and a cell per size.
struct Row(String, Vec<String>);

/// The table of every size: a column per size; per-group rows also give the ratio to the
/// baseline column (the smallest size measured, normally N = 1).
pub(super) fn table(all: &[Figures]) -> String {
    let Some(base) = all.iter().min_by_key(|f| f.groups) else { return String::new() };
    let mut rows = rest_rows(all, base);
    rows.extend(failover_rows(all));
    render(all, &rows)
}

/// A row of one cell per size.
fn plain(all: &[Figures], label: &str, f: &dyn Fn(&Figures) -> String) -> Row {
    Row(label.to_owned(), all.iter().map(f).collect())
}

/// A row of `v` per group, each with its ratio to `base`'s.
fn per_group(all: &[Figures], base: &Figures, label: &str, v: &dyn Fn(&Figures) -> f64) -> Row {
    let b = v(base) / base.groups.max(1) as f64;
    let cells = all
        .iter()
        .map(|f| {
            let x = v(f) / f.groups.max(1) as f64;
            let ratio = if b > 0.0 { x / b } else { 0.0 };
            format!("{x:.2} ({ratio:.2}x)")
        })
        .collect();
    Row(format!("  {label} per group"), cells)
}

fn rest_rows(all: &[Figures], base: &Figures) -> Vec<Row> {
    let bytes = |f: &Figures| (f.rest.received_bytes + f.rest.sent_bytes) / 1024.0;
    vec![
        plain(all, "nodes", &|f| f.nodes.to_string()),
        plain(all, "etcd requests/s", &|f| format!("{:.1}", f.rest.requests)),
        per_group(all, base, "requests/s", &|f| f.rest.requests),
        plain(all, "etcd writes/s (raft proposals)", &|f| format!("{:.1}", f.rest.writes)),
        per_group(all, base, "writes/s", &|f| f.rest.writes),
        plain(all, "etcd KiB/s received + sent", &|f| format!("{:.1}", bytes(f))),
        per_group(all, base, "KiB/s", &bytes),
        plain(all, "etcd watchers", &|f| format!("{:.0}", f.rest.watchers)),
        plain(all, "keys of the cluster", &|f| f.cluster_keys.to_string()),
        per_group(all, base, "keys", &|f| f.cluster_keys as f64),
        plain(all, "etcd db file MiB", &|f| format!("{:.1}", f.db_bytes / 1048576.0)),
        plain(all, "etcd db in use grows KiB/s", &|f| {
            format!("{:.1}", f.rest.db_growth_bytes / 1024.0)
        }),
        plain(all, "etcd CPU % of a core", &|f| format!("{:.1}", f.rest.etcd_cpu_pct)),
        plain(all, "etcd RSS MiB", &|f| format!("{:.0}", mib(f.rest.etcd_rss))),
        plain(all, "controller CPU % of a core", &|f| format!("{:.2}", f.rest.controller_cpu_pct)),
        per_group(all, base, "controller CPU %", &|f| f.rest.controller_cpu_pct),
        plain(all, "controller RSS MiB (peak)", &|f| {
            format!("{:.0} ({:.0})", mib(f.rest.controller_rss), mib(f.controller_rss_peak))
        }),
        plain(all, "members CPU % (this process)", &|f| format!("{:.1}", f.rest.members_cpu_pct)),
        plain(all, "members RSS MiB (this process)", &|f| {
            format!("{:.0}", mib(f.rest.members_rss))
        }),
        plain(all, "+1 topology stream: etcd KiB/s sent", &|f| {
            format!("{:+.1}", (f.watched.sent_bytes - f.rest.sent_bytes) / 1024.0)
        }),
        per_group(all, base, "snapshot bytes", &|f| f.snapshot_bytes as f64),
        plain(all, "  its client: updates/s, KiB/s", &|f| {
            format!("{:.2}, {:.1}", f.stream_updates, f.stream_bytes / 1024.0)
        }),
    ]
}

fn failover_rows(all: &[Figures]) -> Vec<Row> {
    let secs = |fo: &Option<Failovers>, pick: fn(&Failovers) -> &Vec<Duration>| match fo {
        Some(fo) => {
            let (p, m) = p50_max(pick(fo));
            format!("{:.2} / {:.2}", p.as_secs_f64(), m.as_secs_f64())
        }
        None => "-".to_owned(),
    };
    let ms = |fo: Option<Failovers>| match fo {
        Some(fo) => {
            let (p, m) = p50_max(&fo.topology);
            format!("{:.1} / {:.1}", p.as_secs_f64() * 1e3, m.as_secs_f64() * 1e3)
        }
        None => "-".to_owned(),
    };
    let mut rows = Vec::new();
    for (title, pick_fo) in [
        ("1 group fails", (|f: &Figures| f.one.clone()) as fn(&Figures) -> Option<Failovers>),
        ("several fail at once", |f: &Figures| f.many.clone()),
    ] {
        let groups = |f: &Figures| pick_fo(f).map_or("-".to_owned(), |fo| fo.groups.to_string());
        rows.extend([
            plain(all, &format!("{title}: groups"), &groups),
            plain(all, "  lease gone s p50/max", &|f| secs(&pick_fo(f), |fo| &fo.expire)),
            plain(all, "  detect: epoch opened s", &|f| secs(&pick_fo(f), |fo| &fo.detect)),
            plain(all, "  fence: opened->chosen s", &|f| secs(&pick_fo(f), |fo| &fo.fence)),
            plain(all, "  promote: chosen->stable s", &|f| secs(&pick_fo(f), |fo| &fo.promote)),
            plain(all, "  crash->stable s", &|f| secs(&pick_fo(f), |fo| &fo.total)),
            plain(all, "  topology stream delay ms", &|f| ms(pick_fo(f))),
        ]);
    }
    rows
}

fn render(all: &[Figures], rows: &[Row]) -> String {
    let label_w = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    let head: Vec<String> = all.iter().map(|f| format!("N={}", f.groups)).collect();
    let col_w = rows
        .iter()
        .flat_map(|r| r.1.iter().map(String::len))
        .chain(head.iter().map(String::len))
        .max()
        .unwrap_or(0);
    let mut out = format!("  {:<label_w$}", "");
    for h in &head {
        out.push_str(&format!("  {h:>col_w$}"));
    }
    out.push('\n');
    for Row(label, cells) in rows {
        out.push_str(&format!("  {label:<label_w$}"));
        for c in cells {
            out.push_str(&format!("  {c:>col_w$}"));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p50_is_the_lower_middle_and_max_the_largest() {
        let ms = Duration::from_millis;
        assert_eq!(p50_max(&[ms(3), ms(1), ms(2)]), (ms(2), ms(3)));
        assert_eq!(p50_max(&[ms(4), ms(1)]), (ms(1), ms(4)));
        assert_eq!(p50_max(&[]), (Duration::ZERO, Duration::ZERO));
    }

    #[test]
    fn rates_are_per_second_between_samples_and_per_group_rows_compare_to_the_smallest_size() {
        let t = Instant::now();
        let mut a = Sample {
            at: t,
            etcd: EtcdMetrics::default(),
            etcd_proc: ProcStat::default(),
            controller: ProcStat::default(),
            members: ProcStat::default(),
        };
        a.etcd.handled.insert("Txn".into(), 10.0);
        let mut b = a.clone();
        b.at = t + Duration::from_secs(2);
        b.etcd.handled.insert("Txn".into(), 30.0);
        b.etcd.handled.insert("Range".into(), 4.0);
        b.controller.cpu_s = 0.5;
        let r = Rates::between(&a, &b);
        assert_eq!((r.requests, r.by_method["Range"], r.controller_cpu_pct), (12.0, 2.0, 25.0));
        assert_eq!(r.methods(), "Txn 10.0, Range 2.0");
        let one = Figures { groups: 1, rest: r.clone(), ..Figures::default() };
        let mut ten = Figures { groups: 10, rest: r, ..Figures::default() };
        ten.rest.requests = 60.0;
        let t = table(&[one, ten]);
        let row = t.lines().find(|l| l.contains("requests/s per group")).unwrap();
        assert!(row.contains("12.00 (1.00x)") && row.contains("6.00 (0.50x)"), "{t}");
    }
}
