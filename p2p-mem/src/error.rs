//! The errors of `p2p-mem`: every variant names the device (and the peer, where there is one)
//! and says what to do.

use crate::wire::DecodeError;

/// An error from `p2p-mem`.
#[derive(thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The FFI layer failed before any device was involved (a missing library, `cuInit`).
    #[error(transparent)]
    Sys(#[from] p2p_sys::Error),
    /// A CUDA call failed on one device.
    #[error("GPU {device}: {source}")]
    Cuda {
        /// The device ordinal.
        device: i32,
        /// The failed call.
        #[source]
        source: p2p_sys::Error,
    },
    /// A CUDA call between two devices failed.
    #[error("GPU {device} -> GPU {peer}: {source}")]
    Peer {
        /// The device whose context made the call.
        device: i32,
        /// The other device.
        peer: i32,
        /// The failed call.
        #[source]
        source: p2p_sys::Error,
    },
    /// The ordinal is past the number of visible devices.
    #[error(
        "GPU {ordinal} does not exist: {count} visible (check nvidia-smi and CUDA_VISIBLE_DEVICES)"
    )]
    NoSuchDevice {
        /// The ordinal asked for.
        ordinal: i32,
        /// How many devices are visible.
        count: i32,
    },
    /// The two devices cannot map each other's memory.
    #[error(
        "GPU {device} -> GPU {peer}: peer access is not supported (cuDeviceCanAccessPeer = 0); \
         move data host-staged or through an intermediate GPU"
    )]
    PeerUnsupported {
        /// The device that would access.
        device: i32,
        /// The device whose memory would be accessed.
        peer: i32,
    },
    /// The device already has peer access to as many devices as the driver allows (8).
    #[error(
        "GPU {device} -> GPU {peer}: GPU {device} already has peer access enabled to the driver's \
         limit of 8 GPUs; disable peer access to one of them first"
    )]
    PeerSlotsExhausted {
        /// The device out of slots.
        device: i32,
        /// The peer that did not fit.
        peer: i32,
    },
    /// A range or view lies outside its buffer.
    #[error("range {start}..{end} is out of bounds for a buffer of {len} elements")]
    OutOfBounds {
        /// First element asked for.
        start: usize,
        /// One past the last element asked for.
        end: usize,
        /// The buffer's length in elements.
        len: usize,
    },
    /// Two sides of a copy differ in size.
    #[error("size mismatch: {what} is {got} bytes, expected {expected}")]
    SizeMismatch {
        /// Which side is wrong.
        what: &'static str,
        /// The size required.
        expected: usize,
        /// The size given.
        got: usize,
    },
    /// A handle was imported by the process that exported it, which CUDA does not allow.
    #[error(
        "this {kind} handle was exported by this very process (pid {pid}); CUDA cannot import it \
         here: use the exporting buffer's device pointer instead"
    )]
    ImportInExporter {
        /// `IPC memory` or `IPC event`.
        kind: &'static str,
        /// This process's id.
        pid: u32,
    },
    /// The driver, the device or the system does not support the operation here.
    #[error("{what} is not supported here: {reason}")]
    Unsupported {
        /// The operation.
        what: &'static str,
        /// Why, with the evidence.
        reason: String,
    },
    /// Bytes that should have been a handle were not.
    #[error("malformed handle: {0}")]
    Decode(#[from] DecodeError),
    /// An operating-system call failed.
    #[error("{op}: {source}")]
    Io {
        /// What was being done, e.g. `connect to /run/user/0/p2p-1234/sock`.
        op: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The process at the other end of a socket runs as another user.
    #[error(
        "the peer process runs as uid {got}, not {expected}: refusing to exchange file descriptors"
    )]
    PeerCredentials {
        /// Our uid.
        expected: u32,
        /// The peer's uid.
        got: u32,
    },
    /// A message on the fd socket broke the protocol (truncated, wrong number of fds, ...).
    #[error("fd socket protocol: {0}")]
    Protocol(String),
    /// The process at the other end closed the socket (it exited, crashed or hung up).
    #[error("the peer process closed the socket while {0}")]
    Closed(String),
    /// An argument is outside what the call accepts.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The kernel cache could not hold what was compiled ([`crate::kernel::cache_all`]).
    #[error("the kernel cache in {dir} does not hold the kernels: {why}; set XDG_CACHE_HOME to a writable folder")]
    Cache {
        /// The cache folder.
        dir: String,
        /// What went wrong.
        why: String,
    },
    /// A synchronous copy, fill or event wait gave up ([`crate::HOST_WAIT`], or the limit it
    /// was given): the work it is ordered after, or the operation itself, still ran. Nothing
    /// was stopped.
    #[error("{op} on GPU {device}: {waiting_for} still ran after {waited:?}, so {outcome}; nothing was stopped: let that work finish (or find the kernel that does not end) and try again")]
    Busy {
        /// The operation, e.g. `copy to host`.
        op: &'static str,
        /// The device ordinal.
        device: i32,
        /// The work it waited for.
        waiting_for: &'static str,
        /// How long it waited.
        waited: std::time::Duration,
        /// What became of the operation: not made, queued and not finished, or a wait given up.
        outcome: &'static str,
    },
    /// NVRTC did not finish compiling kernels within the limit
    /// ([`crate::kernel::COMPILE_LIMIT`]). The compile goes on in its thread and fills the
    /// kernel cache when it ends.
    #[error("NVRTC did not finish compiling {kernels} for {arch} within {limit:?}; it goes on in the background and fills the kernel cache when it ends. To start without compiling: on sm_80-sm_90 GPUs use the shipped kernels (P2P_KERNELS=shipped, the default; unset P2P_KERNELS=compile), or fill the cache ahead of the job with `p2p-bench kernels` (Communicator::precompile) where the job runs")]
    CompileTimeout {
        /// The kernel sources being compiled.
        kernels: String,
        /// The target, e.g. `sm_90`.
        arch: String,
        /// The limit it met.
        limit: std::time::Duration,
    },
    /// NVRTC rejected a kernel: the log says why.
    #[error("NVRTC could not compile {kernel} for {arch}:\n{log}")]
    Compile {
        /// The kernel source's name.
        kernel: String,
        /// The target, e.g. `sm_90`.
        arch: String,
        /// The compiler's log.
        log: String,
    },
}
p2p_sys::debug_as_display!(Error);

impl Error {
    /// The failed FFI call (or missing library) under this error, if it holds one: the same
    /// [`p2p_sys::Error`] whichever variant carries it. The layers above have the same method,
    /// so code can ask any of them which CUDA call failed, and how, without knowing the path
    /// the failure took.
    pub fn sys(&self) -> Option<&p2p_sys::Error> {
        match self {
            Error::Sys(e) | Error::Cuda { source: e, .. } | Error::Peer { source: e, .. } => {
                Some(e)
            }
            _ => None,
        }
    }

    /// Whether a failed driver call that returned `code` is under this error (see
    /// [`sys`](Self::sys)).
    pub fn is_driver(&self, code: p2p_sys::cuda::CUresult) -> bool {
        self.sys().is_some_and(|e| e.is_driver(code))
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Attaches the device ordinal to a failed FFI call.
pub(crate) trait OnDevice<T> {
    /// The error happened on `device`.
    fn on(self, device: i32) -> Result<T>;
    /// The error happened between `device` and `peer`.
    fn between(self, device: i32, peer: i32) -> Result<T>;
}

impl<T> OnDevice<T> for std::result::Result<T, p2p_sys::Error> {
    fn on(self, device: i32) -> Result<T> {
        self.map_err(|source| Error::Cuda { device, source })
    }
    fn between(self, device: i32, peer: i32) -> Result<T> {
        self.map_err(|source| Error::Peer {
            device,
            peer,
            source,
        })
    }
}

/// An OS error from `op` (a rustix call), in this crate's error type.
pub(crate) fn os(op: impl Into<String>) -> impl FnOnce(rustix::io::Errno) -> Error {
    let op = op.into();
    move |e| Error::Io {
        op,
        source: e.into(),
    }
}
