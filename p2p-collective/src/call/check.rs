//! The first stage of a call: its arguments checked, in, and what the planner and the launch
//! need to know of its buffers, out ([`Checked`]). Nothing is queued before this passes, so a
//! refused call leaves every rank as it was.
//!
//! [`check_args`] is what every communicator type checks (element types, streams, the root,
//! the count, the lengths, devices and alignment of the buffers); [`check`] adds what a
//! [`Communicator`]'s kernels need: the communicator usable on the stream's GPU, which
//! buffers lie in registered windows, whether the call is in place, and whether a part or a
//! buffer lies off a 16-byte boundary.

use p2p_mem::{Device, DeviceMemory, Stream};

use crate::comm::Communicator;
use crate::error::{Error, Result};
use crate::plan::{Access, MAX_RANKS};
use crate::types::{Call, DataType, Op};

pub(crate) use super::region::Region;

/// A call's buffers as its caller gave them.
#[derive(Clone, Copy)]
pub(crate) enum Buffers<'a> {
    /// Out of place: reads `send`, writes `recv`.
    Apart {
        send: &'a dyn DeviceMemory,
        recv: &'a dyn DeviceMemory,
    },
    /// In place in one buffer, as NCCL defines it.
    InPlace(&'a dyn DeviceMemory),
    /// The input and output regions, whose memory was checked when a group took the call.
    Regions(Region<'a>, Region<'a>),
}

/// Which rank a call runs on, of how many, on which GPU: what its arguments are checked
/// against.
pub(crate) struct Shape<'a> {
    pub(crate) rank: usize,
    pub(crate) world: usize,
    pub(crate) device: &'a Device,
}

impl<'a> Shape<'a> {
    /// The shape of `comm`'s rank.
    pub(crate) fn of(comm: &'a Communicator) -> Shape<'a> {
        Shape {
            rank: comm.rank,
            world: comm.world,
            device: comm.device(),
        }
    }
}

/// A call whose arguments passed [`check_args`]: its regions and their lengths in elements.
#[derive(Clone, Copy)]
pub(crate) struct Args<'a> {
    pub(crate) input: Region<'a>,
    pub(crate) output: Region<'a>,
    pub(crate) in_len: usize,
    pub(crate) out_len: usize,
}

/// A call a [`Communicator`] can plan and launch: its arguments, and what its buffers are.
pub(crate) struct Checked<'a> {
    pub(crate) args: Args<'a>,
    /// What the planner knows of the buffers.
    pub(crate) access: Access,
    /// Every rank's input, as this GPU addresses it, where the input lies in a window.
    pub(crate) peer_in: Option<[u64; MAX_RANKS]>,
    /// Every rank's output, likewise.
    pub(crate) peer_out: Option<[u64; MAX_RANKS]>,
}

/// Refuses `op` on `comm` unless the communicator is usable (not aborted, no failure recorded)
/// and `stream` is on its GPU: what every call and group checks first.
pub(crate) fn usable_on(comm: &Communicator, op: &'static str, stream: &Stream) -> Result<()> {
    comm.health.usable(op, comm.rank)?;
    if stream.device() != comm.device() {
        return Err(Error::InvalidArgument {
            op,
            rank: comm.rank,
            what: format!(
                "the stream is on GPU {}, this rank's GPU is {}",
                stream.device().ordinal(),
                comm.device().ordinal()
            ),
        });
    }
    Ok(())
}

/// Checks `call` on `comm` with `buffers` queued on `stream`; `None` for a call with nothing
/// to do (count 0).
pub(crate) fn check<'a>(
    comm: &Communicator,
    call: &Call,
    buffers: Buffers<'a>,
    stream: &Stream,
) -> Result<Option<Checked<'a>>> {
    usable_on(comm, call.op.name(), stream)?;
    let Some(args) = check_args(&Shape::of(comm), call, buffers, stream)? else {
        return Ok(None);
    };
    let size = call.dtype.size();
    let (input, output) = (args.input, args.output);
    let [peer_in, peer_out] = comm.windows.find(
        comm.world,
        [
            (input.ptr, args.in_len * size),
            (output.ptr, args.out_len * size),
        ],
    );
    let overlap = input.ptr < output.ptr + (args.out_len * size) as u64
        && output.ptr < input.ptr + (args.in_len * size) as u64;
    // An all-gather is in place only with its input exactly this rank's part of the output
    // (the copy engines' plan copies no own part then). Any other overlap takes the scratch
    // path: the direct and copy-engine plans assume separate buffers. Such a partial overlap
    // (undefined, as in NCCL; only unsafe code makes one) plans as in place, so the kernel keeps
    // its own copies (no own part by the copy engine).
    let (in_place, partial) = match call.op {
        Op::AllGather => {
            let exact = input.ptr == output.ptr + (comm.rank * args.in_len * size) as u64;
            (exact, overlap && !exact)
        }
        _ => (overlap, false),
    };
    let unaligned = (call.count * size) % 16 != 0 || input.ptr % 16 != 0 || output.ptr % 16 != 0;
    Ok(Some(Checked {
        args,
        access: Access {
            input: peer_in.is_some() && !partial,
            output: peer_out.is_some() && !partial,
            in_place: in_place || partial,
            unaligned,
        },
        peer_in,
        peer_out,
    }))
}

/// Checks `call` with `buffers` on `stream` for rank `shape.rank` of `shape.world`: element
/// types, streams, the root, the count, and the buffers' devices, lengths and alignment. Its
/// regions, or `None` for a call with nothing to do (count 0).
///
/// The buffers of a reduction must start at a multiple of their element's size (the kernels
/// load whole elements: one off its alignment would stop the kernel with a misaligned-address
/// fault, which ends the context); the collectives that only move data copy bytes, at any
/// address, and are not checked.
pub(crate) fn check_args<'a>(
    shape: &Shape<'_>,
    call: &Call,
    buffers: Buffers<'a>,
    stream: &Stream,
) -> Result<Option<Args<'a>>> {
    let op = call.op.name();
    let bad = |what: String| Error::InvalidArgument {
        op,
        rank: shape.rank,
        what,
    };
    let element =
        |which: &str, m: &dyn DeviceMemory| check_element(op, shape.rank, call.dtype, which, m);
    let (input, output) = match buffers {
        Buffers::Apart { send, recv } => {
            element("send", send)?;
            element("receive", recv)?;
            (Region::of(send, stream)?, Region::of(recv, stream)?)
        }
        Buffers::InPlace(buf) => {
            element("in-place", buf)?;
            in_place(shape.rank, call, Region::of(buf, stream)?)
        }
        Buffers::Regions(input, output) => (input, output),
    };
    if call.op.rooted() && call.root >= shape.world {
        return Err(bad(format!(
            "root {} is out of range: there are {} ranks",
            call.root, shape.world
        )));
    }
    if call.count == 0 {
        return Ok(None);
    }
    if call.count >= 1 << 40
        || call
            .count
            .checked_mul(shape.world * call.dtype.size())
            .is_none()
    {
        return Err(bad(format!("count {} is too large", call.count)));
    }
    let (in_len, out_len) = call
        .op
        .buffer_lens(call.count, shape.world, shape.rank, call.root);
    let size = call.dtype.size() as u64;
    for (what, region, len) in [("send", &input, in_len), ("recv", &output, out_len)] {
        if len == 0 {
            continue;
        }
        region.holds(shape, op, what, len, (call.dtype.size(), call.dtype.name()))?;
        if call.op.reduces() && region.ptr % size != 0 {
            return Err(bad(format!(
                "the {what} buffer starts at {:#x}, not a multiple of {size} bytes (the size of {}): \
                 reductions need buffers aligned to their element type",
                region.ptr, call.dtype
            )));
        }
    }
    Ok(Some(Args {
        input,
        output,
        in_len,
        out_len,
    }))
}

/// The input and output regions of `call` run in place in `whole` on `rank`: for all-gather
/// the input is this rank's part of the output; for reduce-scatter the output is this rank's
/// part of the input.
fn in_place<'a>(rank: usize, call: &Call, whole: Region<'a>) -> (Region<'a>, Region<'a>) {
    // Saturating, and empty past the end: a count too large for the buffer is refused by the
    // lengths' check.
    let off = rank
        .saturating_mul(call.count)
        .saturating_mul(call.dtype.size());
    let part = Region {
        ptr: whole.ptr.saturating_add(off as u64),
        bytes: whole.bytes.saturating_sub(off),
        device: whole.device,
    };
    match call.op {
        Op::AllGather => (part, whole),
        Op::ReduceScatter => (whole, part),
        _ => (whole, whole),
    }
}

/// Refuses a typed buffer whose elements are of another numeric type than `dtype` (a
/// `DeviceBuffer<f32>` reduced as `I32`): the sizes may agree while the results would be
/// garbage. Byte buffers (`u8`), other element types and untyped memory pass.
pub(crate) fn check_element(
    op: &'static str,
    rank: usize,
    dtype: DataType,
    which: &str,
    m: &(impl DeviceMemory + ?Sized),
) -> Result<()> {
    let Some(e) = m.element_type() else {
        return Ok(());
    };
    match DataType::of_element(e) {
        Some(d) if d != dtype => Err(Error::InvalidArgument {
            op,
            rank,
            what: format!(
                "the {which} buffer holds {} elements but the call says {dtype:?}: pass DataType::{d:?}, or a buffer of bytes (u8) to reinterpret memory",
                e.name
            ),
        }),
        _ => Ok(()),
    }
}
