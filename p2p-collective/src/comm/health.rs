//! Whether a communicator is usable: aborting it, synchronising with a deadline, and what a
//! failed call reports (the kernels' status words read back as an error naming the call,
//! the rank, the peer and the cause).

use std::sync::Mutex;

use p2p_mem::abort::{
    AbortHandle, KERNEL_FAILED, KERNEL_FAILED_MISMATCH, KERNEL_FAILED_PEER_SHIFT,
    KERNEL_FAILED_RANK_SHIFT,
};
use p2p_mem::Stream;

use crate::abi::{F_ABORT, F_MISMATCH, F_TIMEOUT};
use crate::error::{Error, Result};
use crate::plan;

use super::{init::few_queues, Communicator, SYNC_GRACE};

// The kernels' values for the abort flag are the GPU runtime's (AbortHandle reads them).
const _: () = assert!(crate::abi::ABORT_KERNEL_FAILED == KERNEL_FAILED as usize);
const _: () = assert!(crate::abi::ABORT_PEER_SHIFT == KERNEL_FAILED_PEER_SHIFT as usize);
const _: () = assert!(crate::abi::ABORT_RANK_SHIFT == KERNEL_FAILED_RANK_SHIFT as usize);
const _: () = assert!(crate::abi::ABORT_MISMATCH == KERNEL_FAILED_MISMATCH as usize);

/// A communicator's health: the abort flag its kernels poll (shared by every rank of one
/// `init_all`, watched by the job's monitor), and the first failure a call reported (after
/// which every call is refused).
pub(crate) struct Health {
    pub(crate) abort: AbortHandle,
    failed: Mutex<Option<String>>,
}

impl Health {
    pub(crate) fn new(abort: AbortHandle) -> Health {
        Health {
            abort,
            failed: Mutex::new(None),
        }
    }

    /// Refuses `op` on `rank` if the communicator was aborted or a call of it failed.
    pub(crate) fn usable(&self, op: &'static str, rank: usize) -> Result<()> {
        if self.abort.is_aborted() {
            return Err(Error::Unusable {
                op,
                rank,
                why: match self.abort.reason() {
                    Some((r, why)) if r != rank => format!("rank {r} failed: {why}"),
                    Some((_, why)) => format!("it was aborted: {why}"),
                    None => "it was aborted".into(),
                },
            });
        }
        if let Some(why) = self.failed.lock().ok().and_then(|f| f.clone()) {
            return Err(Error::Unusable { op, rank, why });
        }
        Ok(())
    }

    /// After an error queueing a call's work on `rank`: the peers may already be waiting for
    /// this rank's kernel (or barrier), so stop them now rather than at their time limit.
    pub(crate) fn abort_on_error(&self, rank: usize, op: &str, queued: Result<()>) -> Result<()> {
        if let Err(e) = &queued {
            self.abort.abort_because(
                rank,
                format!("queueing {op} failed, so its peers would wait for this rank: {e}"),
            );
        }
        queued
    }

    /// Keeps the first failure reported, which every later call is refused with.
    fn record(&self, err: &Error) {
        if let Ok(mut f) = self.failed.lock() {
            f.get_or_insert_with(|| err.to_string());
        }
    }
}

impl Communicator {
    /// A handle that aborts this communicator from any thread (in one process, every rank made
    /// by the same `init_all` shares it).
    pub fn abort_handle(&self) -> AbortHandle {
        self.health.abort.clone()
    }

    /// Stops every running and queued call: each waiting kernel thread sees it within a few
    /// milliseconds (it reads the flag at most once every 6.4 ms), and later calls fail.
    pub fn abort(&self) {
        self.health.abort.abort();
    }

    /// Waits for everything queued on `stream`, then reports a call that stalled, was
    /// aborted or did not match its peers' as an error. After such an error the communicator
    /// is unusable.
    ///
    /// The wait has a limit: the communicator's time limit ([`Options`](super::Options)'s
    /// `timeout`) plus [`SYNC_GRACE`], past which every call of ours has ended (each stops at
    /// its own time limit or an abort). A stream still running then holds other work (yours,
    /// queued before): that is [`Error::NotDrained`], and nothing is stopped. The report that
    /// follows reads the status words ([`check`](Self::check)) within [`SYNC_GRACE`] more.
    pub fn synchronize(&self, stream: &Stream) -> Result<()> {
        let limit = self.options.timeout.saturating_add(SYNC_GRACE);
        match stream.synchronize_within(limit) {
            Ok(true) => self.check(),
            Ok(false) => Err(Error::NotDrained {
                rank: self.rank,
                device: self.device.ordinal(),
                waited: limit,
                aborted: self
                    .health
                    .abort
                    .reason()
                    .map(|(r, why)| format!(" (the communicator was aborted by rank {r}: {why})"))
                    .unwrap_or_default(),
            }),
            Err(e) => {
                // A fault on this rank's stream: the other ranks would wait for it until their
                // time limit, so stop them now.
                self.health
                    .abort
                    .abort_because(self.rank, format!("a CUDA error on its stream: {e}"));
                Err(e.into())
            }
        }
    }

    /// Reports a call that already stalled, was aborted or did not match, without waiting for
    /// the calls (what [`synchronize`](Self::synchronize) does after the stream is idle). Its
    /// read of the status words is a synchronous copy, which the driver orders after the work
    /// on the GPU's legacy default stream and blocking streams (anyone's, not p2p's): it waits
    /// for that at most [`SYNC_GRACE`], then fails with the memory layer's `Busy` error.
    pub fn check(&self) -> Result<()> {
        let st = self.workspace.status(SYNC_GRACE)?;
        if st[0] == 0 {
            return Ok(());
        }
        let op = match st[1] as usize {
            crate::abi::K_SEND => "send".to_string(),
            crate::abi::K_RECV | crate::abi::K_RECV_ORDER => "recv".to_string(),
            code => plan::describe_code(code as u64)
                .map(|(op, _, _)| op.name().to_string())
                .unwrap_or_else(|| "a collective".into()),
        };
        let (peer, block) = (st[2] as usize, st[3]);
        let err = match (st[0], self.health.abort.reason()) {
            (c, Some((failed, why))) if c == F_ABORT as u64 && failed != self.rank => {
                Error::PeerFailed {
                    op,
                    failure: p2p_transport::PeerFailure {
                        rank: self.rank,
                        peer: failed,
                        why,
                    },
                }
            }
            (c, _) => self.kernel_error(c, op, peer, block, &st),
        };
        self.health.record(&err);
        Err(err)
    }

    /// The error a kernel's status words describe.
    fn kernel_error(&self, code: u64, op: String, peer: usize, block: u64, st: &[u64]) -> Error {
        match code {
            c if c == F_MISMATCH as u64 && st[1] == crate::abi::K_RECV_ORDER as u64 => {
                Error::Mismatch {
                    op,
                    rank: self.rank,
                    peer,
                    mine: format!("a recv as its message {} from rank {peer}", st[4]),
                    theirs: format!(
                        "a send as its message {} to rank {} (the order or number of messages between the two ranks differs)",
                        st[5], self.rank
                    ),
                }
            }
            c if c == F_MISMATCH as u64 && op == "recv" => Error::Mismatch {
                op,
                rank: self.rank,
                peer,
                mine: format!("recv of {} bytes", st[4]),
                theirs: format!("send of {} bytes", st[5]),
            },
            c if c == F_MISMATCH as u64 => Error::Mismatch {
                op,
                rank: self.rank,
                peer,
                mine: plan::describe(st[4]),
                theirs: plan::describe(st[5]),
            },
            code => Error::Stalled {
                op,
                rank: self.rank,
                device: self.device.ordinal(),
                peer,
                block,
                why: match code {
                    c if c == F_TIMEOUT as u64 => {
                        let mut why = format!("timed out after {:?}", self.options.timeout);
                        if self.share > 1 && self.job.is_none() {
                            if let Some(advice) = few_queues() {
                                why = format!("{why} (maybe not a peer's fault: {advice})");
                            }
                        }
                        why
                    }
                    c if c == F_ABORT as u64 => match self.health.abort.reason() {
                        Some((_, why)) => format!("was aborted ({why})"),
                        None => match self.health.abort.kernel_failure() {
                            Some(f) => format!("was stopped ({f}, on this process)"),
                            None => "was aborted".into(),
                        },
                    },
                    c => format!("failed (kernel status {c})"),
                },
            },
        }
    }
}
