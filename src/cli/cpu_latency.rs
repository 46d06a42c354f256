//! A CPU wake-up latency request through Linux PM QoS (`/dev/cpu_dma_latency`).
//!
//! On a virtual machine whose idle vCPUs halt (cpuidle governor `haltpoll` with
//! `guest_halt_poll_ns` = 0, or any governor whose deep states exit slowly), every wake-up of a
//! thread on another vCPU pays the halt's exit: on the machine the benchmarks ran on about 30 µs
//! per hop, several hops per SYNC put. While a process holds this device open with a value
//! written to it, the kernel keeps every CPU out of idle states whose exit latency exceeds that
//! many microseconds (0: idle CPUs poll). The request ends when the file is closed, here when
//! the [`CpuLatencyHold`] is dropped or the process exits. It is machine-wide and costs CPU on
//! idle CPUs, so it is off unless asked for (`node.cpu-dma-latency-us`, or the benches'
//! `--cpu-dma-latency-us`); it is what tuned's `latency-performance` profile does.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use anyhow::Context;

/// The kernel's PM QoS device for the CPU latency request.
pub(crate) const DEVICE: &str = "/dev/cpu_dma_latency";

/// The largest value the kernel accepts (its "no constraint" default).
pub(crate) const MAX_US: i32 = crate::config::MAX_CPU_DMA_LATENCY_US;

/// An open CPU latency request; dropping it ends the request.
#[derive(Debug)]
pub(crate) struct CpuLatencyHold {
    _file: File,
    us: i32,
}

impl CpuLatencyHold {
    /// Asks the kernel to keep every CPU's wake-up latency at or below `us` microseconds.
    pub(crate) fn request(us: i32) -> anyhow::Result<Self> {
        Self::request_at(Path::new(DEVICE), us)
    }

    fn request_at(path: &Path, us: i32) -> anyhow::Result<Self> {
        anyhow::ensure!(
            (0..=MAX_US).contains(&us),
            "a CPU latency request of {us} µs is out of range (0 to {MAX_US})"
        );
        let mut file = File::options()
            .write(true)
            .open(path)
            .with_context(|| format!("opening {} for writing", path.display()))?;
        // The device takes the value as a native-endian 32-bit integer (or a hex string).
        file.write_all(&us.to_ne_bytes())
            .with_context(|| format!("writing a {us} µs request to {}", path.display()))?;
        Ok(Self { _file: file, us })
    }

    /// The requested latency in microseconds.
    pub(crate) fn us(&self) -> i32 {
        self.us
    }
}

/// Holds a request of `us` µs when asked for (`us` >= 0), logging what happened; a machine that
/// refuses it (no device, not root) gets a warning naming the reason and runs on without it.
pub(crate) fn hold_if_asked(us: i32) -> Option<CpuLatencyHold> {
    if us < 0 {
        return None;
    }
    match CpuLatencyHold::request(us) {
        Ok(hold) => {
            tracing::info!(
                latency_us = us,
                device = DEVICE,
                "holding a CPU wake-up latency request (node.cpu-dma-latency-us): idle CPUs \
                 stay in states that wake within it, machine-wide, while this process runs"
            );
            Some(hold)
        }
        Err(e) => {
            tracing::warn!(
                latency_us = us,
                error = format!("{e:#}"),
                "node.cpu-dma-latency-us: the CPU latency request was refused; running without it"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_writes_the_value_as_a_native_endian_i32_and_keeps_the_file_open() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cpu_dma_latency");
        std::fs::write(&path, b"").unwrap();
        let hold = CpuLatencyHold::request_at(&path, 20).unwrap();
        assert_eq!(hold.us(), 20);
        assert_eq!(std::fs::read(&path).unwrap(), 20_i32.to_ne_bytes());
    }

    #[test]
    fn a_missing_device_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("no-such-device");
        let err = CpuLatencyHold::request_at(&path, 0).unwrap_err();
        assert!(format!("{err:#}").contains("no-such-device"), "{err:#}");
    }

    #[test]
    fn an_out_of_range_request_is_refused_before_the_device_is_opened() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cpu_dma_latency");
        std::fs::write(&path, b"").unwrap();
        for us in [-1, MAX_US + 1] {
            let err = CpuLatencyHold::request_at(&path, us).unwrap_err();
            assert!(format!("{err}").contains("out of range"), "{err}");
        }
        assert!(std::fs::read(&path).unwrap().is_empty());
    }

    #[test]
    fn no_request_is_made_when_not_asked_for() {
        assert!(hold_if_asked(-1).is_none());
    }
}
