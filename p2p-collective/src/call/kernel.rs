//! The launch of a plan whose kernel moves the data (every protocol but the copy engines'): the
//! kernel's argument block, the one launch, and for an out-of-place all-gather or all-to-all
//! through the scratch of a large size, this rank's own part copied by the copy engine beside
//! the kernel.

use p2p_mem::Stream;

use crate::abi::CollArgs;
use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::plan::{Plan, Proto};
use crate::types::{Call, Op, RedOp};

use super::check::Checked;

/// Launches the kernel of `plan` for `call` on `stream`.
pub(super) fn launch(
    comm: &Communicator,
    call: &Call,
    checked: &Checked<'_>,
    plan: &Plan,
    stream: &Stream,
) -> Result<()> {
    debug_assert!(plan.proto != Proto::CopyEngine, "{plan:?}");
    // LL runs one 8-byte unit per thread: a piece larger than the block would drop units.
    debug_assert!(
        plan.proto != Proto::Ll || plan.piece <= plan.threads as u64,
        "{plan:?}"
    );
    let mut args = args(comm, call, checked, plan);
    // A partial overlap (undefined; only unsafe code makes one) keeps the kernel's copy.
    if !plan.own_by_copy_engine || checked.partial {
        return comm.launcher.launch(
            plan.entry,
            plan.kernel_type,
            (plan.grid, plan.threads),
            &args,
            stream,
        );
    }
    // The kernel neither reads the destination of the own part nor writes its source.
    args.own_done = 1;
    let side = comm.launcher.fork(stream)?;
    // The fork orders the copy after the caller's earlier work on `stream`.
    let queued = copy_own_part(comm, call, checked, side).and_then(|()| {
        comm.launcher.launch(
            plan.entry,
            plan.kernel_type,
            (plan.grid, plan.threads),
            &args,
            stream,
        )
    });
    // Joined whatever happened, so that `stream` waits for the copy and a capture ends with its
    // fork joined.
    let joined = comm.launcher.join(stream);
    queued.and(joined)
}

/// The argument block of `plan`'s kernels for `call` on `comm`.
pub(super) fn args(
    comm: &Communicator,
    call: &Call,
    checked: &Checked<'_>,
    plan: &Plan,
) -> CollArgs {
    let (input, output) = (checked.args.input, checked.args.output);
    let tuning = comm.tuning();
    let redop = if call.op.reduces() {
        call.redop
    } else {
        RedOp::Sum
    };
    let mut args = CollArgs {
        input: input.ptr,
        output: output.ptr,
        abort_flag: comm.health.abort.device_ptr(),
        count: plan.units,
        piece: plan.piece,
        sub: plan.sub,
        slot_bytes: tuning.slot_bytes() as u64,
        stride: tuning.piece_bytes as u64,
        timeout_ns: comm
            .options
            .timeout
            .min(crate::settings::MAX_TIMEOUT)
            .as_nanos() as u64,
        sig: plan.sig,
        op: call.op.code(),
        redop: redop.code(),
        rank: comm.rank as i32,
        nranks: comm.world as i32,
        root: if call.op.rooted() {
            call.root as i32
        } else {
            0
        },
        check: comm.options.check as i32,
        code: plan.code() as i32,
        ..CollArgs::default()
    };
    for r in 0..comm.world {
        args.sync[r] = comm.workspace.sync(r);
        args.scratch[r] = comm.workspace.scratch(r);
    }
    if plan.uses_windows() {
        args.peer_in = checked.peer_in.unwrap_or_default();
        args.peer_out = checked.peer_out.unwrap_or_default();
    }
    args
}

/// Queues on `side` the copy of this rank's own part of an out-of-place all-gather or
/// all-to-all (its input; part `rank` of an all-to-all's input) into part `rank` of its
/// output.
pub(super) fn copy_own_part(
    comm: &Communicator,
    call: &Call,
    checked: &Checked<'_>,
    side: &Stream,
) -> Result<()> {
    let (input, output) = (checked.args.input, checked.args.output);
    let seg = (call.count * call.dtype.size()) as u64;
    let mine = comm.rank as u64 * seg;
    let src = match call.op {
        Op::AllToAll => input.ptr + mine,
        _ => input.ptr,
    };
    // SAFETY: the check found the input and output long enough for the call (an all-to-all's
    // input and output and an all-gather's output hold `world` parts of `seg` bytes, an
    // all-gather's input one), so both ranges lie inside them; they do not overlap (the own
    // part is copied only out of place, never for a partial overlap).
    #[allow(unsafe_code)]
    let copied = unsafe { p2p_mem::copy_async(output.ptr + mine, src, seg as usize, side) };
    copied.map_err(Error::from)
}
