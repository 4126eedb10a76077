//! Errors of `p2p-transport`.

/// An error from `p2p-transport`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// From the memory layer (CUDA calls on a device, buffers, peer access).
    #[error(transparent)]
    Mem(#[from] p2p_mem::Error),
    /// From the FFI layer (a missing library, a failed NVRTC call).
    #[error(transparent)]
    Sys(#[from] p2p_sys::Error),
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

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
