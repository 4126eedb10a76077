//! The abort flag that every kernel wait of this project polls, and what a failed kernel writes
//! into it. It lives here, with [`Device`], [`Stream`](crate::Stream) and the kernel runtime,
//! because every layer above uses it: the transport's connections, the rendezvous group that
//! relays a peer's death, and the collectives' kernels.
//!
//! The flag's values are read by CUDA code too: the collective kernels write [`KERNEL_FAILED`]
//! and its fields (`coll_abi.h` names them `ABORT_*`; `p2p-collective` checks at build time that
//! both agree), and every kernel treats any nonzero value as "stop".

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, OnceLock};

use crate::error::Result;
use crate::{Device, PinnedHostBuffer};

/// Lets any thread stop a connection's or a communicator's kernels: their waits see it and end.
///
/// The flag is an `int` in pinned host memory that every wait of the kernels polls. The host
/// sets it to [`ABORTED`]; a collective kernel that fails (time limit, mismatch) sets it to
/// [`KERNEL_FAILED`] itself, with its rank, the rank it waited for and why
/// ([`kernel_failure`](Self::kernel_failure)), so that
/// the other ranks sharing the flag stop within milliseconds
/// (a collective kernel's waiting thread reads the flag at most once every 6.4 ms) rather than
/// at their own time limit. The first reason given with [`abort_because`](Self::abort_because) is
/// kept for the error reports.
#[derive(Clone)]
pub struct AbortHandle {
    flag: Arc<PinnedHostBuffer<i32>>,
    reason: Arc<OnceLock<(usize, String)>>,
    first_failure: Arc<OnceLock<KernelFailure>>,
}

/// The abort flag's value once the host aborted.
pub const ABORTED: i32 = 1;
/// The abort flag's low byte once a kernel failed and stopped its peers.
pub const KERNEL_FAILED: i32 = 2;
/// In a failed kernel's flag, above the low byte: the rank it waited for + 1 (0: none named).
pub const KERNEL_FAILED_PEER_SHIFT: u32 = 8;
/// In a failed kernel's flag, the next byte: its own rank + 1 (0: none named).
pub const KERNEL_FAILED_RANK_SHIFT: u32 = 16;
/// In a failed kernel's flag: set for a mismatched call, clear for the time limit.
pub const KERNEL_FAILED_MISMATCH: i32 = 1 << 24;

impl std::fmt::Debug for AbortHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AbortHandle")
            .field("flag", &self.value())
            .field("reason", &self.reason.get())
            .finish()
    }
}

impl AbortHandle {
    /// A new, unset abort flag in pinned host memory (`device` supplies the context).
    pub fn new(device: &Device) -> Result<AbortHandle> {
        Ok(AbortHandle {
            flag: Arc::new(PinnedHostBuffer::<i32>::new(device, 1)?),
            reason: Arc::new(OnceLock::new()),
            first_failure: Arc::new(OnceLock::new()),
        })
    }
    fn atomic(&self) -> &AtomicI32 {
        // SAFETY: the pinned buffer holds one aligned i32 and lives as long as `self`; kernels
        // read and write it with volatile accesses, the host only atomically, through a pointer
        // that no shared reference to the element was made from.
        unsafe { AtomicI32::from_ptr(self.flag.as_raw_ptr()) }
    }
    /// Makes every wait of the kernels give up now, and later calls fail at once.
    pub fn abort(&self) {
        let _ = self
            .atomic()
            .compare_exchange(0, ABORTED, Ordering::SeqCst, Ordering::SeqCst);
    }
    /// As [`abort`](Self::abort), recording that `rank` failed and why (the first reason
    /// given wins).
    pub fn abort_because(&self, rank: usize, why: impl Into<String>) {
        let _ = self.reason.set((rank, why.into()));
        self.abort();
    }
    /// Whether the flag is set (by [`abort`](Self::abort) or by a failing kernel).
    pub fn is_aborted(&self) -> bool {
        self.value() != 0
    }
    /// The flag's value: 0, [`ABORTED`], or [`KERNEL_FAILED`] in the low byte with the
    /// details of [`KernelFailure`] above it.
    pub fn value(&self) -> i32 {
        self.atomic().load(Ordering::SeqCst)
    }
    /// What the failed kernel that set the flag wrote into it (which rank, waiting for which,
    /// why), for the error reports of the ranks it stopped; `None` if no kernel set it. The
    /// first failure read is kept: kernels on two GPUs that fail at once may both write the
    /// flag, and every report of this process then names the same one.
    pub fn kernel_failure(&self) -> Option<KernelFailure> {
        if let Some(f) = self.first_failure.get() {
            return Some(*f);
        }
        let f = KernelFailure::from_flag(self.value())?;
        Some(*self.first_failure.get_or_init(|| f))
    }
    /// The rank and reason recorded by [`abort_because`](Self::abort_because), if any.
    pub fn reason(&self) -> Option<(usize, String)> {
        self.reason.get().cloned()
    }
    /// The flag's address as kernels see it (an `int`, nonzero once aborted).
    pub fn device_ptr(&self) -> u64 {
        // Pinned host memory is addressable from the device at the same address (UVA).
        self.flag.as_ptr() as u64
    }
}

/// What a failed collective kernel wrote into the abort flag it shares with the other ranks
/// of its process: the [`Display`](std::fmt::Display) form is the reason their calls report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelFailure {
    /// The rank whose kernel failed, where the kernel named it.
    pub rank: Option<usize>,
    /// The rank it was waiting for, where it named one.
    pub waited_for: Option<usize>,
    /// `true`: that rank made a different call (a mismatch); `false`: the time limit passed.
    pub mismatch: bool,
}

impl KernelFailure {
    /// An abort flag's value read as a kernel's failure: `None` if no kernel set it (0, or the
    /// host's [`ABORTED`]).
    pub fn from_flag(value: i32) -> Option<Self> {
        if value & 0xff != KERNEL_FAILED {
            return None;
        }
        let rank_of = |shift: u32| {
            let r = ((value as u32) >> shift) & 0xff;
            (r > 0).then(|| r as usize - 1)
        };
        Some(Self {
            rank: rank_of(KERNEL_FAILED_RANK_SHIFT),
            waited_for: rank_of(KERNEL_FAILED_PEER_SHIFT),
            mismatch: value & KERNEL_FAILED_MISMATCH != 0,
        })
    }
}

impl std::fmt::Display for KernelFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.rank {
            Some(r) => write!(f, "rank {r}'s collective kernel")?,
            None => write!(f, "a collective kernel")?,
        }
        match (self.mismatch, self.waited_for) {
            (true, Some(p)) => write!(f, " found that rank {p} made a different (mismatched) call"),
            (true, None) => write!(f, " found a mismatched call"),
            (false, Some(p)) => write!(f, " reached its time limit waiting for rank {p}"),
            (false, None) => write!(f, " reached its time limit"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_kernels_flag_names_both_ranks_and_why() {
        // What coll.cu's abort_value writes.
        let flag = |rank: i32, peer: i32, mismatch: bool| {
            KERNEL_FAILED
                | ((peer + 1) << KERNEL_FAILED_PEER_SHIFT)
                | ((rank + 1) << KERNEL_FAILED_RANK_SHIFT)
                | if mismatch { KERNEL_FAILED_MISMATCH } else { 0 }
        };
        let f = KernelFailure::from_flag(flag(1, 0, true)).expect("a kernel's failure");
        assert_eq!((f.rank, f.waited_for, f.mismatch), (Some(1), Some(0), true));
        assert_eq!(
            f.to_string(),
            "rank 1's collective kernel found that rank 0 made a different (mismatched) call"
        );
        let f = KernelFailure::from_flag(flag(7, 6, false)).expect("a kernel's failure");
        assert_eq!(
            f.to_string(),
            "rank 7's collective kernel reached its time limit waiting for rank 6"
        );
        // A kernel that named no rank (the value older kernels wrote).
        let f = KernelFailure::from_flag(KERNEL_FAILED).expect("a kernel's failure");
        assert_eq!((f.rank, f.waited_for, f.mismatch), (None, None, false));
        assert_eq!(f.to_string(), "a collective kernel reached its time limit");
        // Not a kernel's failure: unset, or the host's abort.
        assert_eq!(KernelFailure::from_flag(0), None);
        assert_eq!(KernelFailure::from_flag(ABORTED), None);
    }
}
