//! The p2p benchmark harness and the `p2p-bench` command-line tool.
//!
//! `p2p-bench list` reports the GPUs and CUDA libraries it finds; [`p2p`] is the bandwidth and
//! latency benchmark (`cargo xtask bench p2p`); [`coll`] the collective benchmark beside NCCL
//! (`cargo xtask bench coll`), which drives NCCL through [`nccl`]; [`host`] splits the host's
//! cost of issuing one call (`p2p-bench host`).

#![deny(unsafe_code)]

pub mod coll;
#[allow(unsafe_code)] // kernel launches and getrlimit, each with its SAFETY line
pub mod doctor;
pub mod exit;
pub mod faults;
pub mod floor;
#[allow(unsafe_code)] // the gate's launch and its pinned flags
pub mod gate;
pub mod held;
pub mod host;
pub mod hosts;
pub mod kernels;
#[allow(unsafe_code)] // kernel launches
pub mod latency;
#[allow(unsafe_code)]
pub mod nccl;
pub mod out;
pub mod p2p;
pub mod plan;
pub mod progress;
pub mod render;
pub mod sendrecv;
pub mod settings;
/// `p2p-bench kernels --ship`: the crates' shipped kernel archives.
pub mod ship;
pub mod timing;
pub mod watchdog;

use p2p_mem::Device;
use p2p_sys::Library;

/// One GPU as `p2p-bench list` reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuInfo {
    /// CUDA ordinal.
    pub ordinal: i32,
    /// Marketing name.
    pub name: String,
    /// `major.minor`.
    pub compute_capability: String,
    /// PCI bus id.
    pub pci_bus_id: String,
    /// `GPU-...` UUID.
    pub uuid: String,
    /// Streaming multiprocessors.
    pub sm_count: i32,
    /// Total memory in MiB.
    pub memory_mib: usize,
}

impl GpuInfo {
    /// Reads what `list` shows from an open device.
    pub fn of(d: &Device) -> GpuInfo {
        let (major, minor) = d.compute_capability();
        GpuInfo {
            ordinal: d.ordinal(),
            name: d.name().to_string(),
            compute_capability: format!("{major}.{minor}"),
            pci_bus_id: d.pci_bus_id().to_string(),
            uuid: d.uuid_string(),
            sm_count: d.sm_count(),
            memory_mib: d.total_memory() >> 20,
        }
    }

    /// As a JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "ordinal": self.ordinal, "name": self.name, "compute_capability": self.compute_capability,
            "pci_bus_id": self.pci_bus_id, "uuid": self.uuid, "sm_count": self.sm_count,
            "memory_mib": self.memory_mib,
        })
    }
}

/// The current UTC time as `YYYY-MM-DDTHH:MM:SSZ` (RFC 3339), as the results record it.
pub fn utc_now() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

/// The distinct kernel targets (`sm_90`, ...) of `devices`, sorted.
pub fn gpu_archs(devices: &[Device]) -> Vec<String> {
    let mut archs: Vec<String> = devices.iter().map(p2p_mem::kernel::arch_for).collect();
    archs.sort();
    archs.dedup();
    archs
}

/// The GPU of each rank of a benchmark that drives every rank from this process: the first
/// `gpus` GPUs (0: all), one rank each; or, with `share_gpu` > 0, that many ranks on GPU 0 (a
/// machine with one GPU). At least two ranks, else an error that names `tool` and the remedy.
pub fn rank_devices(tool: &str, gpus: usize, share_gpu: usize) -> Result<Vec<Device>, String> {
    let devices = if share_gpu > 0 {
        vec![Device::new(0).map_err(|e| e.to_string())?; share_gpu]
    } else {
        let mut all = Device::all().map_err(|e| e.to_string())?;
        if gpus > 0 {
            all.truncate(gpus);
        }
        all
    };
    if devices.len() < 2 {
        return Err(format!(
            "{tool} needs at least 2 ranks, found {} GPU(s): on one GPU, use --share-gpu 2",
            devices.len()
        ));
    }
    Ok(devices)
}

/// Which CUDA libraries load here: `(library, Ok(file name) or Err(error text))`.
pub fn libraries() -> Vec<(Library, Result<String, String>)> {
    Library::ALL
        .iter()
        .map(|&l| {
            (
                l,
                p2p_sys::probe::require(l)
                    .map(str::to_string)
                    .map_err(|e| e.to_string()),
            )
        })
        .collect()
}

/// Renders GPUs as an aligned text table.
pub fn gpu_table(gpus: &[GpuInfo]) -> String {
    let head = ["GPU", "name", "cc", "PCI bus", "SMs", "MiB", "UUID"].map(String::from);
    let rows = std::iter::once(head.to_vec()).chain(gpus.iter().map(|g| {
        vec![
            g.ordinal.to_string(),
            g.name.clone(),
            g.compute_capability.clone(),
            g.pci_bus_id.clone(),
            g.sm_count.to_string(),
            g.memory_mib.to_string(),
            g.uuid.clone(),
        ]
    }));
    p2p_transport::text_columns(rows.collect(), &[4, 5])
}

/// A GPU's name as the benchmarks' result files carry it: "NVIDIA H200" -> "h200".
pub fn gpu_slug(name: &str) -> String {
    name.to_lowercase().replace("nvidia ", "").replace(' ', "-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_results_date_is_rfc3339_utc_to_the_second() {
        let t = utc_now();
        let shape: String = t
            .chars()
            .map(|c| if c.is_ascii_digit() { '9' } else { c })
            .collect();
        assert_eq!(shape, "9999-99-99T99:99:99Z", "{t}");
    }

    #[test]
    fn the_table_has_a_row_per_gpu() {
        let g = GpuInfo {
            ordinal: 1,
            name: "NVIDIA H200".into(),
            compute_capability: "9.0".into(),
            pci_bus_id: "0000:00:07.0".into(),
            uuid: "GPU-1".into(),
            sm_count: 132,
            memory_mib: 143771,
        };
        let t = gpu_table(&[g.clone(), g.clone()]);
        assert_eq!(t.lines().count(), 3);
        assert!(t
            .lines()
            .nth(1)
            .is_some_and(|l| l.starts_with("1    NVIDIA H200") && l.contains("143771")));
        assert_eq!(g.to_json()["sm_count"], 132);
    }

    #[test]
    fn every_library_gets_an_answer() {
        let libs = libraries();
        assert_eq!(libs.len(), Library::ALL.len());
        for (lib, r) in libs {
            if let Err(e) = r {
                assert!(e.contains(lib.name()), "{e}");
            }
        }
    }
}

/// The README's examples, compiled as doctests so they cannot drift from the API (this crate
/// depends on every layer the README shows).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
struct ReadmeExamples;
