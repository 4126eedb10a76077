//! cuMem virtual memory management: allocations that can be shared as POSIX fds or fabric
//! handles and mapped for a chosen set of devices.
//!
//! A [`VmmBuffer`] is built in four steps, each undone on `Drop` in reverse: create the physical
//! allocation (`cuMemCreate`), reserve an address range (`cuMemAddressReserve`), map one onto
//! the other (`cuMemMap`), and grant access per device (`cuMemSetAccess`). Sizes are rounded up
//! to the allocation granularity (2 MiB on H100/H200). Dropping unmaps, releases the handle and
//! frees the address range, in that order; a failure half-way undoes only the steps that ran.
//!
//! Sharing: [`VmmBuffer::export_fd`] gives a [`VmmHandle`] (size and origin, as bytes) and an
//! fd to send with [`crate::fdpass`]; [`VmmBuffer::import_fd`] maps it in the other process.
//! Fabric handles ([`VmmBuffer::export_fabric`]) need an IMEX channel; where the driver or the
//! system refuses them the call returns [`Error::Unsupported`] with the reason.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use p2p_sys::{cu, cuda};

use crate::device::Device;
use crate::error::{Error, OnDevice, Result};
use crate::wire::{self, DecodeError, HandleKind, Reader};

/// Which shareable handle types an allocation is created with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShareableHandles {
    /// Exportable as a POSIX file descriptor (same host).
    pub posix_fd: bool,
    /// Exportable as a fabric handle (needs IMEX; crosses hosts on NVLink fabrics).
    pub fabric: bool,
}

impl ShareableHandles {
    /// No sharing: the allocation stays in this process.
    pub const NONE: Self = ShareableHandles {
        posix_fd: false,
        fabric: false,
    };
    /// POSIX-fd sharing only.
    pub const POSIX_FD: Self = ShareableHandles {
        posix_fd: true,
        fabric: false,
    };
    /// Fabric sharing only.
    pub const FABRIC: Self = ShareableHandles {
        posix_fd: false,
        fabric: true,
    };

    fn to_cu(self) -> cuda::CUmemAllocationHandleType {
        let mut bits = 0;
        if self.posix_fd {
            bits |= cuda::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.0;
        }
        if self.fabric {
            bits |= cuda::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC.0;
        }
        cuda::CUmemAllocationHandleType_enum(bits)
    }
}

fn allocation_prop(device: &Device, handles: ShareableHandles) -> cuda::CUmemAllocationProp {
    // SAFETY: CUmemAllocationProp is a plain C struct for which all-zero is the documented default.
    let mut prop: cuda::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = cuda::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.requestedHandleTypes = handles.to_cu();
    prop.location.type_ = cuda::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device.ordinal();
    prop
}

/// The allocation granularity for `device` and `handles`: the minimum, or with `recommended`
/// the size the driver suggests for performance.
pub fn granularity(device: &Device, handles: ShareableHandles, recommended: bool) -> Result<usize> {
    p2p_sys::init_driver()?;
    let prop = allocation_prop(device, handles);
    let option = if recommended {
        cuda::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
    } else {
        cuda::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM
    };
    let mut g = 0;
    // SAFETY: `prop` is fully initialised and `g` is an out-pointer.
    unsafe { cu!(cuMemGetAllocationGranularity(&mut g, &prop, option)) }.on(device.ordinal())?;
    Ok(g)
}

/// Rounds `bytes` up to a multiple of `granularity` (a power of two, as the driver reports).
/// Zero bytes, a granularity that is not a power of two, and overflow are errors.
pub fn round_to_granularity(bytes: usize, granularity: usize) -> Result<usize> {
    if bytes == 0 {
        return Err(Error::InvalidArgument(
            "a cuMem allocation cannot be empty".into(),
        ));
    }
    if !granularity.is_power_of_two() {
        return Err(Error::InvalidArgument(format!(
            "granularity {granularity} is not a power of two"
        )));
    }
    bytes.checked_next_multiple_of(granularity).ok_or_else(|| {
        Error::InvalidArgument(format!("{bytes} bytes rounded to {granularity} overflows"))
    })
}

/// A cuMem allocation mapped into this process, owned or imported. Freed on `Drop`.
pub struct VmmBuffer {
    device: Device,
    handle: cuda::CUmemGenericAllocationHandle,
    ptr: cuda::CUdeviceptr,
    size: usize,
    granularity: usize,
    handles: ShareableHandles,
    created: bool,
    reserved: bool,
    mapped: bool,
}

// SAFETY: the mapping is process-wide device memory; every use binds the device first.
unsafe impl Send for VmmBuffer {}
// SAFETY: shared access only reads; writes need `&mut`.
unsafe impl Sync for VmmBuffer {}

impl VmmBuffer {
    fn empty(device: &Device, size: usize, granularity: usize, handles: ShareableHandles) -> Self {
        VmmBuffer {
            device: device.clone(),
            handle: 0,
            ptr: 0,
            size,
            granularity,
            handles,
            created: false,
            reserved: false,
            mapped: false,
        }
    }

    /// Allocates at least `bytes` on `device` (rounded up to the granularity), shareable as
    /// `handles`, and grants read-write access to `device` and every device in `access`.
    ///
    /// ```no_run
    /// use p2p_mem::{Device, vmm::{VmmBuffer, ShareableHandles}};
    /// let (g0, g1) = (Device::new(0)?, Device::new(1)?);
    /// let buf = VmmBuffer::new(&g0, 1 << 20, &[&g1], ShareableHandles::POSIX_FD)?;
    /// assert_eq!(buf.size() % (2 << 20), 0);
    /// # Ok::<(), p2p_mem::Error>(())
    /// ```
    pub fn new(
        device: &Device,
        bytes: usize,
        access: &[&Device],
        handles: ShareableHandles,
    ) -> Result<VmmBuffer> {
        if handles.fabric {
            check_fabric_supported(device)?;
        }
        let gran = granularity(device, handles, false)?;
        let size = round_to_granularity(bytes, gran)?;
        let prop = allocation_prop(device, handles);
        device.bind_to_thread()?;
        let mut buf = Self::empty(device, size, gran, handles);
        // SAFETY: `prop` is initialised; the handle is released in Drop once `created` is set.
        let created = unsafe { cu!(cuMemCreate(&mut buf.handle, size, &prop, 0)) };
        if let Err(e) = created {
            if handles.fabric
                && (e.is_driver(cuda::CUresult::CUDA_ERROR_NOT_PERMITTED)
                    || e.is_driver(cuda::CUresult::CUDA_ERROR_NOT_SUPPORTED))
            {
                return Err(Error::Unsupported {
                    what: "a cuMem allocation with fabric handles",
                    reason: fabric_reason(&e),
                });
            }
            return Err(Error::Cuda {
                device: device.ordinal(),
                source: e,
            });
        }
        buf.created = true;
        buf.map_for(access)?;
        tracing::debug!(
            device = device.ordinal(),
            size,
            ?handles,
            "created a cuMem allocation"
        );
        Ok(buf)
    }

    /// Reserves, maps and sets access: the steps shared by `new` and the imports.
    fn map_for(&mut self, access: &[&Device]) -> Result<()> {
        let ord = self.device.ordinal();
        // SAFETY: `ptr` is an out-pointer; the range is freed in Drop once `reserved` is set.
        unsafe {
            cu!(cuMemAddressReserve(
                &mut self.ptr,
                self.size,
                self.granularity,
                0,
                0
            ))
        }
        .on(ord)?;
        self.reserved = true;
        // SAFETY: the reserved range and the allocation are both `size` bytes.
        unsafe { cu!(cuMemMap(self.ptr, self.size, 0, self.handle, 0)) }.on(ord)?;
        self.mapped = true;
        let mut devices = vec![self.device.ordinal()];
        devices.extend(access.iter().map(|d| d.ordinal()).filter(|o| *o != ord));
        let descs: Vec<cuda::CUmemAccessDesc> = devices
            .iter()
            .map(|&id| {
                // SAFETY: a plain C struct; all-zero is a valid starting value.
                let mut d: cuda::CUmemAccessDesc = unsafe { std::mem::zeroed() };
                d.location.type_ = cuda::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
                d.location.id = id;
                d.flags = cuda::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
                d
            })
            .collect();
        // SAFETY: the range is mapped; `descs` holds `descs.len()` initialised entries.
        unsafe {
            cu!(cuMemSetAccess(
                self.ptr,
                self.size,
                descs.as_ptr(),
                descs.len()
            ))
        }
        .on(ord)
    }

    /// The mapped size in bytes (a multiple of the granularity).
    pub fn size(&self) -> usize {
        self.size
    }
    /// The allocation granularity used.
    pub fn granularity(&self) -> usize {
        self.granularity
    }
    /// The handle types the allocation can be exported as.
    pub fn shareable_handles(&self) -> ShareableHandles {
        self.handles
    }

    /// Exports the allocation as a POSIX fd (close-on-exec) plus the [`VmmHandle`] describing it.
    pub fn export_fd(&self) -> Result<(VmmHandle, OwnedFd)> {
        if !self.handles.posix_fd {
            return Err(Error::InvalidArgument(
                "this allocation was not created with POSIX-fd handles".into(),
            ));
        }
        self.device.bind_to_thread()?;
        let mut fd: std::ffi::c_int = -1;
        let ty = cuda::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        // SAFETY: for POSIX fds the out-parameter is an int; the handle is live.
        unsafe {
            cu!(cuMemExportToShareableHandle(
                (&mut fd as *mut std::ffi::c_int).cast(),
                self.handle,
                ty,
                0
            ))
        }
        .on(self.device.ordinal())?;
        // SAFETY: the driver just created this fd for us; we own it from here on.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        set_cloexec(&fd)?;
        Ok((self.describe(), fd))
    }

    fn describe(&self) -> VmmHandle {
        VmmHandle {
            size: self.size as u64,
            granularity: self.granularity as u64,
            device_uuid: *self.device.uuid(),
            exporter_pid: std::process::id(),
        }
    }

    /// Maps an allocation received as `fd` (with its `handle`) on `device`, granting access to
    /// `device` and `access`. The fd may be closed afterwards; the mapping keeps the memory.
    pub fn import_fd(
        device: &Device,
        handle: &VmmHandle,
        fd: BorrowedFd<'_>,
        access: &[&Device],
    ) -> Result<VmmBuffer> {
        let (size, gran) = handle.checked_sizes()?;
        device.bind_to_thread()?;
        let mut buf = Self::empty(device, size, gran, ShareableHandles::POSIX_FD);
        let ty = cuda::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
        // For POSIX fds the driver takes the fd's value cast to a pointer.
        let os_handle = fd.as_raw_fd() as usize as *mut std::ffi::c_void;
        // SAFETY: `fd` is open for the call; the imported handle is released in Drop.
        unsafe {
            cu!(cuMemImportFromShareableHandle(
                &mut buf.handle,
                os_handle,
                ty
            ))
        }
        .on(device.ordinal())?;
        buf.created = true;
        buf.map_for(access)?;
        Ok(buf)
    }

    /// Exports the allocation as a fabric handle, or [`Error::Unsupported`] where refused.
    pub fn export_fabric(&self) -> Result<FabricHandle> {
        if !self.handles.fabric {
            return Err(Error::InvalidArgument(
                "this allocation was not created with fabric handles".into(),
            ));
        }
        self.device.bind_to_thread()?;
        let mut fh = cuda::CUmemFabricHandle { data: [0; 64] };
        let ty = cuda::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC;
        // SAFETY: for fabric handles the out-parameter is a CUmemFabricHandle; the handle is live.
        let r = unsafe {
            cu!(cuMemExportToShareableHandle(
                (&mut fh as *mut cuda::CUmemFabricHandle).cast(),
                self.handle,
                ty,
                0
            ))
        };
        r.map_err(|e| fabric_error(self.device.ordinal(), e))?;
        Ok(FabricHandle {
            data: fh.data,
            vmm: self.describe(),
        })
    }

    /// Maps an allocation received as a fabric handle, or [`Error::Unsupported`] where refused.
    pub fn import_fabric(
        device: &Device,
        handle: &FabricHandle,
        access: &[&Device],
    ) -> Result<VmmBuffer> {
        check_fabric_supported(device)?;
        let (size, gran) = handle.vmm.checked_sizes()?;
        device.bind_to_thread()?;
        let mut buf = Self::empty(device, size, gran, ShareableHandles::FABRIC);
        let mut fh = cuda::CUmemFabricHandle { data: handle.data };
        let ty = cuda::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_FABRIC;
        // SAFETY: for fabric handles the driver reads a CUmemFabricHandle through the pointer.
        let r = unsafe {
            cu!(cuMemImportFromShareableHandle(
                &mut buf.handle,
                (&mut fh as *mut cuda::CUmemFabricHandle).cast(),
                ty
            ))
        };
        r.map_err(|e| fabric_error(device.ordinal(), e))?;
        buf.created = true;
        buf.map_for(access)?;
        Ok(buf)
    }
}

// SAFETY: the address and size describe the range this value reserves and maps for its
// lifetime (see the constructors).
crate::memory::device_memory!(VmmBuffer, device: device, ptr: ptr, len: size);

impl Drop for VmmBuffer {
    fn drop(&mut self) {
        let ord = self.device.ordinal();
        let _ = self.device.bind_to_thread();
        if self.mapped {
            // Unmapping does not wait for work still using the range: wait first, within a
            // deadline; past it, leak the whole allocation rather than unmap it under a kernel.
            if !self.device.idle_before_free("a cuMem buffer", self.size) {
                return;
            }
            let _ = self.device.bind_to_thread();
            // SAFETY: the range was mapped by `map_for` and is unmapped once.
            if let Err(e) = unsafe { cu!(cuMemUnmap(self.ptr, self.size)) } {
                tracing::error!(device = ord, "unmapping a cuMem range: {e}");
            }
        }
        if self.created {
            // SAFETY: the handle came from cuMemCreate or an import and is released once.
            if let Err(e) = unsafe { cu!(cuMemRelease(self.handle)) } {
                tracing::error!(device = ord, "releasing a cuMem allocation: {e}");
            }
        }
        if self.reserved {
            // SAFETY: the range was reserved by `map_for` and is freed once, after the unmap.
            if let Err(e) = unsafe { cu!(cuMemAddressFree(self.ptr, self.size)) } {
                tracing::error!(device = ord, "freeing a cuMem address range: {e}");
            }
        }
    }
}

fn check_fabric_supported(device: &Device) -> Result<()> {
    let attr = cuda::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED;
    if device.attribute(attr)? == 0 {
        return Err(Error::Unsupported {
            what: "fabric handles",
            reason: format!(
                "GPU {} reports CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED = 0",
                device.ordinal()
            ),
        });
    }
    Ok(())
}

const IMEX_CHANNELS: &str = "/dev/nvidia-caps-imex-channels";

fn fabric_reason(e: &p2p_sys::Error) -> String {
    let channels = match std::fs::read_dir(IMEX_CHANNELS) {
        Ok(d) => format!("{} IMEX channel(s) in {IMEX_CHANNELS}", d.count()),
        Err(_) => format!("{IMEX_CHANNELS} does not exist: no IMEX daemon has created a channel"),
    };
    format!("{e}; {channels}. Start nvidia-imex and create a channel, or share with POSIX fds on one host")
}

fn fabric_error(device: i32, e: p2p_sys::Error) -> Error {
    type R = cuda::CUresult;
    if e.is_driver(R::CUDA_ERROR_NOT_PERMITTED) || e.is_driver(R::CUDA_ERROR_NOT_SUPPORTED) {
        Error::Unsupported {
            what: "fabric handles",
            reason: fabric_reason(&e),
        }
    } else {
        Error::Cuda { device, source: e }
    }
}

fn set_cloexec(fd: &OwnedFd) -> Result<()> {
    rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::CLOEXEC).map_err(|e| Error::Io {
        op: "setting FD_CLOEXEC on an exported cuMem fd".into(),
        source: e.into(),
    })
}

/// What an importer needs to map a cuMem allocation besides its fd: size and origin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VmmHandle {
    size: u64,
    granularity: u64,
    device_uuid: [u8; 16],
    exporter_pid: u32,
}

impl VmmHandle {
    /// The allocation's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }
    /// UUID of the device the memory lives on.
    pub fn device_uuid(&self) -> &[u8; 16] {
        &self.device_uuid
    }
    /// Process id of the exporter.
    pub fn exporter_pid(&self) -> u32 {
        self.exporter_pid
    }

    fn checked_sizes(&self) -> Result<(usize, usize)> {
        let size =
            usize::try_from(self.size).map_err(|_| Error::InvalidArgument("cuMem size".into()))?;
        let gran = usize::try_from(self.granularity)
            .map_err(|_| Error::InvalidArgument("granularity".into()))?;
        if round_to_granularity(size, gran)? != size {
            return Err(Error::InvalidArgument(format!(
                "size {size} is not a multiple of granularity {gran}"
            )));
        }
        Ok((size, gran))
    }

    fn payload(&self) -> [u8; 16] {
        let mut p = [0u8; 16];
        p[..8].copy_from_slice(&self.size.to_le_bytes());
        p[8..].copy_from_slice(&self.granularity.to_le_bytes());
        p
    }

    fn parse_sizes(r: &mut Reader<'_>, uuid: [u8; 16], pid: u32) -> Result<VmmHandle, DecodeError> {
        let size = r.u64().ok_or(DecodeError::Field("cuMem size"))?;
        let granularity = r.u64().ok_or(DecodeError::Field("cuMem granularity"))?;
        if size == 0 || !granularity.is_power_of_two() || size % granularity != 0 {
            return Err(DecodeError::Field(
                "cuMem size must be a non-zero multiple of a power-of-two granularity",
            ));
        }
        Ok(VmmHandle {
            size,
            granularity,
            device_uuid: uuid,
            exporter_pid: pid,
        })
    }

    /// Encodes the description (see [`wire`]); the fd travels separately.
    pub fn to_bytes(&self) -> Vec<u8> {
        wire::encode(
            HandleKind::VmmFd,
            &self.device_uuid,
            self.exporter_pid,
            &self.payload(),
        )
    }
    /// Decodes a description, rejecting anything malformed.
    pub fn from_bytes(bytes: &[u8]) -> Result<VmmHandle, DecodeError> {
        let env = wire::decode(bytes, HandleKind::VmmFd)?;
        Self::parse_sizes(
            &mut Reader::new(env.payload),
            env.device_uuid,
            env.exporter_pid,
        )
    }
}

/// A cuMem fabric handle with the allocation's size: plain bytes, no fd needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FabricHandle {
    data: [u8; 64],
    vmm: VmmHandle,
}

impl FabricHandle {
    /// The allocation's size in bytes.
    pub fn size(&self) -> u64 {
        self.vmm.size
    }
    /// Encodes the handle (see [`wire`]).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut p = Vec::with_capacity(HandleKind::Fabric.payload_len());
        p.extend_from_slice(&self.data);
        p.extend_from_slice(&self.vmm.payload());
        wire::encode(
            HandleKind::Fabric,
            &self.vmm.device_uuid,
            self.vmm.exporter_pid,
            &p,
        )
    }
    /// Decodes a handle, rejecting anything malformed.
    pub fn from_bytes(bytes: &[u8]) -> Result<FabricHandle, DecodeError> {
        let env = wire::decode(bytes, HandleKind::Fabric)?;
        let mut r = Reader::new(env.payload);
        let data = r.array::<64>().ok_or(DecodeError::Field("fabric handle"))?;
        let vmm = VmmHandle::parse_sizes(&mut r, env.device_uuid, env.exporter_pid)?;
        Ok(FabricHandle { data, vmm })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB2: usize = 2 << 20;

    #[test]
    fn sizes_round_up_to_the_granularity() {
        assert_eq!(round_to_granularity(1, MIB2).ok(), Some(MIB2));
        assert_eq!(round_to_granularity(MIB2, MIB2).ok(), Some(MIB2));
        assert_eq!(round_to_granularity(MIB2 + 1, MIB2).ok(), Some(2 * MIB2));
        assert_eq!(round_to_granularity(1000, 1).ok(), Some(1000));
        assert_eq!(
            round_to_granularity((1 << 30) + 3, MIB2).ok(),
            Some((1 << 30) + MIB2)
        );
    }

    #[test]
    fn bad_sizes_are_errors_not_panics() {
        assert!(matches!(
            round_to_granularity(0, MIB2),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            round_to_granularity(10, 0),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            round_to_granularity(10, 3 << 20),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            round_to_granularity(usize::MAX - 5, MIB2),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn handle_types_map_to_driver_bits() {
        assert_eq!(ShareableHandles::NONE.to_cu().0, 0);
        assert_eq!(ShareableHandles::POSIX_FD.to_cu().0, 1);
        assert_eq!(ShareableHandles::FABRIC.to_cu().0, 8);
        assert_eq!(
            ShareableHandles {
                posix_fd: true,
                fabric: true
            }
            .to_cu()
            .0,
            9
        );
    }

    #[test]
    fn vmm_and_fabric_handles_round_trip() {
        let v = VmmHandle {
            size: 4 * MIB2 as u64,
            granularity: MIB2 as u64,
            device_uuid: [5; 16],
            exporter_pid: 99,
        };
        assert_eq!(VmmHandle::from_bytes(&v.to_bytes()), Ok(v));
        let f = FabricHandle {
            data: [0xab; 64],
            vmm: v,
        };
        assert_eq!(FabricHandle::from_bytes(&f.to_bytes()), Ok(f));
        assert!(matches!(
            VmmHandle::from_bytes(&f.to_bytes()),
            Err(DecodeError::WrongKind { .. })
        ));
    }

    #[test]
    fn inconsistent_sizes_are_rejected() {
        for (size, gran) in [
            (0u64, 2u64 << 20),
            (3 << 20, 2 << 20),
            (4 << 20, 3 << 20),
            (4 << 20, 0),
        ] {
            let v = VmmHandle {
                size,
                granularity: gran,
                device_uuid: [0; 16],
                exporter_pid: 1,
            };
            assert!(
                matches!(
                    VmmHandle::from_bytes(&v.to_bytes()),
                    Err(DecodeError::Field(_))
                ),
                "{size} {gran}"
            );
        }
    }

    #[test]
    fn fabric_refusals_say_what_to_do() {
        let e = p2p_sys::check_cu("cuMemCreate", cuda::CUresult::CUDA_ERROR_NOT_PERMITTED)
            .expect_err("error");
        let err = fabric_error(0, e);
        let text = err.to_string();
        assert!(matches!(err, Error::Unsupported { .. }));
        assert!(
            text.contains("CUDA_ERROR_NOT_PERMITTED") && text.contains("IMEX"),
            "{text}"
        );
        let e = p2p_sys::check_cu("cuMemCreate", cuda::CUresult::CUDA_ERROR_OUT_OF_MEMORY)
            .expect_err("error");
        assert!(matches!(fabric_error(0, e), Error::Cuda { device: 0, .. }));
    }
}
