//! One way to reach a peer's memory, for everything above the memory layer: the connections
//! of the `conn` feature's connections, and the workspaces of `p2p-collective`'s communicators.
//!
//! - [`limit_to_level`] refuses P2P on pairs farther apart than `P2P_LEVEL`.
//! - [`choose`] picks the [`Sharing`] for a group of ranks from the configuration (`P2P_MODE`,
//!   `P2P_DISABLE`, `P2P_CUMEM`, `P2P_DIRECT_DISABLE`) and whether each pair of GPUs has direct
//!   P2P, and says why; one group shares one way (the weakest pair decides).
//! - [`LocalRegion::allocate`] makes zeroed memory of the kind that sharing needs: device memory
//!   (plain pointers, legacy IPC), a cuMem allocation with POSIX-fd or fabric handles, or
//!   pinned host memory in a memory file (host-staged, for GPUs with no usable P2P).
//! - [`LocalRegion::export`] gives what crosses to another process (an [`Exported`]: handle
//!   bytes, and an fd for cuMem and host memory); [`send`] / [`recv`] carry it over an
//!   [`FdChannel`]; [`import`] maps it on the receiving GPU as a [`PeerRegion`].
//!
//! ```no_run
//! use p2p_mem::Device;
//! use p2p_transport::config::Config;
//! use p2p_transport::peer::{choose, LocalRegion, PairP2p};
//! let (g0, g1) = (Device::new(0)?, Device::new(1)?);
//! let pairs = [PairP2p::probe(&g0, &g1)?, PairP2p::probe(&g1, &g0)?];
//! let (sharing, why) = choose(&Config::default(), true, &pairs);
//! let region = LocalRegion::allocate(&g0, 1 << 20, sharing)?;
//! println!("{sharing:?} because {why}");
//! # Ok::<(), p2p_transport::Error>(())
//! ```

use std::os::fd::{AsFd, OwnedFd};

use p2p_mem::fdpass::FdChannel;
use p2p_mem::ipc::{ImportedBuffer, IpcMemHandle};
use p2p_mem::shm::HostShared;
use p2p_mem::vmm::{FabricHandle, ShareableHandles, VmmBuffer, VmmHandle};
use p2p_mem::{Device, DeviceBuffer, DeviceMemory, DeviceMemoryMut};

use crate::config::{Config, ForcedMode, PathLevel};
use crate::error::{Error, Result};
use crate::mode::NoP2p;

/// How one rank's memory reaches another rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sharing {
    /// Legacy CUDA IPC handles (between processes).
    LegacyIpc = 0,
    /// cuMem allocations passed as POSIX fds (between processes of one host).
    CuMem = 1,
    /// cuMem fabric handles (plain bytes; need an IMEX channel, so across hosts of one NVLink
    /// fabric). Where the driver refuses them the export fails with `Unsupported`.
    Fabric = 2,
    /// Pinned host memory shared through a memory file: for GPUs with no usable P2P. Every
    /// access crosses PCIe to host memory: correct everywhere, and slow.
    HostStaged = 3,
    /// Plain device addresses with peer access enabled (within one process).
    Pointer = 4,
}

impl Sharing {
    /// The byte that names the sharing in handshakes.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The sharing a byte from [`code`](Self::code) names.
    pub fn from_code(code: u8) -> Option<Sharing> {
        [
            Sharing::LegacyIpc,
            Sharing::CuMem,
            Sharing::Fabric,
            Sharing::HostStaged,
            Sharing::Pointer,
        ]
        .into_iter()
        .find(|s| s.code() == code)
    }

    /// How the logs name it, as the routes do (`P2P/cuMem`, `host-staged`).
    pub fn name(self) -> &'static str {
        match self {
            Sharing::LegacyIpc => "P2P/IPC",
            Sharing::CuMem => "P2P/cuMem",
            Sharing::Fabric => "P2P/fabric",
            Sharing::HostStaged => "host-staged",
            Sharing::Pointer => "P2P/direct pointer",
        }
    }

    /// Whether peers address each other's GPU memory directly (everything but host-staged).
    pub fn is_p2p(self) -> bool {
        self != Sharing::HostStaged
    }

    /// Whether an export of this kind carries a file descriptor.
    fn carries_fd(self) -> bool {
        matches!(self, Sharing::CuMem | Sharing::HostStaged)
    }

    /// Weaker sorts last: host-staged, then legacy IPC, then cuMem and fabric, then pointers.
    fn strength(self) -> u8 {
        match self {
            Sharing::HostStaged => 0,
            Sharing::LegacyIpc => 1,
            Sharing::CuMem | Sharing::Fabric => 2,
            Sharing::Pointer => 3,
        }
    }

    /// The weaker of two sharings (the one a group must fall back to).
    pub fn weaker(self, other: Sharing) -> Sharing {
        if other.strength() < self.strength() {
            other
        } else {
            self
        }
    }
}

/// Whether one ordered pair of GPUs has direct P2P, as probed by the GPU that maps the other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PairP2p {
    /// The GPU that maps (ordinal in the probing process).
    pub from: i32,
    /// The GPU mapped (ordinal, or -1 where the probing process cannot see it).
    pub to: i32,
    /// `Ok` where `from` can map `to`'s memory; otherwise why not.
    pub p2p: std::result::Result<(), NoP2p>,
}

impl PairP2p {
    /// Probes `from` mapping `to` (`cuDeviceCanAccessPeer`; one GPU can always map itself).
    pub fn probe(from: &Device, to: &Device) -> Result<PairP2p> {
        let ok = from.can_access_peer(to)?;
        Ok(PairP2p {
            from: from.ordinal(),
            to: to.ordinal(),
            p2p: if ok {
                Ok(())
            } else {
                Err(NoP2p::CannotAccessPeer {
                    from: from.ordinal(),
                    to: to.ordinal(),
                })
            },
        })
    }

    /// Probes `from` mapping the GPU with `uuid`, which may live in another process. A GPU this
    /// process cannot see (`CUDA_VISIBLE_DEVICES`) is taken as reachable, as the driver decides
    /// only when the memory is mapped; `P2P_DISABLE=1` is how to refuse it.
    pub fn probe_uuid(from: &Device, uuid: &[u8; 16]) -> Result<PairP2p> {
        Ok(match from.can_access_peer_uuid(uuid)? {
            Some((to, true)) => PairP2p {
                from: from.ordinal(),
                to,
                p2p: Ok(()),
            },
            Some((to, false)) => PairP2p {
                from: from.ordinal(),
                to,
                p2p: Err(NoP2p::CannotAccessPeer {
                    from: from.ordinal(),
                    to,
                }),
            },
            None => PairP2p {
                from: from.ordinal(),
                to: -1,
                p2p: Ok(()),
            },
        })
    }
}

/// Applies `P2P_LEVEL` to probed pairs, as the transport's own copies do: a pair whose topology
/// path is farther than the level loses direct P2P (and the group goes host-staged). At the
/// default level (`SYS`) this does nothing; otherwise it reads the topology once (NVML and
/// sysfs). A pair whose far GPU this process cannot see (`CUDA_VISIBLE_DEVICES`) loses P2P too,
/// because its path cannot be checked.
pub fn limit_to_level(cfg: &Config, pairs: &mut [PairP2p]) -> Result<()> {
    if cfg.p2p_level == PathLevel::Sys || pairs.iter().all(|p| p.p2p.is_err()) {
        return Ok(());
    }
    let t = crate::topo::discover()?;
    for p in pairs.iter_mut().filter(|p| p.p2p.is_ok()) {
        p.p2p = match (usize::try_from(p.from), usize::try_from(p.to)) {
            (Ok(a), Ok(b)) => crate::mode::p2p_allowed(&t, cfg, a, b),
            _ => Err(NoP2p::PeerNotVisible {
                level: cfg.p2p_level,
                from: p.from,
            }),
        };
    }
    Ok(())
}

/// The sharing for a group of ranks: one process (`one_process`) or one process per GPU, and
/// each ordered pair's P2P. Returns the sharing and why, for the log.
///
/// - `P2P_MODE=host`, `P2P_DISABLE=1`, or a pair without P2P: host-staged.
/// - One process: plain pointers (whatever `P2P_MODE` names: IPC handles cannot be opened in
///   the process that made them).
/// - Between processes: `P2P_MODE=ipc` or `P2P_CUMEM=0` gives legacy IPC; otherwise cuMem fds.
pub fn choose(cfg: &Config, one_process: bool, pairs: &[PairP2p]) -> (Sharing, String) {
    if cfg.force_mode == Some(ForcedMode::HostStaged) {
        return (Sharing::HostStaged, "forced by P2P_MODE=host".into());
    }
    if cfg.p2p_disable {
        return (Sharing::HostStaged, "P2P_DISABLE=1".into());
    }
    if let Some((p, why)) = pairs
        .iter()
        .find_map(|p| p.p2p.as_ref().err().map(|w| (p, w)))
    {
        return (
            Sharing::HostStaged,
            format!(
                "no direct P2P from GPU {} to GPU {} ({why}): every rank goes through host memory",
                p.from, p.to
            ),
        );
    }
    if one_process {
        return (
            Sharing::Pointer,
            "one process, P2P between every pair: plain pointers with peer access".into(),
        );
    }
    match cfg.force_mode {
        Some(ForcedMode::Ipc) => (Sharing::LegacyIpc, "forced by P2P_MODE=ipc".into()),
        Some(ForcedMode::CuMem) if cfg.cumem => (Sharing::CuMem, "forced by P2P_MODE=cumem".into()),
        _ if !cfg.cumem => (
            Sharing::LegacyIpc,
            "different processes; P2P_CUMEM=0: legacy IPC".into(),
        ),
        _ => (
            Sharing::CuMem,
            "different processes; cuMem fds enabled (P2P_CUMEM=0 for legacy IPC)".into(),
        ),
    }
}

fn invalid(msg: String) -> Error {
    Error::InvalidArgument(msg)
}

enum Owned {
    Device(DeviceBuffer<u8>),
    Vmm(VmmBuffer),
    Host(HostShared),
}

/// Memory this rank owns and shares with its peers, allocated as its [`Sharing`] needs; zeroed.
/// Freed on `Drop` (after the device has finished with it, as each kind's own `Drop` does).
pub struct LocalRegion {
    sharing: Sharing,
    mem: Owned,
}

impl LocalRegion {
    /// Allocates `bytes` (at least; cuMem rounds up to its granularity) on `device`.
    pub fn allocate(device: &Device, bytes: usize, sharing: Sharing) -> Result<LocalRegion> {
        let mem = match sharing {
            Sharing::Pointer | Sharing::LegacyIpc => {
                Owned::Device(DeviceBuffer::<u8>::zeroed(device, bytes)?)
            }
            Sharing::CuMem | Sharing::Fabric => {
                let handles = if sharing == Sharing::CuMem {
                    ShareableHandles::POSIX_FD
                } else {
                    ShareableHandles::FABRIC
                };
                let mut buf = VmmBuffer::new(device, bytes, &[], handles)?;
                buf.memset_u8(0)?;
                Owned::Vmm(buf)
            }
            Sharing::HostStaged => Owned::Host(HostShared::new(device, bytes)?),
        };
        Ok(LocalRegion { sharing, mem })
    }

    /// How it is shared.
    pub fn sharing(&self) -> Sharing {
        self.sharing
    }

    /// What a peer process needs to map it. Plain-pointer regions are shared by address within
    /// their process and have nothing to export.
    pub fn export(&self) -> Result<Exported> {
        match (&self.mem, self.sharing) {
            (Owned::Device(b), Sharing::LegacyIpc) => Ok(Exported {
                header: IpcMemHandle::export(b)?.to_bytes(),
                fd: None,
            }),
            (Owned::Vmm(b), Sharing::CuMem) => {
                let (desc, fd) = b.export_fd()?;
                Ok(Exported {
                    header: desc.to_bytes(),
                    fd: Some(fd),
                })
            }
            (Owned::Vmm(b), Sharing::Fabric) => Ok(Exported {
                header: b.export_fabric()?.to_bytes(),
                fd: None,
            }),
            (Owned::Host(h), _) => Ok(Exported {
                header: (h.byte_len() as u64).to_le_bytes().to_vec(),
                fd: Some(
                    h.fd()
                        .try_clone_to_owned()
                        .map_err(|e| invalid(format!("duplicating a memory file's fd: {e}")))?,
                ),
            }),
            (_, s) => Err(invalid(format!(
                "a region shared as {} is reached by address within its process; nothing to export",
                s.name()
            ))),
        }
    }
}

// SAFETY: the pointer and length describe memory this value owns or borrows for its
// lifetime (see the type's constructor).
unsafe impl DeviceMemory for LocalRegion {
    fn device(&self) -> &Device {
        match &self.mem {
            Owned::Device(b) => b.device(),
            Owned::Vmm(b) => b.device(),
            Owned::Host(b) => b.device(),
        }
    }
    fn device_ptr(&self) -> u64 {
        match &self.mem {
            Owned::Device(b) => b.device_ptr(),
            Owned::Vmm(b) => b.device_ptr(),
            Owned::Host(b) => b.device_ptr(),
        }
    }
    fn byte_len(&self) -> usize {
        match &self.mem {
            Owned::Device(b) => b.byte_len(),
            Owned::Vmm(b) => b.byte_len(),
            Owned::Host(b) => b.byte_len(),
        }
    }
}
// SAFETY: the pointer and length describe memory this value owns or borrows for its
// lifetime (see the type's constructor).
unsafe impl DeviceMemoryMut for LocalRegion {}

/// Exports memory this layer did not allocate (a user's buffer from `cudaMalloc`, a
/// framework's allocator) for peers in other processes: such memory crosses processes only as
/// a legacy IPC handle, so import it with [`Sharing::LegacyIpc`].
pub fn export_memory(memory: &dyn DeviceMemory) -> Result<Exported> {
    Ok(Exported {
        header: IpcMemHandle::export(memory)?.to_bytes(),
        fd: None,
    })
}

/// What crosses to the peer: handle bytes and, for cuMem and host memory, one fd.
#[derive(Debug)]
pub struct Exported {
    /// The handle (IPC handle, cuMem description, fabric handle, or the host file's length).
    pub header: Vec<u8>,
    /// The cuMem allocation's or the memory file's fd.
    pub fd: Option<OwnedFd>,
}

/// A peer's region mapped on this rank's GPU. Unmapped on `Drop`.
pub enum PeerRegion {
    /// Through a legacy IPC handle.
    Ipc(ImportedBuffer),
    /// Through a cuMem fd or fabric handle.
    Vmm(VmmBuffer),
    /// Through a memory file of pinned host memory.
    Host(HostShared),
}

// SAFETY: the pointer and length describe memory this value owns or borrows for its
// lifetime (see the type's constructor).
unsafe impl DeviceMemory for PeerRegion {
    fn device(&self) -> &Device {
        match self {
            PeerRegion::Ipc(b) => b.device(),
            PeerRegion::Vmm(b) => b.device(),
            PeerRegion::Host(b) => b.device(),
        }
    }
    fn device_ptr(&self) -> u64 {
        match self {
            PeerRegion::Ipc(b) => b.device_ptr(),
            PeerRegion::Vmm(b) => b.device_ptr(),
            PeerRegion::Host(b) => b.device_ptr(),
        }
    }
    fn byte_len(&self) -> usize {
        match self {
            PeerRegion::Ipc(b) => b.byte_len(),
            PeerRegion::Vmm(b) => b.byte_len(),
            PeerRegion::Host(b) => b.byte_len(),
        }
    }
}
// SAFETY: the pointer and length describe memory this value owns or borrows for its
// lifetime (see the type's constructor).
unsafe impl DeviceMemoryMut for PeerRegion {}

/// Maps a peer's exported region on `device`. `peer` names the peer rank in errors.
pub fn import(device: &Device, sharing: Sharing, peer: usize, e: Exported) -> Result<PeerRegion> {
    let bad = |why: String| Error::Handshake { peer, why };
    match sharing {
        Sharing::LegacyIpc => {
            let h = IpcMemHandle::from_bytes(&e.header)
                .map_err(|x| bad(format!("its IPC handle: {x}")))?;
            Ok(PeerRegion::Ipc(h.open(device)?))
        }
        Sharing::CuMem => {
            let desc = VmmHandle::from_bytes(&e.header)
                .map_err(|x| bad(format!("its cuMem handle: {x}")))?;
            let fd =
                e.fd.ok_or_else(|| bad("its cuMem handle came without an fd".into()))?;
            Ok(PeerRegion::Vmm(VmmBuffer::import_fd(
                device,
                &desc,
                fd.as_fd(),
                &[],
            )?))
        }
        Sharing::Fabric => {
            let h = FabricHandle::from_bytes(&e.header)
                .map_err(|x| bad(format!("its fabric handle: {x}")))?;
            Ok(PeerRegion::Vmm(VmmBuffer::import_fabric(device, &h, &[])?))
        }
        Sharing::HostStaged => {
            let len: [u8; 8] = e.header.as_slice().try_into().map_err(|_| {
                bad(format!(
                    "a {}-byte host-memory header, expected 8",
                    e.header.len()
                ))
            })?;
            let fd =
                e.fd.ok_or_else(|| bad("its host memory came without an fd".into()))?;
            let len = usize::try_from(u64::from_le_bytes(len)).map_err(|_| {
                bad("a host-memory length past this machine's address space".into())
            })?;
            Ok(PeerRegion::Host(HostShared::from_fd(device, fd, len)?))
        }
        Sharing::Pointer => Err(bad(
            "plain-pointer regions are shared by address within one process, not imported".into(),
        )),
    }
}

/// The `wire` message kind that carries an export.
const EXPORT: u16 = 0x0E01;

/// Sends an export over `chan` as rank `from` (a `wire` message: the rank, then the handle;
/// the fd, if any, beside it).
pub fn send(chan: &FdChannel, from: usize, e: &Exported) -> Result<()> {
    let msg = export_message(from, &e.header);
    match &e.fd {
        Some(fd) => chan.send_fd(&msg, fd.as_fd())?,
        None => chan.send_msg(&msg)?,
    }
    Ok(())
}

/// Receives an export of `sharing` sent by [`send`]; returns the rank the sender named and
/// the export. A message that is not a well-formed export is an error (its fd is closed).
pub fn recv(chan: &FdChannel, sharing: Sharing) -> Result<(usize, Exported)> {
    let (msg, fd) = if sharing.carries_fd() {
        let (m, fd) = chan.recv_fd()?;
        (m, Some(fd))
    } else {
        (chan.recv_msg()?, None)
    };
    parse_export(&msg, fd)
}

/// The message [`send`] writes: rank `from`, then the export's `header`.
pub(crate) fn export_message(from: usize, header: &[u8]) -> Vec<u8> {
    p2p_mem::wire::encode_message(
        EXPORT,
        &p2p_mem::wire::Writer::new()
            .u32(u32::try_from(from).unwrap_or(u32::MAX))
            .blob(header)
            .finish(),
    )
}

/// The export in a message that [`send`] wrote (`fd`: what came beside it), or why `msg` is not
/// one.
pub(crate) fn parse_export(msg: &[u8], fd: Option<OwnedFd>) -> Result<(usize, Exported)> {
    let bad = |why: String| Error::Handshake {
        peer: usize::MAX,
        why,
    };
    let (kind, payload) = p2p_mem::wire::decode_message(msg, p2p_mem::fdpass::MAX_MESSAGE)
        .map_err(|e| bad(format!("not an export: {e}")))?;
    if kind != EXPORT {
        return Err(bad(format!("message kind {kind}, not an export")));
    }
    let mut r = p2p_mem::wire::Reader::new(payload);
    let (from, header) = (|| {
        let from = r.u32()?;
        let header = r.blob(p2p_mem::fdpass::MAX_MESSAGE)?.to_vec();
        r.end()?;
        Some((from as usize, header))
    })()
    .ok_or_else(|| bad("a malformed export".into()))?;
    Ok((from, Exported { header, fd }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(ok: bool) -> PairP2p {
        pair_of(0, 1, ok)
    }

    fn pair_of(from: i32, to: i32, ok: bool) -> PairP2p {
        PairP2p {
            from,
            to,
            p2p: if ok {
                Ok(())
            } else {
                Err(NoP2p::CannotAccessPeer { from, to })
            },
        }
    }

    #[test]
    fn the_default_level_leaves_pairs_alone_without_reading_the_topology() {
        // At SYS nothing is read (this machine has no NVML) and nothing changes.
        let mut pairs = [pair_of(0, 1, true), pair_of(1, 0, false)];
        limit_to_level(&Config::default(), &mut pairs).expect("no topology needed");
        assert_eq!(pairs, [pair_of(0, 1, true), pair_of(1, 0, false)]);
        // A stricter level with no pair left to refuse reads nothing either.
        let nvl = Config {
            p2p_level: PathLevel::Nvl,
            ..Config::default()
        };
        let mut none = [pair(false)];
        limit_to_level(&nvl, &mut none).expect("nothing to check");
        assert!(none[0].p2p.is_err());
    }

    #[test]
    fn a_pair_without_p2p_names_why_in_the_sharing_reason() {
        let (s, why) = choose(
            &Config::default(),
            false,
            &[pair(true), pair_of(1, 0, false)],
        );
        assert_eq!(s, Sharing::HostStaged);
        assert_eq!(
            why,
            "no direct P2P from GPU 1 to GPU 0 (cuDeviceCanAccessPeer says GPU 1 cannot map GPU 0): \
             every rank goes through host memory"
        );
        let hidden = NoP2p::PeerNotVisible {
            level: PathLevel::Nvl,
            from: 2,
        };
        assert_eq!(
            hidden.to_string(),
            "P2P_LEVEL=NVL is set and GPU 2's peer is not visible to this process \
             (CUDA_VISIBLE_DEVICES), so the path between them cannot be checked"
        );
    }

    #[test]
    fn random_and_mutated_export_messages_are_refused_or_read_exactly() {
        let mut rng = p2p_testkit::Rng::new(3);
        let header: Vec<u8> = (0..96).map(|i| i as u8).collect();
        let good = export_message(3, &header);
        let (from, e) = parse_export(&good, None).expect("a valid export");
        assert_eq!((from, &e.header[..]), (3, &header[..]));
        let (mut accepted, mut refused) = (0, 0);
        for _ in 0..40_000u32 {
            let m = rng.mutated(&good);
            match parse_export(&m, None) {
                // Whatever is accepted says exactly what the sender's encoding of it would.
                Ok((from, e)) => {
                    assert_eq!(export_message(from, &e.header), m);
                    accepted += 1;
                }
                Err(Error::Handshake { .. }) => refused += 1,
                Err(other) => panic!("not a handshake error: {other}"),
            }
        }
        // Changes inside the header bytes are valid exports; the rest are refused.
        assert!(
            accepted > 1_000 && refused > 10_000,
            "{accepted} / {refused}"
        );
    }

    #[test]
    fn exports_travel_as_wire_messages_with_and_without_fds() {
        use p2p_mem::fdpass::{FdChannel, FdListener, PrivateDir};
        let dir = PrivateDir::new("peer-unit").expect("dir");
        let listener = FdListener::bind(&dir.path().join("s")).expect("bind");
        let a = FdChannel::connect(listener.path()).expect("connect");
        let b = listener
            .accept(std::time::Duration::from_secs(5))
            .expect("accept");
        // Legacy IPC: no fd.
        let e = Exported {
            header: vec![1, 2, 3, 4, 5],
            fd: None,
        };
        send(&a, 3, &e).expect("send");
        let (from, got) = recv(&b, Sharing::LegacyIpc).expect("recv");
        assert_eq!(
            (from, got.header, got.fd.is_none()),
            (3, vec![1, 2, 3, 4, 5], true)
        );
        // cuMem: the fd travels beside the handle.
        let file = std::fs::File::open("/dev/null").expect("fd");
        let e = Exported {
            header: vec![9; 40],
            fd: Some(file.into()),
        };
        send(&a, 1, &e).expect("send");
        let (from, got) = recv(&b, Sharing::CuMem).expect("recv");
        assert_eq!((from, got.header.len(), got.fd.is_some()), (1, 40, true));
        // Anything else is refused.
        a.send_msg(b"not an export").expect("send");
        assert!(recv(&b, Sharing::LegacyIpc).is_err());
        a.send_msg(&p2p_mem::wire::encode_message(0x0C01, &[0; 22]))
            .expect("send");
        assert!(recv(&b, Sharing::LegacyIpc).is_err());
    }

    #[test]
    fn codes_round_trip_and_weakest_wins() {
        for s in [
            Sharing::LegacyIpc,
            Sharing::CuMem,
            Sharing::Fabric,
            Sharing::HostStaged,
            Sharing::Pointer,
        ] {
            assert_eq!(Sharing::from_code(s.code()), Some(s));
            assert_eq!(s.weaker(Sharing::HostStaged), Sharing::HostStaged);
            assert_eq!(Sharing::Pointer.weaker(s), s);
        }
        assert_eq!(Sharing::from_code(9), None);
        assert_eq!(
            Sharing::CuMem.weaker(Sharing::LegacyIpc),
            Sharing::LegacyIpc
        );
    }

    #[test]
    fn the_configuration_and_the_pairs_choose_the_sharing() {
        let ok = [pair(true), pair(true)];
        let cfg = Config::default();
        assert_eq!(choose(&cfg, false, &ok).0, Sharing::CuMem);
        assert_eq!(choose(&cfg, true, &ok).0, Sharing::Pointer);
        let no_cumem = Config {
            cumem: false,
            ..Config::default()
        };
        let (s, why) = choose(&no_cumem, false, &ok);
        assert_eq!(s, Sharing::LegacyIpc);
        assert!(why.contains("P2P_CUMEM=0"), "{why}");
        let disabled = Config {
            p2p_disable: true,
            ..Config::default()
        };
        assert_eq!(choose(&disabled, false, &ok).0, Sharing::HostStaged);
        assert_eq!(choose(&disabled, true, &ok).0, Sharing::HostStaged);
        let forced_host = Config {
            force_mode: Some(ForcedMode::HostStaged),
            ..Config::default()
        };
        assert_eq!(choose(&forced_host, true, &ok).0, Sharing::HostStaged);
        let forced_ipc = Config {
            force_mode: Some(ForcedMode::Ipc),
            ..Config::default()
        };
        assert_eq!(choose(&forced_ipc, false, &ok).0, Sharing::LegacyIpc);
        assert_eq!(choose(&forced_ipc, true, &ok).0, Sharing::Pointer);
        let (s, why) = choose(&cfg, false, &[pair(true), pair(false)]);
        assert_eq!(s, Sharing::HostStaged);
        assert!(why.contains("GPU 0 to GPU 1"), "{why}");
    }
}
