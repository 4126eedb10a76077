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

use p2p_collective::{Communicator, DataType, RedOp};
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
    println!(
        "HELD {}",
        json!({"rank": rank, "phase": what, "cycle": cycle, "held_bytes": held})
    );
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
    let n = 1 << 20;
    let streams: Vec<Stream> = devices
        .iter()
        .map(Stream::new)
        .collect::<Result<_, _>>()
        .map_err(e)?;
    let mut bufs = Vec::new();
    for d in &devices {
        bufs.push((
            DeviceBuffer::<f32>::zeroed(d, n).map_err(e)?,
            DeviceBuffer::<f32>::zeroed(d, n).map_err(e)?,
        ));
    }
    let base2: Vec<i64> = devices.iter().map(free).collect::<Result<_, _>>()?;
    for c in 1..=cycles {
        let comms = Communicator::init_all(&devices).map_err(|e| e.to_string())?;
        for (i, comm) in comms.iter().enumerate() {
            let (send, recv) = &mut bufs[i];
            comm.all_reduce(send, recv, n, DataType::F32, RedOp::Sum, &streams[i])
                .map_err(|e| e.to_string())?;
        }
        for (comm, s) in comms.iter().zip(&streams) {
            comm.synchronize(s).map_err(|e| e.to_string())?;
        }
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
    if local {
        let devices = Device::all().map_err(|e| e.to_string())?;
        let streams: Vec<Stream> = devices
            .iter()
            .map(Stream::new)
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
        let mut bufs = Vec::new();
        for d in &devices {
            bufs.push((
                DeviceBuffer::<f32>::zeroed(d, n).map_err(|e| e.to_string())?,
                DeviceBuffer::<f32>::zeroed(d, n).map_err(|e| e.to_string())?,
            ));
        }
        let base: Vec<i64> = devices.iter().map(free).collect::<Result<_, _>>()?;
        let _module = crate::floor::EmptyKernel::load(&devices[0]).map_err(|e| e.to_string())?;
        line(
            0,
            "one small module loaded on GPU 0",
            0,
            &settled(&devices, &base)?,
        );
        for c in 1..=cycles {
            let comms = Communicator::init_all(&devices).map_err(|e| e.to_string())?;
            line(0, "communicators made", c, &settled(&devices, &base)?);
            for (i, comm) in comms.iter().enumerate() {
                let (send, recv) = &mut bufs[i];
                comm.all_reduce(send, recv, n, DataType::F32, RedOp::Sum, &streams[i])
                    .map_err(|e| e.to_string())?;
            }
            for (comm, s) in comms.iter().zip(&streams) {
                comm.synchronize(s).map_err(|e| e.to_string())?;
            }
            drop(comms);
            line(0, "dropped", c, &settled(&devices, &base)?);
        }
        return Ok(());
    }
    let rank: usize = std::env::var("RANK")
        .ok()
        .and_then(|r| r.parse().ok())
        .ok_or("RANK is not set: run it under `p2p-bench launch -n N --`, or pass --local")?;
    let count = Device::count().map_err(|e| e.to_string())? as usize;
    let device = Device::new((rank % count.max(1)) as i32).map_err(|e| e.to_string())?;
    let devices = [device.clone()];
    let stream = Stream::new(&device).map_err(|e| e.to_string())?;
    let send = DeviceBuffer::<f32>::zeroed(&device, n).map_err(|e| e.to_string())?;
    let mut recv = DeviceBuffer::<f32>::zeroed(&device, n).map_err(|e| e.to_string())?;
    stream.synchronize().map_err(|e| e.to_string())?;
    let base = [free(&device)?];
    let _module = crate::floor::EmptyKernel::load(&device).map_err(|e| e.to_string())?;
    line(
        rank,
        "one small module loaded",
        0,
        &settled(&devices, &base)?,
    );
    for c in 1..=cycles {
        let comm = Communicator::from_env().map_err(|e| e.to_string())?;
        line(rank, "communicator made", c, &settled(&devices, &base)?);
        comm.all_reduce(&send, &mut recv, n, DataType::F32, RedOp::Sum, &stream)
            .map_err(|e| e.to_string())?;
        comm.synchronize(&stream).map_err(|e| e.to_string())?;
        drop(comm);
        line(rank, "dropped", c, &settled(&devices, &base)?);
    }
    Ok(())
}
