//! The transport's per-process context, [`Transport`]: what one process keeps to move data
//! between its GPUs and to connect to other processes, each part made at its first use and
//! shared by every thread. The data paths are its methods in [`crate::copy`]; the connections of
//! the `conn` feature take their kernels from it.

#[cfg(feature = "conn")]
use std::sync::Arc;
use std::sync::Mutex;

use p2p_mem::{Device, Stream};

use crate::config::Config;
use crate::copy::routes::Routes;
use crate::copy::sm::{CopyKernel, SmGrid};
use crate::copy::staged::Pipelines;
use crate::error::{Error, Result};
#[cfg(feature = "conn")]
use crate::kernels::SrKernels;

pub(crate) mod lazy;
pub(crate) mod peers;

use lazy::Lazy;
use peers::PeerAccess;

/// What the transport keeps for one of its GPUs, each made at its first use.
pub(crate) struct PerDevice {
    pub(crate) device: Device,
    /// The SM copy kernel.
    pub(crate) copy: Lazy<CopyKernel>,
    /// The send/recv kernels of the connections.
    #[cfg(feature = "conn")]
    pub(crate) sendrecv: Lazy<Arc<SrKernels>>,
    /// The stream a copy that must run on this GPU is bridged to from another GPU's stream.
    pub(crate) bridge: Lazy<Stream>,
}

impl PerDevice {
    fn new(device: Device) -> PerDevice {
        PerDevice {
            device,
            copy: Lazy::new("the SM copy kernel"),
            #[cfg(feature = "conn")]
            sendrecv: Lazy::new("the send/recv kernels"),
            bridge: Lazy::new("a bridge stream"),
        }
    }
}

/// What one process needs to move data between its GPUs. Cheap to share across threads.
///
/// It is made of four parts, each filled as copies first need it: per GPU, the kernels and the
/// bridge stream; the peer access enabled so far; the staging pipelines
/// (`staged.rs`); and the routes of [`copy_peer`](Self::copy_peer) (`routes.rs`: topology,
/// configuration, one choice per pair).
pub struct Transport {
    pub(crate) devices: Vec<PerDevice>,
    pub(crate) peers: PeerAccess,
    pub(crate) pipelines: Pipelines,
    pub(crate) routes: Routes,
    pub(crate) sm_grid: Mutex<SmGrid>,
}

impl Transport {
    /// A transport over `devices` (usually [`Device::all`]); kernels compile on first use.
    pub fn new(devices: Vec<Device>) -> Transport {
        Transport {
            devices: devices.into_iter().map(PerDevice::new).collect(),
            peers: PeerAccess::default(),
            pipelines: Pipelines::default(),
            routes: Routes::new(),
            sm_grid: Mutex::new(SmGrid::DEFAULT),
        }
    }

    /// Uses `config` for [`copy_peer`](Self::copy_peer)'s mode selection instead of the
    /// `P2P_*` environment.
    pub fn set_config(&self, config: Config) {
        self.routes.set_config(config);
    }

    /// The device with this ordinal.
    pub fn device(&self, ordinal: i32) -> Result<&Device> {
        self.devices
            .iter()
            .map(|d| &d.device)
            .find(|d| d.ordinal() == ordinal)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "GPU {ordinal} is not one of this transport's devices ({:?})",
                    self.devices
                        .iter()
                        .map(|d| d.device.ordinal())
                        .collect::<Vec<_>>()
                ))
            })
    }

    /// What this transport keeps for `device`.
    pub(crate) fn slot(&self, device: &Device) -> Result<&PerDevice> {
        self.devices
            .iter()
            .find(|d| &d.device == device)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "GPU {} is not part of this transport",
                    device.ordinal()
                ))
            })
    }

    /// The send/recv kernels of `device`, compiled on first use.
    #[cfg(feature = "conn")]
    pub(crate) fn sendrecv_kernels(&self, device: &Device) -> Result<Arc<SrKernels>> {
        self.slot(device)?
            .sendrecv
            .get(|| Ok(Arc::new(SrKernels::build(device)?)))
            .cloned()
    }

    /// Enables `device` to access `peer`'s memory, once per pair.
    pub fn ensure_peer_access(&self, device: &Device, peer: &Device) -> Result<()> {
        self.peers.ensure(device, peer)
    }

    /// Enables peer access in both directions between `a` and `b`.
    pub fn ensure_peer_access_both(&self, a: &Device, b: &Device) -> Result<()> {
        self.peers.ensure_both(a, b)
    }
}
