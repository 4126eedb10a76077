//! The launch floor: an empty kernel launched as the collectives launch theirs, for the
//! benchmarks (tool code, so it lives here rather than in a library crate).

use p2p_mem::kernel::{arch_for, compile_cached, Function, Module, Source};
use p2p_mem::Device;

/// The empty kernel of [`EmptyKernel`].
pub const EMPTY: Source = Source {
    name: "empty.cu",
    code: r#"
extern "C" __global__ void empty_kernel() {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
"#,
};

/// A kernel that does nothing, launched the way the collectives launch theirs (programmatic
/// dependent launch on compute capability 9.0+): what it costs per launch is the floor under
/// any one-kernel operation. Benchmarks measure it beside the collectives.
pub struct EmptyKernel {
    module: Module,
    function: Function,
}

impl EmptyKernel {
    /// Compiles (cached) and loads the kernel on `device`.
    pub fn load(device: &Device) -> p2p_mem::Result<EmptyKernel> {
        let cubin = compile_cached(&EMPTY, &arch_for(device))?;
        let module = Module::load(device, &cubin)?;
        let function = module.function("empty_kernel")?;
        Ok(EmptyKernel { module, function })
    }

    /// Queues one launch of `grid` blocks of `block` threads on `stream` (of this kernel's GPU).
    #[allow(unsafe_code)] // a kernel launch: the one unsafe call in this crate's library
    pub fn launch(&self, grid: u32, block: u32, stream: &p2p_mem::Stream) -> p2p_mem::Result<()> {
        // SAFETY: the kernel takes no parameters and touches no memory; its first instruction
        // is the `griddepcontrol.wait` that launch_overlapped asks for.
        unsafe {
            self.module
                .launch_overlapped(self.function, grid, block, &mut [], stream)
        }
    }
}
