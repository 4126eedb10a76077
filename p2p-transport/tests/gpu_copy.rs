//! The in-process data paths on real GPUs. Ignored in CI; the bundle's run.sh runs them.
//! `gpu1_*` need one GPU, `gpu2_*` two with P2P.

use p2p_testkit::{all_gpus as gpus, fresh_seed as seed, random_u8 as random_bytes};

use p2p_mem::{Device, DeviceBuffer, DeviceMemory, DeviceMemoryMut, Stream};
use p2p_transport::config::{Config, ForcedMode};
use p2p_transport::copy::Path;
use p2p_transport::mode::{one_process, select, Mode};
use p2p_transport::Transport;

/// Odd sizes from the issue: 1 B, 4095 B, 1 MiB + 3, 256 MiB.
const SIZES: [usize; 4] = [1, 4095, (1 << 20) + 3, 256 << 20];

/// At least `n` GPUs (every one there is) and a transport over them.
fn transport(n: usize) -> (Vec<Device>, Transport) {
    let g = gpus(n);
    let t = Transport::new(g.clone());
    (g, t)
}

/// Copies `n` random bytes from `src_dev` to `dst_dev` by `path` at the given byte offsets into
/// the buffers (to test unaligned pointers), with the destination poisoned first; checks every
/// byte, and that the bytes around the destination range are untouched.
fn check(
    t: &Transport,
    src_dev: &Device,
    dst_dev: &Device,
    path: Path,
    n: usize,
    offsets: (usize, usize),
    seed: u64,
) {
    let data = random_bytes(seed, n);
    let mut src = DeviceBuffer::<u8>::new(src_dev, n + offsets.0).expect("alloc");
    src.slice_mut(offsets.0..)
        .expect("view")
        .copy_from_host(&data)
        .expect("upload");
    let mut dst = DeviceBuffer::<u8>::new(dst_dev, n + offsets.1 + 64).expect("alloc");
    dst.memset_u8(0xee).expect("poison");
    let runner = if path == Path::SmRead {
        dst_dev
    } else {
        src_dev
    };
    let stream = Stream::new(runner).expect("stream");
    {
        let src_view = src.slice(offsets.0..).expect("view");
        let mut dst_view = dst.slice_mut(offsets.1..offsets.1 + n).expect("view");
        t.copy(&mut dst_view, &src_view, path, &stream)
            .expect("copy");
    }
    stream.synchronize().expect("the copy ran");
    let all = dst.to_host_vec::<u8>().expect("download");
    let what = format!(
        "{path:?} GPU{} -> GPU{} {n} B offsets {offsets:?}",
        src_dev.ordinal(),
        dst_dev.ordinal()
    );
    let wrong = all[offsets.1..offsets.1 + n]
        .iter()
        .zip(&data)
        .filter(|(a, b)| a != b)
        .count();
    assert_eq!(wrong, 0, "{what}: {wrong} wrong bytes");
    assert!(
        all[..offsets.1]
            .iter()
            .chain(&all[offsets.1 + n..])
            .all(|&b| b == 0xee),
        "{what}: wrote outside the range"
    );
}

#[test]
#[ignore = "needs 2 GPUs"]
fn gpu2_every_path_moves_odd_sizes_both_ways() {
    let (g, t) = transport(2);
    let s = seed();
    for (a, b) in [(0, 1), (1, 0)] {
        // The relay runs through the destination GPU itself: with two GPUs there is no third one,
        // so this checks the pipeline's mechanics (two legs, slots, events), not a real detour.
        for path in [
            Path::CopyEngine,
            Path::SmWrite,
            Path::SmRead,
            Path::HostStaged,
            Path::Relay { via: b as i32 },
        ] {
            for (i, &n) in SIZES.iter().enumerate() {
                check(&t, &g[a], &g[b], path, n, (0, 0), s + i as u64);
            }
            // Unaligned source and destination: the kernel's byte path, the engines' odd addresses.
            check(&t, &g[a], &g[b], path, (1 << 20) + 3, (3, 5), s ^ 0xabc);
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn gpu1_paths_within_one_gpu() {
    let (g, t) = transport(1);
    let s = seed();
    for path in [
        Path::CopyEngine,
        Path::SmWrite,
        Path::SmRead,
        Path::HostStaged,
    ] {
        for (i, &n) in SIZES.iter().enumerate() {
            check(&t, &g[0], &g[0], path, n, (0, 0), s + i as u64);
        }
        check(&t, &g[0], &g[0], path, 4095, (1, 2), s);
    }
}

/// The error of a copy that must be refused, by a transport over (at least) `gpus` GPUs: from a
/// zeroed buffer of `src.1` bytes on GPU `src.0` into one of `dst.1` bytes on GPU `dst.0`, by
/// `path`, on a stream of GPU `on`.
fn refused(
    gpus: usize,
    src: (usize, usize),
    dst: (usize, usize),
    path: Path,
    on: usize,
) -> p2p_transport::Error {
    let (g, t) = transport(gpus);
    let src = DeviceBuffer::<u8>::zeroed(&g[src.0], src.1).expect("alloc");
    let mut dst = DeviceBuffer::<u8>::zeroed(&g[dst.0], dst.1).expect("alloc");
    let stream = Stream::new(&g[on]).expect("stream");
    t.copy(&mut dst, &src, path, &stream)
        .expect_err("the copy must be refused")
}

#[test]
#[ignore = "needs a GPU"]
fn gpu1_sm_paths_demand_the_right_stream_and_sizes() {
    let e = refused(1, (0, 16), (0, 8), Path::CopyEngine, 0);
    assert!(
        matches!(e, p2p_transport::Error::InvalidArgument(_))
            && e.to_string().contains("holds 8 bytes but the source 16"),
        "{e}"
    );
    refused(1, (0, 16), (0, 8), Path::Relay { via: 7 }, 0);
}

#[test]
#[ignore = "needs 2 GPUs"]
fn gpu2_sm_write_needs_the_source_stream() {
    // The stream is on the destination GPU.
    let e = refused(2, (0, 64), (1, 64), Path::SmWrite, 1);
    assert!(
        e.to_string()
            .contains("runs on the source GPU 0, but the stream is on GPU 1"),
        "{e}"
    );
}

#[test]
#[ignore = "needs 2 GPUs"]
fn gpu2_routes_from_mode_selection_move_data() {
    let g = gpus(2);
    let topo = p2p_transport::topo::discover().expect("topology");
    let t = Transport::new(g.clone());
    let s = seed();
    let host = Config {
        force_mode: Some(ForcedMode::HostStaged),
        ..Config::default()
    };
    let ce = Config {
        use_copy_engine: true,
        ..Config::default()
    };
    for cfg in [Config::default(), host, ce] {
        for route in select(&topo, &one_process(2), &cfg).expect("routes") {
            eprintln!("{route}: {}", route.reason);
            let (a, b) = (&g[route.from.gpu], &g[route.to.gpu]);
            let n = (8 << 20) + 1;
            let data = random_bytes(s ^ route.from.gpu as u64, n);
            let src = DeviceBuffer::from_host(a, &data).expect("upload");
            let mut dst = DeviceBuffer::<u8>::zeroed(b, n).expect("alloc");
            let runner = if route.direction == p2p_transport::mode::Direction::Read
                && route.mode == Mode::DirectPointer
            {
                b
            } else {
                a
            };
            let stream = Stream::new(runner).expect("stream");
            t.copy_route(&route, &mut dst, &src, &stream).expect("copy");
            stream.synchronize().expect("ran");
            assert_eq!(dst.to_host_vec::<u8>().expect("download"), data, "{route}");
        }
    }
}

#[test]
#[ignore = "needs 2 GPUs"]
fn gpu2_copy_peer_follows_mode_selection_from_either_stream() {
    let g = gpus(2);
    let s = seed();
    let host = Config {
        force_mode: Some(ForcedMode::HostStaged),
        ..Config::default()
    };
    let write = Config {
        read: p2p_transport::config::Switch::Off,
        ..Config::default()
    };
    let ce = Config {
        use_copy_engine: true,
        ..Config::default()
    };
    for (cfg, want) in [
        (Config::default(), Mode::DirectPointer),
        (write, Mode::DirectPointer),
        (ce, Mode::DirectPointer),
        (host, Mode::HostStaged),
    ] {
        let t = Transport::new(g.clone());
        t.set_config(cfg.clone());
        for (a, b) in [(0, 1), (1, 0)] {
            for on in [a, b] {
                let n = (4 << 20) + 5;
                let data = random_bytes(s ^ (a * 2 + on) as u64, n);
                let src = DeviceBuffer::from_host(&g[a], &data).expect("upload");
                let mut dst = DeviceBuffer::<u8>::zeroed(&g[b], n).expect("alloc");
                let stream = Stream::new(&g[on]).expect("stream");
                let route = t.copy_peer(&mut dst, &src, &stream).expect("copy_peer");
                stream.synchronize().expect("ran");
                assert_eq!(route.mode, want, "{route}");
                assert_eq!(
                    dst.to_host_vec::<u8>().expect("download"),
                    data,
                    "{route} with the stream on GPU {on}"
                );
            }
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn gpu1_copy_peer_on_one_gpu_is_a_local_copy() {
    let (g, t) = transport(1);
    let data = random_bytes(seed(), 4095);
    let src = DeviceBuffer::from_host(&g[0], &data).expect("upload");
    let mut dst = DeviceBuffer::<u8>::zeroed(&g[0], 4095).expect("alloc");
    let stream = Stream::new(&g[0]).expect("stream");
    let route = t.copy_peer(&mut dst, &src, &stream).expect("copy_peer");
    stream.synchronize().expect("ran");
    assert_eq!(route.mode, Mode::Local);
    assert_eq!(dst.to_host_vec::<u8>().expect("download"), data);
}
