//! What the cudarc views share across cudarc versions (features `cudarc` for 0.19,
//! `cudarc-0-18`, `cudarc-0-17`): their one API, written once as the macro `interop!` and
//! instantiated in each version's module, whose safe types have the same shape in all three
//! (`DevicePtr::device_ptr(stream)` with its `SyncOnDrop` guard, `CudaStream::context`,
//! `CudaContext::check_err`); and the check that does not depend on cudarc.

use p2p_sys::{cu, cuda};

use crate::device::Device;
use crate::error::{Error, OnDevice, Result};

/// Checks that `ptr..ptr + bytes` is memory of `device` (not of another GPU, not host memory).
pub(crate) fn check_on(device: &Device, ptr: cuda::CUdeviceptr, bytes: usize) -> Result<()> {
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

/// The device of a cudarc context, `ordinal` and `cu_ctx` its own: it must be the GPU's
/// primary context, which p2p shares.
pub(crate) fn device_of(ordinal: usize, cu_ctx: cuda::CUcontext) -> Result<Device> {
    let ordinal = i32::try_from(ordinal)
        .map_err(|_| Error::InvalidArgument(format!("cudarc context of GPU {ordinal}")))?;
    let device = Device::new(ordinal)?;
    if device.cu_context() != cu_ctx {
        return Err(Error::InvalidArgument(format!(
            "the cudarc context of GPU {ordinal} is not the GPU's primary context; p2p works \
             in primary contexts: make the context with CudaContext::new({ordinal})"
        )));
    }
    Ok(device)
}

/// The items of one cudarc version's module, `$cudarc` the crate: `device`, `stream`, `view`,
/// `view_mut` and the two view types.
macro_rules! interop {
    ($cudarc:ident) => {
        use std::sync::Arc;

        use p2p_sys::cuda;
        use $cudarc::driver::{CudaContext, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};

        use crate::device::{Device, Stream};
        use crate::error::{Error, Result};
        use crate::memory::{DeviceMemory, DeviceMemoryMut, ElementType, ExternalMemory};

        /// The device of a cudarc context. It must be the GPU's primary context (what
        /// `CudaContext::new` makes), which p2p shares.
        pub fn device(ctx: &CudaContext) -> Result<Device> {
            crate::cudarc_views::device_of(ctx.ordinal(), ctx.cu_ctx() as cuda::CUcontext)
        }

        /// Borrows cudarc's `stream` (of `device`'s primary context) so that p2p queues its
        /// work on it; keeps it alive for as long as the returned value. Dropping the result
        /// does not destroy the stream.
        pub fn stream(device: &Device, stream: &Arc<CudaStream>) -> Result<Stream> {
            if stream.context().cu_ctx() as cuda::CUcontext != device.cu_context() {
                return Err(Error::InvalidArgument(format!(
                    "the cudarc stream belongs to GPU {}'s context, not GPU {}'s primary context",
                    stream.context().ordinal(),
                    device.ordinal()
                )));
            }
            // SAFETY: the stream is a live stream of `device`'s primary context (checked
            // above), and the Arc kept in the value keeps it alive for as long as the value
            // lives.
            let mut s = unsafe { Stream::from_raw(device, stream.cu_stream() as cuda::CUstream) };
            s.cudarc = Some(Arc::new(stream.clone()));
            Ok(s)
        }

        /// The cudarc stream (of this cudarc version) that `stream` borrows, if [`stream`]
        /// made it.
        pub fn cudarc_stream(stream: &Stream) -> Option<&Arc<CudaStream>> {
            stream.cudarc.as_ref()?.downcast_ref::<Arc<CudaStream>>()
        }

        /// A read-only view of a cudarc slice for p2p's calls, made by [`view`]. It borrows
        /// the slice and the stream; dropping it records cudarc's read event after the work
        /// queued with it.
        pub struct CudarcView<'a>(Viewed<'a>);

        /// A writable view of a cudarc slice for p2p's calls, made by [`view_mut`]. It
        /// borrows the slice mutably and the stream; dropping it records cudarc's write event
        /// after the work queued with it.
        pub struct CudarcViewMut<'a>(Viewed<'a>);

        /// What either view holds: the slice's memory, its stream and element type, and
        /// cudarc's guard (which records the read or write event when dropped).
        struct Viewed<'a> {
            memory: ExternalMemory,
            stream: cuda::CUstream,
            element: ElementType,
            _sync: SyncOnDrop<'a>,
        }

        fn cudarc_of(stream: &Stream) -> Result<&Arc<CudaStream>> {
            cudarc_stream(stream).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "a view of a cudarc slice needs a stream made from a cudarc stream of the \
                     same cudarc version ({}::stream)",
                    module_path!()
                ))
            })
        }

        /// cudarc records a failed wait of the stream for the slice's last write in its
        /// context instead of returning it: take it back, so that p2p never runs unordered
        /// with that write.
        fn waited(cu: &CudaStream) -> Result<()> {
            cu.context().check_err().map_err(|e| {
                Error::InvalidArgument(format!(
                    "cudarc could not order the stream after the slice's last write: {e}"
                ))
            })
        }

        /// A view of `slice` (a `CudaSlice`, `CudaView` or `CudaViewMut`) on `stream` (made
        /// from a cudarc stream, of the GPU the slice lives on). No copy: p2p reads the
        /// slice's own memory.
        pub fn view<'a, T: 'static, S: DevicePtr<T>>(
            stream: &'a Stream,
            slice: &'a S,
        ) -> Result<CudarcView<'a>> {
            let cu = cudarc_of(stream)?;
            let bytes = slice.num_bytes();
            let (ptr, sync) = slice.device_ptr(cu);
            // SAFETY: cudarc guarantees `bytes` bytes at `ptr` stay allocated while `slice`
            // is borrowed, which outlives the view ('a).
            unsafe { viewed::<T>(stream, cu, ptr, bytes, sync) }.map(CudarcView)
        }

        /// A writable view of `slice` (a `CudaSlice` or `CudaViewMut`) on `stream` (made from
        /// a cudarc stream, of the GPU the slice lives on). No copy: p2p writes the slice's
        /// own memory.
        pub fn view_mut<'a, T: 'static, S: DevicePtrMut<T>>(
            stream: &'a Stream,
            slice: &'a mut S,
        ) -> Result<CudarcViewMut<'a>> {
            let cu = cudarc_of(stream)?;
            let bytes = slice.num_bytes();
            let (ptr, sync) = slice.device_ptr_mut(cu);
            // SAFETY: as in `view`; the slice is borrowed mutably for 'a, so nothing else
            // writes it.
            unsafe { viewed::<T>(stream, cu, ptr, bytes, sync) }.map(CudarcViewMut)
        }

        /// The rest of [`view`] and [`view_mut`], once cudarc has given the slice's pointer
        /// (and made `cu` wait for its last write): takes back a failure of that wait, checks
        /// that the memory is on the stream's GPU, and views it.
        ///
        /// # Safety
        /// `bytes` bytes at `ptr` must stay allocated for 'a (cudarc's guarantee while the
        /// slice is borrowed).
        unsafe fn viewed<'a, T: 'static>(
            stream: &Stream,
            cu: &CudaStream,
            ptr: cuda::CUdeviceptr,
            bytes: usize,
            sync: SyncOnDrop<'a>,
        ) -> Result<Viewed<'a>> {
            waited(cu)?;
            crate::cudarc_views::check_on(stream.device(), ptr, bytes)?;
            // SAFETY: the memory stays allocated for 'a (this function's contract), which
            // outlives the view; `check_on` showed it is on the stream's GPU.
            let memory = unsafe { ExternalMemory::from_raw(stream.device(), ptr, bytes) };
            Ok(Viewed {
                memory,
                stream: cu.cu_stream() as cuda::CUstream,
                element: ElementType::of::<T>(),
                _sync: sync,
            })
        }

        crate::cudarc_views::delegate_memory!(CudarcView);
        crate::cudarc_views::delegate_memory!(CudarcViewMut);
        // SAFETY: the view borrows its slice mutably, so p2p may write it.
        unsafe impl DeviceMemoryMut for CudarcViewMut<'_> {}
    };
}
pub(crate) use interop;

/// `DeviceMemory` for a view type of an `interop!` module (a tuple struct over `Viewed`): the
/// borrowed slice's memory, bound to the view's stream.
macro_rules! delegate_memory {
    ($view:ident) => {
        // SAFETY: the memory is the borrowed cudarc slice's, live for the view's lifetime.
        unsafe impl DeviceMemory for $view<'_> {
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
pub(crate) use delegate_memory;
