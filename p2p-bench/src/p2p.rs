//! `p2p-bench p2p`: the equivalent of CUDA's p2pBandwidthLatencyTest for every GPU pair.
//!
//! Unidirectional and bidirectional bandwidth matrices for each path (host-staged, copy engine,
//! SM write, SM read, and plain `cudaMemcpyPeerAsync` in the same run), GPU and CPU latency
//! matrices, and a size sweep from 4 B to 1 GiB per path and ordered pair. Each figure is the
//! median of `samples` CUDA-event timings of many back-to-back copies after a warm-up; buffers
//! rotate through 1 GiB so small copies are not served from L2. Results go out as JSON plus a
//! Markdown table.

use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Instant;

use crate::progress::Progress;

use p2p_mem::{Device, DeviceBuffer, DeviceMemory, DeviceMemoryMut, Event, Stream};
use p2p_transport::conn::{connect_in_process, ConnOptions, RecvConn, SendConn};
use p2p_transport::copy::{Path, SmGrid};
use p2p_transport::mode::Engine;
use p2p_transport::Transport;
use serde_json::{json, Value};
use statrs::statistics::{Data, Max, Min, OrderStatistics};

/// SM kernel launch shapes tried by the grid sweep: (blocks per SM, threads per block).
pub const SM_GRIDS: [(u32, u32); 9] = [
    (1, 256),
    (1, 512),
    (1, 1024),
    (2, 256),
    (2, 512),
    (2, 1024),
    (4, 256),
    (4, 512),
    (8, 256),
];

/// send/recv ring shapes tried at the matrix size: (slots, KiB per slot, copy engine?).
pub const RING_SHAPES: [(u32, usize, bool); 6] = [
    (128, 256, false),
    (128, 1024, false),
    (64, 2048, false),
    (32, 4096, false),
    (32, 4096, true),
    (16, 16384, true),
];

/// One way of moving the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Our pinned double-buffer pipeline (P2P disabled).
    HostStaged,
    /// Our chunked `cuMemcpyPeerAsync`.
    CopyEngine,
    /// Our SM kernel on the source GPU, storing into the peer.
    SmWrite,
    /// Our SM kernel on the destination GPU, loading from the peer.
    SmRead,
    /// Plain `cudaMemcpyPeerAsync`, the reference.
    CudaMemcpyPeer,
    /// Our send/recv kernels through a connection's slot ring (one process).
    SendRecv,
}

impl Method {
    /// All methods, in table order.
    pub const ALL: [Method; 6] = [
        Method::HostStaged,
        Method::CopyEngine,
        Method::SmWrite,
        Method::SmRead,
        Method::CudaMemcpyPeer,
        Method::SendRecv,
    ];

    /// The name in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Method::HostStaged => "host-staged",
            Method::CopyEngine => "copy engine",
            Method::SmWrite => "SM write",
            Method::SmRead => "SM read",
            Method::CudaMemcpyPeer => "cudaMemcpyPeerAsync",
            Method::SendRecv => "send/recv",
        }
    }
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct Options {
    /// Size of the matrix measurements (256 MiB).
    pub matrix_bytes: usize,
    /// Largest size of the sweep (1 GiB).
    pub max_bytes: usize,
    /// Timed samples per figure (at least 20).
    pub samples: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            matrix_bytes: 256 << 20,
            max_bytes: 1 << 30,
            samples: 20,
        }
    }
}

/// Median, minimum and maximum of a figure over its samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Stat {
    /// The median.
    pub median: f64,
    /// The lowest sample.
    pub min: f64,
    /// The highest sample.
    pub max: f64,
}

impl Stat {
    /// Summarises samples (all zero if there are none). The order statistics are statrs's
    /// (the median of an even count is the mean of the middle two).
    pub fn of(v: Vec<f64>) -> Stat {
        if v.is_empty() {
            return Stat {
                median: 0.0,
                min: 0.0,
                max: 0.0,
            };
        }
        let mut d = Data::new(v);
        Stat {
            median: d.median(),
            min: d.min(),
            max: d.max(),
        }
    }

    fn json(&self) -> Value {
        json!({"median": self.median, "min": self.min, "max": self.max})
    }
}

/// Sizes of the sweep: 4 B, 16 B, ... up to `max`, by factors of 4.
pub fn sweep_sizes(max: usize) -> Vec<usize> {
    std::iter::successors(Some(4usize), |s| s.checked_mul(4))
        .take_while(|s| *s <= max)
        .collect()
}

/// Human-readable size: 4 B, 16 KiB, 1 GiB.
pub fn size_name(bytes: usize) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{} GiB", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} B"),
    }
}

/// (source GPU, destination GPU, slots, slot bytes, copy engine?).
type ConnKey = (usize, usize, u32, usize, bool);

struct Bench<'a> {
    t: &'a Transport,
    devices: &'a [Device],
    src: Vec<DeviceBuffer<u8>>,
    dst: Vec<DeviceBuffer<u8>>,
    samples: usize,
    conns: RefCell<HashMap<ConnKey, (SendConn, RecvConn)>>,
}

/// Copies per timed sample: ~1 GiB worth, at least 2 (so the host's launch gap after the start
/// event is amortised) and at most 200.
fn iters_for(bytes: usize) -> usize {
    ((1usize << 30) / bytes.max(1)).clamp(2, 200)
}

impl Bench<'_> {
    fn runner(&self, m: Method, a: usize, b: usize) -> &Device {
        if m == Method::SmRead {
            &self.devices[b]
        } else {
            &self.devices[a]
        }
    }

    /// Queues `iters` copies a -> b of `bytes`, rotating through the buffers.
    fn enqueue(
        &self,
        m: Method,
        (a, b): (usize, usize),
        bytes: usize,
        iters: usize,
        first: usize,
        stream: &Stream,
    ) -> p2p_transport::Result<()> {
        let room = self.src[a].len().min(self.dst[b].len());
        let stride = bytes.next_multiple_of(256);
        let positions = ((room - bytes) / stride + 1).max(1);
        for i in 0..iters {
            let off = ((first + i) % positions) * stride;
            let src = self.src[a].slice(off..off + bytes)?;
            // A shared buffer cannot be borrowed mutably twice; copy into a view of our own dst.
            let dst_ptr = self.dst[b].device_ptr() + off as u64;
            match m {
                Method::CudaMemcpyPeer => runtime_memcpy_peer(
                    dst_ptr,
                    &self.devices[b],
                    src.device_ptr(),
                    &self.devices[a],
                    bytes,
                    stream,
                )?,
                _ => {
                    let path = match m {
                        Method::HostStaged => Path::HostStaged,
                        Method::CopyEngine => Path::CopyEngine,
                        Method::SmWrite => Path::SmWrite,
                        _ => Path::SmRead,
                    };
                    let mut dst = RawRegion {
                        device: &self.devices[b],
                        ptr: dst_ptr,
                        bytes,
                    };
                    self.t.copy(&mut dst, &src, path, stream)?;
                }
            }
        }
        Ok(())
    }

    /// GB/s of send/recv a -> b: the receiver's kernel on b's stream, the sender's on a's.
    fn sendrecv_bandwidth(
        &self,
        a: usize,
        b: usize,
        bytes: usize,
        shape: ConnOptions,
    ) -> p2p_transport::Result<Stat> {
        let mut conns = self.conns.borrow_mut();
        let (tx, rx) = match conns.entry((
            a,
            b,
            shape.slots,
            shape.slot_bytes,
            shape.engine == Engine::CopyEngine,
        )) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => e.insert(connect_in_process(
                self.t,
                &self.devices[a],
                &self.devices[b],
                (a, b),
                shape,
            )?),
        };
        let iters = iters_for(bytes);
        let (s1, s2) = (
            Stream::new(&self.devices[a])?,
            Stream::new(&self.devices[b])?,
        );
        let (start, end) = (
            Event::timing(&self.devices[a])?,
            Event::timing(&self.devices[a])?,
        );
        let joined = Event::new(&self.devices[b])?;
        let room = self.src[a].len().min(self.dst[b].len());
        let stride = bytes.next_multiple_of(256);
        let positions = ((room - bytes) / stride + 1).max(1);
        let mut samples = Vec::with_capacity(self.samples);
        for k in 0..self.samples + 2 {
            start.record(&s1)?;
            start.wait_on(&s2)?;
            for i in 0..iters {
                let off = ((k * iters + i) % positions) * stride;
                let mut dst = RawRegion {
                    device: &self.devices[b],
                    ptr: self.dst[b].device_ptr() + off as u64,
                    bytes,
                };
                rx.recv(&mut dst, &s2)?;
                tx.send(&self.src[a].slice(off..off + bytes)?, &s1)?;
            }
            joined.record(&s2)?;
            joined.wait_on(&s1)?;
            end.record(&s1)?;
            end.synchronize()?;
            tx.wait(&s1)?;
            rx.wait(&s2)?;
            let ms = start.elapsed_ms(&end)? as f64;
            if k >= 2 {
                samples.push((bytes * iters) as f64 / (ms * 1e-3) / 1e9);
            }
        }
        Ok(Stat::of(samples))
    }

    /// GB/s of a -> b, and with `both` of b -> a at the same time (bytes of both counted).
    fn bandwidth(
        &self,
        m: Method,
        a: usize,
        b: usize,
        bytes: usize,
        both: bool,
    ) -> p2p_transport::Result<Stat> {
        if m == Method::SendRecv {
            return self.sendrecv_bandwidth(a, b, bytes, ConnOptions::default());
        }
        let iters = iters_for(bytes);
        let s1 = Stream::new(self.runner(m, a, b))?;
        let s2 = Stream::new(self.runner(m, b, a))?;
        let (start, end) = (Event::timing(s1.device())?, Event::timing(s1.device())?);
        let joined = Event::new(s2.device())?;
        let mut samples = Vec::with_capacity(self.samples);
        for k in 0..self.samples + 2 {
            start.record(&s1)?;
            self.enqueue(m, (a, b), bytes, iters, k * iters, &s1)?;
            if both {
                start.wait_on(&s2)?;
                self.enqueue(m, (b, a), bytes, iters, k * iters + 1, &s2)?;
                joined.record(&s2)?;
                joined.wait_on(&s1)?;
            }
            end.record(&s1)?;
            end.synchronize()?;
            let ms = start.elapsed_ms(&end)? as f64;
            if k >= 2 {
                // The first two are warm-up: kernel compilation, pipelines, first touch.
                let moved = (bytes * iters * if both { 2 } else { 1 }) as f64;
                samples.push(moved / (ms * 1e-3) / 1e9);
            }
        }
        Ok(Stat::of(samples))
    }
}

/// Device memory named by pointer, for the benchmark's rotating views of its own buffers.
struct RawRegion<'a> {
    device: &'a Device,
    ptr: u64,
    bytes: usize,
}

// SAFETY: a RawRegion is only made in this module, from a sub-range of one of the benchmark's
// own live buffers, and used while that buffer lives.
#[allow(unsafe_code)]
unsafe impl DeviceMemory for RawRegion<'_> {
    fn device(&self) -> &Device {
        self.device
    }
    fn device_ptr(&self) -> u64 {
        self.ptr
    }
    fn byte_len(&self) -> usize {
        self.bytes
    }
}
// SAFETY: as above; the benchmark writes only its own destination buffers.
#[allow(unsafe_code)]
unsafe impl DeviceMemoryMut for RawRegion<'_> {}

/// CPU-side latency: a 4-byte `cuMemcpyPeerAsync` plus stream synchronisation, timed on the host.
fn cpu_latency_us(t: &Transport, a: &Device, b: &Device) -> p2p_transport::Result<Stat> {
    let src = DeviceBuffer::<u32>::zeroed(a, 1)?;
    let mut dst = DeviceBuffer::<u32>::zeroed(b, 1)?;
    let s = Stream::new(a)?;
    let mut samples = Vec::new();
    for k in 0..22 {
        let t0 = Instant::now();
        for _ in 0..100 {
            t.copy(&mut dst, &src, Path::CopyEngine, &s)?;
            s.synchronize()?;
        }
        if k >= 2 {
            samples.push(t0.elapsed().as_secs_f64() * 1e6 / 100.0);
        }
    }
    Ok(Stat::of(samples))
}

/// Runs the whole benchmark and returns its results as JSON.
pub fn run(opts: &Options) -> p2p_transport::Result<Value> {
    let devices = Device::all()?;
    let n = devices.len();
    let t = Transport::new(devices.clone());
    let buf = opts.max_bytes.max(opts.matrix_bytes);
    eprintln!("allocating {} x 2 per GPU on {n} GPU(s)", size_name(buf));
    let mut src = Vec::new();
    let mut dst = Vec::new();
    for d in &devices {
        let mut s = DeviceBuffer::<u8>::new(d, buf)?;
        // Real bytes, not zeros (idle memory can be faster to read on some parts).
        s.memset_u8(0x5a)?;
        src.push(s);
        dst.push(DeviceBuffer::<u8>::zeroed(d, buf)?);
    }
    // P2P enabled for every pair before anything is timed: without it, peer copies (ours and
    // cudaMemcpyPeerAsync alike) are silently staged through the host by the driver.
    for a in &devices {
        for b in &devices {
            if a != b && a.can_access_peer(b)? {
                t.ensure_peer_access(a, b)?;
            }
        }
    }
    let bench = Bench {
        t: &t,
        devices: &devices,
        src,
        dst,
        samples: opts.samples.max(1),
        conns: RefCell::new(HashMap::new()),
    };
    let pairs: Vec<(usize, usize)> = (0..n)
        .flat_map(|a| (0..n).filter(move |&b| b != a).map(move |b| (a, b)))
        .collect();
    let sizes = sweep_sizes(opts.max_bytes);
    let total = (SM_GRIDS.len() * 2 + RING_SHAPES.len()) * pairs.len().min(1)
        + Method::ALL.len() * n * n
        + (Method::ALL.len() - 1) * pairs.len()
        + 2 * pairs.len()
        + Method::ALL.len() * sizes.len() * pairs.len();
    let progress = Progress::new(total);

    // The SM kernel's launch shape, on the first pair, before the matrices use the default.
    let mut grid_sweep = Vec::new();
    if let Some(&(a, b)) = pairs.first() {
        for &(blocks_per_sm, threads) in &SM_GRIDS {
            t.set_sm_grid(SmGrid {
                blocks_per_sm,
                threads,
            })?;
            for m in [Method::SmWrite, Method::SmRead] {
                let st = bench.bandwidth(m, a, b, opts.matrix_bytes, false)?;
                grid_sweep.push(json!({"from": a, "to": b, "method": m.name(), "blocks_per_sm": blocks_per_sm, "threads": threads, "gbps": st.json()}));
                progress.step(&format!(
                    "SM grid {blocks_per_sm}x{threads} {} GPU{a}->GPU{b}",
                    m.name()
                ));
            }
        }
        t.set_sm_grid(SmGrid::DEFAULT)?;
    }

    // send/recv ring shapes on the first pair: is the cost per round (slot reuse) or per byte?
    let mut ring_sweep = Vec::new();
    if let Some(&(a, b)) = pairs.first() {
        for &(slots, slot_kib, ce) in &RING_SHAPES {
            let engine = if ce {
                Engine::CopyEngine
            } else {
                Engine::SmKernel
            };
            let shape = ConnOptions {
                slots,
                slot_bytes: slot_kib << 10,
                engine,
                ..ConnOptions::default()
            };
            let st = bench.sendrecv_bandwidth(a, b, opts.matrix_bytes, shape)?;
            ring_sweep.push(json!({"from": a, "to": b, "slots": slots, "slot_kib": slot_kib, "engine": if ce { "copy engine" } else { "SM" }, "gbps": st.json()}));
            progress.step(&format!(
                "send/recv ring {slots} x {slot_kib} KiB GPU{a}->GPU{b}"
            ));
        }
    }

    let mut uni = serde_json::Map::new();
    let mut bi = serde_json::Map::new();
    for m in Method::ALL {
        let mut um = vec![vec![Value::Null; n]; n];
        let mut bm = vec![vec![Value::Null; n]; n];
        for a in 0..n {
            for b in 0..n {
                um[a][b] = bench.bandwidth(m, a, b, opts.matrix_bytes, false)?.json();
                progress.step(&format!(
                    "{} GPU{a}->GPU{b} {}",
                    m.name(),
                    size_name(opts.matrix_bytes)
                ));
                // Bidirectional send/recv would need two connections at once: not measured.
                if a != b && m != Method::SendRecv {
                    bm[a][b] = bench.bandwidth(m, a, b, opts.matrix_bytes, true)?.json();
                    progress.step(&format!(
                        "{} GPU{a}<->GPU{b} {}",
                        m.name(),
                        size_name(opts.matrix_bytes)
                    ));
                }
            }
        }
        uni.insert(m.name().into(), json!(um));
        bi.insert(m.name().into(), json!(bm));
    }

    let mut gpu_lat = vec![vec![Value::Null; n]; n];
    let mut cpu_lat = vec![vec![Value::Null; n]; n];
    for &(a, b) in &pairs {
        let samples: Vec<f64> = (0..5)
            .map(|_| {
                crate::latency::one_way_ns(&devices[a], &devices[b], 1000, 10_000)
                    .map(|ns| ns / 1000.0)
            })
            .collect::<p2p_transport::Result<_>>()?;
        gpu_lat[a][b] = Stat::of(samples).json();
        progress.step(&format!("GPU latency GPU{a}<->GPU{b}"));
        cpu_lat[a][b] = cpu_latency_us(&t, &devices[a], &devices[b])?.json();
        progress.step(&format!("CPU latency GPU{a}->GPU{b}"));
    }

    let mut sweep = Vec::new();
    for &(a, b) in &pairs {
        for m in Method::ALL {
            for &s in &sizes {
                let st = bench.bandwidth(m, a, b, s, false)?;
                // Time per copy, from the median bandwidth.
                let us = s as f64 / (st.median * 1e9) * 1e6;
                sweep.push(json!({"from": a, "to": b, "method": m.name(), "bytes": s, "gbps": st.json(), "us_per_copy": us}));
                progress.step(&format!(
                    "sweep GPU{a}->GPU{b} {} {}",
                    m.name(),
                    size_name(s)
                ));
            }
        }
    }

    let driver = p2p_sys::driver_version().unwrap_or(0);
    Ok(json!({
        "benchmark": "p2p",
        "date": crate::utc_now(),
        "commit": env!("P2PBUILD_COMMIT"),
        "host": p2p_transport::hostname(),
        "gpus": devices.iter().map(|d| json!({"ordinal": d.ordinal(), "name": d.name(), "pci_bus_id": d.pci_bus_id(), "uuid": d.uuid_string()})).collect::<Vec<_>>(),
        "cuda_driver": format!("{}.{}", driver / 1000, driver % 1000 / 10),
        "options": {"matrix_bytes": opts.matrix_bytes, "max_bytes": opts.max_bytes, "samples": opts.samples},
        "method": "CUDA events around back-to-back copies on one stream (two for bidirectional), after 2 warm-up samples; median of the samples; buffers rotate through the allocation",
        "bandwidth_gbps": {"unidirectional": uni, "bidirectional": bi},
        "latency_us": {"gpu_one_way": gpu_lat, "cpu_memcpy_4B": cpu_lat},
        "sweep": sweep,
        "sendrecv_ring": ring_sweep,
        "sm_grid": {"default": {"blocks_per_sm": SmGrid::DEFAULT.blocks_per_sm, "threads": SmGrid::DEFAULT.threads}, "sweep": grid_sweep},
    }))
}

fn median_of(v: &Value) -> Option<f64> {
    v.get("median").and_then(Value::as_f64)
}

/// The readable report: targets beside measured figures, matrices, and the sweep.
pub fn render(r: &Value) -> String {
    let gpus = r["gpus"].as_array().cloned().unwrap_or_default();
    let n = gpus.len();
    let names: Vec<String> = gpus
        .iter()
        .map(|g| g["name"].as_str().unwrap_or("?").to_string())
        .collect();
    let mut out = format!(
        "# p2p bandwidth and latency\n\n{} x {} | CUDA driver {} | commit {} | {}\n\n{}\n\n",
        n,
        names.first().cloned().unwrap_or_default(),
        r["cuda_driver"].as_str().unwrap_or("?"),
        r["commit"].as_str().unwrap_or("?"),
        r["date"].as_str().unwrap_or("?"),
        r["method"].as_str().unwrap_or("")
    );
    let mb = r["options"]["matrix_bytes"].as_u64().unwrap_or(0) as usize;
    // Targets (TARGETS.md, 2 x H200 SXM joined by NVLink): the worst pair counts.
    let worst = |kind: &str, m: &str| -> Option<f64> {
        let mat = &r["bandwidth_gbps"][kind][m];
        (0..n)
            .flat_map(|a| (0..n).filter(move |&b| b != a).map(move |b| (a, b)))
            .filter_map(|(a, b)| median_of(&mat[a][b]))
            .reduce(f64::min)
    };
    let lat = (0..n)
        .flat_map(|a| (0..n).map(move |b| (a, b)))
        .filter_map(|(a, b)| median_of(&r["latency_us"]["gpu_one_way"][a][b]))
        .reduce(f64::max);
    out += &format!("## Targets at {} (worst pair)\n\n| target | goal | measured | met |\n| --- | --- | --- | --- |\n", size_name(mb));
    let row = |name: &str, goal: &str, v: Option<f64>, ok: bool| {
        format!(
            "| {name} | {goal} | {} | {} |\n",
            v.map(|v| format!("{v:.1}")).unwrap_or_else(|| "-".into()),
            if v.is_none() {
                "-"
            } else if ok {
                "yes"
            } else {
                "**no**"
            }
        )
    };
    let ge = |v: Option<f64>, g: f64| v.is_some_and(|v| v >= g);
    for (name, goal, v, ok) in [
        (
            "copy engine, one way (GB/s)",
            ">= 390",
            worst("unidirectional", "copy engine"),
            390.0,
        ),
        (
            "copy engine, both ways (GB/s)",
            ">= 740",
            worst("bidirectional", "copy engine"),
            740.0,
        ),
        (
            "SM write (GB/s)",
            ">= 370",
            worst("unidirectional", "SM write"),
            370.0,
        ),
        (
            "SM read (GB/s)",
            ">= 370",
            worst("unidirectional", "SM read"),
            370.0,
        ),
        (
            "host-staged (GB/s)",
            ">= 40",
            worst("unidirectional", "host-staged"),
            40.0,
        ),
    ] {
        out += &row(name, goal, v, ge(v, ok));
    }
    out += &row(
        "one-way latency, SM store + flag (us)",
        "<= 1.5",
        lat,
        lat.is_some_and(|v| v <= 1.5),
    );
    out += &format!(
        "| (reference) cudaMemcpyPeerAsync one way (GB/s) | - | {} | - |\n\n",
        worst("unidirectional", "cudaMemcpyPeerAsync")
            .map(|v| format!("{v:.1}"))
            .unwrap_or_else(|| "-".into())
    );

    let matrix = |title: &str, mat: &Value, unit: &str| -> String {
        let mut s = format!(
            "**{title}** ({unit}; median, [min-max])\n\n| | {} |\n|{}\n",
            (0..n)
                .map(|b| format!("GPU{b}"))
                .collect::<Vec<_>>()
                .join(" | "),
            " --- |".repeat(n + 1)
        );
        for a in 0..n {
            s += &format!("| GPU{a} |");
            for b in 0..n {
                let c = &mat[a][b];
                s += &match median_of(c) {
                    Some(m) => format!(
                        " {m:.1} [{:.1}-{:.1}] |",
                        c["min"].as_f64().unwrap_or(0.0),
                        c["max"].as_f64().unwrap_or(0.0)
                    ),
                    None => " - |".into(),
                };
            }
            s += "\n";
        }
        s + "\n"
    };
    out += &format!(
        "## Bandwidth matrices at {} (row = source, column = destination)\n\n",
        size_name(mb)
    );
    for m in Method::ALL {
        out += &matrix(
            &format!("{} unidirectional", m.name()),
            &r["bandwidth_gbps"]["unidirectional"][m.name()],
            "GB/s",
        );
        out += &matrix(
            &format!("{} bidirectional (both directions summed)", m.name()),
            &r["bandwidth_gbps"]["bidirectional"][m.name()],
            "GB/s",
        );
    }
    out += "## Latency matrices\n\n";
    out += &matrix(
        "GPU one-way latency, SM store + flag (half a ping-pong)",
        &r["latency_us"]["gpu_one_way"],
        "us",
    );
    out += &matrix(
        "CPU latency, 4-byte cuMemcpyPeerAsync + stream sync",
        &r["latency_us"]["cpu_memcpy_4B"],
        "us",
    );

    let grid = r["sm_grid"]["sweep"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if !grid.is_empty() {
        out += &format!(
            "## SM kernel launch shape at {} (GB/s, median; GPU{} -> GPU{}; default {}x{})\n\n| blocks/SM x threads | SM write | SM read |\n| --- | --- | --- |\n",
            size_name(mb),
            grid[0]["from"],
            grid[0]["to"],
            r["sm_grid"]["default"]["blocks_per_sm"],
            r["sm_grid"]["default"]["threads"]
        );
        for &(b, th) in &SM_GRIDS {
            let cell = |m: Method| {
                grid.iter()
                    .find(|e| {
                        e["blocks_per_sm"] == b && e["threads"] == th && e["method"] == m.name()
                    })
                    .and_then(|e| median_of(&e["gbps"]))
                    .map(|v| format!("{v:.1}"))
                    .unwrap_or_else(|| "-".into())
            };
            out += &format!(
                "| {b} x {th} | {} | {} |\n",
                cell(Method::SmWrite),
                cell(Method::SmRead)
            );
        }
        out += "\n";
    }
    if let Some(ring) = r["sendrecv_ring"].as_array().filter(|v| !v.is_empty()) {
        out += &format!("## send/recv ring shape and engine at {} (GB/s, median)\n\n| slots x slot size, engine | GB/s |\n| --- | --- |\n", size_name(mb));
        for e in ring {
            out += &format!(
                "| {} x {} KiB, {} | {} |\n",
                e["slots"],
                e["slot_kib"],
                e["engine"].as_str().unwrap_or("SM"),
                median_of(&e["gbps"])
                    .map(|v| format!("{v:.1}"))
                    .unwrap_or_else(|| "-".into())
            );
        }
        out += "\n";
    }
    out += "## Size sweep (GB/s, median; row = size)\n\n";
    let sweep = r["sweep"].as_array().cloned().unwrap_or_default();
    let mut pairs: Vec<(u64, u64)> = sweep
        .iter()
        .map(|e| {
            (
                e["from"].as_u64().unwrap_or(0),
                e["to"].as_u64().unwrap_or(0),
            )
        })
        .collect();
    pairs.dedup();
    for (a, b) in pairs {
        out += &format!(
            "**GPU{a} -> GPU{b}**\n\n| size | {} |\n|{}\n",
            Method::ALL.map(|m| m.name()).join(" | "),
            " --- |".repeat(Method::ALL.len() + 1)
        );
        let sizes: Vec<u64> = {
            let mut s: Vec<u64> = sweep.iter().filter_map(|e| e["bytes"].as_u64()).collect();
            s.sort();
            s.dedup();
            s
        };
        for s in sizes {
            out += &format!("| {} |", size_name(s as usize));
            for m in Method::ALL {
                let cell = sweep.iter().find(|e| {
                    e["from"] == a && e["to"] == b && e["bytes"] == s && e["method"] == m.name()
                });
                out += &match cell.and_then(|c| median_of(&c["gbps"])) {
                    Some(v) if v >= 1.0 => format!(" {v:.1} |"),
                    Some(v) => format!(" {v:.3} |"),
                    None => " - |".into(),
                };
            }
            out += "\n";
        }
        out += "\n";
    }
    out
}

/// `cudaMemcpyPeerAsync` through the runtime API, for comparison in the benchmark.
#[allow(unsafe_code)] // one runtime-API call
pub fn runtime_memcpy_peer(
    dst: u64,
    dst_dev: &Device,
    src: u64,
    src_dev: &Device,
    bytes: usize,
    stream: &Stream,
) -> p2p_transport::Result<()> {
    let on = |source| p2p_transport::Error::Cuda {
        device: stream.device().ordinal(),
        peer: Some(
            if stream.device() == src_dev {
                dst_dev
            } else {
                src_dev
            }
            .ordinal(),
        ),
        source,
    };
    p2p_sys::probe::require(p2p_sys::Library::Cudart).map_err(on)?;
    stream.device().bind_to_thread()?;
    // SAFETY: libcudart is loaded; both ranges lie in live allocations; the runtime uses the
    // primary contexts our Devices retain, so the stream is valid for it.
    let r = unsafe {
        p2p_sys::cudart::cudaMemcpyPeerAsync(
            dst as *mut std::ffi::c_void,
            dst_dev.ordinal(),
            src as *const std::ffi::c_void,
            src_dev.ordinal(),
            bytes,
            stream.cu_stream() as p2p_sys::cudart::cudaStream_t,
        )
    };
    p2p_sys::check_cudart("cudaMemcpyPeerAsync", r).map_err(on)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_sizes() {
        assert_eq!(Stat::of(vec![3.0, 1.0, 2.0]).median, 2.0);
        assert_eq!(
            Stat::of(vec![4.0, 1.0, 2.0, 3.0]),
            Stat {
                median: 2.5,
                min: 1.0,
                max: 4.0
            }
        );
        let s = sweep_sizes(1 << 30);
        assert_eq!((s.len(), s[0], *s.last().unwrap_or(&0)), (15, 4, 1 << 30));
        assert_eq!(size_name(4), "4 B");
        assert_eq!(size_name(256 << 20), "256 MiB");
        assert_eq!(size_name(1 << 30), "1 GiB");
        assert_eq!(iters_for(4), 200);
        assert_eq!(iters_for(256 << 20), 4);
        assert_eq!(iters_for(1 << 30), 2);
    }

    #[test]
    fn the_report_marks_missed_targets() {
        let cell = |v: f64| json!({"median": v, "min": v, "max": v});
        let mat = |v: f64| json!([[Value::Null, cell(v)], [cell(v), Value::Null]]);
        let mut uni = serde_json::Map::new();
        let mut bi = serde_json::Map::new();
        for m in Method::ALL {
            uni.insert(m.name().into(), mat(380.0));
            bi.insert(m.name().into(), mat(750.0));
        }
        let r = json!({
            "gpus": [{"name": "NVIDIA H200"}, {"name": "NVIDIA H200"}], "cuda_driver": "13.0", "commit": "abc", "date": "d", "method": "m",
            "options": {"matrix_bytes": 256 << 20},
            "bandwidth_gbps": {"unidirectional": uni, "bidirectional": bi},
            "latency_us": {"gpu_one_way": mat(1.2), "cpu_memcpy_4B": mat(8.0)},
            "sweep": [{"from": 0, "to": 1, "method": "SM write", "bytes": 4, "gbps": cell(0.002)}],
        });
        let text = render(&r);
        assert!(
            text.contains("| copy engine, one way (GB/s) | >= 390 | 380.0 | **no** |"),
            "{text}"
        );
        assert!(
            text.contains("| copy engine, both ways (GB/s) | >= 740 | 750.0 | yes |"),
            "{text}"
        );
        assert!(
            text.contains("| one-way latency, SM store + flag (us) | <= 1.5 | 1.2 | yes |"),
            "{text}"
        );
        assert!(
            text.contains("| 4 B | - | - | 0.002 | - | - | - |"),
            "{text}"
        );
    }
}
