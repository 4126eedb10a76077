//! Errors of `p2p-transport`.

/// An error from `p2p-transport`.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// From the memory layer (CUDA calls on a device, buffers, peer access).
    #[error(transparent)]
    Mem(#[from] p2p_mem::Error),
    /// A CUDA call the transport made itself (a peer copy, a staged leg, a connection's chunk
    /// copy) failed.
    #[error("on GPU {device}{}: {source}", peer.map(|p| format!(" (to or from GPU {p})")).unwrap_or_default())]
    Cuda {
        /// The device whose context made the call.
        device: i32,
        /// The other device of a copy between two GPUs, if any.
        peer: Option<i32>,
        /// The failed call (it names the CUDA function and its result).
        #[source]
        source: p2p_sys::Error,
    },
    /// A send or recv waited for its peer past the time limit, or was aborted.
    #[error("{op} on rank {rank} (GPU {device}) stalled waiting for rank {peer} at chunk {chunk}: {why}; the connection is now unusable")]
    Stalled {
        /// `send` or `recv`.
        op: &'static str,
        /// This rank.
        rank: usize,
        /// This rank's GPU.
        device: i32,
        /// The rank it waited for.
        peer: usize,
        /// The chunk it was waiting on.
        chunk: i64,
        /// Timed out or aborted.
        why: String,
    },
    /// A wait on a connection's stream gave up at its limit (the connection's time limit and
    /// a grace): the stream still ran, holding other work queued before. Nothing was stopped.
    #[error("{op} on rank {rank} (GPU {device}): the stream still ran after {waited:?}; what runs there is work queued before this {op} (yours), or a kernel past its time limit. Nothing was stopped: wait again, or abort the connection")]
    NotDrained {
        /// `send` or `recv`.
        op: &'static str,
        /// This rank.
        rank: usize,
        /// This rank's GPU.
        device: i32,
        /// How long it waited.
        waited: std::time::Duration,
    },
    /// A connection that already failed or was aborted.
    #[error("{op} on rank {rank}: the connection to rank {peer} is unusable ({why})")]
    Broken {
        /// The refused operation.
        op: String,
        /// This rank.
        rank: usize,
        /// The peer rank.
        peer: usize,
        /// Why.
        why: String,
    },
    /// Setting up a connection between processes failed.
    #[error("connecting to rank {peer}: {why}")]
    Handshake {
        /// The peer rank.
        peer: usize,
        /// What went wrong.
        why: String,
    },
    /// A lazily made resource (the topology, a kernel module, a bridge stream) failed when it
    /// was first made; every later use reports that same error.
    #[error("{what} could not be set up: {source}")]
    Earlier {
        /// What was being made.
        what: &'static str,
        /// The original error, kept whole.
        source: std::sync::Arc<Error>,
    },
    /// Joining a job, or an exchange between its ranks, failed.
    #[error("rendezvous{}: {why}", rank.map(|r| format!(" of rank {r}")).unwrap_or_default())]
    Rendezvous {
        /// This rank, where known.
        rank: Option<usize>,
        /// What went wrong and what to check.
        why: String,
    },
    /// Another rank of the job failed (its process died, it aborted, or a kernel of its
    /// failed); this rank stopped.
    #[error("{0}")]
    PeerFailed(PeerFailure),
    /// An NCCL communicator between hosts ([`crate::nccl`]) failed or passed its time limit,
    /// and was aborted.
    #[error("NCCL {op} on rank {rank} (GPU {device}): {why}; the NCCL communicator was aborted")]
    NcclFailed {
        /// The NCCL call.
        op: &'static str,
        /// This rank in the NCCL communicator.
        rank: usize,
        /// This rank's GPU.
        device: i32,
        /// What happened.
        why: String,
    },
    /// An argument is outside what the call accepts; nothing was done.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A `P2P_*` setting could not be used.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// Mode selection refused the pair (a forced mode that cannot work).
    #[error(transparent)]
    Mode(#[from] crate::mode::ModeError),
}
p2p_sys::debug_as_display!(Error);

impl Error {
    /// The failed FFI call (or missing library) under this error, whichever way it came: held
    /// here, in a memory error, or in the first failure of a lazily made resource.
    pub fn sys(&self) -> Option<&p2p_sys::Error> {
        match self {
            Error::Cuda { source: e, .. } => Some(e),
            Error::Mem(e) => e.sys(),
            Error::Earlier { source, .. } => source.sys(),
            _ => None,
        }
    }

    /// Whether a failed driver call that returned `code` is under this error (see
    /// [`sys`](Self::sys)).
    pub fn is_driver(&self, code: p2p_sys::cuda::CUresult) -> bool {
        self.sys().is_some_and(|e| e.is_driver(code))
    }
}

/// Turns a failed CUDA call into [`Error::Cuda`] on `device` (and `peer`, for a copy between two
/// GPUs).
pub(crate) fn cuda(device: i32, peer: Option<i32>) -> impl Fn(p2p_sys::Error) -> Error + Copy {
    move |source| Error::Cuda {
        device,
        peer,
        source,
    }
}

/// A peer's failure as a surviving rank learns it: the one description every layer reports
/// (the transport's [`Error::PeerFailed`], and the collectives' with the call that stopped).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rank {rank}: rank {peer} failed: {why}")]
pub struct PeerFailure {
    /// This rank (the survivor).
    pub rank: usize,
    /// The rank that failed.
    pub peer: usize,
    /// What happened to it.
    pub why: String,
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
