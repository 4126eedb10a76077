//! Host memory shared between processes and usable by the GPU: the medium of host-staged
//! transfers between processes.
//!
//! [`HostShared::new`] creates an anonymous memory file (`memfd_create`, close-on-exec), maps it
//! and registers it with CUDA (portable, device-mapped), so copies and kernels reach it at a
//! device address. Its fd goes to another process with [`crate::fdpass`], where
//! [`HostShared::from_fd`] maps and registers the same pages. `Drop` unregisters, then unmaps.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use p2p_sys::{cu, cuda};

use crate::device::Device;
use crate::error::{os, Error, OnDevice, Result};

/// The seals every shared memory file carries: its size cannot change.
const SIZE_SEALS: rustix::fs::SealFlags =
    rustix::fs::SealFlags::SHRINK.union(rustix::fs::SealFlags::GROW);

/// Shared, pinned host memory with a device address. Zeroed when created.
pub struct HostShared {
    device: Device,
    fd: OwnedFd,
    ptr: *mut u8,
    len: usize,
    device_ptr: cuda::CUdeviceptr,
}

// SAFETY: the mapping is process-wide memory; host access goes through DeviceMemory's copies,
// which take `&mut` to write.
unsafe impl Send for HostShared {}
// SAFETY: as above.
unsafe impl Sync for HostShared {}

impl HostShared {
    /// Creates `len` bytes of shareable host memory, registered with `device`'s context.
    pub fn new(device: &Device, len: usize) -> Result<HostShared> {
        if len == 0 {
            return Err(Error::InvalidArgument(
                "shared host memory cannot be empty".into(),
            ));
        }
        use rustix::fs::{MemfdFlags, SealFlags};
        let fd = rustix::fs::memfd_create(
            c"p2p-host-staged",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )
        .map_err(os("memfd_create for shared host memory"))?;
        // A new memfd reads as zeros.
        rustix::fs::ftruncate(&fd, len as u64)
            .map_err(os(format!("sizing shared host memory to {len} bytes")))?;
        // Its size is fixed for good: no process that holds the fd can shrink it under the
        // other's mapping (a host access past the end would be a SIGBUS) or grow it.
        rustix::fs::fcntl_add_seals(&fd, SIZE_SEALS | SealFlags::SEAL)
            .map_err(os("sealing the size of shared host memory"))?;
        Self::map(device, fd, len)
    }

    /// Maps `len` bytes of a memory file received from another process: one made by
    /// [`HostShared::new`], whose size is sealed (a file whose size the other process could
    /// still change is refused).
    pub fn from_fd(device: &Device, fd: OwnedFd, len: usize) -> Result<HostShared> {
        let seals = rustix::fs::fcntl_get_seals(&fd).unwrap_or(rustix::fs::SealFlags::empty());
        if !seals.contains(SIZE_SEALS) {
            return Err(Error::InvalidArgument(
                "a shared host memory fd whose size is not sealed (not a memory file from HostShared::new): the other process could shrink it under this mapping".into(),
            ));
        }
        let st = rustix::fs::fstat(&fd).map_err(os("fstat of a shared host memory fd"))?;
        if (st.st_size as u64) < len as u64 || len == 0 {
            return Err(Error::SizeMismatch {
                what: "shared host memory file",
                expected: len,
                got: st.st_size as usize,
            });
        }
        Self::map(device, fd, len)
    }

    fn map(device: &Device, fd: OwnedFd, len: usize) -> Result<HostShared> {
        use rustix::mm::{MapFlags, ProtFlags};
        // SAFETY: a new shared read-write mapping of `len` bytes of a file at least that long,
        // placed by the kernel (no fixed address, so nothing existing is replaced).
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &fd,
                0,
            )
        }
        .map_err(os(format!("mapping {len} bytes of shared host memory")))?;
        let unmap = |p: *mut std::ffi::c_void| {
            // SAFETY: `p` is the mapping made above, of `len` bytes, used by nothing else.
            let _ = unsafe { rustix::mm::munmap(p, len) };
        };
        if let Err(e) = device.bind_to_thread() {
            unmap(ptr);
            return Err(e);
        }
        let flags = cuda::CU_MEMHOSTREGISTER_PORTABLE | cuda::CU_MEMHOSTREGISTER_DEVICEMAP;
        // SAFETY: `ptr` is a live mapping of `len` bytes; it is unregistered in Drop.
        if let Err(e) = unsafe { cu!(cuMemHostRegister_v2(ptr, len, flags)) }.on(device.ordinal()) {
            unmap(ptr);
            return Err(e);
        }
        let mut device_ptr = 0;
        // SAFETY: the range was registered with DEVICEMAP just above.
        if let Err(e) = unsafe { cu!(cuMemHostGetDevicePointer_v2(&mut device_ptr, ptr, 0)) }
            .on(device.ordinal())
        {
            // SAFETY: registered above; undone before the unmap.
            unsafe { cu!(cuMemHostUnregister(ptr)) }.ok();
            unmap(ptr);
            return Err(e);
        }
        Ok(HostShared {
            device: device.clone(),
            fd,
            ptr: ptr.cast(),
            len,
            device_ptr,
        })
    }

    /// The memory file, to send to another process.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

// SAFETY: the device address and length describe the shared pages this value maps and
// registers for its lifetime (see `map`).
crate::memory::device_memory!(HostShared, device: device, ptr: device_ptr, len: len);

impl Drop for HostShared {
    fn drop(&mut self) {
        let _ = self.device.bind_to_thread();
        // Work queued on the device may still use the pages: wait, within a deadline; past it,
        // leave them registered and mapped (a leak) rather than pull them from under a kernel.
        if !self.device.idle_before_free("shared host memory", self.len) {
            return;
        }
        // SAFETY: registered in `map` and unregistered once, before the unmap.
        let unregister = || unsafe { cu!(cuMemHostUnregister(self.ptr.cast())) };
        self.device
            .release("unregistering shared host memory", unregister);
        // SAFETY: the mapping of `len` bytes made in `map`, unregistered above.
        let _ = unsafe { rustix::mm::munmap(self.ptr.cast(), self.len) };
    }
}
