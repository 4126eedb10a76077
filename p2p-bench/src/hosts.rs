//! `p2p-bench hosts`: a job over several hosts (`MultiHostCommunicator`) beside NCCL's own
//! communicator over the same ranks and host ids, every collective from `min_bytes` to
//! `max_bytes`. Runs in every rank of a job started by `p2p-bench launch -n N --hosts H` (one
//! machine posing as H hosts) or torchrun `--nnodes H`; rank 0 prints each row as it is done
//! and writes `hosts-DATE-WxGPU.{json,md}`.
//!
//! Each figure is the host's wall clock around `iters` calls and a synchronize, the median of
//! `samples` runs, on rank 0 (every call is a collective: no rank finishes before the others
//! have started it). Before the timing, one call on exact inputs is checked on every rank
//! (`#wrong`, summed over ranks).

use std::time::Instant;

use p2p_collective::verify::{compare, expected, input};
use p2p_collective::{Call, Collectives, DataType, MultiHostCommunicator, Op, RedOp};
use p2p_mem::{DeviceBuffer, DeviceMemory, DeviceMemoryMut, Stream};
use p2p_sys::nccl_rt::{ncclDataType_t, ncclRedOp_t};
use p2p_transport::nccl::{self, Collective};
use serde_json::{json, Value};

use crate::p2p::Stat;

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// The collectives.
    pub ops: Vec<Op>,
    /// Smallest size, bytes (the all-reduce's buffer, the all-gather's output, the
    /// reduce-scatter's and all-to-all's input).
    pub min_bytes: usize,
    /// Largest size, bytes.
    pub max_bytes: usize,
    /// Each size is this many times the one before.
    pub factor: usize,
    /// Timed runs per figure (the median is reported).
    pub samples: usize,
    /// Where rank 0 writes the results.
    pub out: std::path::PathBuf,
}

/// Runs the benchmark in this rank. Rank 0 returns the results (and writes them); the others
/// `None`.
pub fn run(opts: &Options) -> Result<Option<Value>, String> {
    if std::env::var_os("RANK").is_none() {
        return Err("run it as the ranks of a job: `p2p-bench launch -n 4 --hosts 2 -- p2p-bench hosts` on one machine, or under torchrun --nnodes H".into());
    }
    let comm = MultiHostCommunicator::from_env().map_err(|e| e.to_string())?;
    let stream = Stream::new(comm.device()).map_err(|e| e.to_string())?;
    let (w, r) = (comm.world_size(), comm.rank());
    let lead = r == 0;
    let layout = *comm.layout();
    if lead {
        eprintln!(
            "hosts: {w} ranks on {} hosts of {}, every op {} B - {} B; p2p over hosts, then NCCL's own communicator",
            layout.hosts, layout.local_world, opts.min_bytes, opts.max_bytes
        );
    }
    let mut rows = Vec::new();
    for &op in &opts.ops {
        for bytes in crate::sendrecv::sizes(opts.min_bytes, opts.max_bytes, opts.factor) {
            // F32 counts: per rank as the op defines `count` (NCCL's convention).
            let Some(sized) = crate::coll::sized(op, DataType::F32, bytes, w) else {
                continue;
            };
            let per_rank = sized.count;
            let call = Call::new(op, DataType::F32, per_rank)
                .redop(RedOp::Sum)
                .root(0);
            let row = measure(&comm, &stream, &call, bytes, opts.samples)?;
            if lead {
                eprintln!(
                    "hosts: {:>14} {:>10} B: p2p {:>10.1} us, NCCL {:>10.1} us, ratio {:.2}, #wrong {}",
                    op.name(),
                    bytes,
                    row["ours_us"].as_f64().unwrap_or(f64::NAN),
                    row["nccl_us"].as_f64().unwrap_or(f64::NAN),
                    row["ratio"].as_f64().unwrap_or(f64::NAN),
                    row["wrong"]
                );
            }
            rows.push(row);
        }
    }
    comm.synchronize(&stream).map_err(|e| e.to_string())?;
    if !lead {
        return Ok(None);
    }
    let gpu = comm.device().name().to_lowercase().replace(' ', "-");
    let results = json!({
        "benchmark": "hosts",
        "date": crate::utc_now(),
        "layout": {"world": w, "hosts": layout.hosts, "per_host": layout.local_world},
        "gpu": comm.device().name(),
        "method": "host wall clock around `iters` calls and a synchronize, median of `samples` runs, on rank 0; f32 sum; the size is the all-reduce's, broadcast's and reduce's buffer, the all-gather's output, the reduce-scatter's and all-to-all's input; NCCL: its own communicator over every rank with the same host ids (MultiHostCommunicator::nccl_all); #wrong: one call on exact inputs, rank 0's output checked (every rank checks its own and fails on a wrong element)",
        "nccl_env": {"NCCL_HOSTID": std::env::var("NCCL_HOSTID").ok()},
        "rows": rows,
    });
    let date: String = crate::utc_now().chars().take(10).collect();
    let stem = format!("hosts-{date}-{w}x{gpu}");
    std::fs::create_dir_all(&opts.out).map_err(|e| format!("{}: {e}", opts.out.display()))?;
    let json_path = opts.out.join(format!("{stem}.json"));
    let md_path = opts.out.join(format!("{stem}.md"));
    let text = serde_json::to_string_pretty(&results).map_err(|e| e.to_string())?;
    std::fs::write(&json_path, text).map_err(|e| format!("{}: {e}", json_path.display()))?;
    std::fs::write(&md_path, render(&results))
        .map_err(|e| format!("{}: {e}", md_path.display()))?;
    eprintln!(
        "hosts: wrote {} and {}",
        json_path.display(),
        md_path.display()
    );
    Ok(Some(results))
}

/// One row: the check, then p2p's time and NCCL's.
fn measure(
    comm: &MultiHostCommunicator,
    stream: &Stream,
    call: &Call,
    bytes: usize,
    samples: usize,
) -> Result<Value, String> {
    let (w, r) = (comm.world_size(), comm.rank());
    let (in_len, out_len) = call.op.buffer_lens(call.count, w, r, call.root);
    let dev = comm.device();
    let e = |e: p2p_mem::Error| e.to_string();
    let mut send = DeviceBuffer::<u8>::zeroed(dev, (in_len * 4).max(1)).map_err(e)?;
    let mut recv =
        DeviceBuffer::<u8>::zeroed(dev, (out_len.max(call.count) * 4).max(1)).map_err(e)?;
    // The check: exact inputs, every output element.
    let host = input(call, w, r, in_len);
    if !host.is_empty() {
        send.slice_mut(..host.len())
            .and_then(|mut v| v.copy_from_host(&host))
            .map_err(e)?;
    }
    recv.memset_u8(0xff).map_err(e)?;
    comm.call(call, &send, &mut recv, stream)
        .and_then(|()| comm.synchronize(stream))
        .map_err(|e| e.to_string())?;
    let got = recv.to_host_vec::<u8>().map_err(e)?;
    let (wrong, first) = compare(call.dtype, &got[..out_len * 4], |j| {
        expected(call, w, r, false, j)
    });
    if wrong > 0 {
        return Err(format!(
            "rank {r}: {} of {bytes} B: {wrong} wrong elements, first {first:?}",
            call.op.name()
        ));
    }
    let iters = if bytes <= 1 << 20 { 20 } else { 5 };
    let ours = time_us(comm, stream, iters, samples, || {
        comm.call(call, &send, &mut recv, stream)
            .map_err(|e| e.to_string())
    })?;
    let theirs = time_us(comm, stream, iters, samples, || {
        nccl_call(comm, stream, call, &send, &mut recv)
    })?;
    Ok(json!({
        "op": call.op.name(),
        "bytes": bytes,
        "count": call.count,
        "iters": iters,
        "ours_us": ours,
        "nccl_us": theirs,
        "ratio": ours / theirs,
        "wrong": wrong,
    }))
}

/// `call` through NCCL's communicator over every rank.
fn nccl_call(
    comm: &MultiHostCommunicator,
    stream: &Stream,
    call: &Call,
    send: &DeviceBuffer<u8>,
    recv: &mut DeviceBuffer<u8>,
) -> Result<(), String> {
    let all = comm.nccl_all();
    let (n, t, sum) = (
        call.count,
        ncclDataType_t::ncclFloat32,
        ncclRedOp_t::ncclSum,
    );
    let root = call.root;
    let which = match call.op {
        Op::AllReduce => Some(Collective::AllReduce(sum)),
        Op::AllGather => Some(Collective::AllGather),
        Op::ReduceScatter => Some(Collective::ReduceScatter(sum)),
        Op::Broadcast => Some(Collective::Broadcast { root }),
        Op::Reduce => Some(Collective::Reduce { red: sum, root }),
        Op::AllToAll => None,
    };
    let res = match which {
        Some(which) => all.collective(which, send, recv, n, t, stream),
        None => {
            let (bytes, world) = (n * 4, comm.world_size());
            nccl::group(std::slice::from_ref(all), || {
                for peer in 0..world {
                    let part = peer * bytes..(peer + 1) * bytes;
                    all.send(&send.slice(part.clone())?, n, t, peer, stream)?;
                    all.recv(&mut recv.slice_mut(part)?, n, t, peer, stream)?;
                }
                Ok(())
            })
        }
    };
    res.map_err(|e| e.to_string())
}

/// Microseconds per call of `f`: the median of `samples` runs of `iters` calls, each timed on
/// the host around a synchronize, after three calls to warm up.
fn time_us(
    comm: &MultiHostCommunicator,
    stream: &Stream,
    iters: usize,
    samples: usize,
    mut f: impl FnMut() -> Result<(), String>,
) -> Result<f64, String> {
    for _ in 0..3 {
        f()?;
    }
    comm.synchronize(stream).map_err(|e| e.to_string())?;
    let mut runs = Vec::with_capacity(samples.max(1));
    for _ in 0..samples.max(1) {
        let t = Instant::now();
        for _ in 0..iters {
            f()?;
        }
        comm.synchronize(stream).map_err(|e| e.to_string())?;
        runs.push(t.elapsed().as_secs_f64() * 1e6 / iters as f64);
    }
    Ok(Stat::of(runs).median)
}

/// The table of a `hosts` result.
pub fn render(r: &Value) -> String {
    let mut s = format!(
        "# p2p over hosts beside NCCL: {} ranks, {} hosts of {} ({}), {}\n\n{}\n\n| op | bytes | p2p (us) | NCCL (us) | p2p / NCCL | #wrong (rank 0) |\n| --- | --- | --- | --- | --- | --- |\n",
        r["layout"]["world"],
        r["layout"]["hosts"],
        r["layout"]["per_host"],
        r["gpu"].as_str().unwrap_or("?"),
        r["date"].as_str().unwrap_or("?"),
        r["method"].as_str().unwrap_or(""),
    );
    for row in r["rows"].as_array().into_iter().flatten() {
        s += &format!(
            "| {} | {} | {:.1} | {:.1} | {:.2} | {} |\n",
            row["op"].as_str().unwrap_or("?"),
            row["bytes"],
            row["ours_us"].as_f64().unwrap_or(f64::NAN),
            row["nccl_us"].as_f64().unwrap_or(f64::NAN),
            row["ratio"].as_f64().unwrap_or(f64::NAN),
            row["wrong"],
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_has_a_row_per_result() {
        let r = json!({
            "layout": {"world": 4, "hosts": 2, "per_host": 2},
            "gpu": "NVIDIA H100", "date": "2026-11-27", "method": "m",
            "rows": [{"op": "all_reduce", "bytes": 8192, "ours_us": 320.0, "nccl_us": 300.0, "ratio": 1.0667, "wrong": 0}],
        });
        let t = render(&r);
        assert!(
            t.contains("| all_reduce | 8192 | 320.0 | 300.0 | 1.07 | 0 |"),
            "{t}"
        );
        assert!(t.contains("4 ranks, 2 hosts of 2"), "{t}");
    }

    #[test]
    fn outside_a_job_it_says_how_to_start_one() {
        if std::env::var_os("RANK").is_some() {
            return;
        }
        let opts = Options {
            ops: vec![Op::AllReduce],
            min_bytes: 8,
            max_bytes: 8,
            factor: 4,
            samples: 1,
            out: std::env::temp_dir(),
        };
        let e = run(&opts).expect_err("no job");
        assert!(e.contains("p2p-bench launch -n 4 --hosts 2"), "{e}");
    }
}
