//! `p2p-bench held-memory`: what GPU memory a process still holds after it dropped its
//! communicators. Makes a communicator, runs one all-reduce and drops it, `cycles` times in one
//! process, and reads the device's free memory against a baseline taken before the first:
//! memory that grows with every cycle is a leak; memory taken once, at the first, and kept for
//! the life of the process is a one-time cost of the context (loaded modules, the driver's
//! reservations). A small module of the benchmark's own is loaded first, alone, to show what a
//! module costs.
//!
//! Process per GPU: `p2p-bench launch -n 2 -- p2p-bench held-memory`; one process driving every
//! GPU: `p2p-bench held-memory --local`; each part of a communicator alone: `--parts`. Each rank prints one line a cycle, prefixed `HELD `.

use std::time::{Duration, Instant};

use p2p_collective::{Collectives, Communicator, DataType, RedOp};
use p2p_mem::{Device, DeviceBuffer, Stream};
use serde_json::json;

fn free(device: &Device) -> Result<i64, String> {
    device
        .memory_info()
        .map(|m| m.0 as i64)
        .map_err(|e| e.to_string())
}

/// Bytes below `base` on every device, once the count stops moving (a peer's unmapping may land
/// a little later) or after 500 ms.
fn settled(devices: &[Device], base: &[i64]) -> Result<Vec<i64>, String> {
    let t = Instant::now();
    let mut last = Vec::new();
    loop {
        let now: Vec<i64> = devices
            .iter()
            .zip(base)
            .map(|(d, b)| free(d).map(|f| b - f))
            .collect::<Result<_, _>>()?;
        if now == last || t.elapsed() > Duration::from_millis(500) {
            return Ok(now);
        }
        last = now;
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn line(rank: usize, what: &str, cycle: usize, held: &[i64]) {
    crate::outln!(
        "HELD {}",
        json!({"rank": rank, "phase": what, "cycle": cycle, "held_bytes": held})
    );
}

/// One stream and a pair of `n`-float buffers on each of `devices`, for the all-reduces.
struct Work {
    streams: Vec<Stream>,
    bufs: Vec<(DeviceBuffer<f32>, DeviceBuffer<f32>)>,
    n: usize,
}

impl Work {
    fn new(devices: &[Device], n: usize) -> Result<Work, String> {
        let e = |e: p2p_mem::Error| e.to_string();
        let mut w = Work {
            streams: Vec::new(),
            bufs: Vec::new(),
            n,
        };
        for d in devices {
            w.streams.push(Stream::new(d).map_err(e)?);
            w.bufs.push((
                DeviceBuffer::zeroed(d, n).map_err(e)?,
                DeviceBuffer::zeroed(d, n).map_err(e)?,
            ));
        }
        Ok(w)
    }

    /// One all-reduce on each of `comms` (communicator i on device i), all queued, then waited.
    fn all_reduce(&mut self, comms: &[Communicator]) -> Result<(), String> {
        for (i, comm) in comms.iter().enumerate() {
            let (send, recv) = &mut self.bufs[i];
            comm.all_reduce(
                send,
                recv,
                self.n,
                DataType::F32,
                RedOp::Sum,
                &self.streams[i],
            )
            .map_err(|e| e.to_string())?;
        }
        for (comm, s) in comms.iter().zip(&self.streams) {
            comm.synchronize(s).map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// Each part of a communicator that holds GPU resources, made and dropped `cycles` times on
/// GPU 0 alone: the collective kernels' modules, an abort flag, a stream with two events, and
/// a local communicator over every GPU with and without a call.
fn parts(cycles: usize) -> Result<(), String> {
    let devices = Device::all().map_err(|e| e.to_string())?;
    let d = devices.first().ok_or("no GPU")?.clone();
    let base: Vec<i64> = devices.iter().map(free).collect::<Result<_, _>>()?;
    let e = |e: p2p_mem::Error| e.to_string();
    let report = |what: &str, c: usize| -> Result<(), String> {
        line(0, what, c, &settled(&devices, &base)?);
        Ok(())
    };
    for c in 1..=cycles {
        drop(p2p_mem::kernel::Module::build_all(&d, &p2p_collective::comm::COLL_PARTS).map_err(e)?);
        report("collective modules loaded and dropped", c)?;
    }
    for c in 1..=cycles {
        drop(p2p_mem::abort::AbortHandle::new(&d).map_err(e)?);
        report("abort flag made and dropped", c)?;
    }
    for c in 1..=cycles {
        let s = Stream::new(&d).map_err(e)?;
        let (a, b) = (
            p2p_mem::Event::new(&d).map_err(e)?,
            p2p_mem::Event::new(&d).map_err(e)?,
        );
        drop((a, b, s));
        report("stream and two events made and dropped", c)?;
    }
    for c in 1..=cycles {
        drop(Communicator::init_all(&devices).map_err(|e| e.to_string())?);
        report("local communicators made and dropped, no call", c)?;
    }
    let mut work = Work::new(&devices, 1 << 20)?;
    let base2: Vec<i64> = devices.iter().map(free).collect::<Result<_, _>>()?;
    for c in 1..=cycles {
        let comms = Communicator::init_all(&devices).map_err(|e| e.to_string())?;
        work.all_reduce(&comms)?;
        drop(comms);
        line(
            0,
            "local communicators, one all-reduce each, dropped (against a later baseline)",
            c,
            &settled(&devices, &base2)?,
        );
    }
    Ok(())
}

/// Runs the experiment: `cycles` communicators made and dropped in this process, one process
/// per GPU (under a launcher) or, with `local`, one process for every GPU; with `parts`, each
/// part of a communicator alone.
pub fn run(cycles: usize, local: bool, parts_only: bool) -> Result<(), String> {
    if parts_only {
        return parts(cycles);
    }
    let n = 1 << 20;
    let (rank, devices) = if local {
        (0, Device::all().map_err(|e| e.to_string())?)
    } else {
        let rank: usize = std::env::var("RANK")
            .ok()
            .and_then(|r| r.parse().ok())
            .ok_or("RANK is not set: run it under `p2p-bench launch -n N --`, or pass --local")?;
        let count = Device::count().map_err(|e| e.to_string())? as usize;
        let device = Device::new((rank % count.max(1)) as i32).map_err(|e| e.to_string())?;
        (rank, vec![device])
    };
    let first = devices.first().ok_or("no GPU")?.clone();
    let mut work = Work::new(&devices, n)?;
    for s in &work.streams {
        s.synchronize().map_err(|e| e.to_string())?;
    }
    let base: Vec<i64> = devices.iter().map(free).collect::<Result<_, _>>()?;
    let _module = crate::floor::EmptyKernel::load(&first).map_err(|e| e.to_string())?;
    line(
        rank,
        "one small module loaded",
        0,
        &settled(&devices, &base)?,
    );
    for c in 1..=cycles {
        let comms = if local {
            Communicator::init_all(&devices)
        } else {
            Communicator::from_env().map(|c| vec![c])
        }
        .map_err(|e| e.to_string())?;
        line(rank, "communicator made", c, &settled(&devices, &base)?);
        work.all_reduce(&comms)?;
        drop(comms);
        line(rank, "dropped", c, &settled(&devices, &base)?);
    }
    Ok(())
}
