//! CUDA events: ordering work between streams (also across devices and processes) and timing it.

use p2p_sys::{cu, cuda};

use crate::device::{Device, Stream};
use crate::error::{OnDevice, Result};

/// A CUDA event on one device, destroyed on `Drop`.
pub struct Event {
    device: Device,
    raw: cuda::CUevent,
}

// SAFETY: CUevent handles may be used from any thread; each use binds the device first.
unsafe impl Send for Event {}
// SAFETY: as above; the handle is never mutated.
unsafe impl Sync for Event {}

impl Event {
    /// An event for ordering only (no timestamps: cheaper to record and wait on).
    pub fn new(device: &Device) -> Result<Event> {
        Self::with_flags(device, cuda::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
    }

    /// An event that records timestamps, for [`elapsed_ms`](Self::elapsed_ms).
    pub fn timing(device: &Device) -> Result<Event> {
        Self::with_flags(device, cuda::CUevent_flags::CU_EVENT_DEFAULT as u32)
    }

    pub(crate) fn with_flags(device: &Device, flags: u32) -> Result<Event> {
        device.bind_to_thread()?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: a context is current and `raw` is an out-pointer.
        unsafe { cu!(cuEventCreate(&mut raw, flags)) }.on(device.ordinal())?;
        Ok(Event {
            device: device.clone(),
            raw,
        })
    }

    /// Takes ownership of an event opened elsewhere (e.g. from an IPC handle).
    pub(crate) fn from_raw(device: &Device, raw: cuda::CUevent) -> Event {
        Event {
            device: device.clone(),
            raw,
        }
    }

    /// The device the event belongs to.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The raw handle, for FFI.
    pub fn cu_event(&self) -> cuda::CUevent {
        self.raw
    }

    /// Records the event at the current end of `stream`.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        stream.device().bind_to_thread()?;
        // SAFETY: both the event and the stream are alive.
        unsafe { cu!(cuEventRecord(self.raw, stream.cu_stream())) }.on(self.device.ordinal())
    }

    /// Makes `stream` (on any device) wait for the work last recorded.
    pub fn wait_on(&self, stream: &Stream) -> Result<()> {
        stream.device().bind_to_thread()?;
        // SAFETY: both the stream and the event are alive.
        unsafe { cu!(cuStreamWaitEvent(stream.cu_stream(), self.raw, 0)) }
            .between(stream.device().ordinal(), self.device.ordinal())
    }

    crate::wait::host_waits! {
        /// Blocks until the work last recorded has finished, however long that takes
        /// ([`synchronize_within`](Self::synchronize_within) gives up at a deadline).
        fn synchronize = cuEventSynchronize;
        /// Waits until the work last recorded has finished, at most `limit`: `Ok(true)` once it
        /// has (or if nothing was ever recorded), `Ok(false)` if it still runs at the deadline
        /// (nothing is stopped, and no thread is left waiting). Polls [`is_done`](Self::is_done)
        /// as [`Stream::synchronize_within`] polls its stream. A fault of the recorded work is an
        /// error, as in [`synchronize`](Self::synchronize).
        fn synchronize_within;
        /// Whether the work last recorded has finished, without waiting (`cuEventQuery`): what a
        /// wait with a deadline polls. An event never recorded is done. A fault of the recorded
        /// work is an error; so is an event last recorded in a stream being captured into a
        /// graph (`CUDA_ERROR_CAPTURED_EVENT`: there is no work to wait for until the graph is
        /// launched).
        fn is_done = cuEventQuery;
    }

    /// Milliseconds between `self` and a later `end`, both recorded and complete, both made
    /// with [`timing`](Self::timing).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        let mut ms = 0.0f32;
        // SAFETY: both events are alive; `ms` is an out-pointer.
        unsafe { cu!(cuEventElapsedTime(&mut ms, self.raw, end.raw)) }.on(self.device.ordinal())?;
        Ok(ms)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: the event is ours and destroyed once.
        let destroy = || unsafe { cu!(cuEventDestroy_v2(self.raw)) };
        self.device.release("destroying an event", destroy);
    }
}
