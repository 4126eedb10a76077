//! Building a [`Topology`] from the live machine: CUDA for identity and P2P, NVML for links and
//! P2P status, sysfs for the PCI hierarchy, NUMA node and CPU affinity. NVML is optional: where
//! it cannot be loaded the topology has no NVLinks or NVML status, and a warning says why.

use std::ffi::OsStr;
use std::path::Path;

use nvml_wrapper::enum_wrappers::device::{P2pCapabilitiesIndex, P2pStatus};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use p2p_mem::Device;
use p2p_sys::nvml::NvLinkRemoteType;
use p2p_sys::Library;

use super::{
    normalize_bus_id, nvlink_generation, Gpu, NvLink, NvmlP2p, PairP2p, PcieLink, Remote, Topology,
    FORMAT,
};

/// The most NVLinks a GPU has (`NVML_NVLINK_MAX_LINKS`).
const MAX_LINKS: u32 = 18;

/// PCI device ids of NVSwitch chips (V100, A100 and H100 generations).
const NVSWITCH_DEVICE_IDS: [u32; 5] = [0x1ac0, 0x1ac1, 0x1ac2, 0x1af1, 0x22a3];

/// Why NVML could not be opened (the topology then goes without NVLinks and NVML status).
#[derive(Debug, thiserror::Error)]
pub(crate) enum NvmlUnavailable {
    /// No NVML library was found or loaded (the probe's error says where it looked).
    #[error(transparent)]
    Library(p2p_sys::Error),
    /// The library loaded, but `nvmlInit` failed.
    #[error("nvmlInit failed: {0}")]
    Init(#[source] NvmlError),
}

/// Loads NVML through the same probe as the CUDA libraries.
pub(crate) fn open_nvml() -> Result<Nvml, NvmlUnavailable> {
    let name = p2p_sys::probe::require(Library::Nvml).map_err(NvmlUnavailable::Library)?;
    Nvml::builder()
        .lib_path(OsStr::new(name))
        .init()
        .map_err(NvmlUnavailable::Init)
}

/// Reads the machine's topology. CUDA must work; NVML and sysfs fill in what they can.
pub fn discover() -> Result<Topology, p2p_mem::Error> {
    let devices = Device::all()?;
    let nvml = open_nvml()
        .inspect_err(|e| tracing::warn!("NVML unavailable, so no NVLink or NVML P2P data: {e}"))
        .ok();
    let all_gpu_bus_ids = nvml.as_ref().map(all_bus_ids).unwrap_or_default();
    let bus_ids: Vec<String> = devices
        .iter()
        .map(|d| normalize_bus_id(d.pci_bus_id()))
        .collect();

    let mut gpus = Vec::with_capacity(devices.len());
    for (index, d) in devices.iter().enumerate() {
        let (major, minor) = d.compute_capability();
        let bus = &bus_ids[index];
        let (numa_node, cpu_affinity, pci_path) = sysfs(bus);
        let nd = nvml
            .as_ref()
            .and_then(|n| n.device_by_pci_bus_id(bus.as_str()).ok());
        let pcie = nd.as_ref().and_then(|nd| {
            Some(PcieLink {
                gen_current: nd.current_pcie_link_gen().ok()?,
                gen_max: nd.max_pcie_link_gen().ok()?,
                width_current: nd.current_pcie_link_width().ok()?,
                width_max: nd.max_pcie_link_width().ok()?,
            })
        });
        let generation = nvlink_generation([major, minor]);
        let nvlinks = nd
            .as_ref()
            .map(|nd| nvlinks(nd, generation, &bus_ids, &all_gpu_bus_ids))
            .unwrap_or_default();
        gpus.push(Gpu {
            index,
            name: d.name().to_string(),
            uuid: d.uuid_string(),
            pci_bus_id: bus.clone(),
            compute_capability: [major, minor],
            sm_count: d.sm_count(),
            memory_mib: d.total_memory() >> 20,
            numa_node,
            cpu_affinity,
            pcie,
            pci_path,
            nvlinks,
            cumem_posix_fd: Some(cumem_posix_fd(d)),
        });
    }

    let mut pairs = Vec::new();
    for (i, a) in devices.iter().enumerate() {
        for (j, b) in devices.iter().enumerate() {
            if i == j {
                continue;
            }
            let attr = a.p2p_attributes(b)?;
            let nvml_status = nvml.as_ref().and_then(|n| {
                let (x, y) = (
                    n.device_by_pci_bus_id(bus_ids[i].as_str()).ok()?,
                    n.device_by_pci_bus_id(bus_ids[j].as_str()).ok()?,
                );
                let s = |idx| status_name(x.p2p_status(&y, idx));
                Some(NvmlP2p {
                    read: s(P2pCapabilitiesIndex::Read),
                    write: s(P2pCapabilitiesIndex::Write),
                    nvlink: s(P2pCapabilitiesIndex::NvLink),
                    atomics: s(P2pCapabilitiesIndex::Atomics),
                })
            });
            pairs.push(PairP2p {
                from: i,
                to: j,
                can_access_peer: a.can_access_peer(b)?,
                performance_rank: attr.performance_rank,
                native_atomics: attr.native_atomics,
                nvml: nvml_status,
            });
        }
    }
    Ok(Topology {
        format: FORMAT,
        source: format!(
            "recorded by p2p-bench {} on {} at {}",
            env!("CARGO_PKG_VERSION"),
            crate::hostname(),
            humantime::format_rfc3339_seconds(std::time::SystemTime::now())
        ),
        gpus,
        pairs,
        all_gpu_bus_ids,
        cuda_visible_devices: std::env::var("CUDA_VISIBLE_DEVICES").ok(),
    })
}

fn cumem_posix_fd(d: &Device) -> bool {
    use p2p_sys::cuda::CUdevice_attribute::*;
    [
        CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED,
        CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
    ]
    .into_iter()
    .all(|a| d.attribute(a).unwrap_or(0) != 0)
}

fn all_bus_ids(nvml: &Nvml) -> Vec<String> {
    let n = nvml.device_count().unwrap_or(0);
    (0..n)
        .filter_map(|i| nvml.device_by_index(i).ok()?.pci_info().ok())
        .map(|p| normalize_bus_id(&p.bus_id))
        .collect()
}

fn nvlinks(
    nd: &nvml_wrapper::Device<'_>,
    generation: u32,
    visible: &[String],
    all: &[String],
) -> Vec<NvLink> {
    let mut out = Vec::new();
    for link in 0..MAX_LINKS {
        let l = nd.link_wrapper_for(link);
        match l.is_active() {
            Ok(true) => {}
            Ok(false) => continue,
            // Past the last link, or no NVLink on this GPU at all.
            Err(NvmlError::InvalidArg) | Err(NvmlError::NotSupported) => break,
            Err(e) => {
                tracing::warn!(link, "reading NVLink state: {e}");
                continue;
            }
        }
        let Ok(remote) = l.remote_pci_info() else {
            continue;
        };
        let remote_bus_id = normalize_bus_id(&remote.bus_id);
        // nvml-wrapper 0.13's remote_device_type always answers Unknown: p2p-sys asks NVML.
        let remote_type = p2p_sys::nvml::nvlink_remote_type(nd, link)
            .inspect_err(|e| tracing::debug!(link, "reading the NVLink far end's type: {e}"))
            .ok();
        let remote_kind = if remote_type == Some(NvLinkRemoteType::Switch) {
            Remote::NvSwitch
        } else if remote_bus_id.starts_with("ffff") {
            Remote::Unresolved
        } else if let Some(i) = visible.iter().position(|b| *b == remote_bus_id) {
            Remote::Gpu(i)
        } else if all.contains(&remote_bus_id) {
            Remote::HiddenGpu
        } else if NVSWITCH_DEVICE_IDS.contains(&(remote.pci_device_id >> 16))
            || remote.pci_device_id & 0xffff == 0x10de
        {
            Remote::NvSwitch
        } else {
            Remote::Other
        };
        out.push(NvLink {
            link,
            generation,
            remote_bus_id,
            remote: remote_kind,
            remote_device_type: remote_type.map(|t| {
                match t {
                    NvLinkRemoteType::Gpu => "gpu",
                    NvLinkRemoteType::IbmNpu => "ibmnpu",
                    NvLinkRemoteType::Switch => "switch",
                    _ => "unknown",
                }
                .to_string()
            }),
        });
    }
    out
}

fn status_name(s: Result<P2pStatus, NvmlError>) -> String {
    match s {
        Ok(P2pStatus::Ok) => "OK",
        Ok(P2pStatus::ChipsetNotSupported) => "CNS",
        Ok(P2pStatus::GpuNotSupported) => "GNS",
        Ok(P2pStatus::IohTopologyNotSupported) => "TNS",
        Ok(P2pStatus::DisabledByRegkey) => "DR",
        Ok(P2pStatus::NotSupported) => "NS",
        Ok(P2pStatus::Unknown) | Err(_) => "-",
    }
    .to_string()
}

/// NUMA node, CPU list and PCI hierarchy of a PCI device from sysfs.
pub(crate) fn sysfs(bus_id: &str) -> (Option<i32>, Option<String>, Vec<String>) {
    let dev = Path::new("/sys/bus/pci/devices").join(bus_id);
    let read = |f: &str| {
        std::fs::read_to_string(dev.join(f))
            .ok()
            .map(|s| s.trim().to_string())
    };
    // Platforms without NUMA information report -1; with one node, that node is 0 (as
    // nvidia-smi shows it).
    let numa = read("numa_node")
        .and_then(|s| s.parse::<i32>().ok())
        .filter(|n| *n >= 0)
        .or((count_numa_nodes() == 1).then_some(0));
    let cpus = read("local_cpulist").filter(|s| !s.is_empty());
    let path = std::fs::canonicalize(&dev)
        .map(|p| {
            let parts: Vec<String> = p
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            let start = parts
                .iter()
                .position(|c| c.starts_with("pci"))
                .unwrap_or(parts.len());
            parts[start..].to_vec()
        })
        .unwrap_or_default();
    (numa, cpus, path)
}

fn count_numa_nodes() -> usize {
    let is_node = |name: &str| {
        name.strip_prefix("node")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    std::fs::read_dir("/sys/devices/system/node")
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| is_node(&e.file_name().to_string_lossy()))
                .count()
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvml_unavailable_says_which_step_failed() {
        let e = NvmlUnavailable::Init(NvmlError::DriverNotLoaded);
        assert!(e.to_string().starts_with("nvmlInit failed: "), "{e}");
        let missing = p2p_sys::Error::LibraryNotFound {
            library: "libnvidia-ml",
            searched: vec!["libnvidia-ml.so.1".into()],
        };
        let e = NvmlUnavailable::Library(missing.clone());
        assert!(matches!(e, NvmlUnavailable::Library(_)), "{e:?}");
        // The probe's own words, unchanged.
        assert_eq!(e.to_string(), missing.to_string());
    }
}
