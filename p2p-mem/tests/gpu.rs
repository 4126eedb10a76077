//! GPU tests. Ignored in CI (no GPU); run on a GPU machine with `--include-ignored`, which the
//! bundle's `run.sh` does. `gpu1_*` need one GPU, `gpu2_*` two with peer access. A GPU test
//! that finds too few GPUs fails; it never passes vacuously.

use std::os::fd::AsFd;
use std::process::Child;
use std::time::Duration;

use p2p_mem::fdpass::{FdChannel, FdListener, PrivateDir};
use p2p_mem::ipc::{IpcEvent, IpcEventHandle, IpcMemHandle};
use p2p_mem::vmm::{ShareableHandles, VmmBuffer, VmmHandle};
use p2p_mem::{
    Device, DeviceBuffer, DeviceMemory, DeviceMemoryMut, Error, PinnedHostBuffer, Stream,
};
use p2p_testkit::{
    child_gpu, child_seed, fresh_seed, gpus, holds_only, join, parent_channel, random_u32,
    random_u8, role, spawn_connected, Held,
};

const CHILD_LIMIT: Duration = Duration::from_secs(120);
const IO_LIMIT: Duration = Duration::from_secs(60);

#[test]
#[ignore = "needs a GPU"]
fn gpu1_device_properties() {
    let d = &gpus(1)[0];
    let count = Device::count().expect("count");
    eprintln!(
        "{count} GPU(s); GPU 0 = {} sm_{:?} {} {}",
        d.name(),
        d.compute_capability(),
        d.pci_bus_id(),
        d.uuid_string()
    );
    assert!(!d.name().is_empty());
    assert!(d.compute_capability() >= (6, 0));
    assert!(d.sm_count() > 0);
    assert!(d.total_memory() > 1 << 30);
    assert!(d.pci_bus_id().contains(':'), "{}", d.pci_bus_id());
    assert_ne!(d.uuid(), &[0u8; 16]);
    assert_eq!(
        Device::by_uuid(d.uuid())
            .expect("by_uuid")
            .map(|x| x.ordinal()),
        Some(0)
    );
    let err = Device::new(count).expect_err("past the last ordinal");
    assert!(matches!(err, Error::NoSuchDevice { .. }), "{err}");
    let (free, total) = d.memory_info().expect("memory info");
    assert!(free <= total && total == d.total_memory());
}

#[test]
#[ignore = "needs a GPU"]
fn gpu1_alloc_copy_memset_round_trips() {
    let d = &gpus(1)[0];
    let seed = fresh_seed();
    // Odd sizes: 1 byte, 4095 bytes, 1 MiB + 3 elements.
    for (i, n) in [1usize, 4095].into_iter().enumerate() {
        let data = random_u8(seed + i as u64, n);
        let buf = DeviceBuffer::from_host(d, &data).expect("upload");
        assert_eq!(
            buf.to_host_vec::<u8>().expect("download"),
            data,
            "{n} bytes"
        );
    }
    let n = (1 << 20) + 3;
    let data = random_u32(seed, n);
    let mut buf = DeviceBuffer::<u32>::new(d, n).expect("alloc");
    buf.copy_from_host(&data).expect("upload");
    let mut back = vec![0u32; n];
    buf.copy_to_host(&mut back).expect("download");
    assert_eq!(back, data);

    // Views: write through a sub-range, read it back through another.
    let patch = random_u32(seed + 7, 1000);
    buf.slice_mut(12_345..13_345)
        .expect("view")
        .copy_from_host(&patch)
        .expect("patch");
    assert_eq!(
        buf.slice(12_345..13_345)
            .expect("view")
            .to_host_vec::<u32>()
            .expect("read"),
        patch
    );
    let whole = buf.to_host_vec::<u32>().expect("download");
    assert_eq!(
        &whole[..12_345],
        &data[..12_345],
        "bytes before the view untouched"
    );
    assert_eq!(
        &whole[13_345..],
        &data[13_345..],
        "bytes after the view untouched"
    );
    assert!(matches!(
        buf.slice(n - 1..n + 1),
        Err(Error::OutOfBounds { .. })
    ));
    assert!(matches!(
        buf.copy_from_host(&data[1..]),
        Err(Error::SizeMismatch { .. })
    ));

    // memset, sync and on a stream.
    buf.memset_u8(0xab).expect("memset");
    assert!(holds_only::<u32>(&buf, 0xabab_abab));
    let stream = Stream::new(d).expect("stream");
    buf.memset_u8_async(0x11, &stream).expect("memset async");
    stream.synchronize().expect("sync");
    assert!(holds_only::<u32>(&buf, 0x1111_1111));
    assert!(holds_only::<u32>(
        &DeviceBuffer::<u32>::zeroed(d, 77).expect("zeroed"),
        0
    ));

    // Empty buffers are fine and allocate nothing.
    let empty = DeviceBuffer::<f64>::new(d, 0).expect("empty");
    assert!(empty.is_empty());
    assert_eq!(empty.to_host_vec::<f64>().expect("read"), Vec::<f64>::new());

    // Pinned host memory as the source and destination.
    let mut pinned = PinnedHostBuffer::<u32>::new(d, n).expect("pinned");
    assert!(
        pinned.iter().all(|&v| v == 0),
        "pinned memory starts zeroed"
    );
    pinned.copy_from_slice(&data);
    buf.copy_from_host(&pinned).expect("upload from pinned");
    let mut pinned_back = PinnedHostBuffer::<u32>::new(d, n).expect("pinned");
    buf.copy_to_host(&mut pinned_back)
        .expect("download to pinned");
    assert_eq!(&pinned_back[..], &data[..]);
}

/// `split_at_mut` gives disjoint writable views that cover the buffer exactly; a split past
/// the end is refused.
#[test]
#[ignore = "needs a GPU"]
fn gpu1_split_views_cover_the_buffer() {
    let d = &gpus(1)[0];
    let mut buf = DeviceBuffer::<u32>::zeroed(d, 1000).expect("alloc");
    let (mut a, rest) = buf.split_at_mut(300).expect("split");
    let (mut b, mut c) = rest.split_at_mut(0).expect("empty first part");
    assert_eq!((a.len(), b.len(), c.len()), (300, 0, 700));
    assert_eq!(c.device_ptr(), a.device_ptr() + 1200);
    a.copy_from_host(&[1u32; 300]).expect("a");
    b.copy_from_host(&[] as &[u32]).expect("b");
    c.copy_from_host(&[3u32; 700]).expect("c");
    let e = buf.split_at_mut(1001).err().expect("past the end");
    assert!(matches!(e, Error::OutOfBounds { len: 1000, .. }), "{e:?}");
    let back = buf.to_host_vec::<u32>().expect("download");
    assert!(back[..300].iter().all(|&v| v == 1) && back[300..].iter().all(|&v| v == 3));
}

#[test]
#[ignore = "needs a GPU"]
fn gpu1_errors_name_the_call_and_the_device() {
    let d = &gpus(1)[0];
    let err = DeviceBuffer::<u8>::new(d, d.total_memory() * 4)
        .err()
        .expect("cannot allocate 4x the memory");
    let text = err.to_string();
    eprintln!("{text}");
    assert!(
        text.starts_with("GPU 0: cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY"),
        "{text}"
    );
    assert!(
        text.contains("out of memory"),
        "the driver's own message is included: {text}"
    );
}

#[test]
#[ignore = "needs a GPU"]
fn gpu1_no_leak_over_1000_alloc_free_cycles() {
    let d = &gpus(1)[0];
    let free_now = || d.memory_info().expect("memory info").0;
    let check = |what: &str, before: usize, after: usize| {
        let drift = before.abs_diff(after);
        eprintln!("{what}: free before {before}, after {after}");
        // The driver may round its own bookkeeping to 2 MiB pages; a leak of 1000 buffers would
        // be at least 1000 x 64 KiB = 62.5 MiB.
        assert!(
            drift <= 4 << 20,
            "{what}: free memory moved by {drift} bytes over 1000 cycles"
        );
    };
    // Warm up each kind once so one-time driver allocations are not counted.
    drop(DeviceBuffer::<u8>::new(d, 64 << 10).expect("warm-up"));
    drop(PinnedHostBuffer::<u8>::new(d, 64 << 10).expect("warm-up"));
    drop(VmmBuffer::new(d, 64 << 10, &[], ShareableHandles::POSIX_FD).expect("warm-up"));

    let before = free_now();
    for _ in 0..1000 {
        drop(DeviceBuffer::<u8>::new(d, 64 << 10).expect("alloc"));
    }
    check("DeviceBuffer", before, free_now());

    let before = free_now();
    for _ in 0..1000 {
        drop(PinnedHostBuffer::<u8>::new(d, 64 << 10).expect("alloc"));
    }
    check("PinnedHostBuffer", before, free_now());

    let before = free_now();
    for _ in 0..1000 {
        let v = VmmBuffer::new(d, 64 << 10, &[], ShareableHandles::POSIX_FD).expect("alloc");
        // Export and close an fd too: an exported handle must not pin the memory.
        drop(v.export_fd().expect("export"));
    }
    check("VmmBuffer", before, free_now());

    let before = free_now();
    for _ in 0..1000 {
        let buf = DeviceBuffer::<u8>::new(d, 64 << 10).expect("alloc");
        IpcMemHandle::export(&buf).expect("export");
        drop(buf);
        drop(IpcEvent::new(d).expect("event"));
    }
    check("IPC export + event", before, free_now());
}

/// A buffer dropped while the GPU runs a kernel waits for the device (bounded by `DROP_WAIT`)
/// and then frees its memory: nothing is freed under the kernel, and nothing leaks once the
/// kernel ends.
#[test]
#[ignore = "needs a GPU"]
fn gpu1_buffers_dropped_while_the_gpu_is_busy_wait_for_it_then_free() {
    let d = &gpus(1)[0];
    let free_now = || d.memory_info().expect("memory info").0;
    drop(DeviceBuffer::<u8>::new(d, 64 << 20).expect("warm-up"));
    drop(PinnedHostBuffer::<u8>::new(d, 1 << 20).expect("warm-up"));
    let (stream, held) = Held::on_new_stream(d);
    let before = free_now();
    let device = DeviceBuffer::<u8>::new(d, 64 << 20).expect("alloc");
    let pinned = PinnedHostBuffer::<u8>::new(d, 1 << 20).expect("alloc");
    assert!(before - free_now() >= 64 << 20, "the buffer took no memory");
    let hold = Duration::from_millis(1500);
    let t0 = std::time::Instant::now();
    std::thread::scope(|s| {
        s.spawn(move || {
            std::thread::sleep(hold);
            held.release();
        });
        drop(device);
        drop(pinned);
    });
    let took = t0.elapsed();
    eprintln!("the drops took {took:?} with the GPU held for {hold:?}");
    assert!(
        took >= hold - Duration::from_millis(100),
        "a drop returned while the kernel still ran: {took:?}"
    );
    assert!(took < Duration::from_secs(30), "{took:?}");
    assert!(stream
        .synchronize_within(Duration::from_secs(10))
        .expect("the held kernel ended"));
    let drift = before.abs_diff(free_now());
    assert!(
        drift <= 4 << 20,
        "the dropped buffers were not freed: free memory differs by {drift} bytes"
    );
}

#[test]
#[ignore = "needs a GPU"]
fn gpu1_vmm_round_trip_and_granularity() {
    let d = &gpus(1)[0];
    let g = p2p_mem::vmm::granularity(d, ShareableHandles::POSIX_FD, false).expect("granularity");
    eprintln!(
        "granularity: {g} bytes (recommended {})",
        p2p_mem::vmm::granularity(d, ShareableHandles::POSIX_FD, true).expect("rec")
    );
    assert!(g.is_power_of_two());
    let mut v = VmmBuffer::new(d, g + 3, &[], ShareableHandles::POSIX_FD).expect("alloc");
    assert_eq!(v.size(), 2 * g, "rounded up to the granularity");
    let data = random_u8(fresh_seed(), v.size());
    v.copy_from_host(&data).expect("upload");
    assert_eq!(v.to_host_vec::<u8>().expect("download"), data);
    // cuMem memory is not legacy-IPC exportable: a clear driver error, not a crash.
    let err = IpcMemHandle::export(&v).expect_err("VMM memory cannot use legacy IPC");
    assert!(err.to_string().contains("cuIpcGetMemHandle"), "{err}");
}

#[test]
#[ignore = "needs a GPU"]
fn gpu1_fabric_handles_work_or_say_why_not() {
    let d = &gpus(1)[0];
    match VmmBuffer::new(d, 1 << 20, &[], ShareableHandles::FABRIC) {
        Ok(v) => match v.export_fabric() {
            Ok(h) => {
                eprintln!("fabric handles work here");
                let parsed = p2p_mem::vmm::FabricHandle::from_bytes(&h.to_bytes()).expect("decode");
                assert_eq!(parsed, h);
                assert_eq!(h.size(), v.size() as u64);
            }
            Err(Error::Unsupported { reason, .. }) => eprintln!("fabric export refused: {reason}"),
            Err(e) => panic!("fabric export failed with an unexpected error: {e}"),
        },
        Err(Error::Unsupported { what, reason }) => {
            eprintln!("fabric handles unsupported: {what}: {reason}");
            assert!(
                reason.contains("IMEX") || reason.contains("FABRIC_SUPPORTED"),
                "{reason}"
            );
        }
        Err(e) => panic!("a fabric allocation failed with an unexpected error: {e}"),
    }
}

/// Starts `test` again in a child process as `{tag}-child`, with `seed` and the GPU
/// `child_gpu`, in a private folder named `tag`, and accepts its connection (every wait on it
/// limited to `IO_LIMIT`): the folder and the listener, to keep while the child runs, the
/// child, and the channel to it.
fn start_child(
    test: &str,
    tag: &str,
    seed: u64,
    child_gpu: i32,
) -> (PrivateDir, FdListener, Child, FdChannel) {
    let dir = PrivateDir::new(tag).expect("dir");
    let env = [
        ("P2PTEST_SEED", seed.to_string()),
        ("P2PTEST_GPU", child_gpu.to_string()),
    ];
    let role = format!("{tag}-child");
    let (listener, child, mut chan) = spawn_connected(test, &role, &dir, &env, IO_LIMIT);
    chan.set_timeout(IO_LIMIT);
    (dir, listener, child, chan)
}

/// The body of a two-process test: the child (started by the parent with `role` set) runs
/// `child`; otherwise this is the parent, which needs `n_gpus` and runs `parent`.
fn two_processes(role_name: &str, child: fn(), n_gpus: usize, parent: impl FnOnce()) {
    if role().as_deref() == Some(role_name) {
        return child();
    }
    gpus(n_gpus);
    parent();
}

/// The two tests of a two-process scenario: `$one` with the child on GPU 0 (beside the parent),
/// `$two` with the child on GPU 1. The child runs `$child` in role `$role`; the parent runs
/// `$parent(test name, child's GPU)`.
macro_rules! two_process_tests {
    ($role:literal, $child:ident, $parent:ident: $one:ident, $two:ident) => {
        #[test]
        #[ignore = "needs a GPU"]
        fn $one() {
            two_processes($role, $child, 1, || $parent(stringify!($one), 0));
        }

        #[test]
        #[ignore = "needs 2 GPUs"]
        fn $two() {
            two_processes($role, $child, 2, || $parent(stringify!($two), 1));
        }
    };
}

// ---- Two processes: legacy IPC ------------------------------------------------------------

/// Parent: exports a buffer and an event; the child (on `child_gpu`) imports both, checks the
/// data, writes its own, and the parent sees it.
fn ipc_parent(test: &str, child_gpu: i32) {
    let d = Device::new(0).expect("GPU 0");
    let seed = fresh_seed();
    let n = (1 << 20) + 3;
    let data = random_u32(seed, n);
    let mut buf = DeviceBuffer::<u32>::new(&d, n + 16).expect("alloc");
    buf.slice_mut(16..)
        .expect("view")
        .copy_from_host(&data)
        .expect("upload");
    // Export a view at an offset: the handle must carry base + offset.
    let handle = IpcMemHandle::export(&buf.slice(16..).expect("view")).expect("export");
    assert_eq!(handle.offset(), 64);
    let err = handle
        .open(&d)
        .err()
        .expect("importing in the exporter must be refused");
    assert!(matches!(err, Error::ImportInExporter { .. }), "{err}");

    let (_dir, _listener, child, chan) = start_child(test, "ipc", seed, child_gpu);
    chan.send_msg(&handle.to_bytes()).expect("send the handle");
    assert_eq!(chan.recv_msg().expect("reply"), b"written");
    let expect = random_u32(seed ^ 0xc41d, n);
    assert_eq!(
        buf.slice(16..)
            .expect("view")
            .to_host_vec::<u32>()
            .expect("read"),
        expect,
        "the child's writes are visible"
    );

    // Event ordering: fill on a stream, record the IPC event, let the child wait on it.
    let stream = Stream::new(&d).expect("stream");
    let event = IpcEvent::new(&d).expect("event");
    buf.memset_u8_async(0x5c, &stream).expect("memset");
    event.record(&stream).expect("record");
    chan.send_msg(&event.handle().expect("event handle").to_bytes())
        .expect("send the event");
    assert_eq!(chan.recv_msg().expect("reply"), b"event-ok");
    join(child, CHILD_LIMIT);
}

fn ipc_child() {
    let seed = child_seed();
    let d = child_gpu();
    let chan = parent_channel();
    let bytes = chan.recv_msg().expect("handle");
    let handle = IpcMemHandle::from_bytes(&bytes).expect("decode");
    let n = (1 << 20) + 3;
    // First a forged copy whose length (the last field) reaches past the allocation: refused,
    // on a fresh mapping, which is closed again on the way out (that once deadlocked on the
    // mapping cache's lock).
    let mut forged = bytes.clone();
    let at = forged.len() - 8;
    forged[at..].copy_from_slice(&(64u64 << 20).to_le_bytes());
    let e = IpcMemHandle::from_bytes(&forged)
        .expect("decode")
        .open(&d)
        .map(|_| ())
        .expect_err("a range past the allocation");
    assert!(e.to_string().contains("forged"), "{e}");
    let mut imported = handle.open(&d).expect("open the IPC handle");
    assert_eq!(imported.byte_len(), n * 4);
    assert_eq!(
        imported.to_host_vec::<u32>().expect("read"),
        random_u32(seed, n),
        "sees the exporter's data"
    );
    // The same handle again: the cached mapping, not a second cuIpcOpenMemHandle.
    let again = handle.open(&d).expect("open again");
    assert!(again.shares_mapping_with(&imported));
    drop(again);
    imported
        .copy_from_host(&random_u32(seed ^ 0xc41d, n))
        .expect("write");
    d.synchronize().expect("sync");
    chan.send_msg(b"written").expect("reply");

    let ev = IpcEventHandle::from_bytes(&chan.recv_msg().expect("event"))
        .expect("decode")
        .open(&d)
        .expect("open event");
    let stream = Stream::new(&d).expect("stream");
    ev.wait_on(&stream).expect("wait on the event");
    stream.synchronize().expect("sync");
    assert!(
        holds_only::<u32>(&imported, 0x5c5c_5c5c),
        "ordered after the exporter's fill"
    );
    chan.send_msg(b"event-ok").expect("reply");
}

two_process_tests!(
    "ipc-child", ipc_child, ipc_parent:
    gpu1_ipc_two_processes_one_gpu, gpu2_ipc_two_processes_two_gpus
);

// ---- Two processes: cuMem VMM over a POSIX fd ------------------------------------------------

fn vmm_parent(test: &str, child_gpu: i32) {
    let devs = Device::all().expect("devices");
    let d = &devs[0];
    let peers: Vec<&Device> = devs.iter().skip(1).take(child_gpu as usize).collect();
    let seed = fresh_seed();
    let mut v = VmmBuffer::new(d, 3 << 20, &peers, ShareableHandles::POSIX_FD).expect("alloc");
    let data = random_u8(seed, v.size());
    v.copy_from_host(&data).expect("upload");
    let (desc, fd) = v.export_fd().expect("export");
    assert_eq!(
        VmmHandle::from_bytes(&desc.to_bytes()).expect("decode"),
        desc
    );

    let (_dir, _listener, child, chan) = start_child(test, "vmm", seed, child_gpu);
    chan.send_fd(&desc.to_bytes(), fd.as_fd())
        .expect("send the fd");
    drop(fd);
    assert_eq!(chan.recv_msg().expect("reply"), b"written");
    assert_eq!(
        v.to_host_vec::<u8>().expect("read"),
        random_u8(seed ^ 0x7a11, v.size()),
        "the child's writes are visible"
    );
    join(child, CHILD_LIMIT);
}

fn vmm_child() {
    let seed = child_seed();
    let d = child_gpu();
    let chan = parent_channel();
    let (header, fd) = chan.recv_fd().expect("fd");
    let desc = VmmHandle::from_bytes(&header).expect("decode");
    let mut v = VmmBuffer::import_fd(&d, &desc, fd.as_fd(), &[]).expect("import the fd");
    drop(fd); // the mapping keeps the memory alive
    assert_eq!(
        v.to_host_vec::<u8>().expect("read"),
        random_u8(seed, v.size()),
        "sees the exporter's data"
    );
    v.copy_from_host(&random_u8(seed ^ 0x7a11, v.size()))
        .expect("write");
    d.synchronize().expect("sync");
    chan.send_msg(b"written").expect("reply");
}

two_process_tests!(
    "vmm-child", vmm_child, vmm_parent:
    gpu1_vmm_fd_two_processes_one_gpu, gpu2_vmm_fd_two_processes_two_gpus
);

// ---- Two GPUs in one process -------------------------------------------------------------------

#[test]
#[ignore = "needs 2 GPUs"]
fn gpu2_peer_access_and_peer_copy() {
    let g = gpus(2);
    let (a, b) = (&g[0], &g[1]);
    assert!(
        a.can_access_peer(b).expect("can access") && b.can_access_peer(a).expect("can access"),
        "these GPUs have no P2P"
    );
    let attr = a.p2p_attributes(b).expect("attributes");
    eprintln!("GPU0 -> GPU1: {attr:?}");
    assert!(attr.access_supported);
    for _ in 0..2 {
        a.enable_peer_access(b).expect("enable 0 -> 1 (idempotent)");
        b.enable_peer_access(a).expect("enable 1 -> 0 (idempotent)");
    }
    // Nothing sticky left behind for the runtime's next error check.
    if p2p_sys::probe::require(p2p_sys::Library::Cudart).is_ok() {
        // SAFETY: libcudart is loaded; cudaGetLastError has no preconditions.
        let last = unsafe { p2p_sys::cudart::cudaGetLastError() };
        assert_eq!(last, p2p_sys::cudart::cudaError_t::cudaSuccess);
    }

    let seed = fresh_seed();
    let n = (64 << 20) / 4 + 3;
    let data = random_u32(seed, n);
    let src = DeviceBuffer::from_host(a, &data).expect("upload");
    let mut dst = DeviceBuffer::<u32>::new(b, n).expect("alloc");
    dst.copy_from_device(&src).expect("peer copy 0 -> 1");
    assert_eq!(dst.to_host_vec::<u32>().expect("read"), data);
    let back_data = random_u32(seed + 1, n);
    dst.copy_from_host(&back_data).expect("upload");
    let mut back = DeviceBuffer::<u32>::new(a, n).expect("alloc");
    back.copy_from_device(&dst).expect("peer copy 1 -> 0");
    assert_eq!(back.to_host_vec::<u32>().expect("read"), back_data);

    a.disable_peer_access(b).expect("disable");
    a.disable_peer_access(b).expect("disable again is fine");
    a.enable_peer_access(b).expect("enable again");
}

#[test]
#[ignore = "needs 2 GPUs"]
fn gpu2_vmm_mapped_for_a_peer() {
    let g = gpus(2);
    let (a, b) = (&g[0], &g[1]);
    let mut v = VmmBuffer::new(a, 5 << 20, &[b], ShareableHandles::NONE)
        .expect("alloc with access for GPU 1");
    let data = random_u32(fresh_seed(), v.size() / 4);
    v.copy_from_host(&data).expect("upload");
    let mut on_b = DeviceBuffer::<u32>::new(b, data.len()).expect("alloc");
    on_b.copy_from_device(&v)
        .expect("GPU 1 reads GPU 0's cuMem memory");
    assert_eq!(on_b.to_host_vec::<u32>().expect("read"), data);
}

#[test]
#[ignore = "needs a GPU"]
fn gpu1_shared_host_memory_maps_twice_and_round_trips() {
    use p2p_mem::shm::HostShared;
    let d = &gpus(1)[0];
    let n = (1 << 20) + 3;
    let mut a = HostShared::new(d, n).expect("create");
    assert!(
        a.to_host_vec::<u8>().expect("read").iter().all(|&b| b == 0),
        "starts zeroed"
    );
    let data = random_u8(fresh_seed(), n);
    a.copy_from_host(&data)
        .expect("write through the device address");
    // A second mapping of the same memory file (as another process would make) sees the bytes.
    let fd = a.fd().try_clone_to_owned().expect("dup");
    let b = HostShared::from_fd(d, fd, n).expect("map again");
    assert_eq!(b.to_host_vec::<u8>().expect("read"), data);
    let short = a.fd().try_clone_to_owned().expect("dup");
    assert!(matches!(
        HostShared::from_fd(d, short, n + 4096),
        Err(Error::SizeMismatch { .. })
    ));
    // Its size is sealed: the other process cannot shrink it under this mapping.
    let e = rustix::fs::ftruncate(a.fd(), 4096).expect_err("the size is sealed");
    assert_eq!(e, rustix::io::Errno::PERM);
    // A memory file whose size is not sealed is refused.
    let plain =
        rustix::fs::memfd_create(c"unsealed", rustix::fs::MemfdFlags::CLOEXEC).expect("memfd");
    rustix::fs::ftruncate(&plain, n as u64).expect("size");
    let e = HostShared::from_fd(d, plain, n)
        .map(|_| ())
        .expect_err("unsealed");
    assert!(e.to_string().contains("not sealed"), "{e}");
}

/// A stream borrowed from its owner (`Stream::from_raw`) queues work on the owner's stream, and
/// dropping it leaves the stream alive; memory named by raw pointer (`ExternalMemory`) is read
/// and written in place.
#[test]
#[ignore = "needs a GPU"]
fn gpu1_borrowed_streams_and_external_memory() {
    let d = &gpus(1)[0];
    let owner = Stream::new(d).expect("stream");
    let mut buf = DeviceBuffer::<u8>::new(d, 4096).expect("alloc");
    {
        // SAFETY: `owner` is a live stream of d's primary context and outlives `borrowed`.
        let borrowed = unsafe { Stream::from_raw(d, owner.cu_stream()) };
        // SAFETY: `buf` is live device memory of `d`, 4096 bytes, and outlives `ext`.
        let mut ext = unsafe { p2p_mem::ExternalMemory::from_raw(d, buf.device_ptr(), 4096) };
        ext.memset_u8_async(0x5a, &borrowed)
            .expect("memset on the borrowed stream");
        borrowed.synchronize().expect("sync");
    }
    assert!(holds_only::<u8>(&buf, 0x5a));
    // The owner's stream still works after the borrow was dropped.
    buf.memset_u8_async(0xa5, &owner)
        .expect("memset on the owner");
    owner.synchronize().expect("sync");
    assert!(holds_only::<u8>(&buf, 0xa5));
}

/// cudarc's own context, stream and pool-allocated slices used directly (feature `cudarc`): the
/// views read and write the slices' memory in place, on the cudarc stream; the rules are
/// enforced (a view needs a cudarc stream; pool memory cannot be shared with peers).
#[cfg(feature = "cudarc")]
#[test]
#[ignore = "needs a GPU"]
fn gpu1_cudarc_slices_and_streams_in_place() {
    use p2p_mem::cudarc_interop::{view, view_mut};
    let ctx = cudarc::driver::CudaContext::new(0).expect("cudarc context");
    let cu = ctx.new_stream().expect("cudarc stream");
    let d = Device::from_cudarc(&ctx).expect("primary context");
    let s = Stream::from_cudarc(&d, &cu).expect("borrowed stream");
    assert_eq!(s.cu_stream(), cu.cu_stream() as p2p_sys::cuda::CUstream);
    let host: Vec<u32> = (0..10_001).map(|i| i * 3 + 1).collect();
    let mut slice = cu.clone_htod(&host).expect("upload");
    {
        // Read in place through p2p.
        let v = view(&s, &slice).expect("view");
        assert_eq!(v.byte_len(), host.len() * 4);
        assert_eq!(v.to_host_vec::<u32>().expect("read"), host);
        // The pool rule: peers cannot map cudarc's stream-ordered pool memory.
        let e = p2p_mem::check_peer_mappable(&v).expect_err("pool memory");
        assert!(e.to_string().contains("stream-ordered memory pool"), "{e}");
    }
    {
        // Write in place through p2p, on the cudarc stream.
        let mut v = view_mut(&s, &mut slice).expect("view_mut");
        v.memset_u8_async(0x11, &s)
            .expect("memset on the cudarc stream");
        // The view is bound to its stream: work on another stream is refused (cudarc frees
        // the slice after that stream's work only).
        let other = Stream::new(&d).expect("stream");
        let e = v.memset_u8_async(0x22, &other).expect_err("another stream");
        assert!(e.to_string().contains("bound to stream"), "{e}");
        // A host read through the view waits for the stream's queued memset.
        assert!(holds_only::<u32>(&v, 0x1111_1111));
    }
    let back: Vec<u32> = cu.clone_dtoh(&slice).expect("download");
    assert!(back.iter().all(|&x| x == 0x1111_1111), "{:?}", &back[..4]);
    // A view needs a stream that came from cudarc.
    let plain = Stream::new(&d).expect("stream");
    assert!(view(&plain, &slice).is_err());
}

#[test]
#[ignore = "needs a GPU"]
fn gpu1_a_cached_cubin_the_driver_refuses_is_compiled_again() {
    use p2p_mem::kernel::{arch_for, cache_file, compile, LaunchConfig, Module, Source};
    let d = &gpus(1)[0];
    let arch = arch_for(d);
    // A source no earlier run has cached: its text names this process and the time.
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |t| t.as_nanos());
    let code = format!(
        "// {} {stamp}\nextern \"C\" __global__ void seven(int* p) {{ *p = 7; }}\n",
        std::process::id()
    );
    let source = Source {
        name: "refused.cu",
        code: Box::leak(code.into_boxed_str()),
        defines: &[],
        shipped: &[],
    };
    let file = cache_file(&source, &arch)
        .expect("NVRTC")
        .expect("a cache folder (HOME)");
    // A cubin that looks whole to the cache but that the driver refuses: its ELF header names
    // another machine (x86-64, not CUDA's 190) and no architecture.
    let mut bad = compile(&source, &arch).expect("compiles");
    bad[0x12..0x14].copy_from_slice(&62u16.to_le_bytes());
    bad[0x30..0x34].fill(0);
    std::fs::create_dir_all(file.parent().expect("a folder")).expect("the cache folder");
    std::fs::write(&file, &bad).expect("written");
    match Module::load(d, &bad) {
        Ok(_) => panic!("the driver loaded the damaged cubin: the test damages it too little"),
        Err(e) => eprintln!("refused: {e}"),
    }
    let module = Module::build(d, &source).expect("compiled again after the refusal");
    let out = DeviceBuffer::<i32>::zeroed(d, 1).expect("alloc");
    // SAFETY: seven(int*) takes one pointer, to `out`'s one int.
    unsafe { module.launch_sync("seven", LaunchConfig::new(1, 1), &out.device_ptr()) }
        .expect("runs");
    assert_eq!(out.to_host_vec::<i32>().expect("read"), [7]);
    let cached = std::fs::read(&file).expect("cached again");
    assert_ne!(cached, bad, "the damaged file was replaced");
    let _ = std::fs::remove_file(&file);
}

/// A `Function` keeps its module loaded after the `Module` is dropped (its handle stays valid),
/// launches only through the module it came from, and `Module::load` refuses an image the
/// driver would read past (PTX without its NUL).
#[test]
#[ignore = "needs a GPU"]
fn gpu1_a_function_keeps_its_module_and_launches_only_through_it() {
    use p2p_mem::kernel::{LaunchConfig, Module, Source};
    let d = &gpus(1)[0];
    const EIGHT: Source = Source {
        name: "eight.cu",
        code: "extern \"C\" __global__ void eight(int* p) { *p = 8; }\n",
        defines: &[],
        shipped: &[],
    };
    let module = Module::build(d, &EIGHT).expect("compiles");
    let f = module.function::<u64>("eight").expect("the kernel");
    let other = Module::build(d, &EIGHT).expect("loads again");
    let stream = Stream::new(d).expect("stream");
    let out = DeviceBuffer::<i32>::zeroed(d, 1).expect("alloc");
    // SAFETY: eight(int*) takes one pointer, to `out`'s one int (refused before any launch).
    let e = unsafe { other.launch(&f, LaunchConfig::new(1, 1), &out.device_ptr(), &stream) }
        .expect_err("another module");
    assert!(e.to_string().contains("does not belong"), "{e}");
    drop(module);
    // The module's handle lives on in `f`.
    assert!(f.max_blocks_per_sm(32).expect("occupancy") >= 1);
    let e = Module::load(d, b".version 8.0")
        .map(|_| ())
        .expect_err("no NUL");
    assert!(e.to_string().contains("NUL-terminated PTX"), "{e}");
}

// ---- Waits with a deadline (issue 37) -------------------------------------------------------

/// How far past its limit a wait with a deadline may return: one poll (at most 1 ms apart)
/// and the scheduler.
const SLACK: Duration = Duration::from_millis(250);

/// The threads of this process named `name` (from /proc).
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .filter_map(|t| t.ok())
                .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
                .filter(|comm| comm.trim() == name)
                .count()
        })
        .unwrap_or(0)
}

/// Asserts that a wait of `limit` gave up within it (and not much past it).
fn gave_up_at(limit: Duration, took: Duration, what: &str) {
    assert!(
        took >= limit && took < limit + SLACK,
        "{what}: gave up after {took:?}, the limit is {limit:?}"
    );
}

/// A stream's, an event's and the whole device's waits with a deadline give up at it while a
/// kernel is held, stop nothing, and leave no thread blocked in the driver (the device's wait
/// polls an event of `cuCtxRecordEvent` where the driver has it); once the kernel is let go,
/// each wait sees the work end.
#[test]
#[ignore = "needs a GPU"]
fn gpu1_waits_with_a_deadline_give_up_at_it_and_leave_no_thread_behind() {
    let d = &gpus(1)[0];
    let (stream, held) = Held::on_new_stream(d);
    let event = p2p_mem::Event::new(d).expect("event");
    event.record(&stream).expect("record");
    let limit = Duration::from_millis(300);
    let before = threads_named("p2p-sync");

    let t = std::time::Instant::now();
    assert!(!stream.synchronize_within(limit).expect("stream wait"));
    gave_up_at(limit, t.elapsed(), "the stream");

    assert!(!event.is_done().expect("query"));
    let t = std::time::Instant::now();
    assert!(!event.synchronize_within(limit).expect("event wait"));
    gave_up_at(limit, t.elapsed(), "the event");

    let t = std::time::Instant::now();
    assert!(!d.synchronize_within(limit).expect("device wait"));
    gave_up_at(limit, t.elapsed(), "the device");
    if p2p_sys::ctx_event::has("cuCtxRecordEvent") {
        assert_eq!(
            threads_named("p2p-sync"),
            before,
            "a helper thread was left blocked in cuCtxSynchronize"
        );
    } else {
        eprintln!("this driver has no cuCtxRecordEvent: the device's wait used a helper thread");
    }

    held.release();
    let long = Duration::from_secs(10);
    assert!(stream.synchronize_within(long).expect("stream wait"));
    assert!(event.synchronize_within(long).expect("event wait"));
    assert!(event.is_done().expect("query"));
    assert!(d.synchronize_within(long).expect("device wait"));
}

/// A synchronous copy is ordered after the legacy default stream's work, as the driver's own
/// is, but waits for it at most its limit: held there, it gives up with `Busy` and leaves the
/// host memory alone; a kernel held on one of p2p's (non-blocking) streams does not delay it
/// at all. Let go, the copy is made.
#[test]
#[ignore = "needs a GPU"]
fn gpu1_a_synchronous_copy_waits_for_the_work_before_it_at_most_its_limit() {
    let d = &gpus(1)[0];
    let data: Vec<u32> = (0..4096).collect();
    let buf = DeviceBuffer::from_host(d, &data).expect("upload");

    // Work on a non-blocking stream: not waited for.
    let (stream, held) = Held::on_new_stream(d);
    let t = std::time::Instant::now();
    assert_eq!(buf.to_host_vec::<u32>().expect("read"), data);
    assert!(
        t.elapsed() < Duration::from_secs(2),
        "waited {:?} for a kernel on a non-blocking stream",
        t.elapsed()
    );
    held.release_and_wait(&stream);

    // Work on the legacy default stream: waited for, at most the limit.
    // SAFETY: the null handle is the legacy default stream of `d`'s primary context, alive as
    // long as the context.
    let legacy = unsafe { Stream::from_raw(d, std::ptr::null_mut()) };
    let held = Held::on(&legacy);
    let limit = Duration::from_millis(300);
    let mut out = vec![u32::MAX; data.len()];
    let t = std::time::Instant::now();
    let e = buf
        .copy_range_to_host_within(0, &mut out, limit)
        .expect_err("the legacy stream is held");
    gave_up_at(limit, t.elapsed(), "the copy");
    assert!(matches!(e, Error::Busy { .. }), "{e}");
    assert!(e.to_string().contains("was not made"), "{e}");
    assert!(
        out.iter().all(|&v| v == u32::MAX),
        "the copy wrote after all"
    );
    held.release();
    buf.copy_range_to_host_within(0, &mut out, Duration::from_secs(10))
        .expect("made once the work ended");
    assert_eq!(out, data);
}

/// An IPC event's wait has a limit too (`cuEventQuery` polled): it gives up while the recorded
/// work is held, and succeeds once it ends.
#[test]
#[ignore = "needs a GPU"]
fn gpu1_an_ipc_event_wait_gives_up_at_its_limit() {
    let d = &gpus(1)[0];
    let (stream, held) = Held::on_new_stream(d);
    let event = IpcEvent::new(d).expect("event");
    event.record(&stream).expect("record");
    let limit = Duration::from_millis(300);
    let t = std::time::Instant::now();
    assert!(!event.synchronize_within(limit).expect("wait"));
    gave_up_at(limit, t.elapsed(), "the IPC event");
    held.release();
    event.synchronize().expect("ended");
}

/// Dropping a cuMem buffer while the GPU is busy waits for the work (it may use the buffer),
/// polling, and frees it once the work ends; no thread is left behind.
#[test]
#[ignore = "needs a GPU"]
fn gpu1_a_buffer_dropped_while_the_gpu_is_busy_is_freed_once_its_work_ends() {
    let d = &gpus(1)[0];
    let stream = Stream::new(d).expect("stream");
    let v = VmmBuffer::new(d, 2 << 20, &[], ShareableHandles::POSIX_FD).expect("alloc");
    let held = Held::on(&stream);
    let before = threads_named("p2p-sync");
    let release_after = Duration::from_millis(700);
    std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(release_after);
            held.release();
        });
        let t = std::time::Instant::now();
        drop(v);
        let took = t.elapsed();
        assert!(
            took >= release_after - Duration::from_millis(50) && took < Duration::from_secs(10),
            "the drop returned after {took:?}; the kernel ran for {release_after:?}"
        );
    });
    if p2p_sys::ctx_event::has("cuCtxRecordEvent") {
        assert_eq!(threads_named("p2p-sync"), before);
    }
    assert!(stream
        .synchronize_within(Duration::from_secs(10))
        .expect("wait"));
}

/// The synchronous copies and fills go through the device's own stream and staging memory in
/// pieces of 8 MiB: every size across a piece's edge arrives whole, into pageable and pinned
/// host memory alike, and between two buffers.
#[test]
#[ignore = "needs a GPU"]
fn gpu1_synchronous_copies_cross_their_staging_pieces_intact() {
    let d = &gpus(1)[0];
    let seed = fresh_seed();
    const PIECE: usize = 8 << 20;
    for (i, n) in [1, PIECE - 1, PIECE, PIECE + 3, 2 * PIECE + 4097]
        .into_iter()
        .enumerate()
    {
        let data = random_u8(seed + i as u64, n);
        let buf = DeviceBuffer::from_host(d, &data).expect("upload");
        assert!(
            buf.to_host_vec::<u8>().expect("download") == data,
            "{n} bytes"
        );
        let mut pinned = PinnedHostBuffer::<u8>::new(d, n).expect("pinned");
        buf.copy_to_host(&mut pinned[..])
            .expect("download into pinned memory");
        assert!(pinned[..] == data[..], "{n} bytes into pinned memory");
        let mut copy = DeviceBuffer::<u8>::new(d, n).expect("alloc");
        copy.copy_from_device(&buf).expect("device to device");
        assert!(
            copy.to_host_vec::<u8>().expect("download") == data,
            "{n} bytes copied"
        );
        copy.memset_u8(0xA5).expect("fill");
        let filled = copy.to_host_vec::<u8>().expect("download");
        assert!(filled.iter().all(|&b| b == 0xA5), "{n} bytes filled");
        let at = n / 2;
        let mut tail = vec![0u8; n - at];
        buf.copy_range_to_host(at, &mut tail).expect("a range");
        assert!(tail[..] == data[at..], "{n} bytes from {at}");
    }
}
