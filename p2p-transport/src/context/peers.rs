//! The peer access a process has enabled, once per pair of GPUs.

use std::collections::HashSet;
use std::sync::Mutex;

use p2p_mem::Device;

use crate::error::Result;

/// The pairs of GPUs between which this process has enabled peer access.
#[derive(Default)]
pub(crate) struct PeerAccess {
    enabled: Mutex<HashSet<(i32, i32)>>,
}

impl PeerAccess {
    /// Enables `device` to access `peer`'s memory, once per pair.
    pub(crate) fn ensure(&self, device: &Device, peer: &Device) -> Result<()> {
        let key = (device.ordinal(), peer.ordinal());
        let mut enabled = self.enabled.lock().unwrap_or_else(|p| p.into_inner());
        if device != peer && !enabled.contains(&key) {
            device.enable_peer_access(peer)?;
            enabled.insert(key);
        }
        Ok(())
    }

    /// Enables peer access in both directions between `a` and `b`.
    pub(crate) fn ensure_both(&self, a: &Device, b: &Device) -> Result<()> {
        self.ensure(a, b)?;
        self.ensure(b, a)
    }
}
