//! The P2P doctor: for every GPU pair, whether P2P works, why not, and what to do.
//!
//! Each check is a pure function from evidence to a [`Finding`] (tested on the host against
//! made-up evidence); [`run`] gathers the evidence from the live machine (CUDA, NVML, sysfs,
//! `/proc`) and runs them all, ending with a functional test that writes through the peer mapping
//! with SM stores on one GPU and checks the data on the other, in both directions, since drivers
//! can report P2P as supported and still deliver wrong data.

use serde::{Deserialize, Serialize};

use crate::kernels::{self, abi};
use p2p_mem::kernel::{LaunchConfig, Module};
use p2p_mem::{Device, DeviceBuffer, DeviceMemory, DeviceMemoryMut};
use p2p_transport::topo::{self, Connection, Topology};

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    /// Nothing to do.
    Ok,
    /// Works, but slower or more fragile than it could be; or not checkable here.
    Warn,
    /// P2P does not work (or a prerequisite is missing).
    Fail,
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
        })
    }
}

/// One check's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// The check, e.g. `pcie-acs`.
    pub check: String,
    /// What it applies to: `system`, `GPU0`, or `GPU0 -> GPU1`.
    pub scope: String,
    /// The outcome.
    pub status: Status,
    /// What was seen.
    pub evidence: String,
    /// What to do (empty when nothing needs doing).
    pub fix: String,
}

fn finding(
    check: &str,
    scope: &str,
    status: Status,
    evidence: impl Into<String>,
    fix: impl Into<String>,
) -> Finding {
    Finding {
        check: check.into(),
        scope: scope.into(),
        status,
        evidence: evidence.into(),
        fix: fix.into(),
    }
}

/// Everything the doctor found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Report {
    /// When and where it ran.
    pub source: String,
    /// Every finding, system checks first, then per GPU, then per pair.
    pub findings: Vec<Finding>,
}

impl Report {
    /// The worst status of any finding.
    pub fn worst(&self) -> Status {
        self.findings
            .iter()
            .map(|f| f.status)
            .max()
            .unwrap_or(Status::Ok)
    }

    /// A readable report: one line per finding, its fix beneath, and a summary.
    pub fn render(&self) -> String {
        let mut out = format!("p2p doctor ({})\n\n", self.source);
        let mut rows = Vec::new();
        for f in &self.findings {
            let status = format!("[{}]", f.status);
            rows.push(vec![
                status,
                f.scope.clone(),
                f.check.clone(),
                f.evidence.clone(),
            ]);
            if !f.fix.is_empty() {
                let fix = format!("fix: {}", f.fix);
                rows.push(vec![String::new(), String::new(), String::new(), fix]);
            }
        }
        out += &p2p_transport::text_columns(rows, &[]);
        let count = |s| self.findings.iter().filter(|f| f.status == s).count();
        out += &format!(
            "\n{} ok, {} warn, {} fail\n",
            count(Status::Ok),
            count(Status::Warn),
            count(Status::Fail)
        );
        out
    }
}

// ---- Pure checks -------------------------------------------------------------------------------

/// Compute capability: P2P needs 6.0 (Pascal) or newer.
pub fn check_compute_capability(gpu: &topo::Gpu) -> Finding {
    let [major, minor] = gpu.compute_capability;
    let sm = format!("{} is sm_{major}{minor}", gpu.name);
    let (status, evidence, fix) = if major < 6 {
        let fix = "use Pascal (sm_60) or newer GPUs for P2P";
        (Status::Fail, format!("{sm}; P2P needs 6.0 or newer"), fix)
    } else {
        (Status::Ok, sm, "")
    };
    let scope = format!("GPU{}", gpu.index);
    finding("compute-capability", &scope, status, evidence, fix)
}

/// Consumer GPUs usually have P2P disabled by the driver.
pub fn check_consumer(gpu: &topo::Gpu) -> Finding {
    let name = &gpu.name;
    let (status, evidence, fix) = if topo::is_consumer_gpu(name) {
        let why =
            format!("{name} is a consumer GPU: NVIDIA's driver usually disables P2P on these");
        let fix = "use data-center or workstation GPUs for P2P, or expect host-staged copies";
        (Status::Warn, why, fix)
    } else {
        (Status::Ok, format!("{name} is not a consumer GPU"), "")
    };
    let scope = format!("GPU{}", gpu.index);
    finding("consumer-gpu", &scope, status, evidence, fix)
}

/// What an NVML P2P status code means.
pub fn nvml_status_meaning(code: &str) -> &'static str {
    match code {
        "OK" => "supported",
        "CNS" => "the chipset does not support P2P",
        "GNS" => "the GPU does not support P2P",
        "TNS" => "the PCIe topology (IOH) does not support P2P between these GPUs",
        "DR" => "P2P is disabled by a driver registry key",
        "NS" => "not supported",
        _ => "unknown",
    }
}

/// `cuDeviceCanAccessPeer` for one ordered pair, explained with NVML's status where known.
pub fn check_can_access(t: &Topology, a: usize, b: usize) -> Finding {
    let scope = format!("GPU{a} -> GPU{b}");
    match t.pair(a, b) {
        None => finding(
            "can-access-peer",
            &scope,
            Status::Warn,
            "no P2P data recorded",
            "run the doctor on the machine itself",
        ),
        Some(p) if p.can_access_peer => finding(
            "can-access-peer",
            &scope,
            Status::Ok,
            format!(
                "cuDeviceCanAccessPeer = 1, performance rank {}, native atomics {}",
                p.performance_rank,
                if p.native_atomics { "yes" } else { "no" }
            ),
            "",
        ),
        Some(p) => {
            let nvml = p
                .nvml
                .as_ref()
                .map(|n| {
                    format!(
                        "; NVML read {} ({}), write {}",
                        n.read,
                        nvml_status_meaning(&n.read),
                        n.write
                    )
                })
                .unwrap_or_default();
            let (_, why) = t.direct_p2p(a, b);
            finding("can-access-peer", &scope, Status::Fail, format!("{why}{nvml}"), "see the checks below for the cause; until fixed, data between these GPUs is host-staged or relayed")
        }
    }
}

/// The path class: across CPU sockets P2P is slow or unsupported.
pub fn check_path(t: &Topology, a: usize, b: usize) -> Finding {
    let scope = format!("GPU{a} -> GPU{b}");
    let p = t.path(a, b);
    let what = match p.connection {
        Connection::NvLink { links, generation } => format!(
            "{links} x NVLink{generation} direct (NV{links}), ~{:.0} GB/s",
            p.bandwidth_gbps
        ),
        Connection::NvSwitch { links, generation } => format!(
            "NVSwitch (NV{links}), {links} x NVLink{generation}, ~{:.0} GB/s to one peer; the links are shared by {} peer(s): ~{:.0} GB/s each when all are sent to at once",
            p.bandwidth_gbps, p.shared_by, p.concurrent_gbps
        ),
        Connection::Pcie(level) => format!(
            "PCIe only, {level}, {} hops, ~{:.0} GB/s",
            p.hops, p.bandwidth_gbps
        ),
        Connection::Same => "the same GPU".into(),
    };
    match p.connection {
        Connection::Pcie(topo::PathLevel::Sys) => finding(
            "path",
            &scope,
            Status::Warn,
            format!("{what}: the GPUs hang off different CPU sockets"),
            "place communicating GPUs under the same CPU socket (see `p2p-bench topo`)",
        ),
        _ => finding("path", &scope, Status::Ok, what, ""),
    }
}

/// Reads the ACS control register from a PCI device's configuration space (`None` when the
/// device has no ACS capability or the extended space could not be read, e.g. without root).
pub fn parse_acs_control(config: &[u8]) -> Option<u16> {
    const ACS_ID: u16 = 0x000d;
    let read32 = |off: usize| {
        config
            .get(off..off + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let mut off = 0x100usize;
    for _ in 0..64 {
        let header = read32(off)?;
        if header == 0 || header == 0xffff_ffff {
            return None;
        }
        if (header & 0xffff) as u16 == ACS_ID {
            let ctrl = config.get(off + 6..off + 8)?;
            return Some(u16::from_le_bytes([ctrl[0], ctrl[1]]));
        }
        let next = (header >> 20) as usize & 0xffc;
        if next < 0x100 {
            return None;
        }
        off = next;
    }
    None
}

/// PCIe ACS on the bridges between two GPUs: request or completion redirect sends every P2P
/// transaction up to the root complex, which is slow or fails.
///
/// `bridges` holds each bridge's address and its ACS control register (`None`: unreadable or no
/// ACS capability).
pub fn check_acs(
    scope: &str,
    connection: Connection,
    bridges: &[(String, Option<u16>)],
) -> Finding {
    if matches!(
        connection,
        Connection::NvLink { .. } | Connection::NvSwitch { .. }
    ) {
        return finding(
            "pcie-acs",
            scope,
            Status::Ok,
            "NVLink path: PCIe ACS does not affect it",
            "",
        );
    }
    if bridges.is_empty() {
        return finding(
            "pcie-acs",
            scope,
            Status::Ok,
            "no PCIe bridges between the GPUs",
            "",
        );
    }
    const REDIRECT: u16 = (1 << 2) | (1 << 3) | (1 << 4); // P2P request redirect, completion redirect, upstream forwarding
    let redirecting: Vec<String> = bridges
        .iter()
        .filter(|(_, c)| c.is_some_and(|c| c & REDIRECT != 0))
        .map(|(b, c)| format!("{b} (ACSCtl {:#06x})", c.unwrap_or(0)))
        .collect();
    let unknown: Vec<&str> = bridges
        .iter()
        .filter(|(_, c)| c.is_none())
        .map(|(b, _)| b.as_str())
        .collect();
    if !redirecting.is_empty() {
        finding("pcie-acs", scope, Status::Fail, format!("ACS redirects P2P on {}", redirecting.join(", ")), "disable ACS on these bridges (setpci -s BDF ECAP_ACS+6.w=0000, or in the BIOS), or expect P2P traffic to go through the CPU")
    } else if !unknown.is_empty() {
        finding("pcie-acs", scope, Status::Warn, format!("could not read ACS on {} (no capability, or config space not readable without root)", unknown.join(", ")), "run the doctor as root to read PCIe config space")
    } else {
        finding(
            "pcie-acs",
            scope,
            Status::Ok,
            format!("ACS redirect is off on {} bridge(s)", bridges.len()),
            "",
        )
    }
}

/// The IOMMU: when translating (not passthrough), PCIe P2P traffic is remapped or blocked.
pub fn check_iommu(iommu_units: usize, cmdline: &str, pcie_pairs: usize) -> Finding {
    let passthrough = cmdline.split_whitespace().any(|w| {
        w == "iommu=pt"
            || w == "iommu.passthrough=1"
            || w == "intel_iommu=off"
            || w == "amd_iommu=off"
            || w == "iommu=off"
    });
    if iommu_units == 0 {
        finding(
            "iommu",
            "system",
            Status::Ok,
            "no IOMMU is active (/sys/class/iommu is empty)",
            "",
        )
    } else if passthrough {
        finding(
            "iommu",
            "system",
            Status::Ok,
            format!("{iommu_units} IOMMU unit(s), passthrough or off on the kernel command line"),
            "",
        )
    } else if pcie_pairs == 0 {
        finding(
            "iommu",
            "system",
            Status::Ok,
            format!(
                "{iommu_units} IOMMU unit(s) translating, but every GPU pair talks over NVLink"
            ),
            "",
        )
    } else {
        finding("iommu", "system", Status::Warn, format!("{iommu_units} IOMMU unit(s) translating DMA and no iommu=pt on the kernel command line"), "boot with iommu=pt (passthrough) so PCIe P2P is not remapped or blocked")
    }
}

/// Containers and PID namespaces: legacy CUDA IPC needs both processes to see each other.
pub fn check_container(proc_status: &str, cgroup: &str, marker_file: bool) -> Finding {
    let nested_pid = proc_status
        .lines()
        .find(|l| l.starts_with("NSpid:"))
        .map(|l| l.split_whitespace().count() > 2)
        .unwrap_or(false);
    let runtime = ["docker", "kubepods", "containerd", "libpod", "lxc"]
        .into_iter()
        .find(|k| cgroup.contains(k));
    if nested_pid || marker_file || runtime.is_some() {
        let mut why = Vec::new();
        if nested_pid {
            why.push("this process is in a nested PID namespace".to_string());
        }
        if let Some(r) = runtime {
            why.push(format!("its cgroup names {r}"));
        }
        if marker_file {
            why.push("/.dockerenv or /run/.containerenv exists".to_string());
        }
        finding("container", "system", Status::Warn, format!("running in a container: {}", why.join(", ")), "for CUDA IPC between processes, run them in one container or share namespaces (docker --ipc=host --pid=host)")
    } else {
        finding(
            "container",
            "system",
            Status::Ok,
            "not in a container or nested PID namespace",
            "",
        )
    }
}

/// The open-file limit. cuMem sharing turns each allocation into an fd per peer while handles
/// are exchanged (they are closed once imported), so a few thousand is plenty; 1024, a common
/// default, runs out with many buffers and peers.
pub fn check_fd_limit(soft: u64, hard: u64) -> Finding {
    let evidence = format!("open-file limit {soft} (hard {hard})");
    let fix = if soft < hard {
        format!("ulimit -n {}", hard.min(1_048_576))
    } else {
        "raise the hard limit (limits.conf, systemd LimitNOFILE, or docker --ulimit nofile=65536)"
            .to_string()
    };
    if soft < 256 {
        finding(
            "fd-limit",
            "system",
            Status::Fail,
            format!("{evidence}: too low to exchange cuMem handles"),
            fix,
        )
    } else if soft < 4096 {
        finding(
            "fd-limit",
            "system",
            Status::Warn,
            format!("{evidence}: low for exchanging many cuMem handles"),
            fix,
        )
    } else {
        finding("fd-limit", "system", Status::Ok, evidence, "")
    }
}

/// The driver's CUDA version against the oldest p2p supports ([`p2p_sys::MIN_DRIVER_VERSION`]).
pub fn check_driver(version: i32) -> Finding {
    let evidence = format!(
        "libcuda loaded, CUDA {} (p2p needs {} or newer)",
        p2p_sys::version_text(version),
        p2p_sys::version_text(p2p_sys::MIN_DRIVER_VERSION)
    );
    let (status, fix) = if version >= p2p_sys::MIN_DRIVER_VERSION {
        (Status::Ok, "")
    } else {
        let fix = "update the NVIDIA driver to 550 or newer (CUDA 12.4+)";
        (Status::Fail, fix)
    };
    finding("driver", "system", status, evidence, fix)
}

/// Fabric handles need an IMEX channel; within one host POSIX fds do the same job.
pub fn check_imex(fabric_supported: bool, channels: Option<usize>) -> Finding {
    match (fabric_supported, channels) {
        (false, _) => finding("imex-channel", "system", Status::Ok, "the GPUs do not support fabric handles; not needed within one host", ""),
        (true, Some(n)) if n > 0 => finding("imex-channel", "system", Status::Ok, format!("{n} IMEX channel(s): fabric handles can work"), ""),
        (true, _) => finding("imex-channel", "system", Status::Warn, "the GPUs support fabric handles but no IMEX channel exists (/dev/nvidia-caps-imex-channels): cuMem fabric export will be refused; within one host p2p uses POSIX fds instead", "only needed across hosts (multi-node NVLink): start nvidia-imex and create a channel"),
    }
}

/// The collective kernels, per GPU architecture (`archs`: target, whether its cubins ship
/// with p2p, parts in the kernel cache, of `parts`): shipped ones need nothing; the others need
/// NVRTC (to compile them, and to key the cache with its release), and unless the cache holds
/// them a process's first communicator compiles them for seconds.
pub fn check_kernels(
    compiler: Result<String, String>,
    cache: Option<&std::path::Path>,
    archs: &[(String, bool, usize)],
    parts: usize,
) -> Finding {
    let shipped: Vec<&str> = archs
        .iter()
        .filter(|(_, shipped, _)| *shipped)
        .map(|(a, _, _)| a.as_str())
        .collect();
    let others: Vec<(&str, usize)> = archs
        .iter()
        .filter(|(_, shipped, _)| !*shipped)
        .map(|(a, _, n)| (a.as_str(), *n))
        .collect();
    let shipped_text =
        (!shipped.is_empty()).then(|| format!("{}: shipped compiled", shipped.join(", ")));
    if !archs.is_empty() && others.is_empty() {
        let compiler = compiler.unwrap_or_else(|_| "no NVRTC".into());
        let evidence = format!(
            "{}; no compiler needed ({compiler})",
            shipped_text.unwrap_or_default()
        );
        return finding("kernels", "system", Status::Ok, evidence, "");
    }
    let prefix = shipped_text.map(|t| format!("{t}; ")).unwrap_or_default();
    let nvrtc = match compiler {
        Ok(c) => c,
        Err(e) if archs.is_empty() => {
            return finding(
                "kernels",
                "system",
                Status::Warn,
                format!("{e}; no GPU here: p2p ships its kernels compiled for sm_80 and sm_90 (and GPUs of the same major), others need NVRTC"),
                "install NVRTC for GPUs other than sm_80/sm_90 (pip install nvidia-cuda-nvrtc, or the CUDA toolkit's libnvrtc)",
            )
        }
        Err(e) => {
            let names: Vec<&str> = others.iter().map(|(a, _)| *a).collect();
            return finding(
                "kernels",
                "system",
                Status::Fail,
                format!("{prefix}{e}: communicators on {} cannot compile their kernels (not shipped compiled for them)", names.join(", ")),
                "install NVRTC (the CUDA toolkit's libnvrtc.so.13, or pip install nvidia-cuda-nvrtc) and make it findable (LD_LIBRARY_PATH)",
            );
        }
    };
    let Some(dir) = cache else {
        return finding(
            "kernels",
            "system",
            Status::Warn,
            format!("{prefix}{nvrtc}; no kernel cache (neither XDG_CACHE_HOME nor HOME is set): every process compiles the kernels at its first communicator"),
            "set HOME or XDG_CACHE_HOME",
        );
    };
    if archs.is_empty() {
        let evidence = format!("{nvrtc}; no GPU here to compile the kernels for");
        return finding("kernels", "system", Status::Ok, evidence, "");
    }
    let counts = others
        .iter()
        .map(|(arch, n)| format!("{arch}: {n} of {parts} parts cached"))
        .collect::<Vec<_>>()
        .join(", ");
    let evidence = format!("{prefix}{nvrtc}; {counts} in {}", dir.display());
    if others.iter().all(|(_, n)| *n >= parts) {
        finding("kernels", "system", Status::Ok, evidence, "")
    } else {
        finding(
            "kernels",
            "system",
            Status::Warn,
            format!("{evidence}: a process's first communicator compiles the rest (about 10 s on 16 cores, 25 s on 2)"),
            "p2p-bench kernels (once per machine, user and NVRTC release)",
        )
    }
}

/// `CUDA_VISIBLE_DEVICES` hiding GPUs, in particular NVLink peers of visible ones.
pub fn check_visible_devices(t: &Topology) -> Finding {
    let hidden = t.all_gpu_bus_ids.len().saturating_sub(t.gpus.len());
    let env = t.cuda_visible_devices.as_deref().unwrap_or("unset");
    let hidden_peers: Vec<String> = t
        .gpus
        .iter()
        .flat_map(|g| {
            g.nvlinks
                .iter()
                .filter(|l| l.remote == topo::Remote::HiddenGpu)
                .map(move |l| format!("GPU{} -> {}", g.index, l.remote_bus_id))
        })
        .collect();
    if t.all_gpu_bus_ids.is_empty() {
        finding("visible-devices", "system", Status::Warn, format!("NVML unavailable, cannot tell whether GPUs are hidden (CUDA_VISIBLE_DEVICES={env})"), "")
    } else if !hidden_peers.is_empty() {
        finding(
            "visible-devices",
            "system",
            Status::Warn,
            format!(
                "CUDA_VISIBLE_DEVICES={env} hides NVLink peers: {}",
                hidden_peers.join(", ")
            ),
            "make every GPU the job uses visible to every process",
        )
    } else if hidden > 0 {
        finding(
            "visible-devices",
            "system",
            Status::Ok,
            format!(
                "CUDA_VISIBLE_DEVICES={env} hides {hidden} GPU(s), none of them an NVLink peer"
            ),
            "",
        )
    } else {
        finding(
            "visible-devices",
            "system",
            Status::Ok,
            format!(
                "all {} GPU(s) are visible (CUDA_VISIBLE_DEVICES={env})",
                t.gpus.len()
            ),
            "",
        )
    }
}

// ---- Gathering evidence and running ------------------------------------------------------------

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

fn count_dir(path: &str) -> Option<usize> {
    std::fs::read_dir(path).ok().map(|d| d.count())
}

/// The bridges strictly between two GPUs in the PCI hierarchy, with their ACS control.
fn bridges_between(a: &topo::Gpu, b: &topo::Gpu) -> Vec<(String, Option<u16>)> {
    let common = a
        .pci_path
        .iter()
        .zip(&b.pci_path)
        .take_while(|(x, y)| x == y)
        .count();
    let below = |g: &topo::Gpu| {
        g.pci_path
            .iter()
            .skip(common.max(1))
            .take(g.pci_path.len().saturating_sub(common.max(1) + 1))
            .cloned()
            .collect::<Vec<_>>()
    };
    let mut bridges: Vec<String> = a.pci_path.iter().take(common).skip(1).cloned().collect();
    bridges.extend(below(a));
    bridges.extend(below(b));
    bridges
        .into_iter()
        .map(|bdf| {
            let config =
                std::fs::read(format!("/sys/bus/pci/devices/{bdf}/config")).unwrap_or_default();
            let acs = parse_acs_control(&config);
            (bdf, acs)
        })
        .collect()
}

/// Runs every check on the live machine, including the functional test when `functional`.
pub fn run(functional: bool) -> Report {
    let mut findings = Vec::new();
    let source = format!("p2p {} at {}", env!("CARGO_PKG_VERSION"), crate::utc_now());
    match p2p_sys::driver_version() {
        Ok(v) => {
            let f = check_driver(v);
            let too_old = f.status == Status::Fail;
            findings.push(f);
            if too_old {
                return Report { source, findings };
            }
        }
        Err(e) => {
            findings.push(finding(
                "driver",
                "system",
                Status::Fail,
                e.to_string(),
                "install the NVIDIA driver, or make libcuda.so.1 findable (LD_LIBRARY_PATH)",
            ));
            return Report { source, findings };
        }
    }
    let t = match topo::discover() {
        Ok(t) => t,
        Err(e) => {
            findings.push(finding(
                "discovery",
                "system",
                Status::Fail,
                e.to_string(),
                "check nvidia-smi; the driver sees no usable GPU",
            ));
            return Report { source, findings };
        }
    };
    let n = t.gpus.len();
    findings.push(match n {
        0 => finding(
            "gpus",
            "system",
            Status::Fail,
            "no GPU visible to CUDA",
            "check nvidia-smi and CUDA_VISIBLE_DEVICES",
        ),
        1 => finding(
            "gpus",
            "system",
            Status::Ok,
            format!(
                "1 GPU ({}): no pairs to check, P2P is not needed",
                t.gpus[0].name
            ),
            "",
        ),
        _ => finding(
            "gpus",
            "system",
            Status::Ok,
            format!(
                "{n} GPUs: {}",
                t.gpus
                    .iter()
                    .map(|g| g.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            "",
        ),
    });
    findings.push(check_visible_devices(&t));
    let pcie_pairs = t
        .paths()
        .iter()
        .filter(|p| matches!(p.connection, Connection::Pcie(_)))
        .count();
    findings.push(check_iommu(
        count_dir("/sys/class/iommu").unwrap_or(0),
        &read("/proc/cmdline"),
        pcie_pairs,
    ));
    let markers = std::path::Path::new("/.dockerenv").exists()
        || std::path::Path::new("/run/.containerenv").exists();
    findings.push(check_container(
        &read("/proc/self/status"),
        &read("/proc/self/cgroup"),
        markers,
    ));
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes one rlimit struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0 {
        findings.push(check_fd_limit(lim.rlim_cur, lim.rlim_max));
    }
    let devices: Vec<Device> = (0..n as i32).filter_map(|i| Device::new(i).ok()).collect();
    let fabric = devices.iter().any(|d| {
        d.attribute(
            p2p_sys::cuda::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED,
        )
        .unwrap_or(0)
            != 0
    });
    findings.push(check_imex(
        fabric,
        count_dir("/dev/nvidia-caps-imex-channels"),
    ));
    findings.push(kernels_finding(&devices));
    for g in &t.gpus {
        findings.push(check_compute_capability(g));
        findings.push(check_consumer(g));
    }
    let mut modules: Vec<Option<Module>> = Vec::new();
    for a in 0..n {
        for b in 0..n {
            if a == b {
                continue;
            }
            let scope = format!("GPU{a} -> GPU{b}");
            findings.push(check_can_access(&t, a, b));
            findings.push(check_path(&t, a, b));
            findings.push(check_acs(
                &scope,
                t.connection(a, b),
                &bridges_between(&t.gpus[a], &t.gpus[b]),
            ));
            if functional && t.pair(a, b).is_some_and(|p| p.can_access_peer) {
                if modules.is_empty() {
                    modules = devices
                        .iter()
                        .map(|d| {
                            Module::build(d, &kernels::PROBE)
                                .inspect_err(|e| tracing::warn!("{e}"))
                                .ok()
                        })
                        .collect();
                }
                findings.push(functional_test(&devices, &modules, a, b));
            }
        }
    }
    Report { source, findings }
}

/// [`check_kernels`] for this machine's GPUs, NVRTC and kernel cache.
fn kernels_finding(devices: &[Device]) -> Finding {
    use p2p_collective::comm::COLL_PARTS;
    use p2p_mem::kernel::{cache_dir, cached, compiler};
    let counts = crate::gpu_archs(devices)
        .into_iter()
        .map(|arch| {
            let shipped = !p2p_mem::kernel::prefer_compile()
                && p2p_mem::kernel::shipped::available(&COLL_PARTS, &arch);
            let n = if shipped {
                0
            } else {
                cached(&COLL_PARTS, &arch).unwrap_or(0)
            };
            (arch, shipped, n)
        })
        .collect::<Vec<_>>();
    check_kernels(
        compiler().map(|c| c.to_string()).map_err(|e| e.to_string()),
        cache_dir().as_deref(),
        &counts,
        COLL_PARTS.len(),
    )
}

/// Elements moved by the functional test: 4 MiB of 16-byte vectors.
const TEST_VECTORS: usize = (4 << 20) / 16;

/// GPU `a` writes into `b`'s memory through the peer mapping, and reads it back from `b`'s
/// memory, with SM kernels; every element is checked on the host.
fn functional_test(devices: &[Device], modules: &[Option<Module>], a: usize, b: usize) -> Finding {
    let scope = format!("GPU{a} -> GPU{b}");
    let (Some(Some(module)), Some(_)) = (modules.get(a), modules.get(b)) else {
        return finding(
            "functional",
            &scope,
            Status::Warn,
            "the test kernel could not be compiled (see the log; is libnvrtc installed?)",
            "install libnvrtc to run the functional test",
        );
    };
    match write_and_read(&devices[a], &devices[b], module) {
        Ok((0, 0)) => finding("functional", &scope, Status::Ok, format!("GPU{a} wrote {} MiB into GPU{b} through the peer mapping and read it back with SM loads: 0 wrong in either direction", (TEST_VECTORS * 16) >> 20), ""),
        Ok((w, r)) => finding("functional", &scope, Status::Fail, format!("wrong 16-byte elements: {w} of {TEST_VECTORS} written, {r} of {TEST_VECTORS} read"), "the driver reports P2P but delivers wrong data: check ACS and IOMMU above, update the driver, or disable P2P (P2P_DISABLE=1)"),
        Err(e) => finding("functional", &scope, Status::Fail, format!("the test could not run: {e}"), "see the error; P2P is not usable between these GPUs"),
    }
}

/// Returns the number of wrong elements in the write and the read direction.
fn write_and_read(
    da: &Device,
    db: &Device,
    module: &Module,
) -> p2p_transport::Result<(usize, usize)> {
    da.enable_peer_access(db)?;
    let n = TEST_VECTORS;
    let seed = std::process::id().wrapping_mul(0x9e37_79b9)
        ^ (da.ordinal() as u32) << 8
        ^ db.ordinal() as u32;
    let expected = |s: u32| -> Vec<u32> {
        (0..n as u64)
            .flat_map(|i| kernels::probe_pattern(i, s))
            .collect()
    };
    let wrong = |got: &[u32], want: &[u32]| {
        got.chunks(4)
            .zip(want.chunks(4))
            .filter(|(g, w)| g != w)
            .count()
    };
    let grid = (da.sm_count().max(1) as u32) * 2;

    // Write: a kernel on A stores into B's memory.
    let mut on_b = DeviceBuffer::<u32>::new(db, n * 4)?;
    on_b.memset_u8(0)?;
    let args = abi::FillArgs {
        dst: on_b.device_ptr(),
        n: n as u64,
        seed,
    };
    // SAFETY: p2p_fill takes one FillArgs (the layout generated from bench_abi.h); `dst` is n
    // 16-byte elements of B's memory, which A can access (peer access enabled above).
    unsafe { module.launch_sync("p2p_fill", LaunchConfig::new(grid, 256), &args) }?;
    let write_wrong = wrong(&on_b.to_host_vec::<u32>()?, &expected(seed));

    // Read: B's memory gets a fresh pattern, a kernel on A loads it into A's memory.
    let seed2 = seed ^ 0xdead_beef;
    let fresh = expected(seed2);
    on_b.copy_from_host(&fresh)?;
    let mut on_a = DeviceBuffer::<u32>::new(da, n * 4)?;
    on_a.memset_u8(0)?;
    let args = abi::CopyArgs {
        dst: on_a.device_ptr(),
        src: on_b.device_ptr(),
        n: n as u64,
    };
    // SAFETY: p2p_copy takes one CopyArgs (the layout generated from bench_abi.h); both buffers
    // hold n 16-byte elements; A may access B's (peer access enabled above).
    unsafe { module.launch_sync("p2p_copy", LaunchConfig::new(grid, 256), &args) }?;
    let read_wrong = wrong(&on_a.to_host_vec::<u32>()?, &fresh);
    Ok((write_wrong, read_wrong))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_per_gpu_checks_pass_or_say_what_to_do() {
        let gpu = |name: &str, major: i32| -> topo::Gpu {
            serde_json::from_value(serde_json::json!({
                "index": 1, "name": name, "uuid": "GPU-1", "pci_bus_id": "0000:02:00.0",
                "compute_capability": [major, 0], "sm_count": 132, "memory_mib": 81_559,
            }))
            .expect("a GPU")
        };
        let f = |check, status, evidence: &str, fix: &str| {
            finding(check, "GPU1", status, evidence, fix)
        };
        let (h100, kepler) = (gpu("NVIDIA H100", 9), gpu("NVIDIA GeForce GTX 780", 3));
        assert_eq!(
            check_compute_capability(&h100),
            f("compute-capability", Status::Ok, "NVIDIA H100 is sm_90", "")
        );
        assert_eq!(
            check_compute_capability(&kepler),
            f(
                "compute-capability",
                Status::Fail,
                "NVIDIA GeForce GTX 780 is sm_30; P2P needs 6.0 or newer",
                "use Pascal (sm_60) or newer GPUs for P2P"
            )
        );
        assert_eq!(
            check_consumer(&h100),
            f(
                "consumer-gpu",
                Status::Ok,
                "NVIDIA H100 is not a consumer GPU",
                ""
            )
        );
        assert_eq!(
            check_consumer(&kepler),
            f(
                "consumer-gpu",
                Status::Warn,
                "NVIDIA GeForce GTX 780 is a consumer GPU: NVIDIA's driver usually disables P2P on these",
                "use data-center or workstation GPUs for P2P, or expect host-staged copies"
            )
        );
    }

    #[test]
    fn acs_is_found_in_the_extended_capability_list() {
        let mut cfg = vec![0u8; 4096];
        // First extended capability at 0x100: AER (id 1), next at 0x140.
        cfg[0x100..0x104].copy_from_slice(&(0x0001u32 | (1 << 16) | (0x140 << 20)).to_le_bytes());
        // ACS (id 0xd) at 0x140, last in the list; control register = 0x001d (SV, RR, CR, UF).
        cfg[0x140..0x144].copy_from_slice(&(0x000du32 | (1 << 16)).to_le_bytes());
        cfg[0x146..0x148].copy_from_slice(&0x001du16.to_le_bytes());
        assert_eq!(parse_acs_control(&cfg), Some(0x001d));
        // Only the 64-byte header readable (no root): unknown, not a panic.
        assert_eq!(parse_acs_control(&cfg[..64]), None);
        // A list without ACS.
        cfg[0x140] = 0x02;
        assert_eq!(parse_acs_control(&cfg), None);
        // A looping list ends.
        cfg[0x100..0x104].copy_from_slice(&(0x0001u32 | (0x100 << 20)).to_le_bytes());
        assert_eq!(parse_acs_control(&cfg), None);
    }

    #[test]
    fn acs_redirect_fails_the_pair() {
        let pcie = Connection::Pcie(topo::PathLevel::Pix);
        let f = check_acs(
            "GPU0 -> GPU1",
            pcie,
            &[
                ("0000:02:00.0".into(), Some(0x001d)),
                ("0000:02:01.0".into(), Some(0)),
            ],
        );
        assert_eq!(f.status, Status::Fail);
        assert!(
            f.evidence.contains("0000:02:00.0") && !f.evidence.contains("0000:02:01.0"),
            "{}",
            f.evidence
        );
        assert!(f.fix.contains("setpci"));
        assert_eq!(
            check_acs("s", pcie, &[("b".into(), Some(0x0001))]).status,
            Status::Ok
        );
        assert_eq!(
            check_acs("s", pcie, &[("b".into(), None)]).status,
            Status::Warn
        );
        assert_eq!(check_acs("s", pcie, &[]).status, Status::Ok);
        assert_eq!(
            check_acs(
                "s",
                Connection::NvLink {
                    links: 18,
                    generation: 4
                },
                &[("b".into(), Some(0x1d))]
            )
            .status,
            Status::Ok
        );
    }

    #[test]
    fn iommu_matters_only_when_translating_pcie_p2p() {
        assert_eq!(check_iommu(0, "", 3).status, Status::Ok);
        assert_eq!(check_iommu(2, "ro quiet iommu=pt", 3).status, Status::Ok);
        assert_eq!(check_iommu(2, "ro quiet", 0).status, Status::Ok);
        let f = check_iommu(2, "ro quiet intel_iommu=on", 3);
        assert_eq!(f.status, Status::Warn);
        assert!(f.fix.contains("iommu=pt"));
    }

    #[test]
    fn containers_are_detected_three_ways() {
        let host = "Name:\tx\nNSpid:\t1234\n";
        assert_eq!(
            check_container(host, "0::/user.slice", false).status,
            Status::Ok
        );
        assert_eq!(
            check_container("NSpid:\t1234\t7\n", "0::/", false).status,
            Status::Warn
        );
        let f = check_container(host, "0::/system.slice/docker-abc.scope", false);
        assert!(f.status == Status::Warn && f.evidence.contains("docker"));
        assert_eq!(check_container(host, "0::/", true).status, Status::Warn);
    }

    #[test]
    fn fd_limits_have_three_bands() {
        assert_eq!(check_fd_limit(100, 4096).status, Status::Fail);
        let f = check_fd_limit(1024, 1_048_576);
        assert_eq!(f.status, Status::Warn);
        assert_eq!(f.fix, "ulimit -n 1048576");
        // When soft == hard, ulimit cannot help: say what can.
        assert!(check_fd_limit(1024, 1024).fix.contains("hard limit"));
        assert_eq!(check_fd_limit(20_000, 20_000).status, Status::Ok);
    }

    #[test]
    fn imex_is_only_a_warning_where_fabric_is_supported() {
        assert_eq!(check_imex(false, None).status, Status::Ok);
        assert_eq!(check_imex(true, Some(1)).status, Status::Ok);
        assert_eq!(check_imex(true, None).status, Status::Warn);
        assert_eq!(check_imex(true, Some(0)).status, Status::Warn);
    }

    #[test]
    fn kernels_need_nothing_where_shipped_and_nvrtc_or_the_cache_elsewhere() {
        let dir = std::path::Path::new("/home/u/.cache/p2p/kernels");
        let nvrtc = || Ok("NVRTC 13.0, build 65be".to_string());
        let gone = || Err("libnvrtc not found".to_string());
        // H100s: shipped, with or without NVRTC.
        let h100 = [("sm_90".to_string(), true, 0)];
        let ok = check_kernels(gone(), Some(dir), &h100, 8);
        assert_eq!(ok.status, Status::Ok, "{ok:?}");
        assert_eq!(
            ok.evidence,
            "sm_90: shipped compiled; no compiler needed (no NVRTC)"
        );
        // A Blackwell beside it: NVRTC needed for that one.
        let mixed = [
            ("sm_90".to_string(), true, 0),
            ("sm_100".to_string(), false, 0),
        ];
        let missing = check_kernels(gone(), Some(dir), &mixed, 8);
        assert_eq!(missing.status, Status::Fail);
        assert!(
            missing.evidence.contains("on sm_100 cannot compile"),
            "{missing:?}"
        );
        assert!(missing.fix.contains("nvidia-cuda-nvrtc"), "{missing:?}");
        let nowhere = check_kernels(nvrtc(), None, &[("sm_100".into(), false, 0)], 8);
        assert_eq!(nowhere.status, Status::Warn);
        assert!(nowhere.evidence.contains("every process compiles"));
        let some = [("sm_90".into(), true, 0), ("sm_100".into(), false, 3)];
        let part = check_kernels(nvrtc(), Some(dir), &some, 8);
        assert_eq!(part.status, Status::Warn);
        assert!(
            part.evidence.starts_with(
                "sm_90: shipped compiled; NVRTC 13.0, build 65be; sm_100: 3 of 8 parts cached"
            ),
            "{part:?}"
        );
        assert_eq!(
            part.fix,
            "p2p-bench kernels (once per machine, user and NVRTC release)"
        );
        let none = check_kernels(nvrtc(), Some(dir), &[], 8);
        assert!(none
            .evidence
            .ends_with("no GPU here to compile the kernels for"));
        assert_eq!(
            check_kernels(gone(), Some(dir), &[], 8).status,
            Status::Warn
        );
        let all = [("sm_100".into(), false, 8), ("sm_120".into(), false, 8)];
        let done = check_kernels(nvrtc(), Some(dir), &all, 8);
        assert_eq!(done.status, Status::Ok, "{done:?}");
    }

    #[test]
    fn a_driver_older_than_cuda_12_4_fails_the_doctor() {
        assert_eq!(check_driver(13000).status, Status::Ok);
        assert_eq!(check_driver(12040).status, Status::Ok);
        let old = check_driver(12020);
        assert_eq!(old.status, Status::Fail);
        assert_eq!(
            old.evidence,
            "libcuda loaded, CUDA 12.2 (p2p needs 12.4 or newer)"
        );
    }

    #[test]
    fn nvml_codes_are_explained() {
        assert_eq!(
            nvml_status_meaning("TNS"),
            "the PCIe topology (IOH) does not support P2P between these GPUs"
        );
        assert_eq!(nvml_status_meaning("??"), "unknown");
    }

    #[test]
    fn reports_render_with_a_summary() {
        let r = Report {
            source: "test".into(),
            findings: vec![
                finding("a", "system", Status::Ok, "fine", ""),
                finding("b", "GPU0 -> GPU1", Status::Fail, "broken", "fix it"),
            ],
        };
        assert_eq!(r.worst(), Status::Fail);
        let text = r.render();
        assert!(text.contains("[FAIL]  GPU0 -> GPU1"), "{text}");
        assert!(text.contains("fix: fix it"));
        assert!(text.trim_end().ends_with("1 ok, 0 warn, 1 fail"));
    }
}
