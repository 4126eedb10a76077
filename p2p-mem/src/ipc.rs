//! Legacy CUDA IPC: sharing `cuMemAlloc` memory and events between processes.
//!
//! The exporter calls [`IpcMemHandle::export`] on any [`DeviceMemory`] from `cuMemAlloc` (a
//! [`DeviceBuffer`](crate::DeviceBuffer) or a view into one), sends [`IpcMemHandle::to_bytes`]
//! to another process by any means, and that process calls [`IpcMemHandle::open`]. The handle
//! names the allocation's base plus an offset, so views export correctly.
//!
//! CUDA refuses to open a handle in the process that exported it, and refuses to open the
//! same allocation twice in one process. So [`open`](IpcMemHandle::open) refuses the first with
//! [`Error::ImportInExporter`] and answers the second from a per-process cache of live mappings:
//! both [`ImportedBuffer`]s share one mapping, which is closed when the last one drops.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock, Weak};

use p2p_sys::{cu, cuda};

use crate::device::{Device, Stream};
use crate::error::{Error, OnDevice, Result};
use crate::event::Event;
use crate::memory::DeviceMemory;
use crate::wire::{self, DecodeError, HandleKind, Reader};

/// A legacy CUDA IPC handle for a range of device memory, ready to send to another process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpcMemHandle {
    raw: [u8; 64],
    offset: u64,
    len: u64,
    device_uuid: [u8; 16],
    exporter_pid: u32,
}

impl IpcMemHandle {
    /// Exports `memory`, which must come from `cuMemAlloc` (cuMem VMM memory and pool memory
    /// cannot be exported this way: the driver returns an error naming the call).
    pub fn export(memory: &(impl DeviceMemory + ?Sized)) -> Result<IpcMemHandle> {
        let device = memory.device();
        let ordinal = device.ordinal();
        device.bind_to_thread()?;
        let (mut base, mut size) = (0, 0);
        if memory.byte_len() == 0 {
            return Err(Error::InvalidArgument(
                "cannot export an empty buffer over CUDA IPC".into(),
            ));
        }
        // SAFETY: the pointer is live device memory; both are out-pointers.
        unsafe {
            cu!(cuMemGetAddressRange_v2(
                &mut base,
                &mut size,
                memory.device_ptr()
            ))
        }
        .on(ordinal)?;
        let mut handle = cuda::CUipcMemHandle { reserved: [0; 64] };
        // SAFETY: `base` is the start of a live allocation; `handle` is an out-pointer.
        unsafe { cu!(cuIpcGetMemHandle(&mut handle, base)) }.on(ordinal)?;
        Ok(IpcMemHandle {
            raw: handle.reserved.map(|c| c as u8),
            offset: memory.device_ptr() - base,
            len: memory.byte_len() as u64,
            device_uuid: *device.uuid(),
            exporter_pid: std::process::id(),
        })
    }

    /// Byte offset of the shared range from the start of its allocation.
    pub fn offset(&self) -> u64 {
        self.offset
    }
    /// Length of the shared range in bytes.
    pub fn byte_len(&self) -> u64 {
        self.len
    }
    /// UUID of the device the memory lives on.
    pub fn device_uuid(&self) -> &[u8; 16] {
        &self.device_uuid
    }
    /// Process id of the exporter.
    pub fn exporter_pid(&self) -> u32 {
        self.exporter_pid
    }

    /// Encodes the handle (see [`wire`] for the format).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut p = Vec::with_capacity(HandleKind::IpcMem.payload_len());
        p.extend_from_slice(&self.raw);
        p.extend_from_slice(&self.offset.to_le_bytes());
        p.extend_from_slice(&self.len.to_le_bytes());
        wire::encode(HandleKind::IpcMem, &self.device_uuid, self.exporter_pid, &p)
    }

    /// Decodes a handle, rejecting anything malformed.
    pub fn from_bytes(bytes: &[u8]) -> Result<IpcMemHandle, DecodeError> {
        let env = wire::decode(bytes, HandleKind::IpcMem)?;
        let mut r = Reader::new(env.payload);
        let field = DecodeError::Field("IPC memory payload");
        let raw = r.array::<64>().ok_or(field.clone())?;
        let offset = r.u64().ok_or(field.clone())?;
        let len = r.u64().ok_or(field)?;
        if len == 0 || offset.checked_add(len).is_none() {
            return Err(DecodeError::Field("IPC memory range is empty or overflows"));
        }
        Ok(IpcMemHandle {
            raw,
            offset,
            len,
            device_uuid: env.device_uuid,
            exporter_pid: env.exporter_pid,
        })
    }

    /// Maps the memory into this process on `device` (lazily enabling peer access when `device`
    /// is not the one the memory lives on).
    ///
    /// Fails with [`Error::ImportInExporter`] in the exporting process. Opening the same
    /// allocation again while a mapping is alive returns a buffer over the same mapping.
    pub fn open(&self, device: &Device) -> Result<ImportedBuffer> {
        if self.exporter_pid == std::process::id() {
            return Err(Error::ImportInExporter {
                kind: "IPC memory",
                pid: self.exporter_pid,
            });
        }
        let key = (device.ordinal(), self.raw);
        let mut cache = lock_cache();
        // A dead entry means the last buffer over that mapping is being dropped right now and
        // its Drop is waiting for this lock to close the handle. Mapping the handle again
        // before that close would race it: let the close finish first.
        while cache.get(&key).is_some_and(|w| w.strong_count() == 0) {
            drop(cache);
            std::thread::yield_now();
            cache = lock_cache();
        }
        let mapping = match cache.get(&key).and_then(Weak::upgrade) {
            Some(m) => {
                tracing::debug!(
                    device = device.ordinal(),
                    "IPC handle already mapped: reusing the mapping"
                );
                m
            }
            None => {
                device.bind_to_thread()?;
                let mut base = 0;
                let handle = cuda::CUipcMemHandle {
                    reserved: self.raw.map(|b| b as std::ffi::c_char),
                };
                let flags = cuda::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
                // SAFETY: a context is current; `handle` came from cuIpcGetMemHandle in another
                // process (a forged one makes the driver return an error, not map memory).
                unsafe { cu!(cuIpcOpenMemHandle_v2(&mut base, handle, flags)) }
                    .on(device.ordinal())?;
                tracing::debug!(
                    device = device.ordinal(),
                    exporter = self.exporter_pid,
                    "opened an IPC memory handle"
                );
                let mut m = IpcMapping {
                    device: device.clone(),
                    base,
                    size: 0,
                    key,
                };
                let (mut abase, mut asize) = (0, 0);
                // SAFETY: `base` is a live mapping in the current context; both are
                // out-pointers.
                let range = unsafe { cu!(cuMemGetAddressRange_v2(&mut abase, &mut asize, base)) }
                    .on(device.ordinal());
                if let Err(e) = range {
                    // `m` closes the handle as it drops, taking the cache lock: let it go first.
                    drop(cache);
                    drop(m);
                    return Err(e);
                }
                m.size = asize as u64;
                let m = Arc::new(m);
                cache.insert(key, Arc::downgrade(&m));
                m
            }
        };
        // A mapping dropped on the way out (the error below) takes the cache lock to close.
        drop(cache);
        // The handle's range was chosen by the other process: it must lie inside the
        // allocation the driver actually mapped, or safe code could reach past it.
        if self
            .offset
            .checked_add(self.len)
            .is_none_or(|end| end > mapping.size)
        {
            return Err(Error::InvalidArgument(format!(
                "an IPC handle names bytes {}..{} of an allocation of {} bytes (a corrupt or forged handle)",
                self.offset,
                self.offset.saturating_add(self.len),
                mapping.size
            )));
        }
        let len = usize::try_from(self.len)
            .map_err(|_| Error::InvalidArgument(format!("IPC range of {} bytes", self.len)))?;
        Ok(ImportedBuffer {
            ptr: mapping.base + self.offset,
            len,
            mapping,
        })
    }
}

type CacheKey = (i32, [u8; 64]);

fn lock_cache() -> std::sync::MutexGuard<'static, HashMap<CacheKey, Weak<IpcMapping>>> {
    static CACHE: OnceLock<Mutex<HashMap<CacheKey, Weak<IpcMapping>>>> = OnceLock::new();
    // A panic while holding the lock cannot leave the map inconsistent (single inserts/removes).
    CACHE
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// One `cuIpcOpenMemHandle` mapping, shared by every [`ImportedBuffer`] over it.
struct IpcMapping {
    device: Device,
    base: cuda::CUdeviceptr,
    /// The mapped allocation's size, from the driver (`cuMemGetAddressRange`).
    size: u64,
    key: CacheKey,
}

impl Drop for IpcMapping {
    fn drop(&mut self) {
        // Hold the cache lock while closing, so a concurrent `open` cannot map the same handle
        // between our removal and the close.
        let mut cache = lock_cache();
        if cache.get(&self.key).is_some_and(|w| w.strong_count() == 0) {
            cache.remove(&self.key);
        }
        let _ = self.device.bind_to_thread();
        // Work queued on this device may still use the mapping: let it finish first, within a
        // deadline; past it, leave the mapping open (a leak) rather than pull it from under a
        // running kernel.
        if !self
            .device
            .idle_before_free("an IPC mapping", self.size as usize)
        {
            return;
        }
        // SAFETY: `base` came from cuIpcOpenMemHandle and is closed exactly once.
        let close = || unsafe { cu!(cuIpcCloseMemHandle(self.base)) };
        self.device.release("closing an IPC memory mapping", close);
    }
}

/// Device memory of another process, mapped into this one. Unmapped when the last buffer over
/// the same mapping drops.
pub struct ImportedBuffer {
    mapping: Arc<IpcMapping>,
    ptr: cuda::CUdeviceptr,
    len: usize,
}

impl ImportedBuffer {
    /// Whether `other` shares this buffer's mapping (the same handle opened twice).
    pub fn shares_mapping_with(&self, other: &ImportedBuffer) -> bool {
        Arc::ptr_eq(&self.mapping, &other.mapping)
    }
}

// SAFETY: the pointer and length lie in the mapping this value holds (an `Arc`) for its
// lifetime (see the constructors).
crate::memory::device_memory!(ImportedBuffer, device: mapping.device, ptr: ptr, len: len);

// SAFETY: the mapping is process-wide device memory usable from any thread.
unsafe impl Send for IpcMapping {}
// SAFETY: the mapping is never mutated after creation.
unsafe impl Sync for IpcMapping {}

/// An event that other processes can wait on (created with `CU_EVENT_INTERPROCESS`).
pub struct IpcEvent {
    event: Event,
}

impl IpcEvent {
    /// Creates an interprocess event on `device` (interprocess events cannot record time).
    pub fn new(device: &Device) -> Result<IpcEvent> {
        let flags = cuda::CUevent_flags::CU_EVENT_INTERPROCESS as u32
            | cuda::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        Ok(IpcEvent {
            event: Event::with_flags(device, flags)?,
        })
    }
    /// Records the event at the current end of `stream`.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        self.event.record(stream)
    }
    /// Waits until the last recorded work has finished, at most [`crate::HOST_WAIT`]; past
    /// it, [`Error::Busy`] (nothing was stopped).
    pub fn synchronize(&self) -> Result<()> {
        event_wait(&self.event, "the work last recorded in the event")
    }
    /// Waits until the last recorded work has finished, at most `limit`: `Ok(false)` if it
    /// still runs at the deadline (nothing is stopped). Polls `cuEventQuery`.
    pub fn synchronize_within(&self, limit: std::time::Duration) -> Result<bool> {
        self.event.synchronize_within(limit)
    }
    /// Makes `stream` wait for the last recorded work.
    pub fn wait_on(&self, stream: &Stream) -> Result<()> {
        self.event.wait_on(stream)
    }
    /// The handle to send to other processes.
    pub fn handle(&self) -> Result<IpcEventHandle> {
        let device = self.event.device();
        device.bind_to_thread()?;
        let mut h = cuda::CUipcEventHandle { reserved: [0; 64] };
        // SAFETY: the event was created with CU_EVENT_INTERPROCESS; `h` is an out-pointer.
        unsafe { cu!(cuIpcGetEventHandle(&mut h, self.event.cu_event())) }.on(device.ordinal())?;
        Ok(IpcEventHandle {
            raw: h.reserved.map(|c| c as u8),
            device_uuid: *device.uuid(),
            exporter_pid: std::process::id(),
        })
    }
}

/// The handle of an [`IpcEvent`], ready to send to another process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpcEventHandle {
    raw: [u8; 64],
    device_uuid: [u8; 16],
    exporter_pid: u32,
}

impl IpcEventHandle {
    /// Encodes the handle (see [`wire`]).
    pub fn to_bytes(&self) -> Vec<u8> {
        wire::encode(
            HandleKind::IpcEvent,
            &self.device_uuid,
            self.exporter_pid,
            &self.raw,
        )
    }
    /// Decodes a handle, rejecting anything malformed.
    pub fn from_bytes(bytes: &[u8]) -> Result<IpcEventHandle, DecodeError> {
        let env = wire::decode(bytes, HandleKind::IpcEvent)?;
        let raw = Reader::new(env.payload)
            .array::<64>()
            .ok_or(DecodeError::Field("IPC event payload"))?;
        Ok(IpcEventHandle {
            raw,
            device_uuid: env.device_uuid,
            exporter_pid: env.exporter_pid,
        })
    }
    /// UUID of the device the event belongs to.
    pub fn device_uuid(&self) -> &[u8; 16] {
        &self.device_uuid
    }
    /// Opens the event in this process; fails with [`Error::ImportInExporter`] in the exporter.
    pub fn open(&self, device: &Device) -> Result<ImportedEvent> {
        if self.exporter_pid == std::process::id() {
            return Err(Error::ImportInExporter {
                kind: "IPC event",
                pid: self.exporter_pid,
            });
        }
        device.bind_to_thread()?;
        let mut raw = std::ptr::null_mut();
        let h = cuda::CUipcEventHandle {
            reserved: self.raw.map(|b| b as std::ffi::c_char),
        };
        // SAFETY: a context is current; a forged handle makes the driver return an error.
        unsafe { cu!(cuIpcOpenEventHandle(&mut raw, h)) }.on(device.ordinal())?;
        Ok(ImportedEvent {
            event: Event::from_raw(device, raw),
        })
    }
}

/// Another process's [`IpcEvent`], opened here. Destroyed on `Drop`.
pub struct ImportedEvent {
    event: Event,
}

impl ImportedEvent {
    /// Makes `stream` wait for the work the exporter last recorded.
    pub fn wait_on(&self, stream: &Stream) -> Result<()> {
        self.event.wait_on(stream)
    }
    /// Waits until the work the exporter last recorded has finished, at most
    /// [`crate::HOST_WAIT`]; past it, [`Error::Busy`] (nothing was stopped).
    pub fn synchronize(&self) -> Result<()> {
        event_wait(
            &self.event,
            "the work the exporting process last recorded in the event",
        )
    }
    /// Waits until the work the exporter last recorded has finished, at most `limit`:
    /// `Ok(false)` if it still runs at the deadline (nothing is stopped). Polls `cuEventQuery`.
    pub fn synchronize_within(&self, limit: std::time::Duration) -> Result<bool> {
        self.event.synchronize_within(limit)
    }
}

/// An IPC event's `synchronize`: [`Event::synchronize_within`] with [`crate::HOST_WAIT`], and
/// [`Error::Busy`] naming `what` if the work still runs then.
fn event_wait(event: &Event, what: &'static str) -> Result<()> {
    if event.synchronize_within(crate::HOST_WAIT)? {
        return Ok(());
    }
    Err(Error::Busy {
        op: "synchronize on an IPC event",
        device: event.device().ordinal(),
        waiting_for: what,
        waited: crate::HOST_WAIT,
        outcome: "the wait gave up",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> IpcMemHandle {
        let mut raw = [0u8; 64];
        raw.iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = i as u8 ^ 0x5a);
        IpcMemHandle {
            raw,
            offset: 4096,
            len: 1 << 20,
            device_uuid: [3; 16],
            exporter_pid: 777,
        }
    }

    #[test]
    fn mem_handles_round_trip() {
        let h = sample();
        assert_eq!(IpcMemHandle::from_bytes(&h.to_bytes()), Ok(h));
    }

    #[test]
    fn event_handles_round_trip() {
        let h = IpcEventHandle {
            raw: [9; 64],
            device_uuid: [1; 16],
            exporter_pid: 12,
        };
        assert_eq!(IpcEventHandle::from_bytes(&h.to_bytes()), Ok(h));
        // A memory handle is not an event handle.
        assert!(matches!(
            IpcEventHandle::from_bytes(&sample().to_bytes()),
            Err(DecodeError::WrongKind { .. })
        ));
    }

    #[test]
    fn empty_or_overflowing_ranges_are_rejected() {
        let mut h = sample();
        h.len = 0;
        assert_eq!(
            IpcMemHandle::from_bytes(&h.to_bytes()),
            Err(DecodeError::Field("IPC memory range is empty or overflows"))
        );
        h.len = 2;
        h.offset = u64::MAX;
        assert!(IpcMemHandle::from_bytes(&h.to_bytes()).is_err());
    }
}
