//! Aborts, synchronising with a deadline, and what a failed call reports.

use p2p_mem::{DeviceMemory, Stream};

use p2p_mem::abort::AbortHandle;

use crate::error::{Error, Result};
use crate::plan::{self, Kind};
use crate::types::DataType;

use super::*;

impl Communicator {
    /// A handle that aborts this communicator from any thread (in one process, every rank made
    /// by the same `init_all` shares it).
    pub fn abort_handle(&self) -> AbortHandle {
        self.abort.clone()
    }

    /// Stops every running and queued call: each waiting kernel thread sees it within a few
    /// milliseconds (it reads the flag at most once every 6.4 ms), and later calls fail.
    pub fn abort(&self) {
        self.abort.abort();
    }

    /// Waits for everything queued on `stream`, then reports a call that stalled, was
    /// aborted or did not match its peers' as an error. After such an error the communicator
    /// is unusable.
    ///
    /// The wait has a limit: the communicator's time limit ([`Options`]'s `timeout`) plus
    /// [`SYNC_GRACE`], past which every call of ours has ended (each stops at its own time
    /// limit or an abort). A stream still running then holds other work (yours, queued
    /// before): that is [`Error::NotDrained`], and nothing is stopped.
    /// The report that follows reads the status words ([`check`](Self::check)) within
    /// [`SYNC_GRACE`] more.
    pub fn synchronize(&self, stream: &Stream) -> Result<()> {
        let limit = self.options.timeout.saturating_add(SYNC_GRACE);
        match stream.synchronize_within(limit) {
            Ok(true) => self.check(),
            Ok(false) => Err(Error::NotDrained {
                rank: self.rank,
                device: self.device.ordinal(),
                waited: limit,
                aborted: self
                    .abort
                    .reason()
                    .map(|(r, why)| format!(" (the communicator was aborted by rank {r}: {why})"))
                    .unwrap_or_default(),
            }),
            Err(e) => {
                // A fault on this rank's stream: the other ranks would wait for it until their
                // time limit, so stop them now.
                self.abort
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
        let mut st = [0u64; STATUS_WORDS];
        // Bounded: the read is a synchronous copy, ordered after the work of the GPU's legacy
        // default stream and blocking streams, which may be anyone's.
        self.workspace
            .copy_range_to_host_within(STATUS_OFF * 8, &mut st, SYNC_GRACE)?;
        if st[0] == 0 {
            return Ok(());
        }
        let op = match st[1] as usize {
            crate::abi::K_SEND => "send".to_string(),
            crate::abi::K_RECV | crate::abi::K_RECV_ORDER => "recv".to_string(),
            code => Kind::from_code(code as u64)
                .map(|k| k.op().name().to_string())
                .unwrap_or_else(|| "a collective".into()),
        };
        let (peer, block) = (st[2] as usize, st[3]);
        let err = match (st[0], self.abort.reason()) {
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
        if let Ok(mut f) = self.failed.lock() {
            f.get_or_insert_with(|| err.to_string());
        }
        Err(err)
    }

    /// The error a kernel's status words describe.
    pub(super) fn kernel_error(
        &self,
        code: u64,
        op: String,
        peer: usize,
        block: u64,
        st: &[u64],
    ) -> Error {
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
                        if self.share > 1 && self.group.is_none() {
                            if let Some(advice) = few_queues() {
                                why = format!("{why} (maybe not a peer's fault: {advice})");
                            }
                        }
                        why
                    }
                    c if c == F_ABORT as u64 => match self.abort.reason() {
                        Some((_, why)) => format!("was aborted ({why})"),
                        None => match self.abort.kernel_failure() {
                            Some(f) => format!("was stopped ({f}, on this process)"),
                            None => "was aborted".into(),
                        },
                    },
                    c => format!("failed (kernel status {c})"),
                },
            },
        }
    }

    /// Before queueing `op` on `stream`: the communicator is usable and the stream is on this
    /// rank's GPU.
    pub(crate) fn ready_on(&self, op: &'static str, stream: &Stream) -> Result<()> {
        self.usable(op)?;
        if stream.device() != &self.device {
            return Err(Error::InvalidArgument {
                op,
                rank: self.rank,
                what: format!(
                    "the stream is on GPU {}, this rank's GPU is {}",
                    stream.device().ordinal(),
                    self.device.ordinal()
                ),
            });
        }
        Ok(())
    }

    /// The `what` buffer of `op` is on this rank's GPU and holds `len` elements of `dtype`.
    pub(crate) fn check_region(
        &self,
        op: &'static str,
        what: &str,
        region: &Region<'_>,
        len: usize,
        dtype: DataType,
    ) -> Result<()> {
        let bad = |what: String| Error::InvalidArgument {
            op,
            rank: self.rank,
            what,
        };
        if region.device != &self.device {
            return Err(bad(format!(
                "the {what} buffer is on GPU {}, this rank's GPU is {}",
                region.device.ordinal(),
                self.device.ordinal()
            )));
        }
        let need = len * dtype.size();
        if region.bytes < need {
            return Err(bad(format!(
                "the {what} buffer holds {} bytes; {len} elements of {dtype} need {need}",
                region.bytes
            )));
        }
        Ok(())
    }

    pub(super) fn usable(&self, op: &'static str) -> Result<()> {
        if self.abort.is_aborted() {
            return Err(Error::Unusable {
                op,
                rank: self.rank,
                why: match self.abort.reason() {
                    Some((r, why)) if r != self.rank => format!("rank {r} failed: {why}"),
                    Some((_, why)) => format!("it was aborted: {why}"),
                    None => "it was aborted".into(),
                },
            });
        }
        if let Some(why) = self.failed.lock().ok().and_then(|f| f.clone()) {
            return Err(Error::Unusable {
                op,
                rank: self.rank,
                why,
            });
        }
        Ok(())
    }
}
