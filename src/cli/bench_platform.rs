//! What the machine under a bench is doing, measured in the bench's own run: whether the
//! processes a run measures are idle before it starts ([`settle`]), and what one thread waking
//! another costs here, across CPUs and on one CPU ([`wake_up_round_trips`]). On a VM the second
//! can be ten times what it is on bare metal, and every hop between the client, the master
//! and the slave pays it.

use std::time::Duration;

use hdrhistogram::Histogram;

/// Below this share of one CPU, what a run measures counts as idle (see [`settle`]).
const IDLE_SHARE: f64 = 0.05;

/// How long [`settle`] waited before one run, and whether what it watched went idle.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Settled {
    pub(crate) waited: Duration,
    pub(crate) idle: bool,
}

/// Waits, at most `limit`, until `cpu_s` (the CPU seconds used so far by the processes a run
/// measures) grows by no more than [`IDLE_SHARE`] of one CPU over one `window`. A fresh store
/// warms its first segments on its store threads after the first put (about 1 CPU-second per
/// 256 MiB on a VM whose memory is touched for the first time), and a run that rolled a
/// segment leaves the next one warming: without this, that work lands in whichever run comes
/// next. A `cpu_s` that cannot be read ends the wait at once.
pub(crate) async fn settle(
    mut cpu_s: impl FnMut() -> Option<f64>,
    window: Duration,
    limit: Duration,
) -> Settled {
    let start = tokio::time::Instant::now();
    let Some(mut before) = cpu_s() else { return Settled::default() };
    loop {
        tokio::time::sleep(window).await;
        let Some(now) = cpu_s() else { return Settled { waited: start.elapsed(), idle: false } };
        let used = now - before;
        before = now;
        let idle = used <= IDLE_SHARE * window.as_secs_f64();
        if idle || start.elapsed() >= limit {
            return Settled { waited: start.elapsed(), idle };
        }
    }
}

/// What [`settle`] waited over a bench's runs, for its summary line.
#[derive(Debug, Default)]
pub(crate) struct SettleLog {
    runs: usize,
    total: Duration,
    longest: Duration,
    busy: usize,
}

impl SettleLog {
    pub(crate) fn add(&mut self, s: Settled) {
        self.runs += 1;
        self.total += s.waited;
        self.longest = self.longest.max(s.waited);
        self.busy += usize::from(!s.idle);
    }

    /// One line: how many runs waited how long in all, the longest wait, and how many runs
    /// started with the processes still busy.
    pub(crate) fn summary(&self, what: &str) -> String {
        let mut line = format!(
            "  each run started once {what} used under {:.0}% of a CPU: {} runs waited {:.1} s in all, at most {:.1} s",
            IDLE_SHARE * 100.0,
            self.runs,
            self.total.as_secs_f64(),
            self.longest.as_secs_f64()
        );
        if self.busy > 0 {
            line.push_str(&format!("; {} started still busy (the wait is bounded)", self.busy));
        }
        line
    }
}

/// `count` round trips between two threads over a Unix socket pair (one byte each way,
/// blocking reads: each side sleeps until the other wakes it), the first thread pinned to
/// `cpus.0` and the second to `cpus.1`; latencies in µs. Equal CPUs measure a switch between
/// two threads on one CPU, different ones a wake-up across CPUs (an inter-processor interrupt,
/// which a VM turns into an exit to its host when the other CPU idles).
pub(crate) fn wake_up_round_trips(
    count: usize,
    cpus: (usize, usize),
) -> anyhow::Result<Histogram<u64>> {
    use std::io::{Read as _, Write as _};
    let (mut a, mut b) = std::os::unix::net::UnixStream::pair()?;
    let echo = std::thread::spawn(move || -> anyhow::Result<()> {
        pin_to(cpus.1)?;
        let mut byte = [0u8; 1];
        while b.read(&mut byte)? == 1 {
            b.write_all(&byte)?;
        }
        Ok(())
    });
    let timed = std::thread::spawn(move || -> anyhow::Result<Histogram<u64>> {
        pin_to(cpus.0)?;
        let mut h = Histogram::<u64>::new(3)?;
        let mut byte = [0u8; 1];
        for _ in 0..count {
            let t = std::time::Instant::now();
            a.write_all(&byte)?;
            a.read_exact(&mut byte)?;
            h.record(t.elapsed().as_micros() as u64)?;
        }
        Ok(h)
    });
    let h = timed.join().map_err(|_| anyhow::anyhow!("the timing thread panicked"))?;
    // The timing thread's end closed its socket: the echo thread reads 0 and ends.
    echo.join().map_err(|_| anyhow::anyhow!("the echo thread panicked"))??;
    h
}

/// Pins this thread to one CPU.
fn pin_to(cpu: usize) -> anyhow::Result<()> {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    rustix::thread::sched_setaffinity(None, &set)
        .map_err(|e| anyhow::anyhow!("pinning a thread to CPU {cpu}: {e}"))
}

/// The first two CPUs this process may run on (one when it may run on one only).
pub(crate) fn allowed_cpus() -> Vec<usize> {
    let Ok(set) = rustix::thread::sched_getaffinity(None) else { return vec![0] };
    (0..rustix::thread::CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).take(2).collect()
}

/// One line: the wake-up round trip across two CPUs and on one, p50 and p99 (across CPUs
/// only when this process may use two).
pub(crate) fn wake_up_line(count: usize) -> anyhow::Result<String> {
    let cpus = allowed_cpus();
    let first = cpus.first().copied().unwrap_or(0);
    let one = wake_up_round_trips(count, (first, first))?;
    let q = |h: &Histogram<u64>| (h.value_at_quantile(0.5), h.value_at_quantile(0.99));
    let (p50, p99) = q(&one);
    let mut line = format!(
        "  thread wake-up round trip (two threads, a Unix socket): p50 {p50} us, p99 {p99} us on one CPU"
    );
    if let Some(&second) = cpus.get(1) {
        let across = wake_up_round_trips(count, (first, second))?;
        let (p50, p99) = q(&across);
        line.push_str(&format!("; p50 {p50} us, p99 {p99} us across two CPUs"));
    } else {
        line.push_str("; this process may use one CPU only");
    }
    Ok(line)
}

/// One line: how idle CPUs wait here (cpuidle driver and governor, each state's exit latency,
/// the haltpoll guest's polling window) and the PM QoS CPU latency limit in force: what a
/// wake-up across CPUs pays.
pub(crate) fn idle_line() -> String {
    idle_line_at(
        std::path::Path::new("/sys"),
        std::path::Path::new(crate::cli::cpu_latency::DEVICE),
    )
}

fn idle_line_at(sys: &std::path::Path, device: &std::path::Path) -> String {
    let read = |p: &str| std::fs::read_to_string(sys.join(p)).ok().map(|s| s.trim().to_owned());
    let mut line = String::from("  idle CPUs: ");
    match read("devices/system/cpu/cpuidle/current_driver") {
        Some(driver) => {
            let governor = read("devices/system/cpu/cpuidle/current_governor")
                .or_else(|| read("devices/system/cpu/cpuidle/current_governor_ro"))
                .unwrap_or_else(|| "?".to_owned());
            line.push_str(&format!("cpuidle driver {driver}, governor {governor}, states"));
            for i in 0..16 {
                let state = format!("devices/system/cpu/cpu0/cpuidle/state{i}");
                let Some(name) = read(&format!("{state}/name")) else { break };
                let latency = read(&format!("{state}/latency")).unwrap_or_else(|| "?".to_owned());
                line.push_str(&format!(" {name} ({latency} us exit)"));
            }
        }
        None => line.push_str("no cpuidle driver"),
    }
    if let Some(ns) = read("module/haltpoll/parameters/guest_halt_poll_ns") {
        line.push_str(&format!("; guest_halt_poll_ns {ns}"));
    }
    match std::fs::read(device).ok().and_then(|b| b.get(..4).map(|b| [b[0], b[1], b[2], b[3]])) {
        Some(b) => {
            let limit = i32::from_ne_bytes(b);
            if limit >= crate::cli::cpu_latency::MAX_US {
                line.push_str("; PM QoS CPU latency limit: none");
            } else {
                line.push_str(&format!("; PM QoS CPU latency limit {limit} us"));
            }
        }
        None => line.push_str("; PM QoS CPU latency limit: unreadable"),
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CPU clock that reads `busy` more seconds at each read for its first `busy_reads`
    /// reads, and nothing more after them.
    fn clock(busy: f64, busy_reads: usize) -> impl FnMut() -> Option<f64> {
        let (mut reads, mut used) = (0, 0.0);
        move || {
            if reads < busy_reads {
                used += busy;
            }
            reads += 1;
            Some(used)
        }
    }

    #[tokio::test(start_paused = true)]
    async fn settle_waits_while_the_processes_are_busy_and_stops_once_they_are_idle() {
        let window = Duration::from_millis(100);
        // Half a CPU for the first three windows (the first read is the baseline), then idle.
        let s = settle(clock(0.05, 4), window, Duration::from_secs(20)).await;
        assert!(s.idle);
        assert_eq!(s.waited, 4 * window, "three busy windows, then one idle");
        // Just under the idle share counts as idle at once.
        let s = settle(clock(0.004, usize::MAX), window, Duration::from_secs(20)).await;
        assert!(s.idle);
        assert_eq!(s.waited, window);
    }

    #[tokio::test(start_paused = true)]
    async fn settle_gives_up_at_its_limit_and_says_the_processes_were_still_busy() {
        let window = Duration::from_millis(100);
        let s = settle(clock(0.05, usize::MAX), window, Duration::from_secs(1)).await;
        assert!(!s.idle);
        assert_eq!(s.waited, Duration::from_secs(1));
        // An unreadable clock does not hold the bench up.
        let s = settle(|| None, window, Duration::from_secs(1)).await;
        assert_eq!(s.waited, Duration::ZERO);
        let mut log = SettleLog::default();
        log.add(s);
        log.add(Settled { waited: Duration::from_millis(1500), idle: true });
        let line = log.summary("the pair");
        assert!(line.contains("2 runs waited 1.5 s in all, at most 1.5 s"), "{line}");
        assert!(line.contains("1 started still busy"), "{line}");
    }

    #[test]
    fn wake_up_round_trips_are_timed_on_one_cpu_and_across_two() {
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty());
        let h = wake_up_round_trips(200, (cpus[0], cpus[0])).unwrap();
        assert_eq!(h.len(), 200);
        if let Some(&second) = cpus.get(1) {
            assert_eq!(wake_up_round_trips(200, (cpus[0], second)).unwrap().len(), 200);
        }
        let line = wake_up_line(100).unwrap();
        assert!(line.contains("on one CPU"), "{line}");
        assert_eq!(line.contains("across two CPUs"), cpus.len() > 1, "{line}");
    }

    #[test]
    fn pinning_to_a_cpu_that_does_not_exist_is_an_error_naming_it() {
        let e = std::thread::spawn(|| pin_to(rustix::thread::CpuSet::MAX_CPU - 1)).join().unwrap();
        assert!(
            e.unwrap_err()
                .to_string()
                .contains(&format!("CPU {}", rustix::thread::CpuSet::MAX_CPU - 1))
        );
    }

    #[test]
    fn the_idle_line_names_driver_states_polling_window_and_latency_limit() {
        let sys = tempfile::tempdir().unwrap();
        let put = |p: &str, v: &str| {
            let path = sys.path().join(p);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, v).unwrap();
        };
        put("devices/system/cpu/cpuidle/current_driver", "haltpoll\n");
        put("devices/system/cpu/cpuidle/current_governor_ro", "haltpoll\n");
        put("devices/system/cpu/cpu0/cpuidle/state0/name", "POLL\n");
        put("devices/system/cpu/cpu0/cpuidle/state0/latency", "0\n");
        put("devices/system/cpu/cpu0/cpuidle/state1/name", "haltpoll idle\n");
        put("devices/system/cpu/cpu0/cpuidle/state1/latency", "1\n");
        put("module/haltpoll/parameters/guest_halt_poll_ns", "0\n");
        std::fs::create_dir_all(sys.path().join("dev")).unwrap();
        std::fs::write(sys.path().join("dev/cpu_dma_latency"), 20_i32.to_ne_bytes()).unwrap();
        let line = idle_line_at(sys.path(), &sys.path().join("dev/cpu_dma_latency"));
        assert_eq!(
            line,
            "  idle CPUs: cpuidle driver haltpoll, governor haltpoll, states POLL (0 us exit) \
             haltpoll idle (1 us exit); guest_halt_poll_ns 0; PM QoS CPU latency limit 20 us"
        );
        let empty = tempfile::tempdir().unwrap();
        let line = idle_line_at(empty.path(), &empty.path().join("none"));
        assert_eq!(line, "  idle CPUs: no cpuidle driver; PM QoS CPU latency limit: unreadable");
    }
}
