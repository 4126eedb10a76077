//! Topology: how the GPUs of a machine are joined, as data.
//!
//! A [`Topology`] holds, for every GPU, its identity, PCIe link and PCIe path from the root
//! complex, NUMA node, CPU affinity and NVLinks (with the far end of each link), and for every
//! ordered pair of GPUs what CUDA and NVML say about P2P. It serializes to and from JSON, so a
//! topology recorded on one machine (`p2p-bench topo --json`) can be loaded and reasoned about on
//! another: the fixtures in `fixtures/` are such files.
//!
//! [`Topology::path`] turns it into a [`PathInfo`] per ordered pair: the connection type, hops,
//! an estimated bandwidth, whether direct P2P is possible and, where it is not, the best
//! intermediate GPU. [`discover`] builds a `Topology` from the live machine.

use serde::{Deserialize, Serialize};

pub use crate::config::PathLevel;

mod discover;
pub mod reference;
mod render;
pub use discover::discover;
pub use render::{render_links, render_matrix, render_p2p_matrix, render_paths, P2pMatrix};

/// The JSON format version written by this build.
pub const FORMAT: u32 = 1;

/// A machine's GPUs and how they are joined.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Topology {
    /// Format version ([`FORMAT`]).
    pub format: u32,
    /// Where this came from: the host and tool that recorded it, or what a fixture models.
    pub source: String,
    /// The GPUs CUDA shows this process, by CUDA ordinal.
    pub gpus: Vec<Gpu>,
    /// What CUDA and NVML say about every ordered pair of distinct GPUs.
    pub pairs: Vec<PairP2p>,
    /// PCI bus ids of every GPU NVML sees, including those `CUDA_VISIBLE_DEVICES` hides.
    #[serde(default)]
    pub all_gpu_bus_ids: Vec<String>,
    /// `CUDA_VISIBLE_DEVICES` when recorded, if set.
    #[serde(default)]
    pub cuda_visible_devices: Option<String>,
}

/// One GPU.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gpu {
    /// CUDA ordinal in the recording process.
    pub index: usize,
    /// Marketing name.
    pub name: String,
    /// `GPU-...` UUID.
    pub uuid: String,
    /// PCI bus id, normalised to `dddd:bb:dd.f`.
    pub pci_bus_id: String,
    /// Compute capability `[major, minor]`.
    pub compute_capability: [i32; 2],
    /// Streaming multiprocessors.
    pub sm_count: i32,
    /// Memory in MiB.
    pub memory_mib: usize,
    /// NUMA node from sysfs, if the platform reports one.
    #[serde(default)]
    pub numa_node: Option<i32>,
    /// CPUs near the GPU (`local_cpulist`), e.g. `0-31`.
    #[serde(default)]
    pub cpu_affinity: Option<String>,
    /// PCIe link generation and width.
    #[serde(default)]
    pub pcie: Option<PcieLink>,
    /// The PCI hierarchy from the root complex down to this GPU, e.g.
    /// `["pci0000:00", "0000:00:01.0", "0000:02:00.0"]` (root first, the GPU last).
    #[serde(default)]
    pub pci_path: Vec<String>,
    /// Active NVLinks.
    #[serde(default)]
    pub nvlinks: Vec<NvLink>,
    /// Whether cuMem allocations can be shared as POSIX fds (VMM and the handle type
    /// supported); `None` where not recorded.
    #[serde(default)]
    pub cumem_posix_fd: Option<bool>,
}

/// A GPU's PCIe link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PcieLink {
    /// Current generation (can drop at idle).
    pub gen_current: u32,
    /// Maximum generation.
    pub gen_max: u32,
    /// Current width in lanes.
    pub width_current: u32,
    /// Maximum width in lanes.
    pub width_max: u32,
}

/// One active NVLink.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvLink {
    /// Link number on this GPU.
    pub link: u32,
    /// NVLink generation (1 = P100 ... 4 = H100/H200, 5 = B200).
    pub generation: u32,
    /// PCI bus id of the far end.
    pub remote_bus_id: String,
    /// What the far end is.
    pub remote: Remote,
    /// The far end's device type as NVML reports it (`gpu`, `switch`, `ibmnpu`, `unknown`);
    /// `None` where not recorded. On VMs that mask the far end's bus id it is what tells a
    /// link to an NVSwitch from a direct link.
    #[serde(default)]
    pub remote_device_type: Option<String>,
}

/// The far end of an NVLink.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Remote {
    /// A GPU visible to CUDA, by index.
    Gpu(usize),
    /// A GPU that exists but `CUDA_VISIBLE_DEVICES` hides.
    HiddenGpu,
    /// An NVSwitch.
    NvSwitch,
    /// Something else (a CPU with NVLink-C2C, or unknown).
    Other,
    /// NVML did not report the far end (some VMs mask it as `ffffffff:ff:ff.0`); the path
    /// model infers it from NVML's per-pair NVLink P2P status.
    Unresolved,
}

/// What CUDA and NVML say about one ordered pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PairP2p {
    /// The accessing GPU.
    pub from: usize,
    /// The GPU whose memory is accessed.
    pub to: usize,
    /// `cuDeviceCanAccessPeer`.
    pub can_access_peer: bool,
    /// `CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK` (lower is better).
    pub performance_rank: i32,
    /// `CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED`.
    pub native_atomics: bool,
    /// NVML's P2P status for read, write, NVLink and atomics (`OK`, `NS`, `CNS`, `GNS`, `TNS`,
    /// `DR`, `-` where unknown), as `nvidia-smi topo -p2p r|w|n|a` prints them.
    #[serde(default)]
    pub nvml: Option<NvmlP2p>,
}

/// NVML's P2P status of one ordered pair.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmlP2p {
    /// Read capability.
    pub read: String,
    /// Write capability.
    pub write: String,
    /// NVLink capability.
    pub nvlink: String,
    /// Atomics capability.
    pub atomics: String,
}

/// How one GPU reaches another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Connection {
    /// The same GPU.
    Same,
    /// Direct NVLinks between the two.
    NvLink {
        /// How many links join them.
        links: u32,
        /// NVLink generation.
        generation: u32,
    },
    /// Through NVSwitches both are linked to.
    NvSwitch {
        /// Links from the less-connected GPU to the switches.
        links: u32,
        /// NVLink generation.
        generation: u32,
    },
    /// PCIe only.
    Pcie(PathLevel),
}

/// The path model's answer for one ordered pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PathInfo {
    /// The source GPU.
    pub from: usize,
    /// The destination GPU.
    pub to: usize,
    /// How they are joined.
    pub connection: Connection,
    /// The path class (`NVL` for NVLink or NVSwitch, otherwise the PCIe class).
    pub level: PathLevel,
    /// Links crossed: 1 for direct NVLink, 2 through a switch or a host bridge, more across
    /// PCIe switches and sockets.
    pub hops: u32,
    /// Estimated bandwidth one way, GB/s.
    pub bandwidth_gbps: f64,
    /// Whether the two can map each other's memory directly.
    pub p2p: bool,
    /// Why or why not, in words.
    pub reason: String,
    /// Where there is no direct P2P: the GPU to relay through, if any has P2P to both.
    pub via: Option<usize>,
    /// How many of the source GPU's peers share `bandwidth_gbps` when all of them are sent to
    /// at once: 1 for direct NVLinks (each peer has its own links); every peer behind the same
    /// NVSwitch fabric (the GPU's links to the switches carry all its traffic); every PCIe peer
    /// (one PCIe link).
    #[serde(default = "one")]
    pub shared_by: u32,
    /// One-way GB/s to this peer while the source GPU sends to every peer that shares its links
    /// at once (`bandwidth_gbps / shared_by`): what a collective over all peers gets per peer.
    #[serde(default)]
    pub concurrent_gbps: f64,
}

fn one() -> u32 {
    1
}

/// Bandwidth of one NVLink, one direction, GB/s, by generation (what `nvidia-smi nvlink -s`
/// reports; generation 4 is 26.5625 GB/s, 18 links = 478 GB/s).
pub fn nvlink_gbps(generation: u32) -> f64 {
    match generation {
        1 => 20.0,
        2 | 3 => 25.0,
        4 => 26.5625,
        5 => 50.0,
        _ => 25.0,
    }
}

/// NVLink generation from compute capability (NVML's own version numbering changed across
/// drivers, so the architecture is the reliable source).
pub fn nvlink_generation(compute_capability: [i32; 2]) -> u32 {
    match compute_capability[0] {
        ..=6 => 1,
        7 => 2,
        8 => 3,
        9 => 4,
        _ => 5,
    }
}

/// Usable bandwidth of one PCIe lane, one direction, GB/s, by generation (after encoding).
pub fn pcie_lane_gbps(generation: u32) -> f64 {
    match generation {
        0 | 1 => 0.25,
        2 => 0.5,
        3 => 0.985,
        4 => 1.969,
        5 => 3.938,
        _ => 7.563,
    }
}

/// `0000:00:06.0` from `00000000:00:06.0`, `0000:00:06.0` or `00:06.0`, lower case.
pub fn normalize_bus_id(id: &str) -> String {
    let id = id.trim().to_ascii_lowercase();
    let parts: Vec<&str> = id.split(':').collect();
    match parts.as_slice() {
        [domain, bus, devfn] => {
            let d = domain.trim_start_matches('0');
            format!("{:0>4}:{bus}:{devfn}", d)
        }
        [bus, devfn] => format!("0000:{bus}:{devfn}"),
        _ => id,
    }
}

/// Classifies the PCIe path between two GPUs from their PCI hierarchies, as
/// `nvidia-smi topo -m` does: a PCIe switch (upstream and downstream ports) counts as one bridge.
///
/// Returns the class and the hops (edges from each GPU up to their meeting point and down).
pub fn pcie_class(a: &Gpu, b: &Gpu) -> (PathLevel, u32) {
    let (pa, pb) = (&a.pci_path, &b.pci_path);
    let roots_known = !pa.is_empty() && !pb.is_empty();
    if !roots_known {
        return (PathLevel::Sys, 4);
    }
    if pa[0] != pb[0] {
        let same_numa =
            matches!((a.numa_node, b.numa_node), (Some(x), Some(y)) if x == y && x >= 0);
        let below = (pa.len() + pb.len()) as u32;
        return if same_numa {
            (PathLevel::Node, below + 1)
        } else {
            (PathLevel::Sys, below + 2)
        };
    }
    // Longest common prefix, excluding the GPUs themselves.
    let common = pa
        .iter()
        .zip(pb.iter())
        .take_while(|(x, y)| x == y)
        .count()
        .min(pa.len() - 1)
        .min(pb.len() - 1);
    let (da, db) = (pa.len() - common, pb.len() - common);
    let hops = (da + db) as u32;
    if common == 1 {
        // They meet at the root complex itself: through the host bridge.
        (PathLevel::Phb, hops)
    } else if da <= 2 && db <= 2 {
        // Each GPU is at most one (downstream) port below the meeting bridge.
        (PathLevel::Pix, hops)
    } else {
        (PathLevel::Pxb, hops)
    }
}

/// Names GPUs like nvidia-smi does, so the gaps in P2P support are recognisable.
pub fn is_consumer_gpu(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    (n.contains("geforce")
        || n.contains("titan")
        || n.contains("rtx 30")
        || n.contains("rtx 40")
        || n.contains("rtx 50"))
        && !n.contains("rtx a")
}

/// Why text is not a topology this build reads ([`Topology::from_json`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TopologyError {
    /// Not JSON, or JSON of another shape (the source says where: line and column).
    #[error("not a p2p topology: {0}")]
    Json(#[source] serde_json::Error),
    /// Written in another format version: record it again with this build
    /// (`p2p-bench topo --json`).
    #[error("topology format {found} but this build reads {FORMAT}")]
    Format {
        /// The version in the text.
        found: u32,
    },
    /// A GPU's `index` is not its position in `gpus`.
    #[error("GPU at position {position} has index {index}")]
    GpuIndex {
        /// Its position in `gpus`.
        position: usize,
        /// The index it claims.
        index: usize,
    },
    /// An NVLink leads to a GPU the topology does not have.
    #[error("GPU {gpu} link {link} points at GPU {remote:?} of {gpus}")]
    LinkOutOfRange {
        /// The GPU the link belongs to.
        gpu: usize,
        /// The link's number.
        link: u32,
        /// Its far end.
        remote: Remote,
        /// GPUs in the topology.
        gpus: usize,
    },
    /// A pair names a GPU the topology does not have, or one GPU twice.
    #[error("pair {from} -> {to} is out of range for {gpus} GPUs")]
    PairOutOfRange {
        /// The accessing GPU.
        from: usize,
        /// The accessed GPU.
        to: usize,
        /// GPUs in the topology.
        gpus: usize,
    },
}

impl Topology {
    /// Parses JSON, checking the format version and that every index is in range.
    pub fn from_json(text: &str) -> Result<Topology, TopologyError> {
        let t: Topology = serde_json::from_str(text).map_err(TopologyError::Json)?;
        if t.format != FORMAT {
            return Err(TopologyError::Format { found: t.format });
        }
        let n = t.gpus.len();
        for (i, g) in t.gpus.iter().enumerate() {
            if g.index != i {
                return Err(TopologyError::GpuIndex {
                    position: i,
                    index: g.index,
                });
            }
            for l in &g.nvlinks {
                if matches!(l.remote, Remote::Gpu(r) if r >= n) {
                    return Err(TopologyError::LinkOutOfRange {
                        gpu: i,
                        link: l.link,
                        remote: l.remote,
                        gpus: n,
                    });
                }
            }
        }
        if let Some(p) = t
            .pairs
            .iter()
            .find(|p| p.from >= n || p.to >= n || p.from == p.to)
        {
            return Err(TopologyError::PairOutOfRange {
                from: p.from,
                to: p.to,
                gpus: n,
            });
        }
        Ok(t)
    }

    /// Pretty JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_default()
    }

    /// What CUDA said about `from` accessing `to`, if recorded.
    pub fn pair(&self, from: usize, to: usize) -> Option<&PairP2p> {
        self.pairs.iter().find(|p| p.from == from && p.to == to)
    }

    /// How `a` reaches `b`.
    ///
    /// # Panics
    /// If a GPU index is not below `gpus.len()`, as slice indexing does (mode selection checks
    /// indices before it asks).
    pub fn connection(&self, a: usize, b: usize) -> Connection {
        if a == b {
            return Connection::Same;
        }
        let (ga, gb) = (&self.gpus[a], &self.gpus[b]);
        let direct = ga
            .nvlinks
            .iter()
            .filter(|l| l.remote == Remote::Gpu(b))
            .count() as u32;
        if direct > 0 {
            let generation = ga.nvlinks.iter().map(|l| l.generation).max().unwrap_or(0);
            return Connection::NvLink {
                links: direct,
                generation,
            };
        }
        let to_switch = |g: &Gpu| {
            g.nvlinks
                .iter()
                .filter(|l| l.remote == Remote::NvSwitch)
                .count() as u32
        };
        let (sa, sb) = (to_switch(ga), to_switch(gb));
        if sa > 0 && sb > 0 {
            let generation = ga
                .nvlinks
                .iter()
                .chain(&gb.nvlinks)
                .map(|l| l.generation)
                .min()
                .unwrap_or(0);
            return Connection::NvSwitch {
                links: sa.min(sb),
                generation,
            };
        }
        if let Some(links) = self.inferred_links(a, b) {
            let generation = ga.nvlinks.iter().map(|l| l.generation).max().unwrap_or(0);
            return Connection::NvLink { links, generation };
        }
        Connection::Pcie(pcie_class(ga, gb).0)
    }

    /// Whether NVML says `a` and `b` can do P2P over NVLink.
    fn nvml_nvlink_ok(&self, a: usize, b: usize) -> bool {
        self.pair(a, b)
            .and_then(|p| p.nvml.as_ref())
            .is_some_and(|n| n.nvlink == "OK")
    }

    /// Links to `b` among `a`'s links whose far end NVML did not report: all of them when `b` is
    /// `a`'s only NVLink peer by NVML's P2P status, otherwise an even share (an estimate).
    fn inferred_links(&self, a: usize, b: usize) -> Option<u32> {
        let unresolved = self.gpus[a]
            .nvlinks
            .iter()
            .filter(|l| l.remote == Remote::Unresolved)
            .count() as u32;
        if unresolved == 0 || !self.nvml_nvlink_ok(a, b) {
            return None;
        }
        let peers = (0..self.gpus.len())
            .filter(|&c| c != a && self.nvml_nvlink_ok(a, c))
            .count()
            .max(1) as u32;
        Some((unresolved / peers).max(1))
    }

    /// Estimated one-way bandwidth and hops of the direct connection between `a` and `b`.
    fn direct_cost(&self, a: usize, b: usize) -> (PathLevel, u32, f64) {
        match self.connection(a, b) {
            Connection::Same => (PathLevel::Loc, 0, f64::INFINITY),
            Connection::NvLink { links, generation } => {
                (PathLevel::Nvl, 1, links as f64 * nvlink_gbps(generation))
            }
            Connection::NvSwitch { links, generation } => {
                (PathLevel::Nvl, 2, links as f64 * nvlink_gbps(generation))
            }
            Connection::Pcie(level) => {
                let (_, hops) = pcie_class(&self.gpus[a], &self.gpus[b]);
                let lane = |g: &Gpu| {
                    g.pcie
                        .map(|p| pcie_lane_gbps(p.gen_max) * p.width_max as f64)
                        .unwrap_or(16.0 * pcie_lane_gbps(3))
                };
                let mut bw = lane(&self.gpus[a]).min(lane(&self.gpus[b]));
                if level == PathLevel::Sys {
                    bw *= 0.5; // the inter-socket link and its protocol overhead, typically
                }
                (level, hops, bw)
            }
        }
    }

    /// Whether `a` can map `b`'s memory, and why or why not.
    ///
    /// # Panics
    /// If a GPU index is not below `gpus.len()`, as slice indexing does (mode selection checks
    /// indices before it asks).
    pub fn direct_p2p(&self, a: usize, b: usize) -> (bool, String) {
        if a == b {
            return (true, "the same GPU".into());
        }
        let name = &self.gpus[a].name;
        match self.pair(a, b) {
            Some(p) if p.can_access_peer => (true, "cuDeviceCanAccessPeer = 1".into()),
            Some(_) if self.gpus[a].compute_capability[0] < 6 => {
                (false, "compute capability below 6.0".into())
            }
            Some(_) if is_consumer_gpu(name) => (
                false,
                format!(
                    "cuDeviceCanAccessPeer = 0 ({name}: consumer GPUs usually have P2P disabled)"
                ),
            ),
            Some(_) => (false, "cuDeviceCanAccessPeer = 0".into()),
            None => (false, "no P2P data recorded for this pair".into()),
        }
    }

    /// The path model for `a` -> `b`.
    ///
    /// # Panics
    /// If a GPU index is not below `gpus.len()`, as slice indexing does (mode selection checks
    /// indices before it asks).
    pub fn path(&self, a: usize, b: usize) -> PathInfo {
        let (level, hops, bw) = self.direct_cost(a, b);
        let (p2p, reason) = self.direct_p2p(a, b);
        let via = if p2p {
            None
        } else {
            self.best_intermediate(a, b)
        };
        let (hops, bandwidth_gbps) = match via {
            // Without direct P2P, data goes through the relay (or the host): report that path.
            Some(c) => {
                let (_, h1, b1) = self.direct_cost(a, c);
                let (_, h2, b2) = self.direct_cost(c, b);
                (h1 + h2, b1.min(b2))
            }
            None => (hops, if bw.is_finite() { bw } else { 0.0 }),
        };
        let shared_by = if via.is_some() {
            1
        } else {
            self.shared_by(a, b)
        };
        PathInfo {
            from: a,
            to: b,
            connection: self.connection(a, b),
            level,
            hops,
            bandwidth_gbps,
            p2p,
            reason,
            via,
            shared_by,
            concurrent_gbps: bandwidth_gbps / shared_by.max(1) as f64,
        }
    }

    /// How many of `a`'s peers share the links `a` uses to reach `b` (see
    /// [`PathInfo::shared_by`]).
    ///
    /// # Panics
    /// If a GPU index is not below `gpus.len()`, as slice indexing does (mode selection checks
    /// indices before it asks).
    pub fn shared_by(&self, a: usize, b: usize) -> u32 {
        let same_kind = |c: usize| {
            matches!(
                (self.connection(a, b), self.connection(a, c)),
                (Connection::NvSwitch { .. }, Connection::NvSwitch { .. })
                    | (Connection::Pcie(_), Connection::Pcie(_))
            )
        };
        match self.connection(a, b) {
            Connection::NvSwitch { .. } | Connection::Pcie(_) => (0..self.gpus.len())
                .filter(|&c| c != a && same_kind(c))
                .count()
                .max(1) as u32,
            _ => 1,
        }
    }

    /// Estimated one-way GB/s from `a` to each of `peers` when `a` sends to all of them at
    /// once: direct NVLinks are each peer's own; a GPU's links to an NVSwitch, and its PCIe
    /// link, are split evenly among the peers that use them.
    ///
    /// # Panics
    /// If a GPU index is not below `gpus.len()`, as slice indexing does (mode selection checks
    /// indices before it asks).
    pub fn concurrent_bandwidth(&self, a: usize, peers: &[usize]) -> Vec<f64> {
        peers
            .iter()
            .map(|&b| {
                let bw = self.bandwidth(a, b);
                let sharing = match self.connection(a, b) {
                    Connection::NvSwitch { .. } => peers
                        .iter()
                        .filter(|&&c| matches!(self.connection(a, c), Connection::NvSwitch { .. }))
                        .count(),
                    Connection::Pcie(_) => peers
                        .iter()
                        .filter(|&&c| matches!(self.connection(a, c), Connection::Pcie(_)))
                        .count(),
                    _ => 1,
                };
                if bw.is_finite() {
                    bw / sharing.max(1) as f64
                } else {
                    bw
                }
            })
            .collect()
    }

    /// The GPU with direct P2P to both `a` and `b` that gives the most bandwidth (the narrower of
    /// its two legs); ties go to the lowest index.
    ///
    /// # Panics
    /// If a GPU index is not below `gpus.len()`, as slice indexing does (mode selection checks
    /// indices before it asks).
    pub fn best_intermediate(&self, a: usize, b: usize) -> Option<usize> {
        self.best_intermediate_where(a, b, |x, y| self.direct_p2p(x, y).0)
    }

    /// Like [`best_intermediate`](Self::best_intermediate), with `usable(x, y)` deciding which
    /// direct legs may be used (mode selection passes the configuration's limits).
    pub fn best_intermediate_where(
        &self,
        a: usize,
        b: usize,
        usable: impl Fn(usize, usize) -> bool,
    ) -> Option<usize> {
        let mut best: Option<(usize, f64)> = None;
        for c in 0..self.gpus.len() {
            if c == a || c == b || !usable(a, c) || !usable(c, b) {
                continue;
            }
            let bw = self.direct_cost(a, c).2.min(self.direct_cost(c, b).2);
            if best.is_none_or(|(_, b0)| bw > b0) {
                best = Some((c, bw));
            }
        }
        best.map(|(c, _)| c)
    }

    /// Estimated one-way GB/s of the direct connection between `a` and `b`.
    ///
    /// # Panics
    /// If a GPU index is not below `gpus.len()`, as slice indexing does (mode selection checks
    /// indices before it asks).
    pub fn bandwidth(&self, a: usize, b: usize) -> f64 {
        self.direct_cost(a, b).2
    }

    /// The path model for every ordered pair of distinct GPUs.
    pub fn paths(&self) -> Vec<PathInfo> {
        let n = self.gpus.len();
        (0..n)
            .flat_map(|a| (0..n).filter(move |&b| b != a).map(move |b| (a, b)))
            .map(|(a, b)| self.path(a, b))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(path: &[&str], numa: i32) -> Gpu {
        Gpu {
            index: 0,
            name: "x".into(),
            uuid: String::new(),
            pci_bus_id: path.last().map(|s| s.to_string()).unwrap_or_default(),
            compute_capability: [9, 0],
            sm_count: 1,
            memory_mib: 1,
            numa_node: Some(numa),
            cpu_affinity: None,
            pcie: None,
            pci_path: path.iter().map(|s| s.to_string()).collect(),
            nvlinks: vec![],
            cumem_posix_fd: None,
        }
    }

    #[test]
    fn bus_ids_normalise() {
        assert_eq!(normalize_bus_id("00000000:00:06.0"), "0000:00:06.0");
        assert_eq!(normalize_bus_id("0000:1B:00.0"), "0000:1b:00.0");
        assert_eq!(normalize_bus_id("00:07.0"), "0000:00:07.0");
        assert_eq!(normalize_bus_id("00000001:00:07.0"), "0001:00:07.0");
    }

    #[test]
    fn pcie_classes_follow_nvidia_smi() {
        // Both on the root bus (our Firecracker VMs): through the host bridge.
        let a = gpu(&["pci0000:00", "0000:00:06.0"], 0);
        let b = gpu(&["pci0000:00", "0000:00:07.0"], 0);
        assert_eq!(pcie_class(&a, &b), (PathLevel::Phb, 2));
        // Behind one switch: root port, switch upstream, two downstream ports.
        let s = ["pci0000:00", "0000:00:01.0", "0000:01:00.0"];
        let a = gpu(&[&s[..], &["0000:02:00.0", "0000:03:00.0"]].concat(), 0);
        let b = gpu(&[&s[..], &["0000:02:01.0", "0000:04:00.0"]].concat(), 0);
        assert_eq!(pcie_class(&a, &b).0, PathLevel::Pix);
        // Two switches deep below a common root port.
        let b2 = gpu(
            &[
                &s[..],
                &[
                    "0000:02:02.0",
                    "0000:05:00.0",
                    "0000:06:00.0",
                    "0000:07:00.0",
                ],
            ]
            .concat(),
            0,
        );
        assert_eq!(pcie_class(&a, &b2).0, PathLevel::Pxb);
        // Different root complexes: same NUMA node, then across sockets.
        let c = gpu(&["pci0000:80", "0000:80:01.0", "0000:81:00.0"], 0);
        assert_eq!(pcie_class(&a, &c).0, PathLevel::Node);
        let d = gpu(&["pci0000:80", "0000:80:01.0", "0000:81:00.0"], 1);
        assert_eq!(pcie_class(&a, &d).0, PathLevel::Sys);
        // Nothing known: assume the worst.
        assert_eq!(pcie_class(&gpu(&[], 0), &a).0, PathLevel::Sys);
    }

    #[test]
    fn consumer_gpus_are_recognised() {
        assert!(is_consumer_gpu("NVIDIA GeForce RTX 4090"));
        assert!(is_consumer_gpu("NVIDIA TITAN RTX"));
        assert!(!is_consumer_gpu("NVIDIA RTX A6000"));
        assert!(!is_consumer_gpu("NVIDIA H200"));
    }

    #[test]
    fn link_speeds() {
        assert_eq!(18.0 * nvlink_gbps(nvlink_generation([9, 0])), 478.125);
        assert_eq!(nvlink_generation([8, 0]), 3);
        assert!((pcie_lane_gbps(4) * 16.0 - 31.5).abs() < 0.1);
    }
}
