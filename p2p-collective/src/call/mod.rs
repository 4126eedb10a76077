//! A call's way through a [`Communicator`], one direction, each stage a typed value handed to
//! the next:
//!
//! 1. **check** (`check.rs`): the call and its buffers in, a [`Checked`](check::Checked) out
//!    (regions, lengths, in place or not, alignment, which buffers lie in registered windows);
//! 2. **plan** (`crate::plan`): the call and what its buffers are in, a
//!    [`Plan`](crate::plan::Plan) out (algorithm, protocol, kernel, grid, pieces);
//! 3. **launch**: the plan in, its work (`comm::launcher::Work`: kernels, copies, flag writes,
//!    on which stream) out, from the kernel's arguments (`args.rs`) by the kernel
//!    (`kernel.rs`) or by the copy engines (`copy_engine.rs`), then queued in one place
//!    (`Launcher::queue_work`).
//!
//! Nothing is queued before the check passes; an error while queueing aborts the
//! communicator, since the peers may already wait for this rank's work.

use p2p_mem::Stream;

use crate::comm::launcher::{Launcher, Work};
use crate::comm::Communicator;
use crate::error::Result;
use crate::plan::{Plan, Planner, Proto};
use crate::types::Call;

mod args;
pub(crate) mod check;
mod copy_engine;
mod kernel;
mod region;

pub(crate) use check::Buffers;
pub(crate) use region::Region;

/// A call checked and planned: what the launch takes.
pub(super) struct Planned<'a> {
    pub(super) comm: &'a Communicator,
    pub(super) call: &'a Call,
    pub(super) checked: check::Checked<'a>,
    pub(super) plan: Plan,
}

/// Checks, plans and launches `call` on `comm` with `buffers` on `stream`.
pub(crate) fn queue(
    comm: &Communicator,
    call: &Call,
    buffers: Buffers<'_>,
    stream: &Stream,
) -> Result<()> {
    let Some(checked) = check::check(comm, call, buffers, stream)? else {
        return Ok(());
    };
    let plan = Planner::plan(&comm.planner, call, checked.access);
    tracing::debug!(
        rank = comm.rank,
        "{} {} {} x {}: {} by {}, {} blocks of {} threads x {} chunks{} ({}){}{}",
        call.op,
        call.dtype,
        call.count,
        call.dtype.size(),
        plan.route(),
        plan.entry,
        plan.grid,
        plan.threads,
        plan.chunks,
        if plan.overlap {
            ", steps overlapped (at least overlap_min_bytes a source)"
        } else {
            ""
        },
        plan.reason,
        plan.refused
            .map(|why| format!("; the forced choice cannot run it: {why}"))
            .unwrap_or_default(),
        if plan.own_by_copy_engine {
            "; own part by the copy engine beside the kernel (out of place, large)"
        } else {
            ""
        }
    );
    let uses_windows = plan.uses_windows();
    let planned = Planned {
        comm,
        call,
        checked,
        plan,
    };
    let prepared = args::prepare(&planned);
    let mut work = Work::new(prepared.args);
    let built = match planned.plan.proto {
        Proto::CopyEngine => copy_engine::copy_work(&planned, prepared.own, &mut work),
        Proto::Ll | Proto::Simple => kernel::kernel_work(&planned, prepared.own, &mut work),
    };
    let queued = built.and_then(|()| {
        // SAFETY: `work` holds the checked call's buffers (their lengths checked against the
        // plan: `check`), the ranks' workspaces (alive while the communicator is) and the
        // registered windows of its buffers (mapped while registered), each range inside its
        // memory as `args.rs`, `kernel.rs` and `copy_engine.rs` say where they derive it.
        #[allow(unsafe_code)]
        unsafe {
            Launcher::queue_work(&comm.launcher, &work, stream)
        }
    });
    if uses_windows {
        // It reads or writes the peers' registered buffers: what deregister waits for. (After
        // a copy-engine plan's join, the side stream's copies are behind it on `stream` too.)
        comm.windows.calls.queued(comm.rank, stream);
    }
    comm.health
        .abort_on_error(comm.rank, call.op.name(), queued)
}
