//! Launching a communicator's work: a call's [`Work`] (its kernels, copies and flag writes, on
//! the caller's stream or the communicator's second stream), and the send/recv kernel.

use std::sync::Arc;

use p2p_mem::kernel::LaunchConfig;
use p2p_mem::{Device, Stream};

use crate::abi::{CollArgs, P2pArgs};
use crate::error::{Error, Result};
use crate::plan::Entry;
use crate::types::DataType;

use super::kernels::{Kernel, Kernels};

/// The most steps one call's [`Work`] holds: a copy-engine all-gather on 8 ranks over two
/// streams takes 19 (two barriers, a fork and a join, its own part, 7 peers x 2 halves).
pub(crate) const MAX_STEPS: usize = 24;

/// Which stream a step goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lane {
    /// The stream the call was given.
    Caller,
    /// The communicator's second stream, between a [`Step::Fork`] and a [`Step::Join`].
    Side,
}

/// Which of a work's two argument blocks a kernel step takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Args {
    /// The call's.
    Call,
    /// The call's, with no data (a barrier kernel around copies: `count` 0).
    NoData,
}

/// One piece of a call's queued work.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// A collective kernel of `entry` for `dtype`, `grid` blocks of `threads`, with the
    /// work's argument block `args`.
    Kernel {
        entry: Entry,
        dtype: DataType,
        grid: u32,
        threads: u32,
        args: Args,
        lane: Lane,
    },
    /// `bytes` bytes from `src` to `dst` by a copy engine (`cuMemcpyAsync`).
    Copy {
        dst: u64,
        src: u64,
        bytes: usize,
        lane: Lane,
    },
    /// The 64-bit word `value` into `dst` (`cuStreamWriteValue64`).
    Write { dst: u64, value: u64, lane: Lane },
    /// `bytes` zero bytes at `dst`.
    Zero { dst: u64, bytes: usize, lane: Lane },
    /// What is queued next on the side stream starts after everything queued so far on the
    /// caller's.
    Fork,
    /// What is queued next on the caller's stream starts after everything queued so far on the
    /// side stream.
    Join,
}

/// A call's queued work: the steps in order, and the argument blocks its kernels take. Built by
/// the call's launch stage (`crate::call`), which vouches for every address in it; queued by
/// [`Launcher::queue_work`].
#[derive(Debug, Clone)]
pub(crate) struct Work {
    steps: arrayvec::ArrayVec<Step, MAX_STEPS>,
    /// The call's argument block ([`Args::Call`]).
    pub(crate) args: CollArgs,
}

impl Work {
    /// No steps yet; the kernel steps take `args` (the call's argument block).
    pub(crate) fn new(args: CollArgs) -> Work {
        Work {
            steps: arrayvec::ArrayVec::new(),
            args,
        }
    }

    /// Appends `step`, or the error past [`MAX_STEPS`] (which a plan's work never reaches: it is
    /// bounded by the world size, see [`MAX_STEPS`]).
    pub(crate) fn push(&mut self, step: Step) -> Result<()> {
        self.steps
            .try_push(step)
            .map_err(|_| Error::InvalidArgument {
                op: "launch",
                rank: self.args.rank.max(0) as usize,
                what: format!("a call's work passed {MAX_STEPS} steps (a defect of p2p)"),
            })
    }

    /// The steps, in order.
    pub(crate) fn steps(&self) -> &[Step] {
        &self.steps
    }
}

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

    /// Queues `work` on `stream` (its [`Lane::Caller`] steps) and the side stream, in order;
    /// on an error the rest is not queued. Whatever happened, a fork is joined: `stream` waits
    /// for whatever reached the side stream, and a capture ends with its fork joined.
    ///
    /// # Safety
    /// Every address of `work` (its copies, writes and zeroes, and the pointers of its argument
    /// blocks) must be memory those steps may read or write for the bytes they name until they
    /// have run: the call's checked buffers, the ranks' workspaces and registered windows.
    #[allow(unsafe_code)]
    pub(crate) unsafe fn queue_work(&self, work: &Work, stream: &Stream) -> Result<()> {
        let mut forked = false;
        let mut queued = Ok(());
        // The barrier kernels' block, made where one is queued.
        let mut no_data = None;
        for step in work.steps() {
            let on = |lane: Lane| match lane {
                Lane::Caller => stream,
                Lane::Side => &self.side.stream,
            };
            queued = match *step {
                Step::Kernel {
                    entry,
                    dtype,
                    grid,
                    threads,
                    args,
                    lane,
                } => {
                    let a = match args {
                        Args::Call => &work.args,
                        Args::NoData => &*no_data.get_or_insert(CollArgs {
                            count: 0,
                            piece: 1,
                            ..work.args
                        }),
                    };
                    self.launch(entry, dtype, (grid, threads), a, on(lane))
                }
                Step::Copy {
                    dst,
                    src,
                    bytes,
                    lane,
                } => {
                    // SAFETY: the caller vouches for both ranges (this function's contract).
                    unsafe { p2p_mem::copy_async(dst, src, bytes, on(lane)) }.map_err(Error::from)
                }
                Step::Write { dst, value, lane } => {
                    // SAFETY: the caller vouches for the word (this function's contract).
                    unsafe { p2p_mem::write_u64_async(dst, value, on(lane)) }.map_err(Error::from)
                }
                Step::Zero { dst, bytes, lane } => {
                    // SAFETY: the caller vouches for the range (this function's contract).
                    unsafe { p2p_mem::memset_async(dst, 0, bytes, on(lane)) }.map_err(Error::from)
                }
                Step::Fork => self.fork(stream).map(|()| forked = true),
                Step::Join => {
                    forked = false;
                    self.join(stream)
                }
            };
            if queued.is_err() {
                break;
            }
        }
        if forked {
            let joined = self.join(stream);
            queued = queued.and(joined);
        }
        queued
    }

    /// Launches the collective kernel of `entry` for `dtype` on `stream`, `grid` blocks of
    /// `threads`.
    #[allow(unsafe_code)]
    fn launch(
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
    fn fork(&self, stream: &Stream) -> Result<()> {
        self.side.fork.record(stream)?;
        self.side.fork.wait_on(&self.side.stream)?;
        Ok(())
    }

    /// Work queued next on `stream` starts after everything queued so far on the side stream.
    fn join(&self, stream: &Stream) -> Result<()> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_keeps_its_steps_in_order() {
        let mut w = Work::new(CollArgs::default());
        w.push(Step::Fork).expect("room");
        let copy = Step::Copy {
            dst: 16,
            src: 32,
            bytes: 8,
            lane: Lane::Side,
        };
        w.push(copy).expect("room");
        w.push(Step::Join).expect("room");
        assert_eq!(w.steps(), [Step::Fork, copy, Step::Join]);
        for _ in 3..MAX_STEPS {
            w.push(Step::Join).expect("room");
        }
        // Past the bound: an error, not a panic, and nothing is lost.
        assert!(w.push(Step::Fork).is_err());
        assert_eq!(w.steps().len(), MAX_STEPS);
    }
}
