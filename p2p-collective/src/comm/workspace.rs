//! The workspaces: this rank's (the sync area, the scratch, the LL region, the send/recv
//! inboxes), every peer's as this GPU addresses it, and where each part lies.

use std::sync::Arc;

use p2p_mem::DeviceMemory;
use p2p_transport::peer::{LocalRegion, PeerRegion};

use crate::abi::{STATUS_OFF, STATUS_WORDS, SYNC_BYTES};
use crate::error::Result;
use crate::plan::{Tuning, LL_SLOT_BYTES, MAX_RANKS};

const _: () = assert!((STATUS_OFF + STATUS_WORDS) * 8 <= SYNC_BYTES);
const _: () = assert!(STATUS_OFF + STATUS_WORDS <= crate::abi::P2P_FREED_OFF);
const _: () = assert!(crate::abi::P2P_END_OFF * 8 <= SYNC_BYTES);
const _: () = assert!((crate::abi::CE_FLAGS_OFF + crate::abi::CE_CHUNKS) * 8 <= SYNC_BYTES);

/// Every rank's workspace as this rank's GPU addresses it, with what keeps them mapped.
pub(crate) struct Workspace {
    /// Rank r's workspace, as this GPU addresses it.
    pub(crate) bases: [u64; MAX_RANKS],
    // Freed in this order: the peers' mappings, then this rank's workspace.
    peers: Vec<PeerMemory>,
    local: Arc<LocalRegion>,
}

/// A peer's workspace, kept alive as long as this rank may write into it (held, never read).
#[allow(dead_code)]
pub(crate) enum PeerMemory {
    /// Made in this process (one process driving every GPU).
    Local(Arc<LocalRegion>),
    /// Mapped from another process.
    Imported(PeerRegion),
}

impl Workspace {
    /// This rank's workspace `local` and the peers' `peers`, at `bases`.
    pub(crate) fn new(
        bases: [u64; MAX_RANKS],
        local: Arc<LocalRegion>,
        peers: Vec<PeerMemory>,
    ) -> Workspace {
        Workspace {
            bases,
            peers,
            local,
        }
    }

    /// Rank r's sync area.
    pub(crate) fn sync(&self, r: usize) -> u64 {
        self.bases[r]
    }

    /// Rank r's scratch (after its sync area).
    pub(crate) fn scratch(&self, r: usize) -> u64 {
        self.bases[r] + SYNC_BYTES as u64
    }

    /// Where rank `owner`'s send/recv inbox for messages from rank `source` begins.
    pub(crate) fn inbox(&self, owner: usize, world: usize, tuning: &Tuning, source: usize) -> u64 {
        self.bases[owner] + inbox_offset(world, tuning, source) as u64
    }

    /// This rank's status words (the first failure its kernels recorded), read with a
    /// synchronous copy bounded by `limit` (it waits for the work of the GPU's legacy default
    /// stream and blocking streams, which may be anyone's).
    pub(crate) fn status(&self, limit: std::time::Duration) -> Result<[u64; STATUS_WORDS]> {
        let mut st = [0u64; STATUS_WORDS];
        self.local
            .copy_range_to_host_within(STATUS_OFF * 8, &mut st, limit)?;
        Ok(st)
    }

    /// Gives up this rank's workspace and the peers' mappings without freeing them: a kernel
    /// may still use them.
    pub(crate) fn leak(&mut self) {
        std::mem::forget(std::mem::take(&mut self.peers));
        std::mem::forget(self.local.clone());
    }
}

/// The sync area, the scratch (2 parities x `world` sources x a slot), the LL region
/// (2 x `world` x `LL_SLOT_BYTES`), then the send/recv inboxes (one per source rank).
pub(crate) fn workspace_bytes(world: usize, tuning: &Tuning) -> usize {
    inbox_offset(world, tuning, world)
}

/// Where, from the start of a workspace, the send/recv inbox for messages from rank `source`
/// begins (`source == world`: the end of the workspace).
pub(crate) fn inbox_offset(world: usize, tuning: &Tuning, source: usize) -> usize {
    SYNC_BYTES
        + 2 * world * tuning.slot_bytes()
        + 2 * world * LL_SLOT_BYTES
        + source * crate::abi::P2P_INBOX_BYTES
}
