//! CUDA graphs captured from a stream: record a sequence of work once, replay it many times
//! with one launch (what nccl-tests `-G` and inference servers do to hide launch overhead).
//!
//! ```no_run
//! use p2p_mem::{Device, Stream};
//! let gpu = Device::new(0)?;
//! let stream = Stream::new(&gpu)?;
//! stream.begin_capture()?;
//! // ... queue kernels or copies on `stream` ...
//! let graph = stream.end_capture()?.instantiate()?;
//! // SAFETY: nothing was captured, so the replay touches no memory.
//! unsafe { graph.launch(&stream)? };
//! stream.synchronize()?;
//! # Ok::<(), p2p_mem::Error>(())
//! ```

use p2p_sys::{cu, cuda};

use crate::device::{Device, Stream};
use crate::error::{OnDevice, Result};

impl Stream {
    /// Starts capturing: work queued on this stream is recorded into a graph instead of run,
    /// until [`end_capture`](Self::end_capture). Uses the thread-local capture mode, so other
    /// threads' CUDA calls are unaffected.
    pub fn begin_capture(&self) -> Result<()> {
        self.device().bind_to_thread()?;
        let mode = cuda::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
        // SAFETY: the stream is alive and its context current.
        unsafe { cu!(cuStreamBeginCapture_v2(self.cu_stream(), mode)) }.on(self.device().ordinal())
    }

    /// Whether the stream is being captured into a graph now (by [`begin_capture`](Self::begin_capture)
    /// or by whoever owns the stream, in any capture mode), so that work queued on it is
    /// recorded, not run (`cuStreamIsCapturing`, which may be called during any capture). A
    /// capture that was invalidated counts as capturing: work queued there does not run either.
    pub fn is_capturing(&self) -> Result<bool> {
        self.device().bind_to_thread()?;
        let mut status = cuda::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: the stream is alive and its context current; `status` is an out-pointer.
        unsafe { cu!(cuStreamIsCapturing(self.cu_stream(), &mut status)) }
            .on(self.device().ordinal())?;
        Ok(status != cuda::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    /// Ends a capture begun by [`begin_capture`](Self::begin_capture) and returns what it
    /// recorded. Fails (and discards the capture) if something not capturable was queued.
    pub fn end_capture(&self) -> Result<Graph> {
        self.device().bind_to_thread()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: the stream is alive; `raw` is an out-pointer.
        unsafe { cu!(cuStreamEndCapture(self.cu_stream(), &mut raw)) }
            .on(self.device().ordinal())?;
        Ok(Graph {
            device: self.device().clone(),
            raw,
        })
    }
}

/// A captured graph, not yet instantiated; destroyed on `Drop`.
pub struct Graph {
    device: Device,
    raw: cuda::CUgraph,
}

// SAFETY: a CUgraph handle may be used from any thread; we never mutate it after capture.
unsafe impl Send for Graph {}

impl Graph {
    /// Makes the graph launchable.
    pub fn instantiate(&self) -> Result<GraphExec> {
        self.device.bind_to_thread()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: the graph is alive; `raw` is an out-pointer.
        unsafe { cu!(cuGraphInstantiateWithFlags(&mut raw, self.raw, 0)) }
            .on(self.device.ordinal())?;
        Ok(GraphExec {
            device: self.device.clone(),
            raw,
        })
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // SAFETY: created by cuStreamEndCapture and destroyed once.
        let destroy = || unsafe { cu!(cuGraphDestroy(self.raw)) };
        self.device.release("destroying a graph", destroy);
    }
}

/// An instantiated graph: [`launch`](Self::launch) replays everything that was captured.
///
/// `Send` but not `Sync`: a `CUgraphExec` must not be launched from two threads at once.
pub struct GraphExec {
    device: Device,
    raw: cuda::CUgraphExec,
}

// SAFETY: a CUgraphExec may be used from any one thread at a time (no `Sync`).
unsafe impl Send for GraphExec {}

impl GraphExec {
    /// Queues one replay of the graph on `stream`.
    ///
    /// # Safety
    /// The replay uses the raw pointers that were captured: every buffer, communicator and
    /// other resource the captured work touches must still be alive (not dropped or freed)
    /// until the replay has finished on the GPU, and must not be used by other work in a way
    /// the captured work would race with.
    pub unsafe fn launch(&self, stream: &Stream) -> Result<()> {
        self.device.bind_to_thread()?;
        // SAFETY: both handles are alive; the captured memory is alive by the caller's
        // contract above.
        unsafe { cu!(cuGraphLaunch(self.raw, stream.cu_stream())) }.on(self.device.ordinal())
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        // SAFETY: created by cuGraphInstantiateWithFlags and destroyed once.
        let destroy = || unsafe { cu!(cuGraphExecDestroy(self.raw)) };
        self.device.release("destroying a graph exec", destroy);
    }
}
