//! Devices, their primary contexts, and streams.
//!
//! A [`Device`] holds a reference on the device's *primary* context (the one the CUDA runtime,
//! PyTorch and NCCL also use), so buffers made here interoperate with them. Every operation binds
//! that context to the calling thread first, so a `Device` can be used from any thread.

use std::sync::Arc;

use p2p_sys::{cu, cuda};

use crate::error::{Error, OnDevice, Result};

/// One CUDA device, with a reference on its primary context. Cheap to clone.
#[derive(Clone)]
pub struct Device {
    inner: Arc<DeviceInner>,
}

struct DeviceInner {
    ordinal: i32,
    cu: cuda::CUdevice,
    ctx: cuda::CUcontext,
    name: String,
    compute_capability: (i32, i32),
    pci_bus_id: String,
    uuid: [u8; 16],
    sm_count: i32,
    total_memory: usize,
    /// The stream and staging memory of the synchronous copies (`sync_copy.rs`).
    copier: crate::sync_copy::Slot,
}

// SAFETY: a CUcontext handle may be used from any thread (the driver API is thread-safe and each
// call binds it first); the other fields are plain data.
unsafe impl Send for DeviceInner {}
// SAFETY: as above; nothing in DeviceInner is mutated after construction.
unsafe impl Sync for DeviceInner {}

impl Drop for DeviceInner {
    fn drop(&mut self) {
        self.copier.release(self.ctx, self.ordinal);
        // SAFETY: we retained the primary context in `Device::new` and release it exactly once.
        if let Err(e) = unsafe { cu!(cuDevicePrimaryCtxRelease_v2(self.cu)) } {
            tracing::error!(device = self.ordinal, "releasing the primary context: {e}");
        }
    }
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("ordinal", &self.inner.ordinal)
            .field("name", &self.inner.name)
            .field("pci_bus_id", &self.inner.pci_bus_id)
            .finish()
    }
}

impl PartialEq for Device {
    fn eq(&self, other: &Self) -> bool {
        self.inner.ordinal == other.inner.ordinal
    }
}
impl Eq for Device {}

impl Device {
    /// How many CUDA devices this process sees.
    ///
    /// Returns [`p2p_sys::Error::LibraryNotFound`] (inside [`Error::Sys`]) on a machine with no
    /// driver, never a panic.
    pub fn count() -> Result<i32> {
        p2p_sys::init_driver()?;
        let mut n = 0;
        // SAFETY: the driver is initialised and `n` is a valid out-pointer.
        unsafe { cu!(cuDeviceGetCount(&mut n)) }?;
        Ok(n)
    }

    /// Every visible device, in ordinal order.
    pub fn all() -> Result<Vec<Device>> {
        (0..Self::count()?).map(Device::new).collect()
    }

    /// Opens device `ordinal` and retains its primary context.
    ///
    /// ```no_run
    /// let gpu = p2p_mem::Device::new(0)?;
    /// println!("{} (sm_{}{})", gpu.name(), gpu.compute_capability().0, gpu.compute_capability().1);
    /// # Ok::<(), p2p_mem::Error>(())
    /// ```
    pub fn new(ordinal: i32) -> Result<Device> {
        let count = Self::count()?;
        if ordinal < 0 || ordinal >= count {
            return Err(Error::NoSuchDevice { ordinal, count });
        }
        let mut dev = 0;
        // SAFETY: the driver is initialised, the ordinal is in range, `dev` is an out-pointer.
        unsafe { cu!(cuDeviceGet(&mut dev, ordinal)) }.on(ordinal)?;
        let attr = |a| -> Result<i32> {
            let mut v = 0;
            // SAFETY: `dev` is a valid device and `v` an out-pointer.
            unsafe { cu!(cuDeviceGetAttribute(&mut v, a, dev)) }.on(ordinal)?;
            Ok(v)
        };
        use cuda::CUdevice_attribute::*;
        let compute_capability = (
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attr(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let sm_count = attr(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?;

        let mut name = [0 as std::ffi::c_char; 256];
        // SAFETY: the buffer is 256 bytes and we pass its length.
        unsafe { cu!(cuDeviceGetName(name.as_mut_ptr(), name.len() as i32, dev)) }.on(ordinal)?;
        let mut bus = [0 as std::ffi::c_char; 64];
        // SAFETY: the buffer is 64 bytes and we pass its length.
        unsafe { cu!(cuDeviceGetPCIBusId(bus.as_mut_ptr(), bus.len() as i32, dev)) }.on(ordinal)?;
        let mut uuid = cuda::CUuuid { bytes: [0; 16] };
        // SAFETY: `uuid` is a valid out-pointer.
        unsafe { cu!(cuDeviceGetUuid_v2(&mut uuid, dev)) }.on(ordinal)?;
        let mut total_memory = 0;
        // SAFETY: `total_memory` is a valid out-pointer.
        unsafe { cu!(cuDeviceTotalMem_v2(&mut total_memory, dev)) }.on(ordinal)?;

        let mut ctx = std::ptr::null_mut();
        // SAFETY: `dev` is valid; the reference taken here is released in DeviceInner::drop.
        unsafe { cu!(cuDevicePrimaryCtxRetain(&mut ctx, dev)) }.on(ordinal)?;
        let device = Device {
            inner: Arc::new(DeviceInner {
                ordinal,
                cu: dev,
                ctx,
                name: c_chars_to_string(&name),
                compute_capability,
                pci_bus_id: c_chars_to_string(&bus),
                uuid: uuid.bytes.map(|b| b as u8),
                sm_count,
                total_memory,
                copier: Default::default(),
            }),
        };
        tracing::debug!(
            device = ordinal,
            name = %device.inner.name,
            bus = %device.inner.pci_bus_id,
            "opened device"
        );
        Ok(device)
    }

    /// Finds the visible device with this UUID, if any.
    pub fn by_uuid(uuid: &[u8; 16]) -> Result<Option<Device>> {
        Ok(Self::all()?.into_iter().find(|d| d.uuid() == uuid))
    }

    /// The ordinal, as CUDA numbers devices in this process (after `CUDA_VISIBLE_DEVICES`).
    pub fn ordinal(&self) -> i32 {
        self.inner.ordinal
    }
    /// The marketing name, e.g. `NVIDIA H200`.
    pub fn name(&self) -> &str {
        &self.inner.name
    }
    /// `(major, minor)`, e.g. `(9, 0)` for Hopper.
    pub fn compute_capability(&self) -> (i32, i32) {
        self.inner.compute_capability
    }
    /// The PCI bus id, e.g. `0000:00:06.0`.
    pub fn pci_bus_id(&self) -> &str {
        &self.inner.pci_bus_id
    }
    /// The 16-byte UUID, stable across processes and `CUDA_VISIBLE_DEVICES` orderings.
    pub fn uuid(&self) -> &[u8; 16] {
        &self.inner.uuid
    }
    /// The UUID as `nvidia-smi -L` prints it (`GPU-xxxxxxxx-xxxx-...`).
    pub fn uuid_string(&self) -> String {
        format_uuid(&self.inner.uuid)
    }
    /// The number of streaming multiprocessors.
    pub fn sm_count(&self) -> i32 {
        self.inner.sm_count
    }
    /// Total device memory in bytes.
    pub fn total_memory(&self) -> usize {
        self.inner.total_memory
    }
    /// The raw `CUdevice`, for FFI.
    pub fn cu_device(&self) -> cuda::CUdevice {
        self.inner.cu
    }
    /// The raw primary context, for FFI.
    pub fn cu_context(&self) -> cuda::CUcontext {
        self.inner.ctx
    }

    /// The stream and staging memory of this device's synchronous copies.
    pub(crate) fn copier(&self) -> &crate::sync_copy::Slot {
        &self.inner.copier
    }

    /// Makes this device's primary context current on the calling thread.
    ///
    /// Every method here does this itself; call it before raw FFI of your own.
    pub fn bind_to_thread(&self) -> Result<()> {
        // SAFETY: the context is retained for as long as `self` lives.
        unsafe { cu!(cuCtxSetCurrent(self.inner.ctx)) }.on(self.inner.ordinal)
    }

    /// `(free, total)` device memory in bytes, as the driver reports it now.
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        self.bind_to_thread()?;
        let (mut free, mut total) = (0, 0);
        // SAFETY: a context is current and both are valid out-pointers.
        unsafe { cu!(cuMemGetInfo_v2(&mut free, &mut total)) }.on(self.ordinal())?;
        Ok((free, total))
    }

    /// Waits until all work queued on this device has finished, however long that takes
    /// (`cuCtxSynchronize`). [`synchronize_within`](Self::synchronize_within) gives up at a
    /// deadline; the library's own waits use that.
    pub fn synchronize(&self) -> Result<()> {
        self.bind_to_thread()?;
        // SAFETY: a context is current.
        unsafe { cu!(cuCtxSynchronize()) }.on(self.ordinal())
    }

    /// Waits until the work queued on this device's legacy default stream (stream 0) has
    /// finished, however long that takes: what [`Module::launch_sync`](crate::kernel::Module::launch_sync)
    /// queues there. Unlike [`synchronize`](Self::synchronize) it does not wait for other streams
    /// (p2p's are created non-blocking), so a synchronous launch for one rank never waits for
    /// another rank's kernel on the same GPU, which may itself wait for a later call of the
    /// first rank. The synchronous copies wait with a deadline instead
    /// ([`default_stream_idle_within`](Self::default_stream_idle_within)).
    pub(crate) fn synchronize_default_stream(&self) -> Result<()> {
        self.bind_to_thread()?;
        // SAFETY: a context is current; the null handle names its legacy default stream.
        unsafe { cu!(cuStreamSynchronize(std::ptr::null_mut())) }.on(self.ordinal())
    }

    /// Waits, at most `limit`, for the work that an operation queued now on the legacy default
    /// stream (stream 0) would follow: what is queued on that stream, and on every blocking
    /// stream of the context (one made without `CU_STREAM_NON_BLOCKING`, such as cudarc's
    /// default stream; p2p's streams are non-blocking and not waited for). `Ok(true)` once it
    /// has finished, `Ok(false)` if it still runs at the deadline. Records an event on the
    /// legacy stream (which orders it after that work, as a synchronous copy is ordered) and
    /// polls it: nothing blocks in the driver.
    pub(crate) fn default_stream_idle_within(&self, limit: std::time::Duration) -> Result<bool> {
        let event = crate::Event::new(self)?;
        // SAFETY: the event is alive and of this device's context, which `Event::new` made
        // current; the null handle names the context's legacy default stream.
        unsafe { cu!(cuEventRecord(event.cu_event(), std::ptr::null_mut())) }.on(self.ordinal())?;
        event.synchronize_within(limit)
    }

    /// As [`synchronize`](Self::synchronize), but gives up after `limit`: `Ok(true)` once
    /// everything queued on the device before the call has finished, `Ok(false)` if work still
    /// runs at the deadline (nothing is stopped). For `Drop`s: free memory only if the device
    /// became idle, otherwise leak it rather than free memory a kernel may still use.
    ///
    /// Where the driver has `cuCtxRecordEvent` (drivers newer than CUDA 12.4), the wait
    /// records the context's whole queued work, every stream's, in an event and polls it: it
    /// blocks nothing in the driver and leaves no thread behind at the deadline. A CUDA 12.4
    /// driver has no way to poll a whole device: there, or if recording fails, the wait runs
    /// `cuCtxSynchronize` in a helper thread (`p2p-sync`) and stops waiting for it at the
    /// deadline; that thread then stays blocked in the driver until the device's work ends.
    ///
    /// While a stream of the device's context is being captured into a graph, the driver
    /// refuses `cuCtxRecordEvent` and invalidates that capture (as it refuses `cuCtxSynchronize`
    /// during a capture in the default, global mode): wait for the device outside captures.
    pub fn synchronize_within(&self, limit: std::time::Duration) -> Result<bool> {
        match self.record_queued_work() {
            Ok(Some(event)) => event.synchronize_within(limit),
            Ok(None) => {
                tracing::debug!(
                    device = self.ordinal(),
                    "the driver has no cuCtxRecordEvent: waiting for the device in a helper thread"
                );
                self.synchronize_in_helper(limit)
            }
            Err(e) => {
                tracing::debug!(
                    device = self.ordinal(),
                    "could not record the device's work in an event ({e}): waiting for the device in a helper thread"
                );
                self.synchronize_in_helper(limit)
            }
        }
    }

    /// In a `Drop`: makes this device's context current and runs `release` (a free, destroy or
    /// unload of something made on this device), logging its error as an error `{what}: {e}`
    /// (a drop has nobody to return it to).
    pub(crate) fn release(
        &self,
        what: &str,
        release: impl FnOnce() -> std::result::Result<(), p2p_sys::Error>,
    ) {
        let _ = self.bind_to_thread();
        if let Err(e) = release() {
            tracing::error!(device = self.ordinal(), "{what}: {e}");
        }
    }

    /// In a `Drop` of memory on this device, before it is freed, unmapped or unregistered:
    /// waits for the device's queued work, up to [`DROP_WAIT`](crate::DROP_WAIT), and says
    /// whether to go on. `false` when the GPU was still busy: logged as an error saying that
    /// `what` (`bytes` long) is leaked, never pulled from under a running kernel. A failed wait
    /// is logged and goes on (the device is then unusable anyway).
    pub(crate) fn idle_before_free(&self, what: &str, bytes: usize) -> bool {
        match self.synchronize_within(crate::DROP_WAIT) {
            Ok(true) => true,
            Ok(false) => {
                tracing::error!(
                    device = self.ordinal(),
                    bytes,
                    "GPU {} is still busy {:?} after {what} was dropped: leaking its {bytes} bytes (left mapped) rather than freeing them under a running kernel",
                    self.ordinal(),
                    crate::DROP_WAIT,
                );
                false
            }
            Err(e) => {
                tracing::error!(device = self.ordinal(), "before freeing {what}: {e}");
                true
            }
        }
    }

    /// An event that completes once everything queued on this device's context (every stream)
    /// has finished (`cuCtxRecordEvent`); `None` where the driver lacks that entry point.
    fn record_queued_work(&self) -> Result<Option<crate::Event>> {
        if !p2p_sys::ctx_event::has("cuCtxRecordEvent") {
            return Ok(None);
        }
        let event = crate::Event::new(self)?;
        // SAFETY: the context is retained for as long as `self` lives, and the event was made
        // in it and is alive.
        let r = unsafe { p2p_sys::ctx_event::cuCtxRecordEvent(self.inner.ctx, event.cu_event()) };
        p2p_sys::check_cu("cuCtxRecordEvent", r).on(self.ordinal())?;
        Ok(Some(event))
    }

    /// [`synchronize`](Self::synchronize) in a helper thread, waited for at most `limit`: for
    /// drivers with no way to poll a whole device. At the deadline the thread is left to end
    /// with the device's work.
    fn synchronize_in_helper(&self, limit: std::time::Duration) -> Result<bool> {
        let (tx, rx) = std::sync::mpsc::channel();
        let d = self.clone();
        let started = std::thread::Builder::new()
            .name("p2p-sync".into())
            .spawn(move || {
                let _ = tx.send(d.synchronize());
            });
        if let Err(e) = started {
            // Not a wait without a deadline instead: the caller treats the device as busy.
            tracing::warn!(
                device = self.ordinal(),
                "could not start a thread to wait for GPU {} ({e}): taking it for busy",
                self.ordinal()
            );
            return Ok(false);
        }
        match rx.recv_timeout(limit) {
            Ok(r) => r.map(|()| true),
            Err(_) => {
                tracing::warn!(
                    device = self.ordinal(),
                    "GPU {} still busy after {limit:?}: a thread (p2p-sync) stays blocked in cuCtxSynchronize until its work ends (a driver newer than CUDA 12.4 waits without one)",
                    self.ordinal()
                );
                Ok(false)
            }
        }
    }

    /// The value of a device attribute.
    pub fn attribute(&self, attribute: cuda::CUdevice_attribute) -> Result<i32> {
        let mut v = 0;
        // SAFETY: the device handle is valid and `v` is an out-pointer.
        unsafe { cu!(cuDeviceGetAttribute(&mut v, attribute, self.inner.cu)) }.on(self.ordinal())?;
        Ok(v)
    }
}

/// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, as `nvidia-smi -L` prints a UUID.
pub fn format_uuid(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn c_chars_to_string(buf: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = buf
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// A non-blocking CUDA stream on one device, destroyed on `Drop` (unless borrowed with
/// [`Stream::from_raw`]).
pub struct Stream {
    device: Device,
    raw: cuda::CUstream,
    /// Whether `Drop` destroys the stream (false for a borrowed one).
    owned: bool,
    /// The cudarc stream this one borrows (an `Arc<CudaStream>` of whichever cudarc version
    /// made it), kept alive for as long as this value.
    #[cfg(any(feature = "cudarc", feature = "cudarc-0-18", feature = "cudarc-0-17"))]
    pub(crate) cudarc: Option<std::sync::Arc<dyn std::any::Any + Send + Sync>>,
}

// SAFETY: a CUstream may be used from any thread; every use binds its device's context first.
unsafe impl Send for Stream {}
// SAFETY: as above; the handle is never mutated.
unsafe impl Sync for Stream {}

impl Stream {
    /// Creates a stream that does not synchronise with the legacy default stream.
    pub fn new(device: &Device) -> Result<Stream> {
        device.bind_to_thread()?;
        let mut raw = std::ptr::null_mut();
        let flags = cuda::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: the device's context is current and `raw` is an out-pointer.
        unsafe { cu!(cuStreamCreate(&mut raw, flags)) }.on(device.ordinal())?;
        Ok(Stream {
            device: device.clone(),
            raw,
            owned: true,
            #[cfg(any(feature = "cudarc", feature = "cudarc-0-18", feature = "cudarc-0-17"))]
            cudarc: None,
        })
    }

    /// Borrows a stream someone else created (cudarc's `CudaStream::cu_stream()`, a C++
    /// library's `cudaStream_t`), so that p2p's calls queue on the user's own stream. Dropping
    /// the result does not destroy the stream.
    ///
    /// p2p uses each device's primary context, which is the one the CUDA runtime, cudarc's
    /// `CudaContext` and PyTorch use, so their streams work here.
    ///
    /// # Safety
    /// `raw` must be a live stream of `device`'s primary context (or the legacy default stream,
    /// null), and must stay alive for as long as the returned value and any work p2p queued on
    /// it.
    pub unsafe fn from_raw(device: &Device, raw: cuda::CUstream) -> Stream {
        Stream {
            device: device.clone(),
            raw,
            owned: false,
            #[cfg(any(feature = "cudarc", feature = "cudarc-0-18", feature = "cudarc-0-17"))]
            cudarc: None,
        }
    }
    /// The device the stream belongs to.
    pub fn device(&self) -> &Device {
        &self.device
    }
    /// The raw handle, for FFI.
    pub fn cu_stream(&self) -> cuda::CUstream {
        self.raw
    }

    crate::wait::host_waits! {
        /// Waits until all work queued on the stream has finished.
        fn synchronize = cuStreamSynchronize;
        /// Waits until everything queued on the stream has finished, at most `limit`:
        /// `Ok(true)` once it has, `Ok(false)` if work still runs at the deadline (nothing is
        /// stopped, and no thread is left waiting). Polls [`is_idle`](Self::is_idle): spinning
        /// for the first 100 µs, so that a short wait costs no more than `cuStreamSynchronize`,
        /// then sleeping between polls, up to 1 ms. A fault of queued work is an error, as in
        /// [`synchronize`](Self::synchronize).
        fn synchronize_within;
        /// Whether everything queued on the stream has finished, without waiting
        /// (`cuStreamQuery`): what a wait with a deadline polls.
        /// A fault of queued work is an error, as [`synchronize`](Self::synchronize) reports it.
        fn is_idle = cuStreamQuery;
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // SAFETY: the stream was created by us and is destroyed once; pending work still completes.
        let destroy = || unsafe { cu!(cuStreamDestroy_v2(self.raw)) };
        self.device.release("destroying a stream", destroy);
    }
}

/// Plain data that may be copied to and from a GPU byte for byte.
///
/// # Safety
/// Every bit pattern of `size_of::<Self>()` bytes must be a valid value (device memory can hold
/// anything), and the type must have no padding and no pointers.
pub unsafe trait DeviceCopy: Copy + Send + Sync + 'static {}

macro_rules! device_copy {
    ($($t:ty),*) => { $(
        // SAFETY: a primitive number: any bit pattern is valid and there is no padding.
        unsafe impl DeviceCopy for $t {}
    )* };
}
device_copy!(u8, i8, u16, i16, u32, i32, u64, i64, u128, i128, usize, isize, f32, f64);
// SAFETY: an array of DeviceCopy values has no padding and accepts any bits elementwise.
unsafe impl<T: DeviceCopy, const N: usize> DeviceCopy for [T; N] {}
// SAFETY: 16-bit floats are two plain bytes; every bit pattern is some value (or a NaN).
unsafe impl DeviceCopy for half::f16 {}
// SAFETY: as above.
unsafe impl DeviceCopy for half::bf16 {}

/// Views a slice of plain data as bytes.
pub(crate) fn as_bytes<T: DeviceCopy>(s: &[T]) -> &[u8] {
    // SAFETY: DeviceCopy types have no padding, so every byte is initialised.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast(), std::mem::size_of_val(s)) }
}

/// Views a mutable slice of plain data as bytes.
pub(crate) fn as_bytes_mut<T: DeviceCopy>(s: &mut [T]) -> &mut [u8] {
    // SAFETY: DeviceCopy accepts any bit pattern, so writing arbitrary bytes is sound.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast(), std::mem::size_of_val(s)) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_print_like_nvidia_smi() {
        let u = [
            0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 1, 2, 3, 4, 5, 6, 7, 8,
        ];
        assert_eq!(format_uuid(&u), "GPU-12345678-9abc-def0-0102-030405060708");
    }

    #[test]
    fn byte_views_cover_every_element() {
        let mut v = [1u32, 2, 0xdead_beef];
        assert_eq!(as_bytes(&v).len(), 12);
        as_bytes_mut(&mut v)[0] = 9;
        assert_eq!(v[0], 9);
    }

    #[test]
    fn no_driver_means_an_error_value_not_a_panic() {
        match Device::count() {
            Ok(n) => assert!(n >= 0),
            Err(Error::Sys(p2p_sys::Error::LibraryNotFound { library, searched })) => {
                assert_eq!(library, "libcuda");
                assert!(!searched.is_empty());
                assert!(matches!(Device::new(0), Err(Error::Sys(_))));
            }
            Err(other) => {
                // A driver without a usable GPU (CUDA_ERROR_NO_DEVICE) is also an error value.
                assert!(
                    matches!(other, Error::Sys(p2p_sys::Error::Call { .. })),
                    "{other}"
                );
            }
        }
    }
}
