//! The SM path's kernel and launch shape (the copies themselves are [`Transport`]
//! (crate::Transport) methods in [`crate::copy`]).

use p2p_mem::kernel::{Function, Module};

use crate::kernels::abi;

/// Threads per block of the SM copy kernel.
pub const SM_THREADS: u32 = 512;
/// Blocks per SM of the SM copy kernel (the grid is capped by the data size).
pub const SM_BLOCKS_PER_SM: u32 = 2;

/// The SM copy kernel of one GPU (kept by the [`Transport`](crate::Transport)).
pub(crate) struct CopyKernel {
    pub(crate) module: Module,
    pub(crate) copy: Function<abi::CopyArgs>,
}

/// The launch shape of the SM copy kernel: blocks per SM (capped by the data) and threads per
/// block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SmGrid {
    /// Blocks per streaming multiprocessor.
    pub blocks_per_sm: u32,
    /// Threads per block (a multiple of 32, at most 1024).
    pub threads: u32,
}

impl SmGrid {
    /// The default shape.
    pub const DEFAULT: SmGrid = SmGrid {
        blocks_per_sm: SM_BLOCKS_PER_SM,
        threads: SM_THREADS,
    };
}
