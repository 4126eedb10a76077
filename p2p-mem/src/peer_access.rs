//! Peer access between two devices in one process.
//!
//! Enabling is idempotent: `CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED` is success. We use the
//! driver API, which keeps no sticky "last error"; the runtime's `cudaDeviceEnablePeerAccess`
//! would leave `cudaErrorPeerAccessAlreadyEnabled` behind in `cudaGetLastError` for the next
//! unrelated check to trip over, which is the trap this avoids (the GPU tests check it).

use p2p_sys::{cu, cuda};

use crate::device::Device;
use crate::error::{Error, OnDevice, Result};

/// What the driver says about one ordered pair of devices (`cuDeviceGetP2PAttribute`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct P2pAttributes {
    /// Relative performance of the link; lower is better (0 on NVLink here).
    pub performance_rank: i32,
    /// Whether peer access is possible at all.
    pub access_supported: bool,
    /// Whether atomics through the link are native.
    pub native_atomics: bool,
    /// Whether CUDA arrays can be accessed through the link.
    pub cuda_array_access: bool,
}

/// Why enabling failed, as one of our errors: the slot limit and "unsupported" get their own
/// variants because users must act on them differently.
pub(crate) fn classify_enable_error(device: i32, peer: i32, e: p2p_sys::Error) -> Result<()> {
    type R = cuda::CUresult;
    if e.is_driver(R::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) {
        Ok(())
    } else if e.is_driver(R::CUDA_ERROR_TOO_MANY_PEERS) {
        Err(Error::PeerSlotsExhausted { device, peer })
    } else if e.is_driver(R::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED) {
        Err(Error::PeerUnsupported { device, peer })
    } else {
        Err(Error::Peer {
            device,
            peer,
            source: e,
        })
    }
}

impl Device {
    /// Whether this device can map `peer`'s memory (`cuDeviceCanAccessPeer`).
    /// A device can always access itself.
    pub fn can_access_peer(&self, peer: &Device) -> Result<bool> {
        if self == peer {
            return Ok(true);
        }
        let mut v = 0;
        // SAFETY: both device handles are valid; `v` is an out-pointer.
        unsafe {
            cu!(cuDeviceCanAccessPeer(
                &mut v,
                self.cu_device(),
                peer.cu_device()
            ))
        }
        .between(self.ordinal(), peer.ordinal())?;
        Ok(v != 0)
    }

    /// Whether this device can map the memory of the visible GPU whose UUID is `uuid` (which
    /// another process may own): `Some((its ordinal here, can map))`, or `None` where no
    /// visible GPU has that UUID (`CUDA_VISIBLE_DEVICES` hides it). Creates no context.
    pub fn can_access_peer_uuid(&self, uuid: &[u8; 16]) -> Result<Option<(i32, bool)>> {
        if uuid == self.uuid() {
            return Ok(Some((self.ordinal(), true)));
        }
        for ordinal in 0..Device::count()? {
            let mut dev = 0;
            // SAFETY: `ordinal` is below the device count; `dev` is an out-pointer.
            unsafe { cu!(cuDeviceGet(&mut dev, ordinal)) }.on(ordinal)?;
            let mut got = cuda::CUuuid { bytes: [0; 16] };
            // SAFETY: `dev` is a valid device handle; `got` is an out-pointer.
            unsafe { cu!(cuDeviceGetUuid_v2(&mut got, dev)) }.on(ordinal)?;
            if got.bytes.map(|b| b as u8) != *uuid {
                continue;
            }
            let mut v = 0;
            // SAFETY: both device handles are valid; `v` is an out-pointer.
            unsafe { cu!(cuDeviceCanAccessPeer(&mut v, self.cu_device(), dev)) }
                .between(self.ordinal(), ordinal)?;
            return Ok(Some((ordinal, v != 0)));
        }
        Ok(None)
    }

    /// The P2P attributes of the ordered pair (this device accessing `peer`).
    pub fn p2p_attributes(&self, peer: &Device) -> Result<P2pAttributes> {
        use cuda::CUdevice_P2PAttribute::*;
        let get = |attr| -> Result<i32> {
            let mut v = 0;
            // SAFETY: both device handles are valid; `v` is an out-pointer.
            unsafe {
                cu!(cuDeviceGetP2PAttribute(
                    &mut v,
                    attr,
                    self.cu_device(),
                    peer.cu_device()
                ))
            }
            .between(self.ordinal(), peer.ordinal())?;
            Ok(v)
        };
        Ok(P2pAttributes {
            performance_rank: get(CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK)?,
            access_supported: get(CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED)? != 0,
            native_atomics: get(CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED)? != 0,
            cuda_array_access: get(CU_DEVICE_P2P_ATTRIBUTE_ACCESS_ACCESS_SUPPORTED)? != 0,
        })
    }

    /// Lets kernels and copies on this device access `peer`'s memory directly.
    ///
    /// Idempotent: enabling twice is success. A device with access to 8 peers already gets
    /// [`Error::PeerSlotsExhausted`]; a pair without P2P gets [`Error::PeerUnsupported`].
    pub fn enable_peer_access(&self, peer: &Device) -> Result<()> {
        if self == peer {
            return Ok(());
        }
        if !self.can_access_peer(peer)? {
            return Err(Error::PeerUnsupported {
                device: self.ordinal(),
                peer: peer.ordinal(),
            });
        }
        self.bind_to_thread()?;
        // SAFETY: this device's context is current; the peer's context is retained by `peer`.
        let r = unsafe { cu!(cuCtxEnablePeerAccess(peer.cu_context(), 0)) };
        match r {
            Ok(()) => {
                tracing::debug!(
                    device = self.ordinal(),
                    peer = peer.ordinal(),
                    "enabled peer access"
                );
                Ok(())
            }
            Err(e) => classify_enable_error(self.ordinal(), peer.ordinal(), e),
        }
    }

    /// Revokes what [`enable_peer_access`](Self::enable_peer_access) granted, freeing a slot.
    /// Disabling access that is not enabled is success.
    pub fn disable_peer_access(&self, peer: &Device) -> Result<()> {
        if self == peer {
            return Ok(());
        }
        self.bind_to_thread()?;
        // SAFETY: this device's context is current; the peer's context is retained by `peer`.
        match unsafe { cu!(cuCtxDisablePeerAccess(peer.cu_context())) } {
            Ok(()) => Ok(()),
            Err(e) if e.is_driver(cuda::CUresult::CUDA_ERROR_PEER_ACCESS_NOT_ENABLED) => Ok(()),
            Err(e) => Err(Error::Peer {
                device: self.ordinal(),
                peer: peer.ordinal(),
                source: e,
            }),
        }
    }
}

/// Checks that peers can map `memory` directly, in this process through peer access or in
/// another through CUDA IPC: it must lie inside one allocation made by `cuMemAlloc` (a
/// [`DeviceBuffer`](crate::DeviceBuffer), `cudaMalloc`, PyTorch's caching allocator).
///
/// Refused, with the reason: memory from a stream-ordered pool (`cuMemAllocAsync`, which
/// cudarc's `CudaSlice` uses: a peer kernel reading it faults unless the pool grants access,
/// and pool memory cannot be exported over IPC), cuMem VMM memory (export it with
/// [`VmmBuffer`](crate::vmm::VmmBuffer) instead), host memory and a range that runs past the
/// end of its allocation.
pub fn check_peer_mappable(memory: &dyn crate::DeviceMemory) -> Result<()> {
    let device = memory.device();
    let ordinal = device.ordinal();
    let ptr = memory.device_ptr();
    let refuse = |why: String| Err(Error::InvalidArgument(format!("GPU {ordinal}: {why}")));
    if memory.byte_len() == 0 {
        return refuse("an empty buffer cannot be shared with peers".into());
    }
    device.bind_to_thread()?;
    let mut pool: cuda::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `pool` is an out-pointer of the attribute's type (a CUmemoryPool handle); the
    // driver only reads the address `ptr`.
    let pooled = unsafe {
        cu!(cuPointerGetAttribute(
            (&mut pool as *mut cuda::CUmemoryPool).cast(),
            cuda::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
            ptr
        ))
    };
    if let Err(e) = pooled {
        return refuse(format!(
            "{ptr:#x} is not device memory the driver knows ({e})"
        ));
    }
    if !pool.is_null() {
        return refuse(format!(
            "{ptr:#x} comes from a stream-ordered memory pool (cuMemAllocAsync, e.g. cudarc's CudaSlice): peers fault on it and it cannot be exported over CUDA IPC; allocate it with cuMemAlloc (p2p_mem::DeviceBuffer) instead"
        ));
    }
    let mut ipc_capable: i32 = 0;
    // SAFETY: `ipc_capable` is an out-pointer of the attribute's type (a 32-bit bool).
    unsafe {
        cu!(cuPointerGetAttribute(
            (&mut ipc_capable as *mut i32).cast(),
            cuda::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE,
            ptr
        ))
    }
    .on(ordinal)?;
    if ipc_capable == 0 {
        return refuse(format!(
            "{ptr:#x} is not a cuMemAlloc allocation (cuMem VMM or host memory?): collectives map peers' buffers through peer access or legacy CUDA IPC; allocate it with cuMemAlloc (p2p_mem::DeviceBuffer)"
        ));
    }
    let (mut base, mut size) = (0, 0);
    // SAFETY: `ptr` is live device memory (the driver just described it); out-pointers.
    unsafe { cu!(cuMemGetAddressRange_v2(&mut base, &mut size, ptr)) }.on(ordinal)?;
    let (end, alloc_end) = (ptr + memory.byte_len() as u64, base + size as u64);
    if end > alloc_end {
        return refuse(format!(
            "{} bytes at {ptr:#x} run {} bytes past the end of their allocation ({base:#x} + {size})",
            memory.byte_len(),
            end - alloc_end
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn driver_error(code: cuda::CUresult) -> p2p_sys::Error {
        p2p_sys::check_cu("cuCtxEnablePeerAccess", code).expect_err("an error code")
    }

    #[test]
    fn already_enabled_is_success() {
        let e = driver_error(cuda::CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED);
        assert!(classify_enable_error(0, 1, e).is_ok());
    }

    #[test]
    fn the_ninth_peer_is_a_clear_error() {
        let e = driver_error(cuda::CUresult::CUDA_ERROR_TOO_MANY_PEERS);
        let err = classify_enable_error(3, 9, e).expect_err("slots exhausted");
        assert!(matches!(
            err,
            Error::PeerSlotsExhausted { device: 3, peer: 9 }
        ));
        assert!(err.to_string().contains("limit of 8"), "{err}");
    }

    #[test]
    fn other_failures_keep_the_call_and_both_devices() {
        let err = classify_enable_error(
            0,
            1,
            driver_error(cuda::CUresult::CUDA_ERROR_INVALID_CONTEXT),
        )
        .expect_err("error");
        let text = err.to_string();
        assert!(
            text.starts_with(
                "GPU 0 -> GPU 1: cuCtxEnablePeerAccess failed: CUDA_ERROR_INVALID_CONTEXT"
            ),
            "{text}"
        );
        let err = classify_enable_error(
            0,
            1,
            driver_error(cuda::CUresult::CUDA_ERROR_PEER_ACCESS_UNSUPPORTED),
        )
        .expect_err("error");
        assert!(matches!(err, Error::PeerUnsupported { device: 0, peer: 1 }));
    }
}
