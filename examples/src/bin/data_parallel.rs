//! A data-parallel training step, as a Rust trainer built on cudarc runs it: one process drives
//! every GPU; each GPU's gradients live in cudarc `CudaSlice`s (stream-ordered pool memory) in
//! buckets, on the trainer's own `CudaStream`; each bucket is all-reduced in place, with no
//! copy, on that stream; then the host reads the slices back through cudarc and checks every
//! element.
//!
//! Run: `cargo run --release -p p2p-examples --bin data_parallel` (every visible GPU;
//! `P2P_EXAMPLE_GPUS=N` for fewer).

use cudarc::driver::CudaSlice;
use p2p_collective::{Collectives, DataType, RedOp};
use p2p_examples::{run_world, sum, value, BoxError, World};
use p2p_mem::cudarc_interop::view_mut;

/// Gradient buckets (elements): a large one, an odd-sized one, a small one.
const BUCKETS: [usize; 3] = [(4 << 20) + 3, 300_007, 1_000];
/// Training steps, each with new gradients.
const STEPS: usize = 3;

fn main() {
    run_world("data_parallel", step);
}

/// The training steps in the trainer's world (a context and a stream per GPU from cudarc, and
/// p2p on the same contexts and streams); how many elements were wrong.
fn step(w: &World) -> Result<usize, BoxError> {
    let n = w.size();
    eprintln!(
        "data_parallel: {n} GPU(s), workspaces shared via {}",
        w.comms[0].sharing().name()
    );

    let mut wrong = 0;
    for step in 0..STEPS {
        // "Backward": each rank's gradients, written by the trainer on its stream.
        let mut grads: Vec<Vec<CudaSlice<f32>>> = Vec::with_capacity(n);
        for (r, s) in w.cu_streams.iter().enumerate() {
            let mut buckets = Vec::new();
            for &len in &BUCKETS {
                let host: Vec<f32> = (0..len).map(|i| value(r, i, step)).collect();
                buckets.push(s.clone_htod(&host)?);
            }
            grads.push(buckets);
        }
        // All-reduce every bucket in place, on each rank's own stream.
        for (r, comm) in w.comms.iter().enumerate() {
            for bucket in grads[r].iter_mut() {
                let len = bucket.len();
                let mut view = view_mut(&w.streams[r], bucket)?;
                comm.all_reduce_in_place(&mut view, len, DataType::F32, RedOp::Sum, &w.streams[r])?;
            }
        }
        w.synchronize()?;
        // The trainer reads its own slices: the sums are there, no copy was made.
        wrong += w.count_wrong_in(
            &grads,
            |r, b| format!("step {step} rank {r} bucket {b}"),
            |_, i| sum(n, i, step),
        )?;
    }
    let elements: usize = BUCKETS.iter().sum();
    println!(
        "data_parallel: {n} GPU(s), {STEPS} steps of {} buckets ({elements} f32 per rank) all-reduced in place in cudarc slices on the trainer's streams: {wrong} wrong",
        BUCKETS.len()
    );
    Ok(wrong)
}
