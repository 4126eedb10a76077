//! Launching a communicator's kernels, and the second stream of the copy-engine plans.

use std::sync::Arc;

use p2p_mem::kernel::LaunchConfig;
use p2p_mem::{Device, Stream};

use crate::abi::{CollArgs, P2pArgs};
use crate::error::Result;
use crate::plan::Entry;
use crate::types::DataType;

use super::kernels::{Kernel, Kernels};

/// What a communicator launches with: its GPU's kernels, the second stream, and whether
/// launches may overlap the previous kernel.
pub(crate) struct Launcher {
    pub(crate) kernels: Arc<Kernels>,
    side: SideStream,
    /// Programmatic dependent launch, unless ranks share this GPU. There a kernel scheduled
    /// early would hold SM slots, waiting for its predecessor, that a peer rank's kernel on the
    /// same GPU needs to start: the predecessor waits for that peer, and the three would stall
    /// until the time limit (seen on one H100 with two ranks).
    overlapped: bool,
}

impl Launcher {
    /// The launcher of a rank on `device` with `kernels`, one of `share` ranks on its GPU.
    pub(crate) fn new(device: &Device, kernels: Arc<Kernels>, share: usize) -> Result<Launcher> {
        Ok(Launcher {
            kernels,
            side: SideStream::new(device)?,
            overlapped: share <= 1,
        })
    }

    /// Launches the collective kernel of `entry` for `dtype` on `stream`, `grid` blocks of
    /// `threads`.
    #[allow(unsafe_code)]
    pub(crate) fn launch(
        &self,
        entry: Entry,
        dtype: DataType,
        (grid, threads): (u32, u32),
        args: &CollArgs,
        stream: &Stream,
    ) -> Result<()> {
        let Kernel { module, function } = self.kernels.function(entry, dtype);
        let config = LaunchConfig::new(grid, threads).overlapped(self.overlapped);
        // SAFETY: `CollArgs` matches the kernel's one by-value parameter field for field. Its
        // pointers are a call's checked buffers (lengths checked against the plan), the
        // workspaces of every rank (alive while the communicator is, which synchronises
        // before freeing them) and the pinned abort flag (held by the communicator). The
        // kernel runs `griddepcontrol.wait` before touching any memory, as an overlapped launch
        // requires (and which a plain launch makes a no-op).
        unsafe { module.launch(function, config, args, stream) }?;
        Ok(())
    }

    /// Launches the send/recv kernel on `stream`, `grid` blocks.
    ///
    /// # Safety
    /// Every pointer of `args` must be a buffer the kernel may read or write for the bytes it
    /// names (the group's checked buffers, the ranks' inboxes and sync areas), alive until the
    /// kernel ends, and `grid` must cover `args.channels` channels.
    #[allow(unsafe_code)]
    pub(crate) unsafe fn launch_sendrecv(
        &self,
        args: &P2pArgs,
        grid: u32,
        stream: &Stream,
    ) -> Result<()> {
        let Kernel { module, function } = self.kernels.sendrecv();
        let config = LaunchConfig::new(grid, crate::plan::THREADS);
        // SAFETY: `P2pArgs` matches the kernel's one by-value parameter field for field; the
        // caller vouches for its pointers and the grid.
        unsafe { module.launch(function, config, args, stream) }?;
        Ok(())
    }

    /// Work queued next on the side stream starts after everything queued so far on `stream`.
    pub(crate) fn fork(&self, stream: &Stream) -> Result<&Stream> {
        self.side.fork.record(stream)?;
        self.side.fork.wait_on(&self.side.stream)?;
        Ok(&self.side.stream)
    }

    /// Work queued next on `stream` starts after everything queued so far on the side stream.
    pub(crate) fn join(&self, stream: &Stream) -> Result<()> {
        self.side.join.record(&self.side.stream)?;
        self.side.join.wait_on(stream)?;
        Ok(())
    }
}

/// A stream beside the caller's for the copy-engine plans (the all-reduce's reduce kernel, the
/// own part's copy of an all-gather or all-to-all), with the events that start it after the
/// work queued so far on the caller's stream and make the caller's stream wait for it: a fork
/// and a join, which CUDA graph capture follows too.
struct SideStream {
    stream: Stream,
    fork: p2p_mem::Event,
    join: p2p_mem::Event,
}

impl SideStream {
    fn new(device: &Device) -> Result<SideStream> {
        Ok(SideStream {
            stream: Stream::new(device)?,
            fork: p2p_mem::Event::new(device)?,
            join: p2p_mem::Event::new(device)?,
        })
    }
}
