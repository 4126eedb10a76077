//! What the example programs share: a readable error exit and the values they check.
//!
//! The programs themselves are in `src/bin`: `data_parallel` (gradients in cudarc slices,
//! all-reduced in place on the callers' streams), `tensor_parallel_graph` (small activations
//! all-reduced inside a CUDA graph captured on cudarc streams), `torchrun_job` (one process
//! per GPU, started by torchrun or `p2p-bench launch`) and `moe_dispatch` (mixture-of-experts
//! dispatch and combine as groups of sends and receives, one process per GPU). Each checks
//! every element it computes and exits non-zero on a wrong one.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use p2p_collective::Communicator;
use p2p_mem::{Device, Stream};

/// A trainer's world on `n` GPUs of one process: cudarc's context and stream per GPU, and p2p's
/// communicators and streams on those same contexts and streams.
pub struct World {
    /// cudarc's contexts (the GPUs' primary contexts).
    pub ctxs: Vec<Arc<CudaContext>>,
    /// The trainer's own streams, from cudarc.
    pub cu_streams: Vec<Arc<CudaStream>>,
    /// The same streams, as p2p borrows them.
    pub streams: Vec<Stream>,
    /// One communicator per GPU.
    pub comms: Vec<Communicator>,
}

/// Makes the [`World`] of GPUs `0..n`.
pub fn world(n: usize) -> Result<World, BoxError> {
    let ctxs: Vec<Arc<CudaContext>> = (0..n).map(CudaContext::new).collect::<Result<_, _>>()?;
    let cu_streams: Vec<Arc<CudaStream>> = ctxs
        .iter()
        .map(|c| c.new_stream())
        .collect::<Result<_, _>>()?;
    let devices: Vec<Device> = ctxs
        .iter()
        .map(|c| Device::from_cudarc(c))
        .collect::<Result<_, _>>()?;
    let streams: Vec<Stream> = devices
        .iter()
        .zip(&cu_streams)
        .map(|(d, s)| Stream::from_cudarc(d, s))
        .collect::<Result<_, _>>()?;
    let comms = Communicator::init_all(&devices)?;
    Ok(World {
        ctxs,
        cu_streams,
        streams,
        comms,
    })
}

impl World {
    /// How many GPUs (ranks) it has.
    pub fn size(&self) -> usize {
        self.comms.len()
    }

    /// Waits until every rank's stream has run what the communicators queued on it.
    pub fn synchronize(&self) -> Result<(), BoxError> {
        for (comm, stream) in self.comms.iter().zip(&self.streams) {
            comm.synchronize(stream)?;
        }
        Ok(())
    }

    /// Reads every rank's slices back through cudarc, on the rank's own stream, and counts the
    /// elements that differ from what they should hold: `want(k, i)` at element `i` of slice
    /// `k` (of `slices[rank]`); `what(rank, k)` names the slice in the messages ([`count_wrong`]).
    pub fn count_wrong_in(
        &self,
        slices: &[Vec<CudaSlice<f32>>],
        what: impl Fn(usize, usize) -> String,
        want: impl Fn(usize, usize) -> f32,
    ) -> Result<usize, BoxError> {
        let mut wrong = 0;
        for (r, s) in self.cu_streams.iter().enumerate() {
            for (k, slice) in slices[r].iter().enumerate() {
                let got: Vec<f32> = s.clone_dtoh(slice)?;
                wrong += count_wrong(&what(r, k), &got, |i| want(k, i));
            }
        }
        Ok(wrong)
    }
}

/// Runs `body` on the [`World`] of the GPUs to use ([`gpus`]) as [`run`] does, and exits with
/// status 1 too where `body` counted wrong elements (it returns how many).
pub fn run_world(name: &str, body: impl FnOnce(&World) -> Result<usize, BoxError>) {
    run(name, || {
        let world = world(gpus()?)?;
        let wrong = body(&world)?;
        if wrong > 0 {
            return Err(format!("{wrong} wrong elements").into());
        }
        Ok(())
    });
}

/// The error type of the examples' `main`s.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Runs `body` and turns an error into a readable message and exit status 1 (rather than the
/// Debug form `main` would print).
pub fn run(name: &str, body: impl FnOnce() -> Result<(), BoxError>) {
    if let Err(e) = body() {
        eprintln!("{name}: error: {e}");
        let mut source = e.source();
        while let Some(s) = source {
            eprintln!("  caused by: {s}");
            source = s.source();
        }
        std::process::exit(1);
    }
}

/// Rank `rank`'s value at element `i` of a buffer of `step`: small integers, so that sums over
/// eight ranks are exact in f32.
pub fn value(rank: usize, i: usize, step: usize) -> f32 {
    ((i * 7 + rank * 13 + step * 5) % 61) as f32
}

/// The sum over `world` ranks of [`value`].
pub fn sum(world: usize, i: usize, step: usize) -> f32 {
    (0..world).map(|r| value(r, i, step)).sum()
}

/// How many elements of `got` differ from `want(i)`; prints the first few.
pub fn count_wrong(what: &str, got: &[f32], want: impl Fn(usize) -> f32) -> usize {
    let mut wrong = 0;
    for (i, &g) in got.iter().enumerate() {
        let w = want(i);
        if g != w {
            if wrong < 5 {
                eprintln!("{what}: element {i} is {g}, expected {w}");
            }
            wrong += 1;
        }
    }
    wrong
}

/// The number of GPUs to use: `P2P_EXAMPLE_GPUS` if set, else every visible one; at least two
/// (on one GPU a sum over ranks is the rank's own value, so nothing would be shown).
pub fn gpus() -> Result<usize, BoxError> {
    let visible = p2p_mem::Device::count()? as usize;
    if visible < 2 {
        return Err(format!("this example needs at least 2 GPUs; {visible} visible").into());
    }
    match std::env::var("P2P_EXAMPLE_GPUS") {
        Ok(v) => {
            let n: usize = v
                .parse()
                .map_err(|_| format!("P2P_EXAMPLE_GPUS={v:?} is not a number"))?;
            if n < 2 || n > visible {
                return Err(
                    format!("P2P_EXAMPLE_GPUS={n}, but {visible} GPU(s) are visible").into(),
                );
            }
            Ok(n)
        }
        Err(_) => Ok(visible),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_sum_exactly_and_wrong_elements_are_counted() {
        assert_eq!(sum(2, 0, 0), value(0, 0, 0) + value(1, 0, 0));
        assert_eq!(sum(8, 3, 1), (0..8).map(|r| value(r, 3, 1)).sum::<f32>());
        let got = [sum(2, 0, 0), sum(2, 1, 0) + 1.0];
        assert_eq!(count_wrong("t", &got, |i| sum(2, i, 0)), 1);
    }
}
