//! cudarc's safe types, used directly (feature `cudarc`, cudarc 0.19): a [`Device`] for a
//! `CudaContext`, a [`Stream`] that borrows a `CudaStream`, and zero-copy views of
//! `CudaSlice` / `CudaView` / `CudaViewMut` that every p2p copy and collective accepts.
//!
//! ```no_run
//! use cudarc::driver::CudaContext;
//! use p2p_mem::cudarc_interop::{view, view_mut};
//! use p2p_mem::{Device, DeviceMemory, Stream};
//!
//! let ctx = CudaContext::new(0)?;
//! let cu_stream = ctx.new_stream()?;
//! let x = cu_stream.clone_htod(&[1.0f32, 2.0, 3.0])?;
//! let mut y = cu_stream.alloc_zeros::<f32>(3)?;
//!
//! let device = Device::from_cudarc(&ctx)?;
//! let stream = Stream::from_cudarc(&device, &cu_stream)?;
//! {
//!     // The views borrow the slices; p2p queues its work on `stream`, which is `cu_stream`.
//!     let src = view(&stream, &x)?;
//!     let mut dst = view_mut(&stream, &mut y)?;
//!     println!("{} bytes at {:#x}", src.byte_len(), src.device_ptr());
//!     # let _ = &mut dst;
//! } // dropping the views records cudarc's read/write events on the stream
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # The rules
//! - **One context per GPU.** p2p works in each GPU's primary context, which is the one
//!   `CudaContext::new` retains; [`Device::from_cudarc`] checks that.
//! - **Streams.** [`Stream::from_cudarc`] keeps the `CudaStream` alive for as long as the
//!   returned value, and p2p queues its work on it: ordering with the user's kernels on that
//!   stream is the stream's own order, with no extra synchronisation.
//! - **Synchronisation with cudarc.** A view obtains its pointer through cudarc's
//!   `DevicePtr::device_ptr(stream)` (or `device_ptr_mut`), so the stream first waits for the
//!   slice's last write on any other stream (when the context manages multi-stream
//!   synchronisation, cudarc's default), and dropping the view records cudarc's read (or write)
//!   event after the work p2p queued. Drop a view only after the calls that use it.
//! - **A view is bound to its stream.** cudarc frees a slice after the work of the stream its
//!   events were recorded on, so every p2p call refuses a view on any other stream
//!   ([`check_stream`](crate::check_stream)), and host copies through a view wait for its
//!   stream first. As with cudarc's own `device_ptr` guards, leaking a view
//!   (`std::mem::forget`) skips the event: cudarc may then free the slice while p2p's work on
//!   it still runs.
//! - **Pool memory.** `CudaSlice` memory comes from the stream-ordered pool
//!   (`cuMemAllocAsync`). p2p's collectives and copies only touch a call's buffers from the
//!   local GPU (peers read and write p2p's own shared workspaces), so pool memory works in
//!   every call. What cannot work is sharing a pool allocation with peers: registering it as a
//!   zero-copy buffer (`Communicator::register`) or exporting it is refused with an error that
//!   says so ([`check_peer_mappable`](crate::check_peer_mappable)); use a
//!   [`DeviceBuffer`](crate::DeviceBuffer) for memory that peers map.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
use p2p_sys::{cu, cuda};

use crate::device::{Device, Stream};
use crate::error::{Error, OnDevice, Result};
use crate::memory::{DeviceMemory, DeviceMemoryMut, ElementType, ExternalMemory};

impl Device {
    /// The device of a cudarc context. It must be the GPU's primary context (what
    /// `CudaContext::new` makes), which p2p shares.
    pub fn from_cudarc(ctx: &CudaContext) -> Result<Device> {
        let ordinal = i32::try_from(ctx.ordinal()).map_err(|_| {
            Error::InvalidArgument(format!("cudarc context of GPU {}", ctx.ordinal()))
        })?;
        let device = Device::new(ordinal)?;
        if device.cu_context() != ctx.cu_ctx() as cuda::CUcontext {
            return Err(Error::InvalidArgument(format!(
                "the cudarc context of GPU {ordinal} is not the GPU's primary context; p2p works \
                 in primary contexts: make the context with CudaContext::new({ordinal})"
            )));
        }
        Ok(device)
    }
}

impl Stream {
    /// Borrows cudarc's `stream` (of `device`'s primary context) so that p2p queues its work
    /// on it; keeps it alive for as long as the returned value. Dropping the result does not
    /// destroy the stream.
    pub fn from_cudarc(device: &Device, stream: &Arc<CudaStream>) -> Result<Stream> {
        if stream.context().cu_ctx() as cuda::CUcontext != device.cu_context() {
            return Err(Error::InvalidArgument(format!(
                "the cudarc stream belongs to GPU {}'s context, not GPU {}'s primary context",
                stream.context().ordinal(),
                device.ordinal()
            )));
        }
        // SAFETY: the stream is a live stream of `device`'s primary context (checked above),
        // and the Arc kept in the value keeps it alive for as long as the value lives.
        let mut s = unsafe { Stream::from_raw(device, stream.cu_stream() as cuda::CUstream) };
        s.cudarc = Some(stream.clone());
        Ok(s)
    }

    /// The cudarc stream this one borrows, if it was made by [`Stream::from_cudarc`].
    pub fn cudarc_stream(&self) -> Option<&Arc<CudaStream>> {
        self.cudarc.as_ref()
    }
}

/// A read-only view of a cudarc slice for p2p's calls, made by [`view`]. It borrows the slice
/// and the stream; dropping it records cudarc's read event after the work queued with it.
pub struct CudarcView<'a>(Viewed<'a>);

/// A writable view of a cudarc slice for p2p's calls, made by [`view_mut`]. It borrows the
/// slice mutably and the stream; dropping it records cudarc's write event after the work
/// queued with it.
pub struct CudarcViewMut<'a>(Viewed<'a>);

/// What either view holds: the slice's memory, its stream and element type, and cudarc's guard
/// (which records the read or write event when dropped).
struct Viewed<'a> {
    memory: ExternalMemory,
    stream: cuda::CUstream,
    element: ElementType,
    _sync: SyncOnDrop<'a>,
}

fn cudarc_of(stream: &Stream) -> Result<&Arc<CudaStream>> {
    stream.cudarc_stream().ok_or_else(|| {
        Error::InvalidArgument(
            "a view of a cudarc slice needs a stream made by Stream::from_cudarc".into(),
        )
    })
}

/// cudarc records a failed wait of the stream for the slice's last write in its context
/// instead of returning it: take it back, so that p2p never runs unordered with that write.
fn waited(cu: &CudaStream) -> Result<()> {
    cu.context().check_err().map_err(|e| {
        Error::InvalidArgument(format!(
            "cudarc could not order the stream after the slice's last write: {e}"
        ))
    })
}

/// Checks that `ptr..ptr + bytes` is memory of `device` (not of another GPU, not host memory).
fn check_on(device: &Device, ptr: cuda::CUdeviceptr, bytes: usize) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    device.bind_to_thread()?;
    let mut ordinal: i32 = -1;
    // SAFETY: `ordinal` is an out-pointer of the attribute's type (an int); the driver only
    // reads the address `ptr`.
    unsafe {
        cu!(cuPointerGetAttribute(
            (&mut ordinal as *mut i32).cast(),
            cuda::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
            ptr
        ))
    }
    .on(device.ordinal())?;
    if ordinal != device.ordinal() {
        return Err(Error::InvalidArgument(format!(
            "the cudarc slice at {ptr:#x} lives on GPU {ordinal}, but the stream is GPU {}'s",
            device.ordinal()
        )));
    }
    Ok(())
}

/// A view of `slice` (a `CudaSlice`, `CudaView` or `CudaViewMut`) on `stream` (made by
/// [`Stream::from_cudarc`], of the GPU the slice lives on). No copy: p2p reads the slice's own
/// memory.
pub fn view<'a, T: 'static, S: DevicePtr<T>>(
    stream: &'a Stream,
    slice: &'a S,
) -> Result<CudarcView<'a>> {
    let cu = cudarc_of(stream)?;
    let bytes = slice.num_bytes();
    let (ptr, sync) = slice.device_ptr(cu);
    // SAFETY: cudarc guarantees `bytes` bytes at `ptr` stay allocated while `slice` is
    // borrowed, which outlives the view ('a).
    unsafe { viewed::<T>(stream, cu, ptr, bytes, sync) }.map(CudarcView)
}

/// A writable view of `slice` (a `CudaSlice` or `CudaViewMut`) on `stream` (made by
/// [`Stream::from_cudarc`], of the GPU the slice lives on). No copy: p2p writes the slice's own
/// memory.
pub fn view_mut<'a, T: 'static, S: DevicePtrMut<T>>(
    stream: &'a Stream,
    slice: &'a mut S,
) -> Result<CudarcViewMut<'a>> {
    let cu = cudarc_of(stream)?;
    let bytes = slice.num_bytes();
    let (ptr, sync) = slice.device_ptr_mut(cu);
    // SAFETY: as in `view`; the slice is borrowed mutably for 'a, so nothing else writes it.
    unsafe { viewed::<T>(stream, cu, ptr, bytes, sync) }.map(CudarcViewMut)
}

/// The rest of [`view`] and [`view_mut`], once cudarc has given the slice's pointer (and made
/// `cu` wait for its last write): takes back a failure of that wait, checks that the memory is
/// on the stream's GPU, and views it.
///
/// # Safety
/// `bytes` bytes at `ptr` must stay allocated for 'a (cudarc's guarantee while the slice is
/// borrowed).
unsafe fn viewed<'a, T: 'static>(
    stream: &Stream,
    cu: &CudaStream,
    ptr: cuda::CUdeviceptr,
    bytes: usize,
    sync: SyncOnDrop<'a>,
) -> Result<Viewed<'a>> {
    waited(cu)?;
    check_on(stream.device(), ptr, bytes)?;
    // SAFETY: the memory stays allocated for 'a (this function's contract), which outlives
    // the view; `check_on` showed it is on the stream's GPU.
    let memory = unsafe { ExternalMemory::from_raw(stream.device(), ptr, bytes) };
    Ok(Viewed {
        memory,
        stream: cu.cu_stream() as cuda::CUstream,
        element: ElementType::of::<T>(),
        _sync: sync,
    })
}

macro_rules! delegate_memory {
    ($t:ident) => {
        // SAFETY: the memory is the borrowed cudarc slice's, live for the view's lifetime.
        unsafe impl DeviceMemory for $t<'_> {
            fn device(&self) -> &Device {
                self.0.memory.device()
            }
            fn device_ptr(&self) -> cuda::CUdeviceptr {
                self.0.memory.device_ptr()
            }
            fn byte_len(&self) -> usize {
                self.0.memory.byte_len()
            }
            fn bound_stream(&self) -> Option<cuda::CUstream> {
                Some(self.0.stream)
            }
            fn element_type(&self) -> Option<ElementType> {
                Some(self.0.element)
            }
        }
    };
}
delegate_memory!(CudarcView);
delegate_memory!(CudarcViewMut);
// SAFETY: the view borrows its slice mutably, so p2p may write it.
unsafe impl DeviceMemoryMut for CudarcViewMut<'_> {}
