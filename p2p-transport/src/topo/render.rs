//! Text views of a [`Topology`], shaped like `nvidia-smi topo -m` and `nvidia-smi topo -p2p`.

use super::{nvlink_gbps, Connection, Remote, Topology};
use crate::util::text_columns as columns;

/// The header row of a GPU-by-GPU matrix: a blank corner, then `GPU0`, `GPU1`, ...
fn header(t: &Topology) -> Vec<String> {
    std::iter::once(String::new())
        .chain(t.gpus.iter().map(|g| format!("GPU{}", g.index)))
        .collect()
}

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

/// The connection matrix: `X`, `NV#`, or the PCIe class, plus CPU and NUMA affinity.
pub fn render_matrix(t: &Topology) -> String {
    let mut top = header(t);
    top.extend(["CPU Affinity".to_string(), "NUMA Affinity".to_string()]);
    let mut rows = vec![top];
    for a in 0..t.gpus.len() {
        let mut row = vec![format!("GPU{a}")];
        for b in 0..t.gpus.len() {
            row.push(match t.connection(a, b) {
                Connection::Same => "X".to_string(),
                Connection::NvLink { links, .. } | Connection::NvSwitch { links, .. } => {
                    format!("NV{links}")
                }
                Connection::Pcie(level) => level.to_string(),
            });
        }
        let g = &t.gpus[a];
        row.push(g.cpu_affinity.clone().unwrap_or_else(|| "N/A".into()));
        row.push(
            g.numa_node
                .map(|n| n.to_string())
                .unwrap_or_else(|| "N/A".into()),
        );
        rows.push(row);
    }
    let mut out = columns(rows, &[]);
    out += "\nLegend: X = self; NV# = # bonded NVLinks (directly or through NVSwitch); PIX = at most one\n\
            PCIe bridge; PXB = several PCIe bridges; PHB = through a PCIe host bridge; NODE = between\n\
            host bridges of one NUMA node; SYS = across NUMA nodes.\n";
    out
}

/// One P2P capability matrix.
pub fn render_p2p_matrix(t: &Topology, which: P2pMatrix) -> String {
    let mut rows = vec![header(t)];
    for a in 0..t.gpus.len() {
        let mut row = vec![format!("GPU{a}")];
        for b in 0..t.gpus.len() {
            row.push(if a == b {
                "X".to_string()
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
            });
        }
        rows.push(row);
    }
    format!("{}\n{}", which.title(), columns(rows, &[]))
}

/// Each GPU's links: PCIe generation and width, and NVLinks grouped by what they reach.
pub fn render_links(t: &Topology) -> String {
    let mut rows = vec![vec![
        "GPU".into(),
        "PCIe (cur/max)".into(),
        "NVLinks".into(),
    ]];
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
        rows.push(vec![format!("GPU{}", g.index), pcie, links]);
    }
    columns(rows, &[])
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
    let mut rows = vec![[
        "path",
        "class",
        "hops",
        "est. GB/s",
        "all peers GB/s",
        "direct P2P",
        "via",
        "reason",
    ]
    .map(String::from)
    .to_vec()];
    for p in t.paths() {
        rows.push(vec![
            format!("GPU{} -> GPU{}", p.from, p.to),
            p.level.name().to_string(),
            p.hops.to_string(),
            format!("{:.1}", p.bandwidth_gbps),
            if p.shared_by > 1 {
                format!("{:.1} (1/{})", p.concurrent_gbps, p.shared_by)
            } else {
                format!("{:.1}", p.concurrent_gbps)
            },
            (if p.p2p { "yes" } else { "no" }).to_string(),
            p.via
                .map(|v| format!("GPU{v}"))
                .unwrap_or_else(|| "-".into()),
            p.reason.clone(),
        ]);
    }
    columns(rows, &[2, 3, 4])
}
