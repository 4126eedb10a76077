//! cudarc's safe types, used directly (feature `cudarc`, cudarc 0.19): a [`Device`] for a
//! `CudaContext`, a [`Stream`] that borrows a `CudaStream`, and zero-copy views of
//! `CudaSlice` / `CudaView` / `CudaViewMut` that every p2p copy and collective accepts.
//! cudarc 0.18 and 0.17 (candle 0.10 and 0.9) have the same functions in
//! `p2p_mem::cudarc_0_18` and `p2p_mem::cudarc_0_17` (features
//! `cudarc-0-18`, `cudarc-0-17`).
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

crate::cudarc_views::interop!(cudarc);

impl Device {
    /// The device of a cudarc context ([`device`]). It must be the GPU's primary context (what
    /// `CudaContext::new` makes), which p2p shares.
    pub fn from_cudarc(ctx: &CudaContext) -> Result<Device> {
        device(ctx)
    }
}

impl Stream {
    /// Borrows cudarc's `stream` (of `device`'s primary context) so that p2p queues its work
    /// on it ([`stream`]); keeps it alive for as long as the returned value. Dropping the
    /// result does not destroy the stream.
    pub fn from_cudarc(device: &Device, stream: &Arc<CudaStream>) -> Result<Stream> {
        self::stream(device, stream)
    }

    /// The cudarc stream this one borrows, if it was made by [`Stream::from_cudarc`].
    pub fn cudarc_stream(&self) -> Option<&Arc<CudaStream>> {
        cudarc_stream(self)
    }
}
