//! A tensor-parallel layer in inference: after each layer every GPU all-reduces a small
//! activation tensor (a few KiB, latency-bound). The trainer captures the all-reduces of one
//! forward pass into a CUDA graph on its own cudarc streams once, then replays the graph for
//! every token with new activations, and checks every element of every replay.
//!
//! Run: `cargo run --release -p p2p-examples --bin tensor_parallel_graph` (every visible GPU;
//! `P2P_EXAMPLE_GPUS=N` for fewer).

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::CudaSlice;
use p2p_collective::{Collectives, DataType, RedOp};
use p2p_examples::{run_world, sum, value, BoxError, World};
use p2p_mem::cudarc_interop::view_mut;

/// Activations per layer: batch 4 x hidden 1024 f32 (16 KiB).
const ACTIVATIONS: usize = 4 * 1024;
/// Layers per forward pass: one all-reduce each.
const LAYERS: usize = 8;
/// Tokens: graph replays.
const TOKENS: usize = 50;

fn main() {
    run_world("tensor_parallel_graph", forward);
}

/// Captures the forward pass and replays it for every token; how many elements were wrong.
fn forward(w: &World) -> Result<usize, BoxError> {
    let n = w.size();

    // One activation buffer per layer and rank, allocated once: the graph keeps their addresses.
    let mut acts: Vec<Vec<CudaSlice<f32>>> = w
        .cu_streams
        .iter()
        .map(|s| {
            (0..LAYERS)
                .map(|_| s.alloc_zeros::<f32>(ACTIVATIONS))
                .collect()
        })
        .collect::<Result<_, _>>()?;

    // Capture each rank's forward pass (its all-reduces) on its own stream. The views are made
    // before the capture (cudarc's event waits happen outside it) and dropped after it, so
    // cudarc's events cover the capture only, not the replays: the replays stay correct because
    // every access to these slices (the uploads, the replays, the reads) is on the same stream,
    // and the slices outlive the graphs.
    let mut graphs = Vec::with_capacity(n);
    {
        let mut views = Vec::with_capacity(n);
        for (r, layers) in acts.iter_mut().enumerate() {
            let v: Vec<_> = layers
                .iter_mut()
                .map(|a| view_mut(&w.streams[r], a))
                .collect::<Result<_, _>>()?;
            views.push(v);
        }
        for (r, comm) in w.comms.iter().enumerate() {
            w.cu_streams[r]
                .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
            for v in views[r].iter_mut() {
                let captured = comm.all_reduce_in_place(
                    v,
                    ACTIVATIONS,
                    DataType::F32,
                    RedOp::Sum,
                    &w.streams[r],
                );
                if let Err(e) = captured {
                    // End the capture so the stream is usable, then report the error.
                    let _ = w.cu_streams[r].end_capture(CUgraphInstantiate_flags(0));
                    return Err(e.into());
                }
            }
            let graph = w.cu_streams[r]
                .end_capture(CUgraphInstantiate_flags(0))?
                .ok_or("the capture recorded nothing")?;
            graphs.push(graph);
        }
    }

    let mut wrong = 0;
    for token in 0..TOKENS {
        // New activations for this token, written by the trainer on its stream.
        for (r, s) in w.cu_streams.iter().enumerate() {
            for (l, a) in acts[r].iter_mut().enumerate() {
                let host: Vec<f32> = (0..ACTIVATIONS).map(|i| value(r, i + l, token)).collect();
                s.memcpy_htod(&host, a)?;
            }
        }
        for g in &graphs {
            g.launch()?;
        }
        w.synchronize()?;
        wrong += w.count_wrong_in(
            &acts,
            |r, l| format!("token {token} rank {r} layer {l}"),
            |l, i| sum(n, i + l, token),
        )?;
    }
    println!(
        "tensor_parallel_graph: {n} GPU(s), {TOKENS} replays of a graph of {LAYERS} all-reduces of {ACTIVATIONS} f32, captured on cudarc streams: {wrong} wrong"
    );
    Ok(wrong)
}
