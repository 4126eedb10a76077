//! Errors of `p2p-collective`.
//!
//! Flat, as each layer's are: this layer wraps only the one below it, the transport's error
//! ([`Error::Transport`]), which in turn wraps the memory layer's, which wraps `p2p-sys`'s. A
//! memory or configuration error met here converts into the transport's error first, so each
//! failure has one place in the tree whatever layer it surfaced in; [`Error::sys`] reaches the
//! failed FFI call under any of them.

/// An error from a communicator or a collective.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// From the layers below: the transport (connections, the rendezvous, `P2P_*` settings)
    /// and, through it, memory (buffers, peer access, IPC handles, kernels) and CUDA calls.
    #[error(transparent)]
    Transport(#[from] p2p_transport::Error),
    /// A call's arguments are wrong; nothing was queued.
    #[error("{op} on rank {rank}: {what}")]
    InvalidArgument {
        /// The refused operation.
        op: &'static str,
        /// This rank.
        rank: usize,
        /// What is wrong and what would be right.
        what: String,
    },
    /// [`Communicator::synchronize`](crate::Communicator::synchronize) gave up: the stream
    /// still ran at its limit (the communicator's time limit and a grace). Nothing was stopped.
    #[error("synchronize on rank {rank} (GPU {device}): the stream still ran after {waited:?}; what runs there is work queued before p2p's calls (yours), or a call of ours past its time limit{aborted}. Nothing was stopped: synchronize again to wait on, or abort() the communicator")]
    NotDrained {
        /// This rank.
        rank: usize,
        /// This rank's GPU.
        device: i32,
        /// How long it waited.
        waited: std::time::Duration,
        /// Empty, or why the communicator was already aborted.
        aborted: String,
    },
    /// [`Communicator::deregister`](crate::Communicator::deregister) gave up: a call that may
    /// use the window still ran at its limit (the communicator's time limit and a grace).
    /// Nothing was stopped, and the buffer stays registered.
    #[error("deregister on rank {rank} (GPU {device}): {waited_for} still ran after {waited:?}, so the buffer stays registered; nothing was stopped: wait for your streams (synchronize) and deregister again, or abort() the communicator")]
    StillInUse {
        /// This rank.
        rank: usize,
        /// This rank's GPU.
        device: i32,
        /// How long it waited.
        waited: std::time::Duration,
        /// What it waited for.
        waited_for: &'static str,
    },
    /// A collective waited for a peer past the time limit, or was aborted.
    #[error("{op} on rank {rank} (GPU {device}) {why} waiting for rank {peer} (block {block}); the communicator is now unusable: create a new one")]
    Stalled {
        /// The collective that stopped.
        op: String,
        /// This rank.
        rank: usize,
        /// This rank's GPU.
        device: i32,
        /// The rank it waited for.
        peer: usize,
        /// The kernel block that saw it.
        block: u64,
        /// `timed out after ...` or `was aborted`.
        why: String,
    },
    /// Another rank failed (its process died, it aborted, or its call failed) and this rank's
    /// call stopped because of it.
    #[error("{op} on rank {}: rank {} failed: {}; {}", failure.rank, failure.peer, failure.why, if op == "init" { "no communicator was made" } else { "the communicator is now unusable: create a new one" })]
    PeerFailed {
        /// The collective that stopped.
        op: String,
        /// Which rank failed, what happened to it, and which rank saw it (the transport's one
        /// description of a peer's failure).
        failure: p2p_transport::PeerFailure,
    },
    /// Ranks made different calls (found in checking mode, `P2P_CHECK=1`).
    #[error("{op} on rank {rank}: rank {peer} made a different call: rank {rank} called {mine}, rank {peer} called {theirs}; the communicator is now unusable")]
    Mismatch {
        /// This rank's operation.
        op: String,
        /// This rank.
        rank: usize,
        /// The peer whose call differs.
        peer: usize,
        /// This rank's call, in words.
        mine: String,
        /// The peer's call, in words.
        theirs: String,
    },
    /// The communicator failed or was aborted earlier; nothing was queued.
    #[error("{op} on rank {rank}: the communicator is unusable ({why}); create a new one")]
    Unusable {
        /// The refused operation.
        op: &'static str,
        /// This rank.
        rank: usize,
        /// What happened before.
        why: String,
    },
    /// Setting up a communicator between processes failed.
    #[error("bootstrap of rank {rank}: {why}")]
    Bootstrap {
        /// This rank.
        rank: usize,
        /// What went wrong and what to check.
        why: String,
    },
}
p2p_sys::debug_as_display!(Error);

impl Error {
    /// The failed FFI call (or missing library) under this error, whichever layer it came
    /// through (a memory error, or a transport error that holds one): for example
    /// `e.sys().and_then(|s| s.call())` names the CUDA function, and
    /// [`is_driver`](Self::is_driver) tests its result code.
    pub fn sys(&self) -> Option<&p2p_sys::Error> {
        match self {
            Error::Transport(e) => e.sys(),
            _ => None,
        }
    }

    /// The memory layer's error under this one, if that is where it came from.
    pub fn mem(&self) -> Option<&p2p_mem::Error> {
        match self {
            Error::Transport(p2p_transport::Error::Mem(e)) => Some(e),
            _ => None,
        }
    }

    /// A peer's failure that the transport's rendezvous group reported, as this layer's
    /// [`Error::PeerFailed`] of `op`; any other error as it is.
    pub(crate) fn peer_failure_in(self, op: &str) -> Error {
        match self {
            Error::Transport(p2p_transport::Error::PeerFailed(failure)) => Error::PeerFailed {
                op: op.into(),
                failure,
            },
            e => e,
        }
    }

    /// Whether a failed driver call that returned `code` is under this error, whichever layer it
    /// came through.
    pub fn is_driver(&self, code: p2p_sys::cuda::CUresult) -> bool {
        self.sys().is_some_and(|e| e.is_driver(code))
    }
}

/// A memory-layer error, through the transport's (the one layer this one wraps).
impl From<p2p_mem::Error> for Error {
    fn from(e: p2p_mem::Error) -> Error {
        Error::Transport(e.into())
    }
}

/// A `P2P_*` setting that could not be used, through the transport's error (which owns the
/// settings' parsing).
impl From<p2p_transport::config::ConfigError> for Error {
    fn from(e: p2p_transport::config::ConfigError) -> Error {
        Error::Transport(e.into())
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::Error;
    use p2p_sys::cuda::CUresult;

    #[test]
    fn an_error_returned_from_main_reads_as_its_sentence() {
        // `fn main() -> Result<(), Box<dyn Error>>` prints `Error: {:?}`.
        let e = Error::from(p2p_mem::Error::Sys(p2p_sys::Error::LibraryNotFound {
            library: "libcuda",
            searched: vec!["libcuda.so.1".into()],
        }));
        let debug = format!("{e:?}");
        assert_eq!(debug, e.to_string());
        assert!(
            debug.starts_with(
                "libcuda was not found (searched: libcuda.so.1); install the NVIDIA driver"
            ),
            "{debug}"
        );
        let boxed: Box<dyn std::error::Error> = Box::new(e);
        assert!(!format!("{boxed:?}").contains("LibraryNotFound"));
    }

    /// A failed driver call, as `p2p_sys::check_cu` makes it.
    fn oom() -> p2p_sys::Error {
        p2p_sys::check_cu("cuMemAlloc_v2", CUresult::CUDA_ERROR_OUT_OF_MEMORY)
            .expect_err("a failure")
    }

    #[test]
    fn one_cuda_failure_reads_the_same_through_every_path() {
        let mem = || p2p_mem::Error::Cuda {
            device: 0,
            source: oom(),
        };
        let paths: Vec<Error> = vec![
            Error::from(mem()),
            Error::from(p2p_mem::Error::Sys(oom())),
            Error::Transport(p2p_transport::Error::Cuda {
                device: 0,
                peer: Some(1),
                source: oom(),
            }),
            Error::Transport(p2p_transport::Error::Earlier {
                what: "a kernel module",
                source: std::sync::Arc::new(p2p_transport::Error::Mem(mem())),
            }),
        ];
        for e in &paths {
            assert!(e.is_driver(CUresult::CUDA_ERROR_OUT_OF_MEMORY), "{e:?}");
            assert!(!e.is_driver(CUresult::CUDA_ERROR_INVALID_VALUE), "{e:?}");
            assert_eq!(
                e.sys().and_then(|s| s.call()),
                Some("cuMemAlloc_v2"),
                "{e:?}"
            );
        }
        // A death the group found in init is this layer's PeerFailed, worded for no communicator.
        let dead = Error::Transport(p2p_transport::Error::PeerFailed(
            p2p_transport::PeerFailure {
                rank: 0,
                peer: 1,
                why: "its process exited".into(),
            },
        ))
        .peer_failure_in("init");
        assert!(
            matches!(&dead, Error::PeerFailed { failure, .. } if failure.peer == 1),
            "{dead:?}"
        );
        assert_eq!(
            dead.to_string(),
            "init on rank 0: rank 1 failed: its process exited; no communicator was made"
        );
        let none = Error::Bootstrap {
            rank: 0,
            why: "no CUDA here".into(),
        };
        assert!(none.sys().is_none());
        assert!(!none.is_driver(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
    }

    #[test]
    fn a_deregister_past_its_limit_names_the_rank_the_wait_and_what_to_do() {
        let e = Error::StillInUse {
            rank: 1,
            device: 3,
            waited: std::time::Duration::from_millis(5200),
            waited_for: "its last call on registered buffers",
        };
        assert_eq!(
            e.to_string(),
            "deregister on rank 1 (GPU 3): its last call on registered buffers still ran after \
             5.2s, so the buffer stays registered; nothing was stopped: wait for your streams \
             (synchronize) and deregister again, or abort() the communicator"
        );
    }
}
