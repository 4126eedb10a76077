//! Device memory: the [`DeviceMemory`] traits every buffer kind shares, [`DeviceBuffer`] from
//! `cuMemAlloc`, bounds-checked views, and [`PinnedHostBuffer`].
//!
//! `DeviceBuffer` deliberately does not use the stream-ordered pool (`cuMemAllocAsync`, which
//! cudarc's `CudaSlice` uses): pool memory cannot be exported through CUDA IPC, and peers fault
//! on it unless the pool's access is set for them.

use std::marker::PhantomData;
use std::ops::{Bound, RangeBounds};

use p2p_sys::{cu, cuda};

use crate::device::{as_bytes, as_bytes_mut, Device, DeviceCopy, Stream};
use crate::error::{Error, OnDevice, Result};
use crate::sync_copy::Copy;

/// Implements [`DeviceMemory`] (device, address, length; the other methods their defaults) and
/// [`DeviceMemoryMut`] for a type of this crate from three of its fields: the `device`, the
/// `ptr` and the `len` paths after `self.`. The invocation is the `unsafe impl`: put a
/// `// SAFETY:` line before it saying why those fields describe memory the value owns (or
/// borrows for its lifetime) and may be written.
macro_rules! device_memory {
    ($ty:ty, device: $($dev:ident).+, ptr: $ptr:ident, len: $len:ident) => {
        // SAFETY: the invoker's (see the macro's documentation and the invocation).
        unsafe impl $crate::DeviceMemory for $ty {
            fn device(&self) -> &$crate::Device {
                &self.$($dev).+
            }
            fn device_ptr(&self) -> p2p_sys::cuda::CUdeviceptr {
                self.$ptr
            }
            fn byte_len(&self) -> usize {
                self.$len
            }
        }
        // SAFETY: as above; the memory may be written through `&mut self`.
        unsafe impl $crate::DeviceMemoryMut for $ty {}
    };
}
pub(crate) use device_memory;

/// A region of device memory that can be read: the common face of every buffer kind.
///
/// # Synchronous copies and fills
/// The synchronous methods here and in [`DeviceMemoryMut`] are ordered as the driver's
/// synchronous copies are: after the work queued before them on the GPU's legacy default stream
/// and on its blocking streams (made without `CU_STREAM_NON_BLOCKING`, such as cudarc's default
/// stream), and, for memory bound to a stream ([`bound_stream`](Self::bound_stream)), after
/// that stream's work; p2p's own streams are non-blocking and not waited for. Every wait has a
/// limit ([`crate::HOST_WAIT`], or the one given to a `_within` method): the method first waits,
/// polling, for the work it follows, then makes the copy or fill on a non-blocking stream of
/// the device's own (so it waits for nothing queued since), host data through pinned staging
/// memory of its own in pieces of 8 MiB, and waits for each piece, at most the limit each
/// time. Work still running at a limit is [`Error::Busy`], which says whether the operation
/// was made; the host memory given is read and written by the host only, never after the
/// method returns. Synchronous copies on one GPU take turns.
///
/// # Safety
/// The kernels and copies of p2p read `byte_len()` bytes at `device_ptr()` on `device()`
/// trusting this trait, so an implementation must guarantee that those bytes are memory the
/// device can access, allocated for as long as the value lives (and as long as any work queued
/// with it runs). For memory p2p did not allocate, use [`ExternalMemory::from_raw`] rather than
/// a new implementation.
pub unsafe trait DeviceMemory {
    /// The device the memory lives on (or, for imported memory, is mapped into).
    fn device(&self) -> &Device;
    /// The device address of the first byte.
    fn device_ptr(&self) -> cuda::CUdeviceptr;
    /// The size in bytes.
    fn byte_len(&self) -> usize;

    /// The stream this memory is bound to, if any: p2p then queues work on it only on that
    /// stream ([`check_stream`]), and waits for that stream before the host touches it. `None`,
    /// the default (every buffer p2p allocates), means any stream. A view of a cudarc slice is
    /// bound to the stream it was made with, the one whose events cudarc's free waits for.
    fn bound_stream(&self) -> Option<cuda::CUstream> {
        None
    }

    /// The Rust type of the elements, where the memory is typed ([`DeviceBuffer<T>`], its
    /// views, a view of a cudarc `CudaSlice<T>`); `None` for untyped bytes (imported or
    /// external memory). Calls that take a data type check it against this.
    fn element_type(&self) -> Option<ElementType> {
        None
    }

    /// Copies the whole region into `dst`, which must be exactly as large. Synchronous, with
    /// [`crate::HOST_WAIT`] as its limit (see the type's "Synchronous copies and fills").
    fn copy_to_host<T: DeviceCopy>(&self, dst: &mut [T]) -> Result<()>
    where
        Self: Sized,
    {
        check_size(
            "host destination",
            self.byte_len(),
            std::mem::size_of_val(dst),
        )?;
        self.copy_range_to_host(0, dst)
    }

    /// Copies `dst.len()` elements' bytes starting `offset` bytes into the region into `dst`
    /// (the range must lie inside the region). Synchronous, with [`crate::HOST_WAIT`] as its
    /// limit (see the type's "Synchronous copies and fills").
    fn copy_range_to_host<T: DeviceCopy>(&self, offset: usize, dst: &mut [T]) -> Result<()>
    where
        Self: Sized,
    {
        self.copy_range_to_host_within(offset, dst, crate::HOST_WAIT)
    }

    /// As [`copy_range_to_host`](Self::copy_range_to_host), waiting at most `limit` for the
    /// work the copy is ordered after: past it, [`Error::Busy`] and `dst` is left as it was.
    fn copy_range_to_host_within<T: DeviceCopy>(
        &self,
        offset: usize,
        dst: &mut [T],
        limit: std::time::Duration,
    ) -> Result<()>
    where
        Self: Sized,
    {
        let dst = as_bytes_mut(dst);
        let end = offset.checked_add(dst.len());
        if end.is_none_or(|e| e > self.byte_len()) {
            return Err(Error::InvalidArgument(format!(
                "bytes {offset}..+{} lie outside a {}-byte region",
                dst.len(),
                self.byte_len()
            )));
        }
        if dst.is_empty() {
            return Ok(());
        }
        const OP: &str = "copy to host";
        wait_before(self, OP, limit)?;
        let copy = Copy::begin(self.device(), OP, limit)?;
        // SAFETY: the range was checked to lie inside the region.
        unsafe { copy.download(self.device_ptr() + offset as u64, dst) }
    }

    /// Copies the whole region into a new `Vec` (the length must divide evenly into `T`s).
    fn to_host_vec<T: DeviceCopy + Default>(&self) -> Result<Vec<T>>
    where
        Self: Sized,
    {
        let size = std::mem::size_of::<T>().max(1);
        if self.byte_len() % size != 0 {
            return Err(Error::SizeMismatch {
                what: "element type",
                expected: size,
                got: self.byte_len(),
            });
        }
        let mut v = vec![T::default(); self.byte_len() / size];
        self.copy_to_host(&mut v)?;
        Ok(v)
    }
}

/// A region of device memory that can also be written.
///
/// # Safety
/// As for [`DeviceMemory`], and the region must be writable: no other live value may rely on
/// its contents while p2p writes it.
pub unsafe trait DeviceMemoryMut: DeviceMemory {
    /// Copies `src`, which must be exactly as large as the region, to the device. Synchronous:
    /// returns once the data is in device memory, with [`crate::HOST_WAIT`] as its limit (see
    /// [`DeviceMemory`]'s "Synchronous copies and fills").
    fn copy_from_host<T: DeviceCopy>(&mut self, src: &[T]) -> Result<()>
    where
        Self: Sized,
    {
        const OP: &str = "copy from host";
        let src = as_bytes(src);
        check_size("host source", self.byte_len(), src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        wait_before(self, OP, crate::HOST_WAIT)?;
        let copy = Copy::begin(self.device(), OP, crate::HOST_WAIT)?;
        // SAFETY: the region is `src.len()` bytes long, writable (`&mut self`).
        unsafe { copy.upload(self.device_ptr(), src) }
    }

    /// Sets every byte to `value`. Synchronous, with [`crate::HOST_WAIT`] as its limit (see
    /// [`DeviceMemory`]'s "Synchronous copies and fills").
    fn memset_u8(&mut self, value: u8) -> Result<()>
    where
        Self: Sized,
    {
        const OP: &str = "fill";
        if self.byte_len() == 0 {
            return Ok(());
        }
        wait_before(self, OP, crate::HOST_WAIT)?;
        let copy = Copy::begin(self.device(), OP, crate::HOST_WAIT)?;
        // SAFETY: the region is `byte_len` bytes of live device memory, writable.
        unsafe { copy.fill(self.device_ptr(), value, self.byte_len()) }
    }

    /// Queues a fill of every byte with `value` on `stream`.
    ///
    /// The region must stay alive until the stream has run it; every buffer kind here
    /// synchronises before freeing, so dropping the buffer early is safe, only wasteful.
    fn memset_u8_async(&mut self, value: u8, stream: &Stream) -> Result<()>
    where
        Self: Sized,
    {
        if self.byte_len() == 0 {
            return Ok(());
        }
        check_stream(self, stream)?;
        stream.device().bind_to_thread()?;
        // SAFETY: the region is live device memory of `byte_len` bytes; see the note above.
        unsafe {
            cu!(cuMemsetD8Async(
                self.device_ptr(),
                value,
                self.byte_len(),
                stream.cu_stream()
            ))
        }
        .on(stream.device().ordinal())
    }

    /// Copies all of `src`, which must be as large, into this region, across devices if they
    /// differ (through peer access where enabled, else staged by the driver). Synchronous:
    /// returns once the copy has finished, with [`crate::HOST_WAIT`] as its limit (see
    /// [`DeviceMemory`]'s "Synchronous copies and fills"; both devices' work is waited for).
    fn copy_from_device<M: DeviceMemory>(&mut self, src: &M) -> Result<()>
    where
        Self: Sized,
    {
        const OP: &str = "copy between devices";
        check_size("device source", self.byte_len(), src.byte_len())?;
        if src.byte_len() == 0 {
            return Ok(());
        }
        wait_before(src, OP, crate::HOST_WAIT)?;
        wait_before(self, OP, crate::HOST_WAIT)?;
        let copy = Copy::begin(self.device(), OP, crate::HOST_WAIT)?;
        // SAFETY: both regions are live and `byte_len` bytes long, the destination writable
        // (`&mut self`), so they do not overlap.
        unsafe {
            copy.peer(
                self.device_ptr(),
                src.device(),
                src.device_ptr(),
                src.byte_len(),
            )
        }
    }
}

/// Queues a copy of `bytes` bytes from `src` to `dst` on `stream` (`cuMemcpyAsync`) and
/// returns once it is queued. Either address may be another GPU's memory that this stream's GPU
/// can address (a peer's allocation with peer access enabled, or a mapping imported from
/// another process); the copy engines move the bytes, no SM.
///
/// # Safety
/// Both ranges must be device memory of at least `bytes` bytes that this stream's GPU can
/// address and that stays allocated until the copy has run; they must not overlap, and nothing
/// may write either range while the copy runs.
pub unsafe fn copy_async(dst: u64, src: u64, bytes: usize, stream: &Stream) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    stream.device().bind_to_thread()?;
    // SAFETY: the caller guarantees both ranges; the stream is alive while borrowed.
    unsafe { cu!(cuMemcpyAsync(dst, src, bytes, stream.cu_stream())) }.on(stream.device().ordinal())
}

/// Queues a write of the 64-bit `value` to `dst` on `stream` (`cuStreamWriteValue64`), after
/// everything queued before it on the stream has finished and its memory writes are visible
/// (the default flags put a memory barrier before the write). `dst` may be another GPU's memory
/// that this stream's GPU can address: a flag that tells a peer a copy has landed.
///
/// # Safety
/// `dst` must be 8-byte aligned device memory of at least 8 bytes that this stream's GPU can
/// address and that stays allocated until the write has run, and no kernel may rely on the
/// old value past it.
pub unsafe fn write_u64_async(dst: u64, value: u64, stream: &Stream) -> Result<()> {
    stream.device().bind_to_thread()?;
    // SAFETY: the caller guarantees the word; the stream is alive while borrowed.
    unsafe { cu!(cuStreamWriteValue64_v2(stream.cu_stream(), dst, value, 0)) }
        .on(stream.device().ordinal())
}

/// Queues setting `bytes` bytes at `dst` to `byte` on `stream` (`cuMemsetD8Async`).
///
/// # Safety
/// `dst` must be device memory of at least `bytes` bytes that this stream's GPU can address
/// and that stays allocated until the write has run, with nothing else reading or writing it
/// meanwhile.
pub unsafe fn memset_async(dst: u64, byte: u8, bytes: usize, stream: &Stream) -> Result<()> {
    if bytes == 0 {
        return Ok(());
    }
    stream.device().bind_to_thread()?;
    // SAFETY: the caller guarantees the range; the stream is alive while borrowed.
    unsafe { cu!(cuMemsetD8Async(dst, byte, bytes, stream.cu_stream())) }
        .on(stream.device().ordinal())
}

/// Checks that work on `memory` may be queued on `stream`: a region bound to a stream
/// ([`DeviceMemory::bound_stream`], a view of a cudarc slice) only on that one, since cudarc
/// frees the slice after the work of that stream alone.
pub fn check_stream<M: DeviceMemory + ?Sized>(memory: &M, stream: &Stream) -> Result<()> {
    match memory.bound_stream() {
        Some(bound) if bound != stream.cu_stream() => Err(Error::InvalidArgument(format!(
            "the memory at {:#x} is a view bound to stream {bound:?} (a cudarc slice's view, made \
             with that stream); queue work on it on that stream, not on {:?}",
            memory.device_ptr(),
            stream.cu_stream()
        ))),
        _ => Ok(()),
    }
}

/// What a synchronous operation waited for, as [`Error::Busy`] names it.
const BOUND_WORK: &str = "the work queued before it on the stream the memory is bound to";
const LEGACY_WORK: &str = "the work queued before it on the GPU's legacy default stream or a blocking stream (one made without CU_STREAM_NON_BLOCKING, such as cudarc's default stream)";

/// Before a synchronous operation on `memory`: waits, at most `limit` each, for the stream
/// the memory is bound to (a cudarc view's), so that the host access follows that stream's work
/// on the memory, and for the work the legacy default stream orders after everything queued
/// before it (that stream's and the blocking streams'). The operation itself then runs on the
/// device's own stream (`sync_copy.rs`), which waits for nothing queued since.
/// [`Error::Busy`] if either still runs (nothing was queued); otherwise the memory's device is
/// left bound to the thread.
fn wait_before<M: DeviceMemory + ?Sized>(
    memory: &M,
    op: &'static str,
    limit: std::time::Duration,
) -> Result<()> {
    let device = memory.device();
    let busy = |waiting_for| Error::Busy {
        op,
        device: device.ordinal(),
        waiting_for,
        waited: limit,
        outcome: "it was not made",
    };
    if let Some(s) = memory.bound_stream() {
        // SAFETY: a bound region's stream outlives the region (the view borrows it); the
        // borrowed `Stream` does not destroy it.
        let bound = unsafe { Stream::from_raw(device, s) };
        if !bound.synchronize_within(limit)? {
            return Err(busy(BOUND_WORK));
        }
    }
    if !device.default_stream_idle_within(limit)? {
        return Err(busy(LEGACY_WORK));
    }
    device.bind_to_thread()
}

pub(crate) fn check_size(what: &'static str, expected: usize, got: usize) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(Error::SizeMismatch {
            what,
            expected,
            got,
        })
    }
}

/// Resolves a range against a length, checking bounds and overflow.
pub(crate) fn resolve_range(range: impl RangeBounds<usize>, len: usize) -> Result<(usize, usize)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => Some(s),
        Bound::Excluded(&s) => s.checked_add(1),
        Bound::Unbounded => Some(0),
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.checked_add(1),
        Bound::Excluded(&e) => Some(e),
        Bound::Unbounded => Some(len),
    };
    match (start, end) {
        (Some(s), Some(e)) if s <= e && e <= len => Ok((s, e)),
        (s, e) => Err(Error::OutOfBounds {
            start: s.unwrap_or(usize::MAX),
            end: e.unwrap_or(usize::MAX),
            len,
        }),
    }
}

/// A typed buffer of `len` elements in device memory from `cuMemAlloc`, freed on `Drop`.
///
/// ```no_run
/// use p2p_mem::{Device, DeviceBuffer, DeviceMemory, DeviceMemoryMut};
/// let gpu = Device::new(0)?;
/// let mut buf = DeviceBuffer::<f32>::from_host(&gpu, &[1.0, 2.0, 3.0])?;
/// buf.slice_mut(1..)?.copy_from_host(&[5.0f32, 6.0])?;
/// assert_eq!(buf.to_host_vec::<f32>()?, vec![1.0, 5.0, 6.0]);
/// # Ok::<(), p2p_mem::Error>(())
/// ```
pub struct DeviceBuffer<T: DeviceCopy> {
    device: Device,
    ptr: cuda::CUdeviceptr,
    len: usize,
    _marker: PhantomData<T>,
}

impl<T: DeviceCopy> DeviceBuffer<T> {
    /// Allocates `len` elements. The contents are whatever the memory held before.
    pub fn new(device: &Device, len: usize) -> Result<Self> {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
            Error::InvalidArgument(format!("{len} elements overflow the address space"))
        })?;
        let mut ptr = 0;
        if bytes > 0 {
            device.bind_to_thread()?;
            // SAFETY: a context is current and `ptr` is an out-pointer.
            unsafe { cu!(cuMemAlloc_v2(&mut ptr, bytes)) }.on(device.ordinal())?;
        }
        Ok(DeviceBuffer {
            device: device.clone(),
            ptr,
            len,
            _marker: PhantomData,
        })
    }

    /// Allocates `len` elements set to zero bytes.
    pub fn zeroed(device: &Device, len: usize) -> Result<Self> {
        let mut b = Self::new(device, len)?;
        b.memset_u8(0)?;
        Ok(b)
    }

    /// Allocates a buffer holding a copy of `src`.
    pub fn from_host(device: &Device, src: &[T]) -> Result<Self> {
        let mut b = Self::new(device, src.len())?;
        b.copy_from_host(src)?;
        Ok(b)
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// Whether the buffer holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// A read-only view of `range`, checked against the length.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<DeviceView<'_, T>> {
        let (s, e) = resolve_range(range, self.len)?;
        Ok(DeviceView {
            device: &self.device,
            ptr: self.elem_ptr(s),
            len: e - s,
            _marker: PhantomData,
        })
    }

    /// A writable view of `range`, checked against the length.
    pub fn slice_mut(&mut self, range: impl RangeBounds<usize>) -> Result<DeviceViewMut<'_, T>> {
        let (s, e) = resolve_range(range, self.len)?;
        let ptr = self.elem_ptr(s);
        Ok(DeviceViewMut {
            device: &self.device,
            ptr,
            len: e - s,
            _marker: PhantomData,
        })
    }

    /// Splits the buffer into two writable views, `[..mid]` and `[mid..]`, like
    /// `slice::split_at_mut`: for calls that fill several parts of one buffer at once (the
    /// receives of a [group](https://docs.rs/p2p-collective), say).
    ///
    /// ```no_run
    /// use p2p_mem::{Device, DeviceBuffer, DeviceMemoryMut};
    /// let gpu = Device::new(0)?;
    /// let mut buf = DeviceBuffer::<f32>::zeroed(&gpu, 300)?;
    /// let (mut a, rest) = buf.split_at_mut(100)?;
    /// let (mut b, mut c) = rest.split_at_mut(100)?;
    /// a.copy_from_host(&[1.0; 100])?;
    /// b.copy_from_host(&[2.0; 100])?;
    /// c.copy_from_host(&[3.0; 100])?;
    /// # Ok::<(), p2p_mem::Error>(())
    /// ```
    pub fn split_at_mut(
        &mut self,
        mid: usize,
    ) -> Result<(DeviceViewMut<'_, T>, DeviceViewMut<'_, T>)> {
        self.slice_mut(..)?.split_at_mut(mid)
    }

    fn elem_ptr(&self, index: usize) -> cuda::CUdeviceptr {
        self.ptr + (index * std::mem::size_of::<T>()) as u64
    }
}

impl<'a, T: DeviceCopy> DeviceViewMut<'a, T> {
    /// Splits the view into `[..mid]` and `[mid..]`, both writable for the view's lifetime
    /// (see [`DeviceBuffer::split_at_mut`]).
    pub fn split_at_mut(self, mid: usize) -> Result<(DeviceViewMut<'a, T>, DeviceViewMut<'a, T>)> {
        if mid > self.len {
            return Err(Error::OutOfBounds {
                start: mid,
                end: mid,
                len: self.len,
            });
        }
        let size = std::mem::size_of::<T>() as u64;
        Ok((
            DeviceViewMut {
                device: self.device,
                ptr: self.ptr,
                len: mid,
                _marker: PhantomData,
            },
            DeviceViewMut {
                device: self.device,
                ptr: self.ptr + mid as u64 * size,
                len: self.len - mid,
                _marker: PhantomData,
            },
        ))
    }
}

/// [`DeviceMemory`] for the typed buffer and its views: `len` elements of `T` at `ptr` on
/// `device` (a `Device` or a `&Device`).
macro_rules! typed_memory {
    ($ty:ty) => {
        // SAFETY: the pointer and length describe memory this value owns or borrows for its
        // lifetime (see the type's constructor).
        unsafe impl<T: DeviceCopy> DeviceMemory for $ty {
            fn device(&self) -> &Device {
                &self.device
            }
            fn device_ptr(&self) -> cuda::CUdeviceptr {
                self.ptr
            }
            fn byte_len(&self) -> usize {
                self.len * std::mem::size_of::<T>()
            }
            fn element_type(&self) -> Option<ElementType> {
                Some(ElementType::of::<T>())
            }
        }
    };
}
typed_memory!(DeviceBuffer<T>);
// SAFETY: the pointer and length describe memory this value owns or borrows for its
// lifetime (see the type's constructor).
unsafe impl<T: DeviceCopy> DeviceMemoryMut for DeviceBuffer<T> {}

impl<T: DeviceCopy> Drop for DeviceBuffer<T> {
    fn drop(&mut self) {
        if self.ptr == 0 {
            return;
        }
        // cuMemFree waits, without a limit, for work still queued on the device: wait within
        // DROP_WAIT first; past it, leak the memory (logged) rather than wait for good.
        let bytes = self.len.saturating_mul(std::mem::size_of::<T>());
        if !self.device.idle_before_free("a device buffer", bytes) {
            return;
        }
        // SAFETY: allocated by cuMemAlloc in `new` and freed once; the device is idle.
        let free = || unsafe { cu!(cuMemFree_v2(self.ptr)) };
        self.device.release("freeing a device buffer", free);
    }
}

// SAFETY: the buffer owns device memory, which any thread may use through the retained context.
unsafe impl<T: DeviceCopy> Send for DeviceBuffer<T> {}
// SAFETY: shared access only reads (copy_to_host); writes need `&mut`.
unsafe impl<T: DeviceCopy> Sync for DeviceBuffer<T> {}

/// A read-only, bounds-checked view into a [`DeviceBuffer`].
pub struct DeviceView<'a, T> {
    device: &'a Device,
    ptr: cuda::CUdeviceptr,
    len: usize,
    _marker: PhantomData<&'a T>,
}

/// A writable, bounds-checked view into a [`DeviceBuffer`].
pub struct DeviceViewMut<'a, T> {
    device: &'a Device,
    ptr: cuda::CUdeviceptr,
    len: usize,
    _marker: PhantomData<&'a mut T>,
}

macro_rules! view_memory {
    ($view:ident) => {
        impl<T: DeviceCopy> $view<'_, T> {
            /// The number of elements in the view.
            pub fn len(&self) -> usize {
                self.len
            }
            /// Whether the view is empty.
            pub fn is_empty(&self) -> bool {
                self.len == 0
            }
        }
        typed_memory!($view<'_, T>);
    };
}
view_memory!(DeviceView);
view_memory!(DeviceViewMut);
// SAFETY: the pointer and length describe memory this value owns or borrows for its
// lifetime (see the type's constructor).
unsafe impl<T: DeviceCopy> DeviceMemoryMut for DeviceViewMut<'_, T> {}

/// Device memory that something else allocated and frees (NCCL's `ncclMemAlloc`, cudarc, a
/// framework's allocator), seen through the [`DeviceMemory`] traits. It frees nothing.
///
/// Making one is `unsafe`: every safe copy and every collective trusts its address and length.
pub struct ExternalMemory {
    device: Device,
    ptr: cuda::CUdeviceptr,
    bytes: usize,
}

impl ExternalMemory {
    /// `bytes` bytes at `ptr` on `device`.
    ///
    /// # Safety
    /// `ptr..ptr + bytes` must be device memory that `device`'s context can access, and must
    /// stay allocated for as long as this value (and any copy or call using it) lives.
    pub unsafe fn from_raw(
        device: &Device,
        ptr: cuda::CUdeviceptr,
        bytes: usize,
    ) -> ExternalMemory {
        ExternalMemory {
            device: device.clone(),
            ptr,
            bytes,
        }
    }

    /// The bytes `range` of this region, as a region of its own.
    pub fn slice(&self, range: impl RangeBounds<usize>) -> Result<ExternalMemory> {
        let (s, e) = resolve_range(range, self.bytes)?;
        Ok(ExternalMemory {
            device: self.device.clone(),
            ptr: self.ptr + s as u64,
            bytes: e - s,
        })
    }
}

// SAFETY: the pointer and length describe memory the caller of `from_raw` vouched for, for this
// value's lifetime (see the constructor).
device_memory!(ExternalMemory, device: device, ptr: ptr, len: bytes);

/// Page-locked host memory from `cuMemHostAlloc` (portable: usable with every context), zeroed
/// at allocation and freed on `Drop`. Dereferences to `[T]`.
pub struct PinnedHostBuffer<T: DeviceCopy> {
    device: Device,
    ptr: *mut T,
    len: usize,
}

impl<T: DeviceCopy> PinnedHostBuffer<T> {
    /// Allocates `len` zeroed elements of pinned memory (`device` supplies the context).
    pub fn new(device: &Device, len: usize) -> Result<Self> {
        let bytes = len.checked_mul(std::mem::size_of::<T>()).ok_or_else(|| {
            Error::InvalidArgument(format!("{len} elements overflow the address space"))
        })?;
        let mut ptr: *mut std::ffi::c_void = std::ptr::null_mut();
        if bytes > 0 {
            device.bind_to_thread()?;
            // SAFETY: a context is current and `ptr` is an out-pointer.
            unsafe {
                cu!(cuMemHostAlloc(
                    &mut ptr,
                    bytes,
                    cuda::CU_MEMHOSTALLOC_PORTABLE
                ))
            }
            .on(device.ordinal())?;
            // SAFETY: the allocation is `bytes` long; zero is a valid value of every DeviceCopy type.
            unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), 0, bytes) };
        }
        Ok(PinnedHostBuffer {
            device: device.clone(),
            ptr: ptr.cast(),
            len,
        })
    }

    /// The first element's address, made without a reference to the elements: for memory that
    /// kernels or other threads write while this lives (a flag read through atomics), where a
    /// `&[T]` from `Deref` would promise Rust that nothing changes it.
    pub fn as_raw_ptr(&self) -> *mut T {
        self.ptr
    }
}

impl<T: DeviceCopy> std::ops::Deref for PinnedHostBuffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `ptr` points to `len` initialised elements we own.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl<T: DeviceCopy> std::ops::DerefMut for PinnedHostBuffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: `ptr` points to `len` initialised elements we own exclusively.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl<T: DeviceCopy> Drop for PinnedHostBuffer<T> {
    fn drop(&mut self) {
        if self.ptr.is_null() {
            return;
        }
        // cuMemFreeHost waits, without a limit, for work that may use the memory: wait within
        // DROP_WAIT first; past it, leak it (logged) rather than wait for good.
        let bytes = self.len.saturating_mul(std::mem::size_of::<T>());
        if !self.device.idle_before_free("pinned host memory", bytes) {
            return;
        }
        // SAFETY: allocated by cuMemHostAlloc and freed once; the device is idle.
        let free = || unsafe { cu!(cuMemFreeHost(self.ptr.cast())) };
        self.device.release("freeing pinned host memory", free);
    }
}

// SAFETY: the buffer owns its allocation exclusively, like a Vec<T>.
unsafe impl<T: DeviceCopy> Send for PinnedHostBuffer<T> {}
// SAFETY: shared access gives `&[T]` only, like a Vec<T>.
unsafe impl<T: DeviceCopy> Sync for PinnedHostBuffer<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_resolve_or_fail_cleanly() {
        assert_eq!(resolve_range(.., 10).ok(), Some((0, 10)));
        assert_eq!(resolve_range(2..5, 10).ok(), Some((2, 5)));
        assert_eq!(resolve_range(2..=9, 10).ok(), Some((2, 10)));
        assert_eq!(resolve_range(10.., 10).ok(), Some((10, 10)));
        assert!(matches!(
            resolve_range(5..11, 10),
            Err(Error::OutOfBounds {
                start: 5,
                end: 11,
                len: 10
            })
        ));
        #[allow(clippy::reversed_empty_ranges)] // a reversed range is the case under test
        let reversed = 6..5;
        assert!(matches!(
            resolve_range(reversed, 10),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            resolve_range(0..=usize::MAX, 10),
            Err(Error::OutOfBounds { .. })
        ));
        assert!(matches!(
            resolve_range((Bound::Excluded(usize::MAX), Bound::Unbounded), 10),
            Err(Error::OutOfBounds { .. })
        ));
    }

    #[test]
    fn sizes_must_match_exactly() {
        assert!(check_size("x", 4, 4).is_ok());
        let e = check_size("host source", 8, 4).expect_err("mismatch");
        assert_eq!(
            e.to_string(),
            "size mismatch: host source is 4 bytes, expected 8"
        );
    }
}

/// The Rust type of a typed buffer's elements ([`DeviceMemory::element_type`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ElementType {
    /// The type's identity.
    pub id: std::any::TypeId,
    /// Its name, for messages (e.g. `f32`, `half::bf16`).
    pub name: &'static str,
}

impl ElementType {
    /// The element type `T`.
    pub fn of<T: 'static>() -> ElementType {
        ElementType {
            id: std::any::TypeId::of::<T>(),
            name: std::any::type_name::<T>(),
        }
    }

    /// Whether this is `T`.
    pub fn is<T: 'static>(&self) -> bool {
        self.id == std::any::TypeId::of::<T>()
    }
}
