//! Moving bytes between GPUs of one process: the data paths.
//!
//! The paths are methods of the per-process context [`Transport`] (`crate::context`), which
//! keeps what they need, each made at its first use: per device the SM copy kernel and a bridge
//! stream, the peer access enabled so far, the staging pipelines (`staged.rs`) and the routes
//! of [`Transport::copy_peer`] (`routes.rs`). [`Transport::copy`] queues one
//! copy on a stream by a chosen [`Path`]; [`Transport::copy_route`] runs the path a
//! [`Route`] from mode selection calls for. Every path is stream-ordered and asynchronous: it
//! starts after the work already queued on `stream` and the stream's later work waits for it.
//!
//! | path | what moves the bytes | which stream |
//! | --- | --- | --- |
//! | [`Path::CopyEngine`] | `cuMemcpyPeerAsync`, in chunks | any |
//! | [`Path::SmWrite`] | a kernel on the source GPU storing into the destination | the source GPU's |
//! | [`Path::SmRead`] | a kernel on the destination GPU loading from the source | the destination GPU's |
//! | [`Path::HostStaged`] | device-to-host and host-to-device copies through pinned double buffers, overlapped on two streams | any |
//! | [`Path::Relay`] | two copy-engine legs through buffers on a third GPU, overlapped | any |
//!
//! As with every asynchronous CUDA call, `src` and `dst` must stay allocated until the stream
//! has run the copy.

use p2p_mem::{Device, DeviceMemory, DeviceMemoryMut, Event, Stream};

use crate::context::Transport;
use crate::error::{Error, Result};
use crate::kernels::{self, abi};
use crate::mode::{Direction, Engine, Mode, Route};
use p2p_mem::kernel::{LaunchConfig, Module};

mod engine;
pub(crate) mod routes;
pub(crate) mod sm;
pub(crate) mod staged;

pub use engine::CE_CHUNK;
pub use sm::{SmGrid, SM_BLOCKS_PER_SM, SM_THREADS};
pub use staged::{STAGE_CHUNK, STAGE_SLOTS};

use engine::copy_engine;
use sm::CopyKernel;

/// How one copy moves its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Path {
    /// The copy engines.
    CopyEngine,
    /// SM stores from the source GPU into the destination's memory.
    SmWrite,
    /// SM loads on the destination GPU from the source's memory.
    SmRead,
    /// Through pinned host memory.
    HostStaged,
    /// Through a third GPU (by ordinal), with the copy engines.
    Relay {
        /// The relaying GPU.
        via: i32,
    },
}

impl Transport {
    /// Copies all of `src` into `dst` (on any GPUs of this process) the way mode selection
    /// decides for the pair (topology discovered once; configuration from the `P2P_*`
    /// variables or [`set_config`](Self::set_config)), queued on `stream`. Returns the route.
    ///
    /// The path may have to run on the other GPU (an SM read runs on the destination): the copy
    /// is then bridged to that GPU's stream with events, still ordered after `stream`'s earlier
    /// work and before its later work.
    ///
    /// ```no_run
    /// use p2p_mem::{Device, DeviceBuffer, Stream};
    /// use p2p_transport::Transport;
    /// let t = Transport::new(Device::all()?);
    /// let (g0, g1) = (t.device(0)?.clone(), t.device(1)?.clone());
    /// let src = DeviceBuffer::<f32>::zeroed(&g0, 1 << 20)?;
    /// let mut dst = DeviceBuffer::<f32>::new(&g1, 1 << 20)?;
    /// let stream = Stream::new(&g0)?;
    /// let route = t.copy_peer(&mut dst, &src, &stream)?; // e.g. "0[0] -> 1[1] via P2P/direct pointer/read (NVLink x18)"
    /// stream.synchronize()?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn copy_peer<D: DeviceMemoryMut, S: DeviceMemory>(
        &self,
        dst: &mut D,
        src: &S,
        stream: &Stream,
    ) -> Result<Route> {
        p2p_mem::check_stream(dst, stream)?;
        p2p_mem::check_stream(src, stream)?;
        let (a, b) = (
            src.device().ordinal() as usize,
            dst.device().ordinal() as usize,
        );
        let route = self.routes.get(a, b)?;
        let runner = match (route.mode, route.engine, route.direction) {
            (Mode::DirectPointer, Engine::SmKernel, Direction::Read) => dst.device().clone(),
            _ => src.device().clone(),
        };
        if stream.device() == &runner
            || !matches!(route.mode, Mode::DirectPointer)
            || route.engine == Engine::CopyEngine
        {
            self.copy_route(&route, dst, src, stream)?;
        } else {
            // Bridge: the runner's stream waits for `stream`, runs the copy, and `stream` waits back.
            let bridge = self
                .slot(&runner)?
                .bridge
                .get(|| Ok(Stream::new(&runner)?))?;
            let before = Event::new(stream.device())?;
            before.record(stream)?;
            before.wait_on(bridge)?;
            self.copy_route(&route, dst, src, bridge)?;
            let after = Event::new(&runner)?;
            after.record(bridge)?;
            after.wait_on(stream)?;
        }
        Ok(route)
    }

    fn copy_kernel(&self, device: &Device) -> Result<&CopyKernel> {
        self.slot(device)?.copy.get(|| {
            let module = Module::build(device, &kernels::COPY)?;
            let copy = module.function("p2p_copy_bytes")?;
            Ok(CopyKernel { module, copy })
        })
    }

    /// The SM copy kernel's launch shape.
    pub fn sm_grid(&self) -> SmGrid {
        *self.sm_grid.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Changes the SM copy kernel's launch shape (for tuning; the default is [`SmGrid::DEFAULT`]).
    /// Refuses a shape no GPU runs: 1 to 32 blocks per SM of 32 to 1024 threads, a multiple of
    /// 32 (an SM holds at most 32 blocks and 2048 threads).
    pub fn set_sm_grid(&self, grid: SmGrid) -> Result<()> {
        if !(1..=32).contains(&grid.blocks_per_sm)
            || !(32..=1024).contains(&grid.threads)
            || grid.threads % 32 != 0
        {
            return Err(Error::InvalidArgument(format!(
                "SM copy grid {} blocks per SM x {} threads: use 1-32 blocks of 32-1024 threads, a multiple of 32",
                grid.blocks_per_sm, grid.threads
            )));
        }
        *self.sm_grid.lock().unwrap_or_else(|p| p.into_inner()) = grid;
        Ok(())
    }

    /// Queues a copy of all of `src` into `dst` (the same size) on `stream` by `path`.
    pub fn copy<D: DeviceMemoryMut, S: DeviceMemory>(
        &self,
        dst: &mut D,
        src: &S,
        path: Path,
        stream: &Stream,
    ) -> Result<()> {
        p2p_mem::check_stream(dst, stream)?;
        p2p_mem::check_stream(src, stream)?;
        let bytes = src.byte_len();
        if dst.byte_len() != bytes {
            return Err(Error::InvalidArgument(format!(
                "copy destination holds {} bytes but the source {bytes}: they must be equal",
                dst.byte_len()
            )));
        }
        if bytes == 0 {
            return Ok(());
        }
        let (sd, dd) = (src.device().clone(), dst.device().clone());
        match path {
            Path::CopyEngine => {
                // Without peer access the driver stages peer copies through host memory
                // (measured: 38 GB/s instead of 393 on NV18).
                self.ensure_peer_access_both(&sd, &dd)?;
                copy_engine(dst.device_ptr(), &dd, src.device_ptr(), &sd, bytes, stream)
            }
            Path::SmWrite | Path::SmRead => {
                let (runner, other) = if path == Path::SmWrite {
                    (&sd, &dd)
                } else {
                    (&dd, &sd)
                };
                if stream.device() != runner {
                    let who = if path == Path::SmWrite {
                        "source"
                    } else {
                        "destination"
                    };
                    return Err(Error::InvalidArgument(format!(
                        "{path:?} runs on the {who} GPU {}, but the stream is on GPU {}",
                        runner.ordinal(),
                        stream.device().ordinal()
                    )));
                }
                self.ensure_peer_access(runner, other)?;
                self.sm_copy(runner, dst.device_ptr(), src.device_ptr(), bytes, stream)
            }
            Path::HostStaged | Path::Relay { .. } => {
                let via = if let Path::Relay { via } = path {
                    Some(self.device(via)?.clone())
                } else {
                    None
                };
                let pipeline = self.pipelines.get(&sd, &dd, via.as_ref(), &self.peers)?;
                let mut p = pipeline.lock().unwrap_or_else(|p| p.into_inner());
                p.run(dst.device_ptr(), src.device_ptr(), bytes, stream)
            }
        }
    }

    /// Queues the copy `route` calls for, for ranks within this process.
    pub fn copy_route<D: DeviceMemoryMut, S: DeviceMemory>(
        &self,
        route: &Route,
        dst: &mut D,
        src: &S,
        stream: &Stream,
    ) -> Result<()> {
        let path = match (route.mode, route.engine, route.direction) {
            (Mode::Local, _, _) | (Mode::DirectPointer, Engine::CopyEngine, _) => Path::CopyEngine,
            (Mode::DirectPointer, Engine::SmKernel, Direction::Write) => Path::SmWrite,
            (Mode::DirectPointer, Engine::SmKernel, Direction::Read) => Path::SmRead,
            (Mode::HostStaged, _, _) => Path::HostStaged,
            (Mode::Intermediate { via }, _, _) => Path::Relay { via: via as i32 },
            (Mode::LegacyIpc | Mode::CuMem, _, _) => {
                return Err(Error::InvalidArgument(format!(
                    "{route} is between processes: it needs a connection, not an in-process copy"
                )))
            }
        };
        tracing::debug!(target: "p2p_transport::copy", "{route}: {path:?}, {} bytes", src.byte_len());
        self.copy(dst, src, path, stream)
    }

    fn sm_copy(
        &self,
        runner: &Device,
        dst: u64,
        src: u64,
        bytes: usize,
        stream: &Stream,
    ) -> Result<()> {
        let k = self.copy_kernel(runner)?;
        let vectors = bytes.div_ceil(16).div_ceil(4) as u64;
        let grid = self.sm_grid();
        let max_blocks = runner.sm_count().max(1) as u64 * grid.blocks_per_sm as u64;
        let blocks = vectors.div_ceil(grid.threads as u64).clamp(1, max_blocks) as u32;
        let args = abi::CopyArgs {
            dst,
            src,
            bytes: bytes as u64,
        };
        // SAFETY: p2p_copy_bytes takes one CopyArgs (the layout generated from transport_abi.h);
        // both ranges are `bytes` long and the runner can access both (its own memory, and the
        // peer's with access enabled above).
        unsafe {
            k.module.launch(
                &k.copy,
                LaunchConfig::new(blocks, grid.threads),
                &args,
                stream,
            )
        }?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_sm_grid_no_gpu_runs_is_refused_and_the_last_good_one_kept() {
        let t = Transport::new(Vec::new());
        for (blocks_per_sm, threads) in [(0, 512), (33, 512), (4, 0), (4, 16), (4, 1056), (4, 100)]
        {
            let bad = SmGrid {
                blocks_per_sm,
                threads,
            };
            assert!(t.set_sm_grid(bad).is_err(), "{bad:?}");
        }
        assert_eq!(t.sm_grid(), SmGrid::DEFAULT);
        let good = SmGrid {
            blocks_per_sm: 32,
            threads: 1024,
        };
        t.set_sm_grid(good).expect("a shape GPUs run");
        assert_eq!(t.sm_grid(), good);
    }
}
