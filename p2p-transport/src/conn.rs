//! Point-to-point connections: `send` on one rank, `recv` on another, through slot buffers.
//!
//! A connection has a ring of `slots` buffers of `slot_bytes` each, one `ready` sequence number
//! per slot in the receiver's memory and one `freed` number per slot in the sender's. In write
//! mode the ring lives with the receiver (the sender stores across the link); in read mode with
//! the sender (the receiver loads across the link). Each side maps the other's
//! memory: by plain pointer within a process ([`connect_in_process`]), or across processes
//! ([`connect_sender`] / [`connect_receiver`] over an [`FdChannel`]) by legacy IPC handle or by
//! cuMem fd, as mode selection chose. Sending and receiving are kernels (`sendrecv.cu`) that
//! pipeline a message of any size through the ring, chunk by chunk, with the flags as ready/done
//! signals; they are stream-ordered and asynchronous.
//!
//! No hangs: every wait in the kernels has a time limit and watches an abort flag (pinned host
//! memory, so [`AbortHandle::abort`] from any thread reaches a spinning kernel at once). A stall
//! is reported by [`SendConn::wait`] / [`RecvConn::wait`] as [`Error::Stalled`] naming the
//! operation, the rank and the peer; the connection then refuses further work. Between
//! processes, [`SendConn::watch`] / [`RecvConn::watch`] hand the abort flag to the job's
//! [`Group`](crate::rendezvous::Group): a peer process that dies (or fails elsewhere) then ends
//! the wait at once with [`Error::PeerFailed`] naming it, and a stall here reaches every other
//! rank.

use std::sync::Arc;
use std::time::Duration;

pub use p2p_mem::abort::{AbortHandle, KernelFailure};
use p2p_mem::fdpass::FdChannel;
use p2p_mem::kernel::LaunchConfig;
use p2p_mem::{Device, DeviceBuffer, DeviceMemory, DeviceMemoryMut, Stream};

use crate::context::Transport;
use crate::error::{Error, PeerFailure, Result};
use crate::kernels::abi::{self, SrArgs, SrWaitArgs};
use crate::kernels::SrKernels;
use crate::mode::{Direction, Engine};
use crate::peer::{self, LocalRegion};

/// How far past a connection's time limit a wait on its stream goes: its kernels end by the
/// limit, an aborted one within milliseconds.
pub const WAIT_GRACE: Duration = p2p_mem::DRAIN_GRACE;

/// The shape and limits of a connection. Both sides must use the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnOptions {
    /// Slots in the receiver's ring; also the number of blocks of the send and recv kernels.
    pub slots: u32,
    /// Bytes per slot: a multiple of 256, at most [`MAX_SLOT_BYTES`].
    pub slot_bytes: usize,
    /// How long a kernel waits for the peer before giving up: more than zero, at most
    /// [`crate::MAX_TIMEOUT`].
    pub timeout: Duration,
    /// What moves the bytes: SM kernels (one block per slot) or the copy engines (one
    /// `cuMemcpyAsync` per chunk between flag waits and `cuStreamWriteValue64` flags).
    pub engine: Engine,
    /// Who crosses the link: `Write`, the sender stores into slots in the receiver's memory;
    /// `Read`, the slots live in the sender's memory and the receiver loads from them. Either
    /// way each side polls only flags in its own memory.
    pub direction: Direction,
}

impl Default for ConnOptions {
    fn default() -> Self {
        ConnOptions {
            slots: 128,
            slot_bytes: 256 << 10,
            timeout: Duration::from_secs(30),
            engine: Engine::SmKernel,
            direction: Direction::Write,
        }
    }
}

impl ConnOptions {
    /// The options for a route chosen by mode selection: its engine and direction.
    pub fn for_route(route: &crate::mode::Route) -> ConnOptions {
        ConnOptions {
            engine: route.engine,
            direction: route.direction,
            ..ConnOptions::default()
        }
    }
    fn slots_bytes(&self) -> u64 {
        self.slots as u64 * self.slot_bytes as u64
    }
    fn ring_bytes(&self) -> usize {
        self.slots as usize * self.slot_bytes + self.flags_bytes()
    }
    /// The receiver's region: slots and ready flags (write), or ready flags only (read).
    fn recv_region_bytes(&self) -> usize {
        if self.direction == Direction::Write {
            self.ring_bytes()
        } else {
            self.flags_bytes()
        }
    }
    /// The sender's region: freed flags (write), or slots and freed flags (read).
    fn send_region_bytes(&self) -> usize {
        if self.direction == Direction::Write {
            self.flags_bytes()
        } else {
            self.ring_bytes()
        }
    }
    fn flags_bytes(&self) -> usize {
        (self.slots as usize * 8).next_multiple_of(256)
    }
    /// Refuses shapes whose sizes would pass the kernels' address arithmetic (at most 1024
    /// slots of at most [`MAX_SLOT_BYTES`], so the ring's size cannot wrap) and time limits of
    /// zero or past [`crate::MAX_TIMEOUT`] (a kernel's deadline is its start plus the limit in
    /// nanoseconds).
    fn check(&self) -> Result<()> {
        if self.slots == 0
            || self.slots > 1024
            || self.slot_bytes == 0
            || self.slot_bytes > MAX_SLOT_BYTES
            || self.slot_bytes % 256 != 0
        {
            return Err(invalid(format!("connection shape {} slots x {} bytes: need 1-1024 slots of a non-zero multiple of 256 bytes, at most {MAX_SLOT_BYTES}", self.slots, self.slot_bytes)));
        }
        if self.timeout.is_zero() || self.timeout > crate::MAX_TIMEOUT {
            return Err(invalid(format!(
                "connection time limit {:?}: need more than zero and at most {:?} (one day)",
                self.timeout,
                crate::MAX_TIMEOUT
            )));
        }
        Ok(())
    }
}

/// The largest slot a connection accepts (1 GiB).
pub const MAX_SLOT_BYTES: usize = 1 << 30;

fn invalid(msg: String) -> Error {
    Error::InvalidArgument(msg)
}

pub use crate::peer::Sharing;

impl Sharing {
    /// The sharing that carries a route between processes chosen by mode selection, if any:
    /// cuMem, legacy IPC or host-staged. Direct pointers and local copies need no connection
    /// between processes; relays through a third GPU between processes are not built.
    pub fn for_mode(mode: crate::mode::Mode) -> Option<Sharing> {
        use crate::mode::Mode;
        match mode {
            Mode::CuMem => Some(Sharing::CuMem),
            Mode::LegacyIpc => Some(Sharing::LegacyIpc),
            Mode::HostStaged => Some(Sharing::HostStaged),
            Mode::Local | Mode::DirectPointer | Mode::Intermediate { .. } => None,
        }
    }

    /// Host-staged connections always use the copy engines, in write mode.
    fn adjust(self, opts: ConnOptions) -> ConnOptions {
        if self == Sharing::HostStaged {
            ConnOptions {
                engine: Engine::CopyEngine,
                direction: Direction::Write,
                ..opts
            }
        } else {
            opts
        }
    }
}

type Shared = Arc<dyn DeviceMemory + Send + Sync>;

/// One side's state shared by send and recv.
struct Side {
    device: Device,
    rank: usize,
    peer: usize,
    opts: ConnOptions,
    kernels: Arc<SrKernels>,
    /// The receiver's region (see `ConnOptions::recv_region_bytes`).
    recv_mem: Shared,
    /// The sender's region (see `ConnOptions::send_region_bytes`).
    send_mem: Shared,
    status: DeviceBuffer<i32>,
    abort: AbortHandle,
    next_chunk: u64,
    failed: Option<String>,
}

impl Side {
    fn new(
        t: &Transport,
        device: &Device,
        ranks: (usize, usize),
        opts: ConnOptions,
        recv_mem: Shared,
        send_mem: Shared,
    ) -> Result<Side> {
        if recv_mem.byte_len() < opts.recv_region_bytes()
            || send_mem.byte_len() < opts.send_region_bytes()
        {
            return Err(invalid(format!(
                "the connection buffers are {} + {} bytes, this side needs {} + {}: both sides must use the same ConnOptions",
                recv_mem.byte_len(),
                send_mem.byte_len(),
                opts.recv_region_bytes(),
                opts.send_region_bytes()
            )));
        }
        Ok(Side {
            device: device.clone(),
            rank: ranks.0,
            peer: ranks.1,
            opts,
            kernels: t.sendrecv_kernels(device)?,
            recv_mem,
            send_mem,
            status: DeviceBuffer::<i32>::zeroed(device, 2)?,
            abort: AbortHandle::new(device)?,
            next_chunk: 0,
            failed: None,
        })
    }

    /// Where the slots, the ready flags and the freed flags are, for this direction.
    fn addresses(&self) -> (u64, u64, u64) {
        let (r, s, n) = (
            self.recv_mem.device_ptr(),
            self.send_mem.device_ptr(),
            self.opts.slots_bytes(),
        );
        match self.opts.direction {
            Direction::Write => (r, r + n, s),
            Direction::Read => (s, r, s + n),
        }
    }

    fn usable(&self, op: &str) -> Result<()> {
        if let Some(e) = self.peer_failed() {
            return Err(e);
        }
        if let Some(why) = &self.failed {
            return Err(Error::Broken {
                op: op.to_string(),
                rank: self.rank,
                peer: self.peer,
                why: why.clone(),
            });
        }
        if self.abort.is_aborted() {
            return Err(Error::Broken {
                op: op.to_string(),
                rank: self.rank,
                peer: self.peer,
                why: self.aborted_why(),
            });
        }
        Ok(())
    }

    /// The error for an abort that names another rank's failure (a watching
    /// [`Group`](crate::rendezvous::Group) learnt that it died or failed).
    fn peer_failed(&self) -> Option<Error> {
        match self.abort.reason() {
            Some((r, why)) if r != self.rank && self.abort.is_aborted() => {
                Some(Error::PeerFailed(PeerFailure {
                    rank: self.rank,
                    peer: r,
                    why,
                }))
            }
            _ => None,
        }
    }

    fn aborted_why(&self) -> String {
        match self.abort.reason() {
            Some((_, why)) => format!("aborted: {why}"),
            None => "aborted".into(),
        }
    }

    /// Launches `send` (from `mem`) or `recv` (into `mem`) on `stream`; both must be on this
    /// side's GPU.
    fn launch(&mut self, sending: bool, mem: &dyn DeviceMemory, stream: &Stream) -> Result<()> {
        let op = if sending { "send" } else { "recv" };
        self.usable(op)?;
        p2p_mem::check_stream(mem, stream)?;
        if mem.device() != &self.device {
            let what = if sending { "source" } else { "destination" };
            return Err(invalid(format!(
                "{op} on rank {}: the {what} is on GPU {}, the connection on GPU {}",
                self.rank,
                mem.device().ordinal(),
                self.device.ordinal()
            )));
        }
        let (buf, bytes) = (mem.device_ptr(), mem.byte_len());
        if stream.device() != &self.device {
            return Err(invalid(format!(
                "{op} on rank {} runs on GPU {}, but the stream is on GPU {}",
                self.rank,
                self.device.ordinal(),
                stream.device().ordinal()
            )));
        }
        if bytes == 0 {
            return Ok(());
        }
        let chunks = bytes.div_ceil(self.opts.slot_bytes) as u64;
        if self.opts.engine == Engine::CopyEngine {
            self.launch_ce(sending, buf, bytes, chunks, stream)?;
            self.next_chunk += chunks;
            return Ok(());
        }
        let grid = (chunks.min(self.opts.slots as u64)) as u32;
        let (slots_at, ready, freed) = self.addresses();
        let args = SrArgs {
            buf,
            bytes: bytes as u64,
            slots: slots_at,
            slot_bytes: self.opts.slot_bytes as u64,
            ready,
            freed,
            base: self.next_chunk,
            timeout_ns: self.opts.timeout.as_nanos() as u64,
            abort_flag: self.abort.device_ptr(),
            status: self.status.device_ptr(),
            nslots: self.opts.slots,
            // The receiver reads the slots across the link in read mode: re-fetch, never cache.
            slots_remote: i32::from(!sending && self.opts.direction == Direction::Read),
        };
        let f = if sending {
            &self.kernels.send
        } else {
            &self.kernels.recv
        };
        // SAFETY: p2p_send / p2p_recv take one SrArgs (the layout generated from transport_abi.h);
        // `buf` holds `bytes` on this GPU; the
        // ring (slots + ready) and the flags are at least as large as the options require
        // (checked in Side::new) and mapped for this GPU; the abort flag is pinned host memory
        // and the status two ints here, all owned by this connection, which outlives the launch
        // as long as the caller waits before dropping it (documented on wait()).
        unsafe {
            self.kernels
                .module
                .launch(f, LaunchConfig::new(grid, 512), &args, stream)
        }?;
        self.next_chunk += chunks;
        Ok(())
    }

    /// The copy-engine transfer: per chunk, wait for the slot's flag (kernel, with limits), copy
    /// (copy engine), publish the flag (stream memory operation, fenced before the write).
    fn launch_ce(
        &self,
        sending: bool,
        buf: u64,
        bytes: usize,
        chunks: u64,
        stream: &Stream,
    ) -> Result<()> {
        let slots = self.opts.slots as u64;
        let slot_bytes = self.opts.slot_bytes as u64;
        let (slots_at, ready, freed) = self.addresses();
        self.device.bind_to_thread()?;
        for k in 0..chunks {
            let g = self.next_chunk + k;
            let (s, seq) = (g % slots, g + 1);
            let off = k * slot_bytes;
            let len = (bytes as u64 - off).min(slot_bytes) as usize;
            let slot = slots_at + s * slot_bytes;
            let (wait_on, want, publish) = if sending {
                (freed + s * 8, seq.saturating_sub(slots), ready + s * 8)
            } else {
                (ready + s * 8, seq, freed + s * 8)
            };
            if want > 0 {
                let args = SrWaitArgs {
                    flag: wait_on,
                    want,
                    timeout_ns: self.opts.timeout.as_nanos() as u64,
                    abort_flag: self.abort.device_ptr(),
                    status: self.status.device_ptr(),
                    chunk: k,
                };
                // SAFETY: p2p_wait_flag takes one SrWaitArgs (generated from transport_abi.h); the flag lies in this connection's
                // mapped flags or ring, the abort flag is pinned host memory, status two ints here.
                unsafe {
                    self.kernels.module.launch(
                        &self.kernels.wait,
                        LaunchConfig::new(1, 32),
                        &args,
                        stream,
                    )
                }?;
            }
            let (dst, src) = if sending {
                (slot, buf + off)
            } else {
                (buf + off, slot)
            };
            // SAFETY: `src` and `dst` are `len` bytes inside the caller's buffer and the ring, both
            // mapped in this context (UVA); the stream orders this after the wait above.
            unsafe { p2p_mem::copy_async(dst, src, len, stream) }?;
            // SAFETY: `publish` is an 8-byte flag in memory mapped here; the write follows a
            // memory barrier, so the copied chunk is visible before the flag.
            unsafe { p2p_mem::write_u64_async(publish, seq, stream) }?;
        }
        Ok(())
    }

    fn wait(&mut self, op: &'static str, stream: &Stream) -> Result<()> {
        // The kernels end by their time limit (or an abort, within milliseconds): a stream still
        // busy past it holds other work, queued before, which is not ours to stop.
        let limit = self.opts.timeout.saturating_add(WAIT_GRACE);
        if !stream.synchronize_within(limit)? {
            return Err(Error::NotDrained {
                op,
                rank: self.rank,
                device: self.device.ordinal(),
                waited: limit,
            });
        }
        let st = self.status.to_host_vec::<i32>()?;
        if st[0] == 0 {
            return Ok(());
        }
        if st[0] == abi::SR_ABORTED {
            if let Some(e) = self.peer_failed() {
                self.failed = Some(e.to_string());
                return Err(e);
            }
        }
        let why = match st[0] {
            abi::SR_TIMED_OUT => format!(
                "timed out after {:?} waiting for the peer",
                self.opts.timeout
            ),
            abi::SR_ABORTED => self.aborted_why(),
            c => format!("kernel status {c}"),
        };
        if st[0] == abi::SR_TIMED_OUT {
            // Tell a watching group, which stops the other ranks' waits too.
            self.abort
                .abort_because(self.rank, format!("its {op} with rank {} {why}", self.peer));
        }
        self.failed = Some(why.clone());
        Err(Error::Stalled {
            op,
            rank: self.rank,
            device: self.device.ordinal(),
            peer: self.peer,
            chunk: st[1] as i64,
            why,
        })
    }
}

/// The sending end of a connection.
pub struct SendConn {
    side: Side,
}

/// The receiving end of a connection.
pub struct RecvConn {
    side: Side,
}

/// What both ends of a connection offer besides their transfers.
macro_rules! conn_end {
    ($end:ty) => {
        impl $end {
            /// A handle that aborts this end from any thread.
            pub fn abort_handle(&self) -> AbortHandle {
                self.side.abort.clone()
            }
            /// Lets `group` (the job's ranks, watched for failures) stop this end's waits when
            /// any rank dies or fails, so that [`wait`](Self::wait) returns
            /// [`Error::PeerFailed`] naming that rank within the group's detection time rather
            /// than this connection's time limit; and reports this end's own stall (time
            /// limit) to every other rank.
            pub fn watch(&self, group: &crate::rendezvous::Group) {
                group.watch(&self.side.abort);
            }
        }
    };
}
conn_end!(SendConn);
conn_end!(RecvConn);

impl SendConn {
    /// Queues sending all of `src` (on this side's GPU) on `stream`. The receiver must call
    /// [`RecvConn::recv`] with a buffer of the same size; messages match in order.
    pub fn send(&mut self, src: &impl DeviceMemory, stream: &Stream) -> Result<()> {
        self.side.launch(true, src, stream)
    }
    /// Waits for the sends queued on `stream`, and reports a stall. Wait before dropping the
    /// connection or the source buffers.
    pub fn wait(&mut self, stream: &Stream) -> Result<()> {
        self.side.wait("send", stream)
    }
}

impl RecvConn {
    /// Queues receiving into all of `dst` (on this side's GPU) on `stream`.
    pub fn recv(&mut self, dst: &mut impl DeviceMemoryMut, stream: &Stream) -> Result<()> {
        self.side.launch(false, dst, stream)
    }
    /// Waits for the receives queued on `stream`, and reports a stall.
    pub fn wait(&mut self, stream: &Stream) -> Result<()> {
        self.side.wait("recv", stream)
    }
}

/// Connects rank `ranks.0` on `sender` to rank `ranks.1` on `receiver`, in one process
/// (direct pointers, peer access enabled both ways).
pub fn connect_in_process(
    t: &Transport,
    sender: &Device,
    receiver: &Device,
    ranks: (usize, usize),
    opts: ConnOptions,
) -> Result<(SendConn, RecvConn)> {
    opts.check()?;
    t.ensure_peer_access_both(sender, receiver)?;
    let ring: Shared = Arc::new(DeviceBuffer::<u8>::zeroed(
        receiver,
        opts.recv_region_bytes(),
    )?);
    let flags: Shared = Arc::new(DeviceBuffer::<u8>::zeroed(
        sender,
        opts.send_region_bytes(),
    )?);
    let s = Side::new(t, sender, ranks, opts, ring.clone(), flags.clone())?;
    let r = Side::new(t, receiver, (ranks.1, ranks.0), opts, ring, flags)?;
    tracing::debug!(
        sender = sender.ordinal(),
        receiver = receiver.ordinal(),
        "connected in one process"
    );
    Ok((SendConn { side: s }, RecvConn { side: r }))
}

/// The `wire` message kind of a connection's hello (its shape: slots, slot size, sharing,
/// engine, direction), compared byte for byte by the sender.
const HELLO: u16 = 0x0C01;

fn hello(opts: &ConnOptions, sharing: Sharing) -> Vec<u8> {
    let shape = p2p_mem::wire::Writer::new()
        .u64(opts.slots as u64)
        .u64(opts.slot_bytes as u64)
        .u16(sharing.code() as u16)
        .u16(opts.engine as u16)
        .u16(opts.direction as u16)
        .finish();
    p2p_mem::wire::encode_message(HELLO, &shape)
}

/// Allocates zeroed memory to share with the peer and sends its handle (the peer layer).
fn export(chan: &FdChannel, device: &Device, bytes: usize, sharing: Sharing) -> Result<Shared> {
    let region = LocalRegion::allocate(device, bytes, sharing)?;
    peer::send(chan, 0, &region.export()?)?;
    Ok(Arc::new(region))
}

/// Receives the peer's handle and maps its memory on `device` (the peer layer).
fn import(chan: &FdChannel, device: &Device, sharing: Sharing, peer_rank: usize) -> Result<Shared> {
    let (_, exported) = peer::recv(chan, sharing)?;
    Ok(Arc::new(peer::import(
        device, sharing, peer_rank, exported,
    )?))
}

/// One end of a connection between processes, as [`connect_sender`] and [`connect_receiver`]
/// take it: where the connection lives and how its memory is shared.
#[derive(Clone, Copy)]
pub struct Link<'a> {
    /// The transport that runs the connection's copies.
    pub transport: &'a Transport,
    /// This end's GPU.
    pub device: &'a Device,
    /// The channel to the peer's process that the handles travel over.
    pub chan: &'a FdChannel,
    /// How the ring and the flags are shared (both ends give the same).
    pub sharing: Sharing,
    /// This rank and the peer's.
    pub ranks: (usize, usize),
}

impl Link<'_> {
    /// The options both ends agree on for this sharing, checked.
    fn options(&self, opts: ConnOptions) -> Result<ConnOptions> {
        let opts = self.sharing.adjust(opts);
        opts.check()?;
        Ok(opts)
    }

    /// The connection's side at this end, over `ring` and `flags`.
    fn side(&self, opts: ConnOptions, ring: Shared, flags: Shared, role: &str) -> Result<Side> {
        let (rank, peer) = self.ranks;
        tracing::debug!(rank, peer, sharing = ?self.sharing, "{role} connected");
        Side::new(self.transport, self.device, self.ranks, opts, ring, flags)
    }
}

/// The receiving side of a connection between processes: allocates the ring, sends its handle,
/// maps the sender's flags.
pub fn connect_receiver(link: Link<'_>, opts: ConnOptions) -> Result<RecvConn> {
    let (device, chan, sharing, peer) = (link.device, link.chan, link.sharing, link.ranks.1);
    let opts = link.options(opts)?;
    chan.send_msg(&hello(&opts, sharing))?;
    let ring = export(chan, device, opts.recv_region_bytes(), sharing)?;
    let flags = import(chan, device, sharing, peer)?;
    Ok(RecvConn {
        side: link.side(opts, ring, flags, "receiver")?,
    })
}

/// The sending side of a connection between processes: checks the receiver's shape, maps its
/// ring, sends the handle of its own flags.
pub fn connect_sender(link: Link<'_>, opts: ConnOptions) -> Result<SendConn> {
    let (device, chan, sharing, peer) = (link.device, link.chan, link.sharing, link.ranks.1);
    let opts = link.options(opts)?;
    if chan.recv_msg()? != hello(&opts, sharing) {
        return Err(Error::Handshake { peer, why: format!("the receiver's connection shape or sharing differs from ours ({opts:?}, {sharing:?})") });
    }
    let ring = import(chan, device, sharing, peer)?;
    let flags = export(chan, device, opts.send_region_bytes(), sharing)?;
    Ok(SendConn {
        side: link.side(opts, ring, flags, "sender")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_and_time_limits_that_would_wrap_are_refused() {
        let ok = ConnOptions::default();
        assert!(ok.check().is_ok());
        // 1024 slots of 2^54 bytes: the ring's size would wrap to 8 KiB.
        let huge = ConnOptions {
            slots: 1024,
            slot_bytes: 1 << 54,
            ..ok
        };
        let e = huge.check().expect_err("a ring past 2^64 bytes");
        assert!(e.to_string().contains("at most 1073741824"), "{e}");
        let largest = ConnOptions {
            slots: 1024,
            slot_bytes: MAX_SLOT_BYTES,
            ..ok
        };
        assert!(largest.check().is_ok());
        assert_eq!(largest.ring_bytes(), (1usize << 40) + 8192);
        // Time limits whose nanoseconds would wrap the kernel's deadline, or none at all.
        for timeout in [
            Duration::MAX,
            Duration::from_secs(18_446_744_074),
            crate::MAX_TIMEOUT + Duration::from_nanos(1),
            Duration::ZERO,
        ] {
            let e = ConnOptions { timeout, ..ok }
                .check()
                .expect_err("a time limit out of range");
            assert!(e.to_string().contains("one day"), "{e}");
        }
        assert!(ConnOptions {
            timeout: crate::MAX_TIMEOUT,
            ..ok
        }
        .check()
        .is_ok());
    }
}
