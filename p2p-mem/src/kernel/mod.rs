//! The GPU runtime for our own kernels: CUDA C++ shipped compiled for sm_80 and sm_90
//! ([`shipped`]), else compiled by NVRTC for the device's own architecture at first use and
//! cached on disk; loaded into a device's context and launched.
//!
//! Every crate's kernels go through here (the transport's copy, probe, latency and send/recv
//! kernels, the collectives' `coll.cu`): [`compile_cached_all`] is the one compile path (the
//! shipped cubins first, then an in-process
//! memo plus an on-disk cache keyed by the source, its macros, the target and the NVRTC release,
//! [`compiler`]; the sources missing from it compile in parallel threads, waited for at most
//! [`COMPILE_LIMIT`]), [`compile_cached`] its
//! one-source case; [`compile_all`] and [`compile`] are the uncached step under them, for CI's
//! compile checks. [`Module`] loads a cubin and launches its [`Function`]s on a [`Stream`](crate::Stream).
//!
//! ```no_run
//! use p2p_mem::kernel::{LaunchConfig, Module, Source};
//! const K: Source = Source {
//!     name: "k.cu",
//!     code: "extern \"C\" __global__ void k() {}",
//!     defines: &[],
//!     shipped: &[],
//! };
//! let gpu = p2p_mem::Device::new(0)?;
//! let stream = p2p_mem::Stream::new(&gpu)?;
//! let module = Module::build(&gpu, &K)?;
//! // `k` takes no parameters: `()` (see `KernelArgs` for the forms a kernel's parameters take).
//! let k = module.function::<()>("k")?;
//! // SAFETY: `k` takes no parameters and touches no memory.
//! unsafe { module.launch(&k, LaunchConfig::new(1, 32), &(), &stream)? };
//! # Ok::<(), p2p_mem::Error>(())
//! ```

use crate::device::Device;

mod args;
mod cache;
mod compile;
mod module;
pub mod shipped;
#[cfg(test)]
mod tests;

pub use args::*;
pub use cache::*;
pub use compile::*;
pub use module::*;

/// A kernel source: its name, CUDA C++ text and the macros it is compiled with.
#[derive(Debug, Clone, Copy)]
pub struct Source {
    /// File name, used in error messages.
    pub name: &'static str,
    /// The CUDA C++ code.
    pub code: &'static str,
    /// Macros defined for the compile, each `NAME` or `NAME=VALUE` (NVRTC's `-D`): one text
    /// compiled into several programs, e.g. a part of its kernels each (empty for most).
    pub defines: &'static [&'static str],
    /// The crate's archive of shipped cubins ([`shipped`]; `include_bytes!` of the file
    /// `cargo xtask kernels` writes), empty for none. An image in it is used only if it was
    /// compiled from this very source.
    pub shipped: &'static [u8],
}

impl Source {
    /// The source `name` of text `code`, compiled with no macros, its cubins shipped in
    /// `shipped` (empty for none): for a crate's kernel constants,
    /// `const K: Source = Source::new("k.cu", include_str!("k.cu"), SHIPPED);`.
    pub const fn new(name: &'static str, code: &'static str, shipped: &'static [u8]) -> Source {
        Source {
            name,
            code,
            defines: &[],
            shipped,
        }
    }

    /// The name, with the macros if any: `coll.cu [COLL_PART=0]`.
    fn label(&self) -> String {
        if self.defines.is_empty() {
            self.name.to_string()
        } else {
            format!("{} [{}]", self.name, self.defines.join(" "))
        }
    }
}

/// `sm_90` for compute capability 9.0.
pub fn arch_for(device: &Device) -> String {
    let (major, minor) = device.compute_capability();
    format!("sm_{major}{minor}")
}
