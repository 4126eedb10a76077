//! The launch floor: an empty kernel launched as the collectives launch theirs, for the
//! benchmarks (tool code, so it lives here rather than in a library crate).

use p2p_mem::kernel::{Function, KernelArgs, LaunchConfig, Module};

use crate::kernels::EMPTY;
use p2p_mem::Device;

/// 64-bit words in the argument block of `empty_args_kernel`: the collectives' block
/// ([`p2p_collective::comm::KERNEL_ARGS_BYTES`]; a test checks the two agree).
pub const ARGS_WORDS: usize = 47;

/// The argument block of `empty_args_kernel` (`struct EmptyArgs` in [`EMPTY`]).
#[repr(C)]
#[derive(Clone, Copy)]
struct EmptyArgs {
    w: [u64; ARGS_WORDS],
}

// SAFETY: `#[repr(C)]`, laid out as `struct EmptyArgs { unsigned long long w[ARGS_WORDS]; }`,
// the one by-value parameter of `empty_args_kernel` (ARGS_WORDS the same in both texts).
#[allow(unsafe_code)]
unsafe impl KernelArgs for EmptyArgs {}

/// How [`EmptyKernel::launch_as`] launches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Launch {
    /// Programmatic dependent launch (as the collectives launch, unless ranks share a GPU).
    pub overlapped: bool,
    /// Pass a zeroed argument block the size of the collectives' (`empty_args_kernel`).
    pub args: bool,
}

/// A kernel that does nothing, launched the way the collectives launch theirs (programmatic
/// dependent launch on compute capability 9.0+): what it costs per launch is the floor under
/// any one-kernel operation. Benchmarks measure it beside the collectives.
pub struct EmptyKernel {
    module: Module,
    function: Function<()>,
    with_args: Function<EmptyArgs>,
}

impl EmptyKernel {
    /// Compiles (cached) and loads the kernel on `device`.
    pub fn load(device: &Device) -> p2p_mem::Result<EmptyKernel> {
        let module = Module::build(device, &EMPTY)?;
        Ok(EmptyKernel {
            function: module.function("empty_kernel")?,
            with_args: module.function("empty_args_kernel")?,
            module,
        })
    }

    /// Queues one launch of `grid` blocks of `block` threads on `stream` (of this kernel's GPU),
    /// with no parameters and programmatic dependent launch.
    pub fn launch(&self, grid: u32, block: u32, stream: &p2p_mem::Stream) -> p2p_mem::Result<()> {
        let how = Launch {
            overlapped: true,
            args: false,
        };
        self.launch_as(how, grid, block, stream)
    }

    /// Queues one launch as `how` says.
    #[allow(unsafe_code)] // kernel launches: the one unsafe block in this crate's library
    pub fn launch_as(
        &self,
        how: Launch,
        grid: u32,
        block: u32,
        stream: &p2p_mem::Stream,
    ) -> p2p_mem::Result<()> {
        let config = LaunchConfig::new(grid, block).overlapped(how.overlapped);
        // SAFETY: `empty_kernel` takes no parameters; `empty_args_kernel` one by-value block
        // of ARGS_WORDS words (EmptyArgs). Neither kernel touches memory, and both start with
        // the `griddepcontrol.wait` that an overlapped launch asks for.
        unsafe {
            if how.args {
                let args = EmptyArgs { w: [0; ARGS_WORDS] };
                self.module.launch(&self.with_args, config, &args, stream)
            } else {
                self.module.launch(&self.function, config, &(), stream)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_argument_block_is_the_collectives_size_in_rust_and_cuda() {
        assert_eq!(
            ARGS_WORDS * 8,
            p2p_collective::comm::KERNEL_ARGS_BYTES,
            "change ARGS_WORDS here and in EMPTY's source"
        );
        assert!(EMPTY
            .code
            .contains(&format!("#define ARGS_WORDS {ARGS_WORDS}\n")));
    }
}
