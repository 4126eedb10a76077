//! The staged paths of [`Transport::copy`](super::Transport::copy): through pinned host memory
//! ([`Path::HostStaged`](super::Path::HostStaged)) or a third GPU
//! ([`Path::Relay`](super::Path::Relay)), in [`STAGE_CHUNK`] pieces overlapped on two streams.
//! One [`Pipeline`] per (source, destination, relay) is made at first use and kept in
//! [`Pipelines`].

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use p2p_mem::{Device, DeviceBuffer, DeviceMemory, Event, PinnedHostBuffer, Stream};
use p2p_sys::cu;

use super::engine::copy_engine;
use crate::context::peers::PeerAccess;
use crate::error::Result;

/// Chunk size of the staged pipelines (host and relay).
pub const STAGE_CHUNK: usize = 4 << 20;
/// Staging buffers per pipeline: four chunks in flight.
pub const STAGE_SLOTS: usize = 4;

/// (source GPU, destination GPU, relay GPU or -1 for host-staged).
type PipelineKey = (i32, i32, i32);

/// The staging pipelines made so far, one per (source, destination, relay).
#[derive(Default)]
pub(crate) struct Pipelines {
    map: Mutex<HashMap<PipelineKey, Arc<Mutex<Pipeline>>>>,
}

impl Pipelines {
    /// The pipeline from `src` to `dst` (through `via`, or host memory), made at first use;
    /// a relay's legs get peer access first (without it the driver would stage them through
    /// the host too).
    pub(super) fn get(
        &self,
        src: &Device,
        dst: &Device,
        via: Option<&Device>,
        peers: &PeerAccess,
    ) -> Result<Arc<Mutex<Pipeline>>> {
        let key = (
            src.ordinal(),
            dst.ordinal(),
            via.map_or(-1, |v| v.ordinal()),
        );
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = map.get(&key) {
            return Ok(p.clone());
        }
        if let Some(v) = via {
            peers.ensure_both(src, v)?;
            peers.ensure_both(v, dst)?;
        }
        let p = Arc::new(Mutex::new(Pipeline::new(src, dst, via)?));
        map.insert(key, p.clone());
        Ok(p)
    }
}

enum Staging {
    Host(PinnedHostBuffer<u8>),
    Device(DeviceBuffer<u8>),
}

impl Staging {
    fn ptr(&self) -> u64 {
        match self {
            Staging::Host(b) => b.as_ptr() as u64,
            Staging::Device(b) => b.device_ptr(),
        }
    }
}

/// Two legs overlapped through [`STAGE_SLOTS`] buffers: leg one fills a slot on stream one, leg
/// two drains it on stream two, and a slot is refilled only after it was drained.
pub(super) struct Pipeline {
    src_dev: Device,
    dst_dev: Device,
    mid: Option<Device>,
    slots: Vec<Staging>,
    s1: Stream,
    s2: Stream,
    filled: Vec<Event>,
    drained: Vec<Event>,
    used: Vec<bool>,
    done: Event,
}

impl Pipeline {
    pub(super) fn new(src: &Device, dst: &Device, via: Option<&Device>) -> Result<Pipeline> {
        let (leg2_dev, slots) = match via {
            // Relay: leg one copies into the relay GPU, leg two out of it, both on copy engines.
            Some(v) => (
                v.clone(),
                (0..STAGE_SLOTS)
                    .map(|_| DeviceBuffer::<u8>::new(v, STAGE_CHUNK).map(Staging::Device))
                    .collect::<p2p_mem::Result<Vec<_>>>()?,
            ),
            // Host-staged: device-to-host on the source, host-to-device on the destination.
            None => (
                dst.clone(),
                (0..STAGE_SLOTS)
                    .map(|_| PinnedHostBuffer::<u8>::new(src, STAGE_CHUNK).map(Staging::Host))
                    .collect::<p2p_mem::Result<Vec<_>>>()?,
            ),
        };
        let s1 = Stream::new(src)?;
        let s2 = Stream::new(&leg2_dev)?;
        let filled = (0..STAGE_SLOTS)
            .map(|_| Event::new(src))
            .collect::<p2p_mem::Result<Vec<_>>>()?;
        let drained = (0..STAGE_SLOTS)
            .map(|_| Event::new(&leg2_dev))
            .collect::<p2p_mem::Result<Vec<_>>>()?;
        let done = Event::new(&leg2_dev)?;
        Ok(Pipeline {
            src_dev: src.clone(),
            dst_dev: dst.clone(),
            mid: via.cloned(),
            slots,
            s1,
            s2,
            filled,
            drained,
            used: vec![false; STAGE_SLOTS],
            done,
        })
    }

    pub(super) fn run(&mut self, dst: u64, src: u64, bytes: usize, caller: &Stream) -> Result<()> {
        let start = Event::new(caller.device())?;
        start.record(caller)?;
        start.wait_on(&self.s1)?;
        let mut off = 0;
        let mut k = 0;
        while off < bytes {
            let len = STAGE_CHUNK.min(bytes - off);
            let slot = k % STAGE_SLOTS;
            if self.used[slot] {
                self.drained[slot].wait_on(&self.s1)?;
            }
            let buf = self.slots[slot].ptr();
            self.leg1(buf, src + off as u64, len)?;
            self.filled[slot].record(&self.s1)?;
            self.filled[slot].wait_on(&self.s2)?;
            self.leg2(dst + off as u64, buf, len)?;
            self.drained[slot].record(&self.s2)?;
            self.used[slot] = true;
            off += len;
            k += 1;
        }
        self.done.record(&self.s2)?;
        Ok(self.done.wait_on(caller)?)
    }

    fn leg1(&self, buf: u64, src: u64, len: usize) -> Result<()> {
        let (sd, s) = (&self.src_dev, &self.s1);
        match &self.mid {
            Some(mid) => copy_engine(buf, mid, src, sd, len, s),
            None => {
                sd.bind_to_thread()?;
                // SAFETY: `buf` is a pinned staging buffer of STAGE_CHUNK >= len bytes owned by the
                // pipeline; `src` lies in a live allocation.
                unsafe {
                    cu!(cuMemcpyDtoHAsync_v2(
                        buf as *mut c_void,
                        src,
                        len,
                        s.cu_stream()
                    ))
                }
                .map_err(crate::error::cuda(sd.ordinal(), None))
            }
        }
    }

    fn leg2(&self, dst: u64, buf: u64, len: usize) -> Result<()> {
        let (dd, s) = (&self.dst_dev, &self.s2);
        match &self.mid {
            Some(mid) => copy_engine(dst, dd, buf, mid, len, s),
            None => {
                dd.bind_to_thread()?;
                // SAFETY: as in leg1, in the other direction.
                unsafe {
                    cu!(cuMemcpyHtoDAsync_v2(
                        dst,
                        buf as *const c_void,
                        len,
                        s.cu_stream()
                    ))
                }
                .map_err(crate::error::cuda(dd.ordinal(), None))
            }
        }
    }
}
