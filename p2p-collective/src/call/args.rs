//! What both launches start from: the kernels' argument block of a planned call, and where its
//! own part would be copied from and to.

use crate::abi::CollArgs;
use crate::types::Op;

use super::Planned;

/// A planned call's kernel arguments and own part.
pub(super) struct Prepared {
    /// The argument block of its kernels.
    pub(super) args: CollArgs,
    /// The copy of this rank's own part of an out-of-place all-gather or all-to-all (its input;
    /// part `rank` of an all-to-all's input) into part `rank` of its output: `(dst, src,
    /// bytes)`. The check found the input and output long enough for the call (an
    /// all-to-all's input and output and an all-gather's output hold `world` parts of `bytes`,
    /// an all-gather's input one), so both ranges lie inside them; apart only when the call is
    /// out of place.
    pub(super) own: (u64, u64, usize),
}

/// The argument block and own part of `planned`.
pub(super) fn prepare(planned: &Planned<'_>) -> Prepared {
    let Planned {
        comm,
        call,
        checked,
        plan,
    } = planned;
    let (input, output) = (checked.args.input, checked.args.output);
    let tuning = comm.tuning();
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
        redop: call.effective_redop().code(),
        rank: comm.rank as i32,
        nranks: comm.world as i32,
        root: call.effective_root() as i32,
        check: comm.options.check as i32,
        code: plan.code() as i32,
        own_done: plan.own_by_copy_engine as i32,
        overlap: plan.overlap as i32,
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
    let seg = call.count * call.dtype.size();
    let mine = (comm.rank * seg) as u64;
    let src = match call.op {
        Op::AllToAll => input.ptr + mine,
        _ => input.ptr,
    };
    Prepared {
        args,
        own: (output.ptr + mine, src, seg),
    }
}
