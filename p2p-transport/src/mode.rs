//! Mode selection: how data moves between each ordered pair of ranks.
//!
//! A pure function of the [`Topology`], where each rank runs ([`Endpoint`]: its GPU and its
//! process) and the [`Config`]. For every ordered pair it picks
//!
//! - the **mode**: a direct pointer within one process; between processes cuMem fds where
//!   enabled and supported, else legacy IPC handles; a relay through an intermediate GPU where
//!   the two have no usable P2P but share a neighbour; host-staged through pinned memory where
//!   there is no P2P at all; or a local copy when both ranks use one GPU;
//! - the **direction**: read (the receiver pulls) or write (the sender pushes). By default read
//!   over NVLink between Ampere-or-newer GPUs, where loads pipeline better, and write over PCIe,
//!   where posted writes are cheaper than read round trips;
//! - the **engine**: SM kernels, or the copy engines with `P2P_USE_COPY_ENGINE=1`.
//!
//! Every choice carries its reason and is logged at `info` level, e.g.
//! `0[0] -> 1[1] via P2P/direct pointer/read (NVLink x18)`. A mode forced with `P2P_MODE` that is
//! impossible for a pair is an error naming the pair and why.

use serde::{Deserialize, Serialize};

use crate::config::{Config, ForcedMode, PathLevel, Switch};
use crate::topo::{Connection, Topology};

/// Where one rank runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Endpoint {
    /// The rank.
    pub rank: usize,
    /// Its GPU, as an index into the topology.
    pub gpu: usize,
    /// Which process it lives in (any id shared by ranks of one process).
    pub process: u32,
}

/// How data travels between two ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Mode {
    /// Both ranks on one GPU: a device-local copy.
    Local,
    /// One process: plain device pointers with peer access.
    DirectPointer,
    /// Two processes: legacy CUDA IPC handles.
    LegacyIpc,
    /// Two processes: cuMem allocations shared as POSIX fds.
    CuMem,
    /// Through a third GPU with P2P to both.
    Intermediate {
        /// The relaying GPU.
        via: usize,
    },
    /// Through pinned host memory.
    HostStaged,
}

/// Who drives the copy across the link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Direction {
    /// The receiver loads from the sender's memory.
    Read,
    /// The sender stores into the receiver's memory.
    Write,
}

/// What moves the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Engine {
    /// SM kernels with 16-byte loads and stores.
    SmKernel,
    /// The GPU's copy engines (DMA).
    CopyEngine,
}

/// The decision for one ordered pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Route {
    /// The sending rank.
    pub from: Endpoint,
    /// The receiving rank.
    pub to: Endpoint,
    /// How.
    pub mode: Mode,
    /// Read or write.
    pub direction: Direction,
    /// SM kernels or copy engines.
    pub engine: Engine,
    /// The link, e.g. `NVLink x18` or `PCIe PHB`.
    pub link: String,
    /// Why this mode.
    pub reason: String,
}

impl Route {
    /// How the bytes go, without the ranks: `P2P/direct pointer/read (NVLink x18)`.
    pub fn how(&self) -> String {
        let dir = match self.direction {
            Direction::Read => "read",
            Direction::Write => "write",
        };
        let engine = if self.engine == Engine::CopyEngine {
            "/CE"
        } else {
            ""
        };
        let how = match self.mode {
            Mode::Local => "local copy".to_string(),
            Mode::DirectPointer => format!("P2P/direct pointer/{dir}{engine}"),
            Mode::LegacyIpc => format!("P2P/IPC/{dir}{engine}"),
            Mode::CuMem => format!("P2P/cuMem/{dir}{engine}"),
            Mode::Intermediate { via } => format!("P2P/intermediate GPU {via}/{dir}{engine}"),
            Mode::HostStaged => "host-staged (pinned double buffer)".to_string(),
        };
        format!("{how} ({})", self.link)
    }
}

impl std::fmt::Display for Route {
    /// `0[0] -> 1[1] via P2P/direct pointer/read (NVLink x18)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}[{}] -> {}[{}] via {}",
            self.from.rank,
            self.from.gpu,
            self.to.rank,
            self.to.gpu,
            self.how()
        )
    }
}

/// A forced mode that cannot work for a pair, or a rank on a GPU that does not exist.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ModeError {
    /// `P2P_MODE` asks for something this pair cannot do.
    #[error("P2P_MODE={forced} is impossible for rank {from} (GPU {from_gpu}) -> rank {to} (GPU {to_gpu}): {why}")]
    Impossible {
        /// The forced mode, as `P2P_MODE` names it.
        forced: &'static str,
        /// The sending rank.
        from: usize,
        /// Its GPU.
        from_gpu: usize,
        /// The receiving rank.
        to: usize,
        /// Its GPU.
        to_gpu: usize,
        /// Why.
        why: String,
    },
    /// A rank names a GPU the topology does not have.
    #[error("rank {rank} is placed on GPU {gpu}, but the topology has {count} GPU(s)")]
    NoSuchGpu {
        /// The rank.
        rank: usize,
        /// The GPU it names.
        gpu: usize,
        /// GPUs in the topology.
        count: usize,
    },
}

fn link_name(t: &Topology, a: usize, b: usize) -> String {
    match t.connection(a, b) {
        Connection::Same => "same GPU".into(),
        Connection::NvLink { links, .. } => format!("NVLink x{links}"),
        Connection::NvSwitch { links, .. } => format!("NVSwitch, NVLink x{links}"),
        Connection::Pcie(level) => format!("PCIe {level}"),
    }
}

/// Why a pair of GPUs may not use direct P2P: what [`p2p_allowed`] refuses, and what a probed
/// pair records ([`crate::peer::PairP2p::p2p`]). Mode selection turns it into a route's reason
/// (host-staged or relayed) or, for a forced mode, into [`ModeError::Impossible`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NoP2p {
    /// A GPU index past the topology's GPUs.
    #[error("GPU {a} or GPU {b} is not in the topology ({gpus} GPUs)")]
    NotInTopology {
        /// The accessing GPU.
        a: usize,
        /// The accessed GPU.
        b: usize,
        /// GPUs in the topology.
        gpus: usize,
    },
    /// `P2P_DISABLE=1` turns P2P off for every pair.
    #[error("P2P_DISABLE=1")]
    Disabled,
    /// The topology records no direct P2P between the two; `why` is
    /// [`Topology::direct_p2p`]'s reason (e.g. `cuDeviceCanAccessPeer = 0`).
    #[error("{why}")]
    NotPossible {
        /// The accessing GPU.
        a: usize,
        /// The accessed GPU.
        b: usize,
        /// What the topology says.
        why: String,
    },
    /// The path between the two is farther than `P2P_LEVEL` allows.
    #[error("the path is {level}, beyond P2P_LEVEL={limit}")]
    BeyondLevel {
        /// The path's class.
        level: PathLevel,
        /// `P2P_LEVEL`.
        limit: PathLevel,
    },
    /// The driver says `from` cannot map `to`'s memory (probed on the live GPUs).
    #[error("cuDeviceCanAccessPeer says GPU {from} cannot map GPU {to}")]
    CannotAccessPeer {
        /// The GPU that would map (ordinal in the probing process).
        from: i32,
        /// The GPU whose memory would be mapped.
        to: i32,
    },
    /// `P2P_LEVEL` is set and `from`'s peer is hidden from this process, so the path between
    /// them cannot be checked.
    #[error(
        "P2P_LEVEL={level} is set and GPU {from}'s peer is not visible to this process \
         (CUDA_VISIBLE_DEVICES), so the path between them cannot be checked"
    )]
    PeerNotVisible {
        /// `P2P_LEVEL`.
        level: PathLevel,
        /// The GPU whose peer is hidden (ordinal in this process).
        from: i32,
    },
}

/// Whether `cfg` lets GPUs `a` and `b` (CUDA ordinals of `t`) use direct P2P: not disabled, possible
/// as `t` records it, and the path no farther than `P2P_LEVEL`. Otherwise, why not.
pub fn p2p_allowed(t: &Topology, cfg: &Config, a: usize, b: usize) -> Result<(), NoP2p> {
    if a >= t.gpus.len() || b >= t.gpus.len() {
        return Err(NoP2p::NotInTopology {
            a,
            b,
            gpus: t.gpus.len(),
        });
    }
    if cfg.p2p_disable {
        return Err(NoP2p::Disabled);
    }
    let (possible, why) = t.direct_p2p(a, b);
    if !possible {
        return Err(NoP2p::NotPossible { a, b, why });
    }
    let level = t.path(a, b).level;
    if level > cfg.p2p_level {
        return Err(NoP2p::BeyondLevel {
            level,
            limit: cfg.p2p_level,
        });
    }
    Ok(())
}

/// Why a pair cannot relay through a third GPU (a route's reason, or a forced mode's refusal).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
enum NoRelay {
    /// `P2P_INTERMEDIATE=0`.
    #[error("P2P_INTERMEDIATE=0")]
    Disabled,
    /// No third GPU has P2P, as `p2p_allowed` allows it, to both.
    #[error("no third GPU has usable P2P to both")]
    NoneUsable,
}

/// Picks a route for every ordered pair of distinct ranks, and logs each.
pub fn select(t: &Topology, ranks: &[Endpoint], cfg: &Config) -> Result<Vec<Route>, ModeError> {
    for r in ranks {
        if r.gpu >= t.gpus.len() {
            return Err(ModeError::NoSuchGpu {
                rank: r.rank,
                gpu: r.gpu,
                count: t.gpus.len(),
            });
        }
    }
    let mut routes = Vec::new();
    for from in ranks {
        for to in ranks {
            if from.rank == to.rank {
                continue;
            }
            let route = select_pair(t, *from, *to, cfg)?;
            tracing::info!(target: "p2p_transport::mode", "{route}: {}", route.reason);
            routes.push(route);
        }
    }
    Ok(routes)
}

fn select_pair(
    t: &Topology,
    from: Endpoint,
    to: Endpoint,
    cfg: &Config,
) -> Result<Route, ModeError> {
    let (a, b) = (from.gpu, to.gpu);
    let impossible = |forced: &'static str, why: String| ModeError::Impossible {
        forced,
        from: from.rank,
        from_gpu: a,
        to: to.rank,
        to_gpu: b,
        why,
    };
    let engine = if cfg.use_copy_engine {
        Engine::CopyEngine
    } else {
        Engine::SmKernel
    };
    let route = |mode: Mode, direction: Direction, link: String, reason: String| Route {
        from,
        to,
        mode,
        direction,
        engine,
        link,
        reason,
    };
    let same_process = from.process == to.process;

    if a == b {
        return match cfg.force_mode {
            None => Ok(route(
                Mode::Local,
                Direction::Write,
                "same GPU".into(),
                "both ranks use one GPU".into(),
            )),
            Some(m) => Err(impossible(
                forced_name(m),
                "both ranks use the same GPU: the copy is local".into(),
            )),
        };
    }
    let link = link_name(t, a, b);
    let direction = match cfg.read {
        Switch::On => Direction::Read,
        Switch::Off => Direction::Write,
        Switch::Auto => {
            let nvlink = matches!(
                t.connection(a, b),
                Connection::NvLink { .. } | Connection::NvSwitch { .. }
            );
            let ampere =
                t.gpus[a].compute_capability[0] >= 8 && t.gpus[b].compute_capability[0] >= 8;
            if nvlink && ampere {
                Direction::Read
            } else {
                Direction::Write
            }
        }
    };
    let p2p = p2p_allowed(t, cfg, a, b);
    let cumem_ok = cfg.cumem
        && [a, b].iter().all(|&g| {
            t.gpus[g].compute_capability[0] >= 6 && t.gpus[g].cumem_posix_fd.unwrap_or(true)
        });
    let via = || {
        if !cfg.intermediate {
            return Err(NoRelay::Disabled);
        }
        t.best_intermediate_where(a, b, |x, y| p2p_allowed(t, cfg, x, y).is_ok())
            .ok_or(NoRelay::NoneUsable)
    };
    let relay_link = |c: usize| {
        format!(
            "{} + {} via GPU {c}",
            link_name(t, a, c),
            link_name(t, c, b)
        )
    };

    match cfg.force_mode {
        Some(ForcedMode::Direct) => {
            if !same_process {
                return Err(impossible(
                    "direct",
                    "the ranks are in different processes: share memory with ipc or cumem".into(),
                ));
            }
            p2p.map_err(|why| impossible("direct", why.to_string()))?;
            Ok(route(
                Mode::DirectPointer,
                direction,
                link,
                "forced by P2P_MODE=direct".into(),
            ))
        }
        Some(m @ (ForcedMode::Ipc | ForcedMode::CuMem)) => {
            p2p.map_err(|why| impossible(forced_name(m), why.to_string()))?;
            if m == ForcedMode::CuMem && !cumem_ok {
                return Err(impossible("cumem", "cuMem POSIX-fd handles are disabled (P2P_CUMEM=0) or unsupported on these GPUs".into()));
            }
            let mode = if m == ForcedMode::Ipc {
                Mode::LegacyIpc
            } else {
                Mode::CuMem
            };
            Ok(route(
                mode,
                direction,
                link,
                format!("forced by P2P_MODE={}", forced_name(m)),
            ))
        }
        Some(ForcedMode::Intermediate) => {
            let c = via().map_err(|why| impossible("intermediate", why.to_string()))?;
            Ok(route(
                Mode::Intermediate { via: c },
                direction,
                relay_link(c),
                "forced by P2P_MODE=intermediate".into(),
            ))
        }
        Some(ForcedMode::HostStaged) => Ok(route(
            Mode::HostStaged,
            Direction::Write,
            link,
            "forced by P2P_MODE=host".into(),
        )),
        None => match p2p {
            Ok(()) if same_process && !cfg.direct_disable => Ok(route(
                Mode::DirectPointer,
                direction,
                link,
                "one process, P2P available".into(),
            )),
            Ok(()) => {
                let why = if same_process {
                    "P2P_DIRECT_DISABLE=1"
                } else {
                    "different processes"
                };
                if cumem_ok {
                    Ok(route(
                        Mode::CuMem,
                        direction,
                        link,
                        format!("{why}; cuMem fds supported and enabled"),
                    ))
                } else {
                    let no = if cfg.cumem {
                        "cuMem fds unsupported"
                    } else {
                        "P2P_CUMEM=0"
                    };
                    Ok(route(
                        Mode::LegacyIpc,
                        direction,
                        link,
                        format!("{why}; {no}: legacy IPC"),
                    ))
                }
            }
            Err(no_p2p) => match via() {
                Ok(c) => Ok(route(
                    Mode::Intermediate { via: c },
                    direction,
                    relay_link(c),
                    format!("no direct P2P ({no_p2p}); GPU {c} has P2P to both"),
                )),
                Err(no_relay) => Ok(route(
                    Mode::HostStaged,
                    Direction::Write,
                    link,
                    format!("no direct P2P ({no_p2p}) and no relay ({no_relay})"),
                )),
            },
        },
    }
}

fn forced_name(m: ForcedMode) -> &'static str {
    match m {
        ForcedMode::Direct => "direct",
        ForcedMode::Ipc => "ipc",
        ForcedMode::CuMem => "cumem",
        ForcedMode::Intermediate => "intermediate",
        ForcedMode::HostStaged => "host",
    }
}

/// One rank per GPU, all in one process: the placement of a single-process communicator.
pub fn one_process(gpus: usize) -> Vec<Endpoint> {
    (0..gpus)
        .map(|g| Endpoint {
            rank: g,
            gpu: g,
            process: 0,
        })
        .collect()
}

/// One rank per GPU, each in its own process.
pub fn process_per_gpu(gpus: usize) -> Vec<Endpoint> {
    (0..gpus)
        .map(|g| Endpoint {
            rank: g,
            gpu: g,
            process: g as u32,
        })
        .collect()
}
