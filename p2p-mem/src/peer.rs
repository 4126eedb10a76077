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
    use cuda::CUresult::*;
    if e.is_driver(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) {
        Ok(())
    } else if e.is_driver(CUDA_ERROR_TOO_MANY_PEERS) {
        Err(Error::PeerSlotsExhausted { device, peer })
    } else if e.is_driver(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED) {
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
