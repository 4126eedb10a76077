//! candle tensors on every visible GPU, all-reduced by p2p straight from their device memory
//! on candle's own streams; every element checked.

use candle_core::{Device as CandleDevice, Storage, Tensor};
use p2p_collective::p2p_mem::cudarc_interop::{view, view_mut};
use p2p_collective::p2p_mem::{Device, Stream};
use p2p_collective::{Collectives, Communicator, DataType, RedOp};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const COUNT: usize = (1 << 20) + 3;

fn main() {
    if let Err(e) = run() {
        eprintln!("p2p-downstream-candle: {e}");
        std::process::exit(1);
    }
}

fn run() -> Result<(), BoxError> {
    let n = cudarc::driver::CudaContext::device_count()? as usize;
    let gpus = (0..n)
        .map(CandleDevice::new_cuda)
        .collect::<Result<Vec<_>, _>>()?;
    let tensors = gpus
        .iter()
        .enumerate()
        .map(|(r, g)| {
            let host: Vec<f32> = (0..COUNT).map(|i| ((r + 1) * (i % 89)) as f32).collect();
            Tensor::from_vec(host, COUNT, g)
        })
        .collect::<Result<Vec<_>, _>>()?;
    // p2p on candle's own contexts and streams.
    let mut devices = Vec::new();
    let mut streams = Vec::new();
    let mut cu_streams = Vec::new();
    for g in &gpus {
        let cu_stream = g.as_cuda_device()?.cuda_stream();
        let device = Device::from_cudarc(cu_stream.context())?;
        streams.push(Stream::from_cudarc(&device, &cu_stream)?);
        devices.push(device);
        cu_streams.push(cu_stream);
    }
    let comms = Communicator::init_all(&devices)?;
    let mut outs = cu_streams
        .iter()
        .map(|s| s.alloc_zeros::<f32>(COUNT))
        .collect::<Result<Vec<_>, _>>()?;
    for (r, comm) in comms.iter().enumerate() {
        let (storage, _layout) = tensors[r].storage_and_layout();
        let Storage::Cuda(cuda) = &*storage else {
            return Err("a candle tensor on a CUDA device is not in CUDA storage".into());
        };
        let send = view(&streams[r], cuda.as_cuda_slice::<f32>()?)?;
        let mut recv = view_mut(&streams[r], &mut outs[r])?;
        comm.all_reduce(&send, &mut recv, COUNT, DataType::F32, RedOp::Sum, &streams[r])?;
    }
    for (r, comm) in comms.iter().enumerate() {
        comm.synchronize(&streams[r])?;
    }
    let ranks: usize = (1..=n).sum();
    let mut wrong = 0;
    for (r, out) in outs.iter().enumerate() {
        // Back into candle: a tensor over the result, summed by candle's own kernels.
        let got: Vec<f32> = cu_streams[r].clone_dtoh(out)?;
        wrong += got
            .iter()
            .enumerate()
            .filter(|&(i, &v)| v != (ranks * (i % 89)) as f32)
            .count();
        let t = Tensor::from_vec(got, COUNT, &gpus[r])?;
        let total: f32 = t.sum_all()?.to_scalar()?;
        let want: f64 = (0..COUNT).map(|i| (ranks * (i % 89)) as f64).sum();
        if ((total as f64) - want).abs() > want * 1e-5 {
            wrong += 1;
        }
    }
    println!(
        "p2p-downstream-candle: {n} GPU(s), candle tensors of {COUNT} f32 all-reduced by p2p from their own memory on candle's streams, checked element by element and by candle's sum: {wrong} wrong"
    );
    if wrong > 0 {
        return Err(format!("{wrong} wrong").into());
    }
    Ok(())
}
