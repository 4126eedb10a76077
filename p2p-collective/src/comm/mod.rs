//! Communicators: one rank's state, grouped by concern, and the methods of each concern in a
//! room of its own.
//!
//! Every rank owns one workspace (`workspace.rs`): a sync area (flags, per-block step
//! counters, the failure record) and a scratch area that peers push data into, and it holds
//! every peer's workspace as its own GPU addresses it, mapped by the transport's peer layer
//! (`p2p_transport::peer`): a plain pointer with peer access (one process driving several
//! GPUs), a cuMem fd or legacy IPC mapping (one process per GPU), or pinned host memory shared
//! by every rank (host-staged, where GPUs have no P2P).
//!
//! | room | what it holds |
//! | --- | --- |
//! | `mod.rs` | [`Communicator`] and [`Options`], its [`Collectives::queue`], the accessors, the plan of a call, `Drop` |
//! | `init.rs` | making communicators: in one process, or one per GPU through the rendezvous |
//! | `workspace.rs` | the workspaces: this rank's, the peers' mappings, their layout |
//! | `health.rs` | aborting, synchronising with a deadline, what a failed call reports |
//! | `launcher.rs` | launching kernels, and the second stream of the copy-engine plans |
//! | `kernels.rs` | the collective program and its kernels, loaded once per GPU |
//! | `windows.rs` | registered buffers (symmetric windows) and the bounded deregister |
//! | `split.rs` | splitting a communicator into smaller ones |
//!
//! A call runs through `crate::call` (check, plan, launch) and never blocks the host, so it can
//! be captured in a CUDA graph. Calls on one communicator must be ordered on the GPU: use one
//! stream per rank (or order streams with events). Two calls on the same communicator running
//! at once would share step counters.

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use p2p_mem::{Device, Stream};
use p2p_transport::config::Config;
use p2p_transport::peer::Sharing;
use p2p_transport::rendezvous::{Group, Rendezvous};

use crate::call::queue;
use crate::collectives::{CallBuffers, Collectives};
use crate::error::{Error, Result};
use crate::plan::{Access, Forced, Plan, Planner, Tuning, MAX_RANKS};
use crate::settings::Settings;
use crate::types::Call;

mod health;
mod init;
pub(crate) mod kernels;
pub(crate) mod launcher;
mod split;
#[cfg(test)]
mod tests;
mod windows;
pub(crate) mod workspace;

pub(crate) use health::Health;
pub(crate) use init::local_device;
pub use kernels::{kernel_name, COLL, COLL_PARTS, KERNEL_ARGS_BYTES, SHIPPED};
pub(crate) use launcher::Launcher;
pub use windows::Registration;
pub(crate) use windows::Windows;
pub(crate) use workspace::Workspace;

/// How far past the communicator's time limit [`Communicator::synchronize`] waits for its
/// stream: every call of ours ends by its time limit, and an aborted one within milliseconds.
pub const SYNC_GRACE: Duration = p2p_mem::DRAIN_GRACE;

/// How a communicator behaves; [`Options::from_env`] reads the `P2P_*` settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// An algorithm, a protocol or both forced (`P2P_ALGO`, `P2P_PROTO`): every call they can
    /// run runs with them; the others as planned, with the reason logged ([`Forced`]).
    pub forced: Forced,
    /// Check on the GPU that every rank made the same call (operation, algorithm, protocol,
    /// type, reduction, root, count); a mismatch fails with [`Error::Mismatch`] on every rank,
    /// naming both calls. The stepped kernels and the copy engines' barrier carry 16 bits of
    /// the call's signature in each step signal and the whole one in a store beside it; LL's
    /// lines carry none, so it turns LL off ([`Planner::new`]). Every rank must agree on it.
    /// (Where the copy engines run, a mismatch found at their first barrier still lets the
    /// queued copies run, inside the registered buffers.)
    pub check: bool,
    /// How long a kernel waits for a peer before giving up.
    pub timeout: Duration,
    /// Planner knobs (`None`: the defaults for the GPU).
    pub tuning: Option<Tuning>,
    /// The transport's settings: how ranks reach each other's memory (`P2P_DISABLE`,
    /// `P2P_MODE`, `P2P_CUMEM`; see [`p2p_transport::peer::choose`]).
    pub transport: Config,
}

impl Options {
    /// From the collectives' settings (`P2P_ALGO`, `P2P_PROTO`, `P2P_CHECK`, `P2P_TIMEOUT_MS`)
    /// and the transport's configuration.
    pub fn from_settings(settings: Settings, transport: Config) -> Options {
        Options {
            forced: settings.forced,
            check: settings.check,
            timeout: settings.timeout,
            tuning: None,
            transport,
        }
    }

    /// From the process environment: a bad value is an error; an unknown `P2P_*` variable is
    /// a warning naming it (`p2p-bench` refuses it instead).
    pub fn from_env() -> Result<Options> {
        Ok(Self::from_settings(
            Settings::from_env()?,
            Config::from_env_lenient()?,
        ))
    }
}

impl Default for Options {
    fn default() -> Self {
        Self::from_settings(Settings::default(), Config::default())
    }
}

/// One rank of a communicator.
///
/// Made by [`Communicator::init_all`] (one process, several GPUs: one handle per rank) or
/// [`Communicator::init`] / [`Communicator::from_env`] (one process per GPU). Its calls are
/// NCCL's (all-reduce, broadcast, ...: the trait [`Collectives`]; send/recv in
/// [`p2p`](crate::p2p)), each asynchronous on the stream it is given;
/// [`synchronize`](Self::synchronize) waits and reports a stalled, aborted or mismatched call
/// as an error.
pub struct Communicator {
    pub(crate) rank: usize,
    pub(crate) world: usize,
    pub(crate) device: Device,
    pub(crate) options: Options,
    /// How every call is planned: the world size, what is forced, the tuning (already divided
    /// among the ranks that share a GPU).
    pub(crate) planner: Planner,
    /// The most ranks of this communicator on any one GPU (1 unless ranks share a GPU): each
    /// rank's grids are sized to fit beside the others' ([`Tuning::shared_by`]).
    pub(crate) share: usize,
    /// How the ranks reach each other's workspaces (the peer layer's choice).
    pub(crate) sharing: Sharing,
    /// Whether the communicator is usable, and how it stops.
    pub(crate) health: Health,
    /// The kernels and the second stream every call launches with.
    pub(crate) launcher: Launcher,
    /// Registered buffers (symmetric windows): calls on them read and write peers directly.
    pub(crate) windows: Windows,
    /// The other processes of the job (process-per-GPU communicators).
    pub(crate) job: Option<Job>,
    // Freed last: the peers' workspaces, then this rank's.
    pub(crate) workspace: Workspace,
}

/// A process-per-GPU communicator's job: the other processes, and how this rank joined.
pub(crate) struct Job {
    /// Exchanges and liveness.
    pub(crate) group: Group,
    /// What a split derives its child's rendezvous from.
    pub(crate) rendezvous: Rendezvous,
    /// Splits made so far: every rank splits in the same order, so the count names the split.
    pub(crate) splits: AtomicU64,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("device", &self.device.ordinal())
            .field("options", &self.options)
            .finish()
    }
}

fn check_world(world: usize) -> Result<()> {
    if world == 0 || world > MAX_RANKS {
        return Err(Error::InvalidArgument {
            op: "init",
            rank: 0,
            what: format!("a communicator has 1 to {MAX_RANKS} ranks, not {world}"),
        });
    }
    Ok(())
}

/// The NCCL-shaped calls ([`Collectives`]): each runs through `crate::call` (check, plan,
/// launch). Buffers or ranks' parts off a 16-byte boundary take kernels that realign their
/// copies.
impl Collectives for Communicator {
    fn queue(&self, call: &Call, buffers: CallBuffers<'_>, stream: &Stream) -> Result<()> {
        queue(self, call, buffers.given(), stream)
    }
}

impl Communicator {
    /// How the ranks reach each other's memory: plain pointers (one process), cuMem fds or
    /// legacy IPC (one process per GPU), or host-staged (no P2P). Logged at init with why.
    pub fn sharing(&self) -> Sharing {
        self.sharing
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// How many ranks.
    pub fn world_size(&self) -> usize {
        self.world
    }

    /// This rank's GPU.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The options in force.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// The most ranks of this communicator on any one GPU: 1 unless ranks share a GPU, when
    /// each rank's grids hold a 1/n share of the GPU's resident blocks ([`Tuning::shared_by`];
    /// [`tuning`](Self::tuning) is already divided).
    pub fn ranks_per_gpu(&self) -> usize {
        self.share
    }

    /// The planner's knobs.
    pub fn tuning(&self) -> &Tuning {
        &self.planner.tuning
    }

    /// How a call on plain (unregistered) buffers would run (algorithm, protocol, grid,
    /// pieces), without running it.
    pub fn plan(&self, call: &Call) -> Plan {
        self.plan_with(call, Access::NONE)
    }

    /// How a call would run with the buffers `access` describes (registered or not). A count
    /// of 0, which runs nothing, plans as 1.
    pub fn plan_with(&self, call: &Call, access: Access) -> Plan {
        let call = Call {
            count: call.count.max(1),
            ..*call
        };
        self.planner.plan(&call, access)
    }
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // Kernels still running may write into peers' workspaces or wait on them: let them end
        // (at worst at their time limit), then let every process get here before memory goes.
        // Every wait has a deadline: past the time limit the calls are aborted; if the device is
        // still busy after that (someone else's endless kernel), the memory is leaked rather
        // than freed under a running kernel.
        let limit = self.options.timeout + Duration::from_secs(2);
        let t = std::time::Instant::now();
        let idle = wait_idle(&self.device, limit)
            || {
                tracing::error!(
                rank = self.rank,
                "GPU {} still busy {limit:?} after the communicator was dropped: aborting its calls",
                self.device.ordinal()
            );
                self.health.abort.abort_because(
                    self.rank,
                    "the communicator was dropped while its calls still ran",
                );
                wait_idle(&self.device, Duration::from_secs(5))
            };
        if !idle {
            tracing::error!(
                rank = self.rank,
                "GPU {} is still busy: leaking this rank's workspace and its peer mappings rather than freeing memory a kernel may use",
                self.device.ordinal()
            );
            self.workspace.leak();
        }
        tracing::debug!(
            rank = self.rank,
            "dropping the communicator: GPU {} {} after {:?}",
            self.device.ordinal(),
            if idle { "idle" } else { "still busy" },
            t.elapsed()
        );
        if let Some(job) = &self.job {
            // Fails at once if a rank is known to have failed.
            if let Err(e) = job.group.barrier() {
                tracing::warn!(rank = self.rank, "the closing barrier failed: {e}");
            }
        }
    }
}

/// Waits until `device` has no work left, at most `limit`: whether it got there. Polls an
/// event that holds all of the device's queued work ([`Device::synchronize_within`]; on a
/// CUDA 12.4 driver, a helper thread).
fn wait_idle(device: &Device, limit: Duration) -> bool {
    match device.synchronize_within(limit) {
        Ok(idle) => idle,
        Err(e) => {
            // A sticky CUDA error: nothing more will run on this context.
            tracing::error!("synchronising GPU {} before freeing: {e}", device.ordinal());
            true
        }
    }
}
