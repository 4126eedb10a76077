//! NCCL through cudarc's bindings, driven the way nccl-tests drives it with one process and
//! several GPUs (`ncclCommInitAll`, one group per call across ranks): the comparison that
//! `p2p-bench coll` runs in the same process, on the same streams and buffers, timed the same way.

use p2p_collective::{DataType, Op, RedOp};
use p2p_mem::Device;
use p2p_sys::{check_nccl, nccl, Library};

/// One NCCL communicator per GPU, destroyed on `Drop`.
pub struct NcclGroup {
    comms: Vec<nccl::ncclComm_t>,
}

/// NCCL's version, e.g. `2.28.9`.
pub fn version() -> Result<String, String> {
    p2p_sys::probe::require(Library::Nccl).map_err(|e| e.to_string())?;
    let mut v = 0;
    // SAFETY: libnccl is loaded (probed); `v` is an out-pointer.
    check_nccl("ncclGetVersion", unsafe { nccl::ncclGetVersion(&mut v) })
        .map_err(|e| e.to_string())?;
    Ok(format!("{}.{}.{}", v / 10000, v / 100 % 100, v % 100))
}

fn dtype(d: DataType) -> nccl::ncclDataType_t {
    use nccl::ncclDataType_t::*;
    match d {
        DataType::F32 => ncclFloat32,
        DataType::F64 => ncclFloat64,
        DataType::F16 => ncclFloat16,
        DataType::BF16 => ncclBfloat16,
        DataType::I32 => ncclInt32,
        DataType::I64 => ncclInt64,
        DataType::U8 => ncclUint8,
    }
}

fn redop(r: RedOp) -> nccl::ncclRedOp_t {
    use nccl::ncclRedOp_t::*;
    match r {
        RedOp::Sum => ncclSum,
        RedOp::Prod => ncclProd,
        RedOp::Min => ncclMin,
        RedOp::Max => ncclMax,
        RedOp::Avg => ncclAvg,
    }
}

/// One rank's buffers for a call: device addresses on that rank's GPU.
#[derive(Debug, Clone, Copy)]
pub struct Bufs {
    /// The send buffer.
    pub send: u64,
    /// The receive buffer.
    pub recv: u64,
}

impl NcclGroup {
    /// `ncclCommInitAll` over `devices` (rank r is `devices[r]`).
    pub fn init_all(devices: &[Device]) -> Result<NcclGroup, String> {
        p2p_sys::probe::require(Library::Nccl).map_err(|e| e.to_string())?;
        let list: Vec<i32> = devices.iter().map(|d| d.ordinal()).collect();
        let mut comms = vec![std::ptr::null_mut(); devices.len()];
        // SAFETY: `comms` has room for one handle per device in `list`.
        check_nccl("ncclCommInitAll", unsafe {
            nccl::ncclCommInitAll(comms.as_mut_ptr(), list.len() as i32, list.as_ptr())
        })
        .map_err(|e| e.to_string())?;
        Ok(NcclGroup { comms })
    }

    /// Queues one collective on every rank, in one NCCL group. `count` follows NCCL (the
    /// per-rank send count of all-gather, the per-rank receive count of reduce-scatter, the
    /// per-peer count of all-to-all). In place, `bufs[r].send` is ignored and NCCL's in-place
    /// addresses are derived from `recv`.
    #[allow(clippy::too_many_arguments)]
    pub fn issue(
        &self,
        op: Op,
        dt: DataType,
        red: RedOp,
        root: usize,
        count: usize,
        in_place: bool,
        bufs: &[Bufs],
        streams: &[p2p_sys::cuda::CUstream],
    ) -> Result<(), String> {
        // SAFETY: plain call; it only opens a group.
        check_nccl("ncclGroupStart", unsafe { nccl::ncclGroupStart() })
            .map_err(|e| e.to_string())?;
        let mut result = Ok(());
        for (r, comm) in self.comms.iter().enumerate() {
            let size = dt.size() as u64;
            let (send, recv) = match (in_place, op) {
                (false, _) => (bufs[r].send, bufs[r].recv),
                (true, Op::AllGather) => {
                    (bufs[r].recv + r as u64 * count as u64 * size, bufs[r].recv)
                }
                (true, Op::ReduceScatter) => {
                    (bufs[r].recv, bufs[r].recv + r as u64 * count as u64 * size)
                }
                (true, _) => (bufs[r].recv, bufs[r].recv),
            };
            let (s, d) = (
                send as *const std::ffi::c_void,
                recv as *mut std::ffi::c_void,
            );
            let stream = streams[r] as nccl::cudaStream_t;
            // SAFETY: the caller's buffers on rank r's GPU hold what `op` reads and writes for
            // `count` (the benchmark sizes them for the largest call); the stream is rank r's.
            let rc = unsafe {
                match op {
                    Op::AllReduce => {
                        nccl::ncclAllReduce(s, d, count, dtype(dt), redop(red), *comm, stream)
                    }
                    Op::Broadcast => {
                        nccl::ncclBroadcast(s, d, count, dtype(dt), root as i32, *comm, stream)
                    }
                    Op::Reduce => nccl::ncclReduce(
                        s,
                        d,
                        count,
                        dtype(dt),
                        redop(red),
                        root as i32,
                        *comm,
                        stream,
                    ),
                    Op::AllGather => nccl::ncclAllGather(s, d, count, dtype(dt), *comm, stream),
                    Op::ReduceScatter => {
                        nccl::ncclReduceScatter(s, d, count, dtype(dt), redop(red), *comm, stream)
                    }
                    Op::AllToAll => nccl::ncclAlltoAll(s, d, count, dtype(dt), *comm, stream),
                }
            };
            if result.is_ok() {
                result = check_nccl(op.name(), rc).map_err(|e| e.to_string());
            }
        }
        // SAFETY: closes the group opened above (also after an error, as NCCL requires).
        let end =
            check_nccl("ncclGroupEnd", unsafe { nccl::ncclGroupEnd() }).map_err(|e| e.to_string());
        result.and(end)
    }
}

impl Drop for NcclGroup {
    fn drop(&mut self) {
        for c in &self.comms {
            // SAFETY: each handle came from ncclCommInitAll and is destroyed once.
            if let Err(e) = check_nccl("ncclCommDestroy", unsafe { nccl::ncclCommDestroy(*c) }) {
                eprintln!("destroying an NCCL communicator: {e}");
            }
        }
    }
}
