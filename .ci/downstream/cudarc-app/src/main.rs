//! All-reduce and broadcast over cudarc slices on every visible GPU, one process, with the
//! cudarc configuration this build chose; checks every element and prints the cold start.

use std::sync::Arc;
use std::time::Instant;

// The cudarc this build has, and p2p's module for it.
#[cfg(feature = "cudarc-0-17")]
use {cudarc_0_17 as cudarc, p2p_collective::p2p_mem::cudarc_0_17 as interop};
#[cfg(feature = "cudarc-0-18")]
use {cudarc_0_18 as cudarc, p2p_collective::p2p_mem::cudarc_0_18 as interop};
#[cfg(feature = "v0-19")]
use {cudarc, p2p_collective::p2p_mem::cudarc_interop as interop};

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use interop::view_mut;
use p2p_collective::{Collectives, Communicator, DataType, RedOp};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const COUNT: usize = (1 << 20) + 3;

fn main() {
    if let Err(e) = run() {
        eprintln!("p2p-downstream-cudarc: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), BoxError> {
    let n = CudaContext::device_count()? as usize;
    let ctxs = (0..n)
        .map(CudaContext::new)
        .collect::<Result<Vec<_>, _>>()?;
    let cu_streams = ctxs
        .iter()
        .map(|c| c.new_stream())
        .collect::<Result<Vec<_>, _>>()?;
    let devices = ctxs
        .iter()
        .map(|c| interop::device(c))
        .collect::<Result<Vec<_>, _>>()?;
    let streams = devices
        .iter()
        .zip(&cu_streams)
        .map(|(d, s)| interop::stream(d, s))
        .collect::<Result<Vec<_>, _>>()?;
    let t = Instant::now();
    let comms = Communicator::init_all(&devices)?;
    let init_s = t.elapsed().as_secs_f64();
    let mut bufs: Vec<CudaSlice<f32>> = cu_streams
        .iter()
        .enumerate()
        .map(|(r, s)| {
            let host: Vec<f32> = (0..COUNT).map(|i| ((r + 1) * (i % 97)) as f32).collect();
            upload(s, &host)
        })
        .collect::<Result<_, _>>()?;
    let t = Instant::now();
    for (r, comm) in comms.iter().enumerate() {
        let mut view = view_mut(&streams[r], &mut bufs[r])?;
        comm.all_reduce_in_place(&mut view, COUNT, DataType::F32, RedOp::Sum, &streams[r])?;
        comm.broadcast_in_place(&mut view, COUNT, DataType::F32, n - 1, &streams[r])?;
    }
    for (r, comm) in comms.iter().enumerate() {
        comm.synchronize(&streams[r])?;
    }
    let first_call_s = t.elapsed().as_secs_f64();
    // Whether a compiler was loaded: the kernels ship compiled for sm_80 and sm_90.
    let nvrtc = std::fs::read_to_string("/proc/self/maps")
        .map(|m| {
            if m.contains("libnvrtc") {
                "libnvrtc loaded"
            } else {
                "no libnvrtc loaded"
            }
        })
        .unwrap_or("maps unreadable");
    let ranks_sum: usize = (1..=n).sum();
    let mut wrong = 0;
    for (r, s) in cu_streams.iter().enumerate() {
        let got: Vec<f32> = download(s, &bufs[r])?;
        wrong += got
            .iter()
            .enumerate()
            .filter(|&(i, &v)| v != (ranks_sum * (i % 97)) as f32)
            .count();
    }
    println!(
        "p2p-downstream-cudarc: {n} GPU(s), all-reduce + broadcast of {COUNT} f32 in place on cudarc slices: {wrong} wrong; init_all {init_s:.3} s, first calls {first_call_s:.3} s, {nvrtc}"
    );
    if wrong > 0 {
        return Err(format!("{wrong} wrong elements").into());
    }
    Ok(())
}

/// `host` copied into a new slice on `stream`'s GPU (`memcpy_stod`, named `clone_htod` from
/// cudarc 0.18).
fn upload(
    stream: &Arc<CudaStream>,
    host: &[f32],
) -> Result<CudaSlice<f32>, cudarc::driver::DriverError> {
    #[allow(deprecated)]
    stream.memcpy_stod(host)
}

/// `slice` copied back to the host (`memcpy_dtov`, named `clone_dtoh` from cudarc 0.18).
fn download(
    stream: &Arc<CudaStream>,
    slice: &CudaSlice<f32>,
) -> Result<Vec<f32>, cudarc::driver::DriverError> {
    #[allow(deprecated)]
    stream.memcpy_dtov(slice)
}
