//! Mixture-of-experts dispatch and combine, one process per GPU, started by a launcher
//! (`p2p-bench launch -n 2 -- ./moe_dispatch`, or torchrun). Every step, rank r sends a
//! different number of token rows to every rank (itself included) in one group of sends and
//! receives (NCCL's grouped ncclSend/ncclRecv), the "experts" leave the rows as they are, and a
//! second group sends every row back to where it came from. Each rank checks every element it
//! received and every element that came back; any rank exits non-zero on a wrong one.

use p2p_collective::{Communicator, DataType};
use p2p_examples::{count_wrong, run, BoxError};
use p2p_mem::{DeviceBuffer, DeviceMemory, DeviceViewMut, Stream};

/// f32 per token row.
const HIDDEN: usize = 512;
const STEPS: usize = 3;

/// Rows rank `from` sends to rank `to` in step `step`: differs for every pair and step.
fn rows(from: usize, to: usize, step: usize) -> usize {
    1 + (from * 37 + to * 11 + step * 53) % 300
}

/// Element `i` of the rows rank `from` sends to rank `to` in step `step` (exact in f32).
fn token(from: usize, to: usize, step: usize, i: usize) -> f32 {
    ((i * 3 + from * 17 + to * 29 + step * 7) % 1021) as f32
}

fn main() {
    run("moe_dispatch", job);
}

/// One group: part p of `src` (`src_lens[p]` elements) goes to rank p, and part p of `dst`
/// (`dst_lens[p]` elements) comes from rank p.
fn exchange(
    comm: &Communicator,
    stream: &Stream,
    src: &DeviceBuffer<f32>,
    src_lens: &[usize],
    dst: &mut DeviceBuffer<f32>,
    dst_lens: &[usize],
) -> Result<(), BoxError> {
    let mut offset = 0;
    let outgoing: Vec<_> = src_lens
        .iter()
        .map(|&len| {
            offset += len;
            src.slice(offset - len..offset)
        })
        .collect::<Result<_, _>>()?;
    let mut incoming: Vec<DeviceViewMut<'_, f32>> = Vec::with_capacity(dst_lens.len());
    let mut rest = dst.slice_mut(..)?;
    for &len in dst_lens {
        let (part, tail) = rest.split_at_mut(len)?;
        incoming.push(part);
        rest = tail;
    }
    let mut group = comm.group(stream);
    for (p, part) in outgoing.iter().enumerate() {
        group.send(part, part.len(), DataType::F32, p)?;
    }
    for (p, part) in incoming.iter_mut().enumerate() {
        let len = part.len();
        group.recv(part, len, DataType::F32, p)?;
    }
    group.launch()?;
    Ok(())
}

fn job() -> Result<(), BoxError> {
    let comm = Communicator::from_env()?;
    let (rank, n) = (comm.rank(), comm.world_size());
    if n < 2 {
        return Err("this example needs at least 2 ranks".into());
    }
    let stream = Stream::new(comm.device())?;
    let mut wrong = 0;
    let mut moved = 0usize;
    for step in 0..STEPS {
        let out_lens: Vec<usize> = (0..n).map(|p| rows(rank, p, step) * HIDDEN).collect();
        let in_lens: Vec<usize> = (0..n).map(|p| rows(p, rank, step) * HIDDEN).collect();
        let host: Vec<f32> = (0..n)
            .flat_map(|p| (0..out_lens[p]).map(move |i| token(rank, p, step, i)))
            .collect();
        let tokens = DeviceBuffer::from_host(comm.device(), &host)?;
        let mut received = DeviceBuffer::<f32>::zeroed(comm.device(), in_lens.iter().sum())?;
        let mut back = DeviceBuffer::<f32>::zeroed(comm.device(), host.len())?;
        // Dispatch: part p of `tokens` to rank p; part p of `received` from rank p. Then
        // combine: every row goes back to the rank it came from.
        exchange(&comm, &stream, &tokens, &out_lens, &mut received, &in_lens)?;
        exchange(&comm, &stream, &received, &in_lens, &mut back, &out_lens)?;
        comm.synchronize(&stream)?;
        let got = received.to_host_vec::<f32>()?;
        let mut at = 0;
        for (p, &len) in in_lens.iter().enumerate() {
            wrong += count_wrong(
                &format!("rank {rank} step {step}: rows from rank {p}"),
                &got[at..at + len],
                |i| token(p, rank, step, i),
            );
            at += len;
        }
        let returned = back.to_host_vec::<f32>()?;
        wrong += count_wrong(
            &format!("rank {rank} step {step}: rows back"),
            &returned,
            |i| host[i],
        );
        moved += 4 * (tokens.len() + received.len());
    }
    if rank == 0 {
        println!(
            "moe_dispatch: {n} ranks, {STEPS} steps of dispatch and combine groups ({} KiB moved by rank 0, workspaces via {}): rank 0 saw {wrong} wrong",
            moved >> 10,
            comm.sharing().name()
        );
    }
    if wrong > 0 {
        return Err(format!("rank {rank}: {wrong} wrong elements").into());
    }
    Ok(())
}
