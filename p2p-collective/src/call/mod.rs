//! A call's way through a [`Communicator`], one direction, each stage a typed value handed to
//! the next:
//!
//! 1. **check** (`check.rs`): the call and its buffers in, a [`Checked`](check::Checked) out
//!    (regions, lengths, in place or not, alignment, which buffers lie in registered windows);
//! 2. **plan** (`crate::plan`): the call and what its buffers are in, a
//!    [`Plan`](crate::plan::Plan) out (algorithm, protocol, kernel, grid, pieces);
//! 3. **launch**: the plan in, queued work out, by the kernel (`kernel.rs`) or by the copy
//!    engines (`copy_engine.rs`).
//!
//! Nothing is queued before the check passes; an error while queueing aborts the
//! communicator, since the peers may already wait for this rank's work.

use p2p_mem::Stream;

use crate::comm::Communicator;
use crate::error::Result;
use crate::plan::{Planner, Proto};
use crate::types::Call;

pub(crate) mod check;
mod copy_engine;
mod kernel;
mod region;

pub(crate) use check::Buffers;
pub(crate) use region::Region;

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
        "{} {} {} x {}: {} by {}, {} blocks of {} threads x {} chunks ({}){}{}",
        call.op,
        call.dtype,
        call.count,
        call.dtype.size(),
        plan.route(),
        plan.entry,
        plan.grid,
        plan.threads,
        plan.chunks,
        plan.reason,
        plan.refused
            .map(|why| format!("; the forced choice cannot run it: {why}"))
            .unwrap_or_default(),
        if plan.own_by_copy_engine && !checked.partial {
            "; own part by the copy engine beside the kernel (out of place, large)"
        } else {
            ""
        }
    );
    let queued = match plan.proto {
        Proto::CopyEngine => copy_engine::launch(comm, call, &checked, &plan, stream),
        Proto::Ll | Proto::Simple => kernel::launch(comm, call, &checked, &plan, stream),
    };
    if plan.uses_windows() {
        // It reads or writes the peers' registered buffers: what deregister waits for. (After
        // a copy-engine plan's join, the side stream's copies are behind it on `stream` too.)
        comm.windows.calls.queued(comm.rank, stream);
    }
    comm.health
        .abort_on_error(comm.rank, call.op.name(), queued)
}
