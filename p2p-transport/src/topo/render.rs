//! Text views of a [`Topology`], shaped like `nvidia-smi topo -m` and `nvidia-smi topo -p2p`.

use super::{nvlink_gbps, Connection, Remote, Topology};

/// Which P2P capability a matrix shows, as `nvidia-smi topo -p2p r|w|n|a` and CUDA name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum P2pMatrix {
    /// NVML read status.
    Read,
    /// NVML write status.
    Write,
    /// NVML NVLink status.
    NvLink,
    /// NVML atomics status.
    Atomics,
    /// `cuDeviceCanAccessPeer`.
    Cuda,
}

impl P2pMatrix {
    /// The title line.
    pub fn title(self) -> &'static str {
        match self {
            P2pMatrix::Read => "P2P read (NVML)",
            P2pMatrix::Write => "P2P write (NVML)",
            P2pMatrix::NvLink => "P2P over NVLink (NVML)",
            P2pMatrix::Atomics => "P2P atomics (NVML)",
            P2pMatrix::Cuda => "cuDeviceCanAccessPeer (CUDA)",
        }
    }
}

fn header(t: &Topology) -> String {
    let mut s = format!("{:<8}", "");
    for g in &t.gpus {
        s += &format!("{:<8}", format!("GPU{}", g.index));
    }
    s
}

/// The connection matrix: `X`, `NV#`, or the PCIe class, plus CPU and NUMA affinity.
pub fn render_matrix(t: &Topology) -> String {
    let mut out = format!("{}{:<16}{}\n", header(t), "CPU Affinity", "NUMA Affinity");
    for a in 0..t.gpus.len() {
        out += &format!("{:<8}", format!("GPU{a}"));
        for b in 0..t.gpus.len() {
            let cell = match t.connection(a, b) {
                Connection::Same => " X".to_string(),
                Connection::NvLink { links, .. } | Connection::NvSwitch { links, .. } => {
                    format!("NV{links}")
                }
                Connection::Pcie(level) => level.to_string(),
            };
            out += &format!("{cell:<8}");
        }
        let g = &t.gpus[a];
        out += &format!(
            "{:<16}{}\n",
            g.cpu_affinity.as_deref().unwrap_or("N/A"),
            g.numa_node
                .map(|n| n.to_string())
                .unwrap_or_else(|| "N/A".into())
        );
    }
    out += "\nLegend: X = self; NV# = # bonded NVLinks (directly or through NVSwitch); PIX = at most one\n\
            PCIe bridge; PXB = several PCIe bridges; PHB = through a PCIe host bridge; NODE = between\n\
            host bridges of one NUMA node; SYS = across NUMA nodes.\n";
    out
}

/// One P2P capability matrix.
pub fn render_p2p_matrix(t: &Topology, which: P2pMatrix) -> String {
    let mut out = format!("{}\n{}\n", which.title(), header(t));
    for a in 0..t.gpus.len() {
        out += &format!("{:<8}", format!("GPU{a}"));
        for b in 0..t.gpus.len() {
            let cell = if a == b {
                " X".to_string()
            } else {
                match (t.pair(a, b), which) {
                    (None, _) => "-".into(),
                    (Some(p), P2pMatrix::Cuda) => {
                        (if p.can_access_peer { "OK" } else { "NS" }).into()
                    }
                    (Some(p), _) => p
                        .nvml
                        .as_ref()
                        .map(|n| match which {
                            P2pMatrix::Read => n.read.clone(),
                            P2pMatrix::Write => n.write.clone(),
                            P2pMatrix::NvLink => n.nvlink.clone(),
                            _ => n.atomics.clone(),
                        })
                        .unwrap_or_else(|| "-".into()),
                }
            };
            out += &format!("{cell:<8}");
        }
        out += "\n";
    }
    out
}

/// Each GPU's links: PCIe generation and width, and NVLinks grouped by what they reach.
pub fn render_links(t: &Topology) -> String {
    let mut out = String::from("GPU   PCIe (cur/max)      NVLinks\n");
    for g in &t.gpus {
        let pcie = g
            .pcie
            .map(|p| {
                format!(
                    "gen{}/{} x{}/x{}",
                    p.gen_current, p.gen_max, p.width_current, p.width_max
                )
            })
            .unwrap_or_else(|| "unknown".into());
        let mut groups: Vec<(String, u32, u32)> = Vec::new();
        for l in &g.nvlinks {
            let to = match l.remote {
                Remote::Gpu(i) => format!("GPU{i}"),
                Remote::HiddenGpu => format!("hidden GPU {}", l.remote_bus_id),
                Remote::NvSwitch => {
                    let peers =
                        peers_where(t, g.index, |c| matches!(c, Connection::NvSwitch { .. }));
                    if peers.is_empty() {
                        "NVSwitch".into()
                    } else {
                        format!("NVSwitch, shared by its traffic to {}", peers.join(", "))
                    }
                }
                Remote::Other => format!("{} (other)", l.remote_bus_id),
                Remote::Unresolved => {
                    let peers = peers_where(t, g.index, |c| matches!(c, Connection::NvLink { .. }));
                    format!(
                        "{} (far end not reported; NVML: NVLink P2P OK)",
                        peers.join(", ")
                    )
                }
            };
            match groups
                .iter_mut()
                .find(|(t, _, gen)| *t == to && *gen == l.generation)
            {
                Some(e) => e.1 += 1,
                None => groups.push((to, 1, l.generation)),
            }
        }
        let links = if groups.is_empty() {
            "none".to_string()
        } else {
            groups
                .iter()
                .map(|(to, n, gen)| {
                    let per = nvlink_gbps(*gen);
                    format!(
                        "{n} x NVLink{gen} ({per} GB/s each, {:.0} GB/s) to {to}",
                        *n as f64 * per
                    )
                })
                .collect::<Vec<_>>()
                .join("; ")
        };
        out += &format!("GPU{:<3} {pcie:<19} {links}\n", g.index);
    }
    out
}

/// `GPUb` for every other GPU b whose connection from `a` satisfies `keep`.
fn peers_where(t: &Topology, a: usize, keep: impl Fn(Connection) -> bool) -> Vec<String> {
    (0..t.gpus.len())
        .filter(|&b| b != a && keep(t.connection(a, b)))
        .map(|b| format!("GPU{b}"))
        .collect()
}

/// The path model as a table. `est. GB/s` is one peer alone; `all peers` is each peer's share
/// while the source sends to every peer that shares its links (a switch's or PCIe's).
pub fn render_paths(t: &Topology) -> String {
    let row = |path: &str,
               class: &str,
               hops: &str,
               bw: &str,
               shared: &str,
               p2p: &str,
               via: &str,
               reason: &str| {
        format!(
            "{path:<15}{class:<7}{hops:>4}  {bw:>9}  {shared:>14}  {p2p:<10}  {via:<6} {reason}\n"
        )
    };
    let mut out = row(
        "path",
        "class",
        "hops",
        "est. GB/s",
        "all peers GB/s",
        "direct P2P",
        "via",
        "reason",
    );
    for p in t.paths() {
        out += &row(
            &format!("GPU{} -> GPU{}", p.from, p.to),
            p.level.name(),
            &p.hops.to_string(),
            &format!("{:.1}", p.bandwidth_gbps),
            &if p.shared_by > 1 {
                format!("{:.1} (1/{})", p.concurrent_gbps, p.shared_by)
            } else {
                format!("{:.1}", p.concurrent_gbps)
            },
            if p.p2p { "yes" } else { "no" },
            &p.via
                .map(|v| format!("GPU{v}"))
                .unwrap_or_else(|| "-".into()),
            &p.reason,
        );
    }
    out
}
