//! The synchronous copies and fills of [`DeviceMemory`](crate::DeviceMemory) and
//! [`DeviceMemoryMut`](crate::DeviceMemoryMut), each bounded.
//!
//! The driver's synchronous copies (`cuMemcpyDtoH`, `cuMemcpyHtoD`, `cuMemsetD8`,
//! `cuMemcpyPeer`) run on the legacy default stream: they wait, with no limit, for whatever
//! another thread queued there since the caller's bounded wait. Here each device has a
//! [`Copier`] of its own instead: a non-blocking stream (it waits for nothing queued anywhere
//! else) and a pinned staging buffer. A copy to or from the host goes through the staging
//! buffer in pieces, each queued on that stream and waited for within the limit, so the host
//! memory the caller gave is read and written only by the host, before the method returns. Past
//! the limit the copier is given up (its stream and staging memory are leaked, since the copy
//! may still land in them) and the next copy makes a new one.
//!
//! The staging buffer is 8 MiB: the piece is large enough that the wait per piece (~10 us)
//! costs under 5 % of a piece's copy at 25 GB/s, and small enough to keep per GPU. Copies on
//! one device take turns on its copier (a mutex): they are for setup and checks, not for the
//! hot path, which queues copies on the caller's stream (`copy_async`).

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use p2p_sys::{cu, cuda};

use crate::error::{Error, OnDevice, Result};
use crate::{Device, Stream};

/// Bytes of pinned staging memory per device.
const STAGING: usize = 8 << 20;

/// What a copy that ran past its limit left behind.
const GIVEN_UP: &str = "it may still land: its stream and staging memory are left allocated";
/// The work a copy waits for once it is queued.
const ITSELF: &str = "the operation itself, on a stream of its own,";

/// A device's stream and staging memory for synchronous copies (plain handles: freed by
/// [`Slot::release`] only, so that dropping one leaks it).
#[derive(Clone, Copy)]
pub(crate) struct Copier {
    stream: cuda::CUstream,
    staging: *mut u8,
}

// SAFETY: the stream and the staging memory are used only under the slot's mutex; driver
// handles may be used from any thread.
unsafe impl Send for Copier {}

/// A device's copier, made at its first synchronous copy.
#[derive(Default)]
pub(crate) struct Slot(Mutex<Option<Copier>>);

impl Slot {
    /// Frees the copier, if any, in the device's context `ctx` (made current here), when the
    /// device goes: only if its stream is idle (a copier whose copy ran past its limit was
    /// given up already; one still busy here is leaked, never waited on).
    pub(crate) fn release(&mut self, ctx: cuda::CUcontext, ordinal: i32) {
        let slot = self.0.get_mut().unwrap_or_else(|e| e.into_inner());
        let Some(c) = slot.take() else { return };
        // SAFETY: the context is still retained (the device releases it after this) and the
        // stream was made in it; the query only reads its state.
        let idle = unsafe { cu!(cuCtxSetCurrent(ctx)).and_then(|()| cu!(cuStreamQuery(c.stream))) };
        if let Err(e) = idle {
            // cuMemFreeHost would wait, unbounded, for a copy still using the staging memory.
            tracing::error!(
                device = ordinal,
                "the synchronous copier's stream is not idle at the device's end ({e}): leaking its {STAGING} bytes of staging memory"
            );
            return;
        }
        // SAFETY: as above; the stream is idle, and it and the staging memory are freed once.
        let freed = unsafe {
            cu!(cuStreamDestroy_v2(c.stream)).and_then(|()| cu!(cuMemFreeHost(c.staging.cast())))
        };
        if let Err(e) = freed {
            tracing::error!(device = ordinal, "freeing the synchronous copier: {e}");
        }
    }
}

/// One synchronous operation: the device's copier held, and the deadline of its waits.
pub(crate) struct Copy<'a> {
    device: &'a Device,
    guard: MutexGuard<'a, Option<Copier>>,
    copier: Copier,
    op: &'static str,
    limit: Duration,
}

impl<'a> Copy<'a> {
    /// Takes `device`'s copier (making it at the first use) for `op`, whose waits each last at
    /// most `limit`. The device's context is current on return.
    pub(crate) fn begin(device: &'a Device, op: &'static str, limit: Duration) -> Result<Self> {
        let mut guard = device.copier().0.lock().unwrap_or_else(|e| e.into_inner());
        device.bind_to_thread()?;
        let copier = match *guard {
            Some(c) => c,
            None => *guard.insert(make(device)?),
        };
        Ok(Copy {
            device,
            guard,
            copier,
            op,
            limit,
        })
    }

    /// Copies `dst.len()` bytes from device address `src` into `dst`, piece by piece.
    ///
    /// # Safety
    /// `src` must be `dst.len()` bytes of device memory that this device can address.
    pub(crate) unsafe fn download(mut self, src: cuda::CUdeviceptr, dst: &mut [u8]) -> Result<()> {
        for (i, piece) in dst.chunks_mut(STAGING).enumerate() {
            let c = self.copier;
            let at = src + (i * STAGING) as u64;
            // SAFETY: the staging buffer holds STAGING >= piece.len() bytes; the caller
            // guarantees the source; the stream is the copier's own.
            unsafe {
                cu!(cuMemcpyDtoHAsync_v2(
                    c.staging.cast(),
                    at,
                    piece.len(),
                    c.stream
                ))
            }
            .on(self.device.ordinal())?;
            self = self.wait()?;
            // SAFETY: the copy into the staging buffer has finished (waited for above).
            let staged = unsafe { std::slice::from_raw_parts(self.copier.staging, piece.len()) };
            piece.copy_from_slice(staged);
        }
        Ok(())
    }

    /// Copies `src` to device address `dst`, piece by piece.
    ///
    /// # Safety
    /// `dst` must be `src.len()` bytes of device memory that this device can address and
    /// that nothing else reads or writes meanwhile.
    pub(crate) unsafe fn upload(mut self, dst: cuda::CUdeviceptr, src: &[u8]) -> Result<()> {
        for (i, piece) in src.chunks(STAGING).enumerate() {
            let c = self.copier;
            // SAFETY: the staging buffer holds STAGING >= piece.len() bytes, and no copy of
            // the copier runs (each is waited for before the next piece).
            unsafe { std::ptr::copy_nonoverlapping(piece.as_ptr(), c.staging, piece.len()) };
            let at = dst + (i * STAGING) as u64;
            // SAFETY: as above for the staging buffer; the caller guarantees the destination.
            unsafe {
                cu!(cuMemcpyHtoDAsync_v2(
                    at,
                    c.staging.cast(),
                    piece.len(),
                    c.stream
                ))
            }
            .on(self.device.ordinal())?;
            self = self.wait()?;
        }
        Ok(())
    }

    /// Sets `bytes` bytes at device address `dst` to `value`.
    ///
    /// # Safety
    /// As for [`upload`](Self::upload), for `bytes` bytes.
    pub(crate) unsafe fn fill(self, dst: cuda::CUdeviceptr, value: u8, bytes: usize) -> Result<()> {
        let stream = self.copier.stream;
        // SAFETY: the caller guarantees the destination; the stream is the copier's own.
        unsafe { cu!(cuMemsetD8Async(dst, value, bytes, stream)) }.on(self.device.ordinal())?;
        self.wait().map(drop)
    }

    /// Copies `bytes` bytes from `src` on `from` to `dst` on this device.
    ///
    /// # Safety
    /// Both ranges must be `bytes` bytes of live device memory on their devices, not
    /// overlapping, and nothing else may write them meanwhile.
    pub(crate) unsafe fn peer(
        self,
        dst: cuda::CUdeviceptr,
        from: &Device,
        src: cuda::CUdeviceptr,
        bytes: usize,
    ) -> Result<()> {
        let (to_ctx, stream) = (self.device.cu_context(), self.copier.stream);
        // SAFETY: the caller guarantees both ranges; both contexts are retained.
        unsafe {
            cu!(cuMemcpyPeerAsync(
                dst,
                to_ctx,
                src,
                from.cu_context(),
                bytes,
                stream
            ))
        }
        .between(self.device.ordinal(), from.ordinal())?;
        self.wait().map(drop)
    }

    /// Waits for what was queued on the copier's stream, at most the limit. Past it the copier
    /// is given up (left allocated: the copy may still land in it) and the operation is
    /// [`Error::Busy`].
    fn wait(mut self) -> Result<Self> {
        let t = Instant::now();
        // SAFETY: the copier's stream lives as long as the copier; the borrowed handle does
        // not destroy it.
        let stream = unsafe { Stream::from_raw(self.device, self.copier.stream) };
        if stream.synchronize_within(self.limit)? {
            return Ok(self);
        }
        // Forgotten, not freed: the copy may still land in its staging memory.
        *self.guard = None;
        tracing::error!(
            device = self.device.ordinal(),
            "{} did not finish within {:?} ({:?} waited): {GIVEN_UP}",
            self.op,
            self.limit,
            t.elapsed()
        );
        Err(Error::Busy {
            op: self.op,
            device: self.device.ordinal(),
            waiting_for: ITSELF,
            waited: self.limit,
            outcome: GIVEN_UP,
        })
    }
}

/// A new copier on `device` (its context current).
fn make(device: &Device) -> Result<Copier> {
    let mut stream = std::ptr::null_mut();
    let flags = cuda::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
    // SAFETY: the device's context is current and `stream` is an out-pointer.
    unsafe { cu!(cuStreamCreate(&mut stream, flags)) }.on(device.ordinal())?;
    let mut staging = std::ptr::null_mut();
    // SAFETY: as above; `staging` is an out-pointer.
    if let Err(e) = unsafe { cu!(cuMemHostAlloc(&mut staging, STAGING, 0)) }.on(device.ordinal()) {
        // SAFETY: made above, unused.
        let _ = unsafe { cu!(cuStreamDestroy_v2(stream)) };
        return Err(e);
    }
    Ok(Copier {
        stream,
        staging: staging.cast(),
    })
}
