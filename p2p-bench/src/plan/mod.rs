//! `p2p-bench plan`: what p2p does for each collective and size on a machine, and why.
//!
//! The view asks the same planner a communicator asks ([`p2p_collective::plan::Planner`]), with
//! the machine's world size, SM count and the settings of the environment (`P2P_ALGO`,
//! `P2P_PROTO`, `P2P_CHECK`), and the transport's mode selection ([`p2p_transport::mode`]) for
//! how each pair of GPUs is reached. On a machine with GPUs it shows that machine; with none, a
//! reference machine built into the tool ([`p2p_transport::topo::reference`]), 4 x H200 behind
//! an NVSwitch unless another is named, where the figures p2p and NCCL measured there stand
//! beside each plan.
//!
//! ```
//! use p2p_bench::plan::{self, Options};
//! let machine = plan::Machine::reference("h200x4-nvswitch").unwrap();
//! let report = plan::run(&Options::new(machine)).unwrap();
//! assert_eq!(report.world, 4);
//! assert!(report.rows.iter().all(|r| !r.route.is_empty()));
//! ```

mod measured;
pub mod model;
mod table;
#[cfg(test)]
mod tests;

use p2p_collective::plan::{Access, Forced, Planner, Proto, Tuning, TuningError};
use p2p_collective::{Call, DataType, Op};
use p2p_transport::config::Config;
use p2p_transport::mode;
use p2p_transport::topo::{reference, Topology};
use serde::Serialize;

pub use measured::{Measured, Sample};
pub use table::render;

/// The machine a plan is made for.
#[derive(Debug, Clone)]
pub struct Machine {
    /// How the view names it: a reference machine's name, a file, or `this machine`.
    pub name: String,
    /// Its GPUs and how they are joined.
    pub topology: Topology,
    /// The figures measured on it, where the tool has them (the default reference machine).
    pub measured: Option<&'static [Sample]>,
}

impl Machine {
    /// The reference machine `name` ([`reference::names`] lists them), or why not.
    pub fn reference(name: &str) -> Result<Machine, PlanError> {
        let topology = reference::machine(name)
            .ok_or_else(|| PlanError::UnknownMachine(name.to_string()))?
            .map_err(|e| PlanError::Topology(name.to_string(), e.to_string()))?;
        Ok(Machine {
            name: name.to_string(),
            topology,
            measured: (name == reference::DEFAULT).then(measured::h200x4),
        })
    }

    /// SMs per GPU, the fewest of its first `ranks` GPUs (what every rank's tuning is made for).
    pub fn sm_count(&self, ranks: usize) -> i32 {
        let gpus = &self.topology.gpus;
        gpus[..ranks.min(gpus.len())]
            .iter()
            .map(|g| g.sm_count)
            .min()
            .unwrap_or(1)
    }

    /// A machine from its topology (found here, or loaded from a file), with nothing measured.
    pub fn from_topology(name: impl Into<String>, topology: Topology) -> Machine {
        Machine {
            name: name.into(),
            topology,
            measured: None,
        }
    }
}

/// What to plan.
#[derive(Debug, Clone)]
pub struct Options {
    /// The machine.
    pub machine: Machine,
    /// Ranks, one per GPU from the first (default: every GPU of the machine).
    pub gpus: Option<usize>,
    /// The collectives (default: all six).
    pub ops: Vec<Op>,
    /// Sizes from this many bytes (the whole buffer, as `p2p-bench coll` and nccl-tests count
    /// them: all-gather, reduce-scatter and all-to-all split it into the ranks' parts; a size
    /// too small for one element a part gives no row)...
    pub min_bytes: usize,
    /// ... to this many...
    pub max_bytes: usize,
    /// ... each this many times the one before.
    pub factor: usize,
    /// Every rank's buffers registered (`Communicator::register`).
    pub registered: bool,
    /// In place.
    pub in_place: bool,
    /// The planner's knobs; `None`: the defaults for the machine's GPUs.
    pub tuning: Option<Tuning>,
    /// What the environment forces (`P2P_ALGO`, `P2P_PROTO`) and checking mode (`P2P_CHECK`).
    pub forced: Forced,
    /// Checking mode.
    pub check: bool,
    /// The transport's settings (`P2P_*` as [`crate::settings::check`] read them): forced
    /// modes and disabled paths change how the pairs are reached.
    pub transport: Config,
}

impl Options {
    /// Every collective from 8 B to 1 GiB by 8, plain buffers out of place, the defaults.
    pub fn new(machine: Machine) -> Options {
        Options {
            machine,
            gpus: None,
            ops: Op::ALL.to_vec(),
            min_bytes: 8,
            max_bytes: 1 << 30,
            factor: 8,
            registered: false,
            in_place: false,
            tuning: None,
            forced: Forced::AUTO,
            check: false,
            transport: Config::default(),
        }
    }
}

/// Why there is no plan to show.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// No reference machine of that name.
    #[error("no reference machine {0:?}; the reference machines: {names}", names = reference::names().collect::<Vec<_>>().join(", "))]
    UnknownMachine(String),
    /// A topology that does not load.
    #[error("{0}: {1}")]
    Topology(String, String),
    /// More ranks than the machine has GPUs, or none.
    #[error("--gpus {asked}: {name} has {has} GPU(s); give 1 to {has}")]
    Gpus {
        /// Asked for.
        asked: usize,
        /// The machine.
        name: String,
        /// Its GPUs.
        has: usize,
    },
    /// Sizes that give no row.
    #[error("sizes: --min-bytes {min} to {max} bytes by a factor of {factor} give no size; the factor must be 2 or more and the range not empty")]
    Sizes {
        /// Smallest.
        min: usize,
        /// Largest.
        max: usize,
        /// Factor.
        factor: usize,
    },
    /// Knobs a communicator would refuse.
    #[error("the planner's knobs: {0}")]
    Tuning(#[from] TuningError),
    /// The transport could not reach every pair (a forced mode that cannot work there).
    #[error("the transport: {0}")]
    Mode(#[from] mode::ModeError),
}

/// The plan of one call.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The collective (`all_reduce`, ...).
    pub op: &'static str,
    /// Bytes (the element count times 4: f32).
    pub bytes: usize,
    /// Algorithm and protocol, e.g. `oneshot/ll`.
    pub route: String,
    /// What moves the bytes between GPUs: `SMs` or `copy engines`.
    pub engine: &'static str,
    /// Blocks in the grid.
    pub blocks: u32,
    /// SMs the call's kernel occupies while it runs (its blocks at the tuning's blocks per SM);
    /// the rest of the GPU's SMs stay free for the caller's kernels.
    pub sms: u32,
    /// Rounds over the data.
    pub chunks: u64,
    /// Whether the chunks' steps overlap.
    pub overlap: bool,
    /// Barrier steps a block takes.
    pub steps: u64,
    /// Why the planner chose it.
    pub reason: &'static str,
    /// Where a forced algorithm or protocol could not run the call: why.
    pub refused: Option<&'static str>,
    /// The cost model's microseconds for this plan on this machine ([`model::modelled_us`]);
    /// `None` with one rank.
    pub model_us: Option<f64>,
    /// What was measured for this call on this machine, where the tool has it.
    pub measured: Option<Measured>,
}

/// The plan view of a machine.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The machine's name.
    pub machine: String,
    /// Where its topology came from (`recorded by ...`, `model: ...`).
    pub source: String,
    /// The GPUs' name (the first GPU's) and SMs (the fewest of any).
    pub gpu: String,
    /// SMs per GPU, the fewest of any.
    pub sm_count: i32,
    /// Ranks.
    pub world: usize,
    /// Buffers registered.
    pub registered: bool,
    /// In place.
    pub in_place: bool,
    /// How each ordered pair of GPUs is reached, one line per kind, with how many pairs.
    pub links: Vec<(String, usize)>,
    /// The planner's knobs in use.
    pub tuning: String,
    /// The rates the cost model used (`None` with one rank).
    pub model: Option<model::Rates>,
    /// Every call planned.
    pub rows: Vec<Row>,
}

/// Plans every call `opts` asks for.
pub fn run(opts: &Options) -> Result<Report, PlanError> {
    let t = &opts.machine.topology;
    let has = t.gpus.len();
    let world = opts.gpus.unwrap_or(has);
    if world == 0 || world > has {
        return Err(PlanError::Gpus {
            asked: world,
            name: opts.machine.name.clone(),
            has,
        });
    }
    let sizes = sizes(opts.min_bytes, opts.max_bytes, opts.factor).ok_or(PlanError::Sizes {
        min: opts.min_bytes,
        max: opts.max_bytes,
        factor: opts.factor,
    })?;
    let sm_count = opts.machine.sm_count(world);
    // A communicator takes two blocks per SM where the kernel's occupancy allows it, which
    // the shipped kernels reach on every GPU they are built for ("Grid and blocks per SM").
    let tuning = opts
        .tuning
        .unwrap_or_else(|| Tuning::for_device(sm_count, 2));
    tuning.validate(tuning.max_blocks, world)?;
    let planner = Planner::new(world, opts.forced, opts.check, tuning);
    let blocks_per_sm = tuning.max_blocks.div_ceil(sm_count.max(1) as u32).max(1);
    let links = links(t, world, &opts.transport)?;
    let rates = model::Rates::of(t, world);
    // Measured figures belong to the machine's defaults: with other knobs, a forced path or
    // checking mode, or fewer ranks, they would stand beside a different plan.
    let measured = opts
        .measured_applies(world)
        .then_some(opts.machine.measured)
        .flatten();
    let mut rows = Vec::new();
    for &op in &opts.ops {
        for &bytes in &sizes {
            // As `p2p-bench coll` (and nccl-tests) count a size: the whole buffer, split into
            // the ranks' parts where the call takes one part a rank.
            let Some(crate::coll::SizedCall { count, bytes, .. }) =
                crate::coll::sized(op, DataType::F32, bytes, world)
            else {
                continue;
            };
            let call = Call::new(op, DataType::F32, count);
            let access = Access {
                input: opts.registered,
                output: opts.registered,
                in_place: opts.in_place,
                // Buffers from the allocator lie on 256-byte boundaries; a part is off a
                // 16-byte one where the count's bytes are (as the communicator's check finds).
                unaligned: bytes % 16 != 0,
            };
            let plan = planner.plan(&call, access);
            rows.push(Row {
                op: op.name(),
                bytes,
                route: plan.route(),
                engine: if plan.proto == Proto::CopyEngine {
                    "copy engines"
                } else {
                    "SMs"
                },
                blocks: plan.grid,
                sms: plan
                    .grid
                    .div_ceil(blocks_per_sm)
                    .min(sm_count.max(1) as u32),
                chunks: plan.chunks,
                overlap: plan.overlap,
                steps: plan.steps(world),
                reason: plan.reason,
                refused: plan.refused,
                model_us: rates.map(|r| model::modelled_us(&plan, bytes, r)),
                measured: measured.and_then(|m| measured::find(m, op.name(), bytes)),
            });
        }
    }
    Ok(Report {
        machine: opts.machine.name.clone(),
        source: t.source.clone(),
        gpu: t.gpus[0].name.clone(),
        sm_count,
        world,
        registered: opts.registered,
        in_place: opts.in_place,
        links,
        tuning: format!("{tuning:?}"),
        model: rates,
        rows,
    })
}

impl Options {
    /// Whether the machine's measured figures were taken under this plan's conditions.
    fn measured_applies(&self, world: usize) -> bool {
        world == self.machine.topology.gpus.len()
            && self.tuning.is_none()
            && self.forced == Forced::AUTO
            && !self.check
            && !self.in_place
    }
}

/// `min`, `min x factor`, ... up to `max`; `None` where that is no size.
fn sizes(min: usize, max: usize, factor: usize) -> Option<Vec<usize>> {
    (factor >= 2 && min > 0 && min <= max).then(|| crate::coll::sizes(min, max, factor))
}

/// How each ordered pair of the first `world` GPUs is reached, one process per GPU (as
/// torchrun starts them), grouped: the mode and link, and how many pairs take it.
fn links(t: &Topology, world: usize, cfg: &Config) -> Result<Vec<(String, usize)>, PlanError> {
    let routes = mode::select(t, &mode::process_per_gpu(world), cfg)?;
    let mut kinds: Vec<(String, usize)> = Vec::new();
    for r in routes {
        let how = r.how();
        match kinds.iter_mut().find(|(k, _)| *k == how) {
            Some((_, n)) => *n += 1,
            None => kinds.push((how, 1)),
        }
    }
    Ok(kinds)
}
