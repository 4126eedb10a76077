//! `p2p-bench sendrecv`: point-to-point between the GPUs of this process, ours (a
//! [`P2pGroup`](p2p_collective::P2pGroup) per rank) beside NCCL's grouped `ncclSend` /
//! `ncclRecv` doing the same, eager and under CUDA graph, for one [`Pattern`]. NCCL runs in two
//! modes: plain, on our buffers and streams; and on its own `ncclMemAlloc` buffers registered
//! as windows, which NCCL can also register for zero-copy send/recv when a graph captures the
//! call (`NCCL_GRAPH_REGISTER`, on by default: nccl-tests' `-G` figures; docs/performance.md,
//! "Send and receive"). The table's ratio is against the faster NCCL mode at each size.
//! Patterns: a ring exchange (rank r sends to r + 1 and receives from r - 1) or an all-to-all
//! written as sends and receives (every rank to every rank, itself included).
//!
//! Method: CUDA events on each rank's stream around `iters` back-to-back exchanges after 3
//! warm-up exchanges; the slowest rank's time per exchange; median of `samples`. Before the
//! figures of each size, one exchange of random bytes by each implementation, every received
//! byte compared. Bandwidth is bytes per message over time: in the ring each rank sends and
//! receives that much at once, so it is the bandwidth per direction of each link of the ring;
//! in the all-to-all each rank sends that much to every rank.

use std::path::PathBuf;

use p2p_collective::{Communicator, DataType};
use p2p_mem::{Device, DeviceBuffer, DeviceMemory, DeviceMemoryMut};
use serde_json::{json, Value};

use crate::nccl::{Bufs, NcclGroup, NcclMode};
use crate::timing;

/// What to run.
#[derive(Debug, Clone)]
pub struct Options {
    /// Smallest message, bytes.
    pub min_bytes: usize,
    /// Largest message, bytes.
    pub max_bytes: usize,
    /// Each size is this many times the one before.
    pub factor: usize,
    /// Timed samples per figure.
    pub samples: usize,
    /// How many GPUs (0: all).
    pub gpus: usize,
    /// Run NCCL beside ours.
    pub nccl: bool,
    /// Who exchanges with whom.
    pub pattern: Pattern,
    /// Where to write the results.
    pub out: PathBuf,
}

/// Who exchanges with whom in one exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// Rank r sends one message to r + 1 and receives one from r - 1.
    Ring,
    /// Rank r sends part p of its send buffer to every rank p (itself included) and receives
    /// from every rank p into part p of its receive buffer: all-to-all as grouped send/recv.
    AllToAll,
}

impl Pattern {
    /// The name on the command line and in the results.
    pub fn name(self) -> &'static str {
        match self {
            Pattern::Ring => "ring",
            Pattern::AllToAll => "all-to-all",
        }
    }

    /// The pattern named `s` (see [`name`](Self::name)).
    pub fn parse(s: &str) -> Result<Pattern, String> {
        match s {
            "ring" => Ok(Pattern::Ring),
            "all-to-all" | "alltoall" => Ok(Pattern::AllToAll),
            _ => Err(format!("unknown pattern {s:?}: ring or all-to-all")),
        }
    }

    /// Message-sized parts of each buffer.
    fn parts(self, n: usize) -> usize {
        match self {
            Pattern::Ring => 1,
            Pattern::AllToAll => n,
        }
    }

    /// What rank `r` of `n` does: `(true, to, send part)` and `(false, from, receive part)`.
    pub fn ops(self, r: usize, n: usize) -> Vec<(bool, usize, usize)> {
        match self {
            Pattern::Ring => vec![(true, (r + 1) % n, 0), (false, (r + n - 1) % n, 0)],
            Pattern::AllToAll => (0..n)
                .map(|p| (true, p, p))
                .chain((0..n).map(|p| (false, p, p)))
                .collect(),
        }
    }

    /// The part of its send buffer that rank `from` sends to rank `to`.
    fn sent_part(self, _from: usize, to: usize) -> usize {
        match self {
            Pattern::Ring => 0,
            Pattern::AllToAll => to,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Imp {
    Ours,
    /// NCCL on our buffers.
    Nccl,
    /// NCCL on its own `ncclMemAlloc` buffers, registered as windows.
    NcclMem,
}

/// The implementations, as named in the results.
const IMPS: [(Imp, &str); 3] = [
    (Imp::Ours, "ours"),
    (Imp::Nccl, NCCL_MODES[0].0),
    (Imp::NcclMem, NCCL_MODES[1].0),
];

/// NCCL's modes: (the key of its figures in a result row, its name in the tables and logs).
const NCCL_MODES: [(&str, &str); 2] = [("nccl", "plain"), ("nccl_mem", "ncclMemAlloc")];

struct Rank {
    timer: timing::Timer,
    send: DeviceBuffer<u8>,
    recv: DeviceBuffer<u8>,
}

struct Harness<'a> {
    pattern: Pattern,
    comms: &'a [Communicator],
    nccl: Option<&'a NcclGroup>,
    nccl_mem: Option<&'a NcclGroup>,
    ranks: Vec<Rank>,
    /// Every rank's operations (`Pattern::ops`), fixed for the run.
    ops: Vec<Vec<(bool, usize, usize)>>,
    bufs: Vec<Bufs>,
    mem_bufs: Vec<Bufs>,
    streams: Vec<p2p_sys::cuda::CUstream>,
    /// Holds every stream while a graph sample is queued (`timing::graph`).
    gate: Option<crate::gate::Gate>,
}

timing::impl_ranks!(Harness<'_>);

impl Harness<'_> {
    fn issue(&mut self, imp: Imp, bytes: usize) -> Result<(), String> {
        let n = self.ranks.len();
        let e = |e: p2p_collective::Error| e.to_string();
        let m = |e: p2p_mem::Error| e.to_string();
        match imp {
            Imp::Ours => {
                let ranks = self.comms.iter().zip(self.ranks.iter_mut()).zip(&self.ops);
                for ((comm, rank), ops) in ranks {
                    let parts = self.pattern.parts(n);
                    let sends: Vec<_> = (0..parts)
                        .map(|k| rank.send.slice(k * bytes..(k + 1) * bytes))
                        .collect::<Result<_, _>>()
                        .map_err(m)?;
                    let mut recvs = Vec::with_capacity(parts);
                    let mut rest = rank.recv.slice_mut(..parts * bytes).map_err(m)?;
                    for _ in 0..parts {
                        let (part, tail) = rest.split_at_mut(bytes).map_err(m)?;
                        recvs.push(part);
                        rest = tail;
                    }
                    let mut refs: Vec<Option<&mut _>> = recvs.iter_mut().map(Some).collect();
                    let mut g = comm.group(&rank.timer.stream);
                    for &(send, peer, part) in ops {
                        if send {
                            g.send(&sends[part], bytes, DataType::U8, peer).map_err(e)?;
                        } else {
                            let buf = refs[part].take().ok_or("a part received twice")?;
                            g.recv(buf, bytes, DataType::U8, peer).map_err(e)?;
                        }
                    }
                    g.launch().map_err(e)?;
                }
                Ok(())
            }
            Imp::Nccl | Imp::NcclMem => {
                let (group, bufs) = if imp == Imp::Nccl {
                    (self.nccl, &self.bufs)
                } else {
                    (self.nccl_mem, &self.mem_bufs)
                };
                group
                    .ok_or("NCCL is not set up")?
                    .issue_p2p(bytes, bufs, &self.streams, &self.ops)
            }
        }
    }

    fn sync(&self) -> Result<(), String> {
        timing::Ranks::sync(self)
    }

    /// Wrong bytes after one exchange of random data.
    fn check(&mut self, imp: Imp, bytes: usize, seed: u64) -> Result<usize, String> {
        let n = self.ranks.len();
        let parts = self.pattern.parts(n);
        let len = parts * bytes;
        let e = |e: p2p_mem::Error| e.to_string();
        let mem = self.nccl_mem;
        let windows = move |r: usize| {
            mem.and_then(|g| g.window_prefix(r, len))
                .ok_or_else(|| "NCCL's ncclMemAlloc buffers are not set up".to_string())
        };
        // Rank r sends data[r]: made once, uploaded, then compared with what each peer got.
        let data: Vec<Vec<u8>> = (0..n).map(|r| random_bytes(seed + r as u64, len)).collect();
        for (r, rank) in self.ranks.iter_mut().enumerate() {
            let data = &data[r];
            if imp == Imp::NcclMem {
                let (mut send, mut recv) = windows(r)?;
                send.copy_from_host(data).map_err(e)?;
                recv.copy_from_host(&vec![0xffu8; len]).map_err(e)?;
            } else {
                rank.send
                    .slice_mut(..len)
                    .and_then(|mut s| s.copy_from_host(data))
                    .map_err(e)?;
                rank.recv.memset_u8(0xff).map_err(e)?;
            }
        }
        self.issue(imp, bytes)?;
        self.sync()?;
        let mut wrong = 0;
        for (r, rank) in self.ranks.iter().enumerate() {
            let got = if imp == Imp::NcclMem {
                windows(r)?.1.to_host_vec::<u8>().map_err(e)?
            } else {
                rank.recv
                    .slice(..len)
                    .and_then(|s| s.to_host_vec::<u8>())
                    .map_err(e)?
            };
            for &(send, from, part) in &self.ops[r] {
                if send {
                    continue;
                }
                let theirs = &data[from];
                let k = self.pattern.sent_part(from, r);
                let want = &theirs[k * bytes..(k + 1) * bytes];
                let got = &got[part * bytes..(part + 1) * bytes];
                wrong += got.iter().zip(want).filter(|(a, b)| a != b).count();
            }
        }
        Ok(wrong)
    }
}

/// Random bytes from a seed (xorshift), the same on every call.
fn random_bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect()
}

/// The sizes: `min`, `min * factor`, ... up to `max` (as `coll` steps them).
pub use crate::coll::sizes;

/// Runs the benchmark; writes `sendrecv[-alltoall]-DATE-NxGPU.{json,md}` under `opts.out`
/// (GPU: the device's name, e.g. `h200`).
pub fn run(opts: &Options) -> Result<Value, String> {
    let all = Device::all().map_err(|e| e.to_string())?;
    let devices: Vec<Device> = if opts.gpus == 0 {
        all
    } else {
        all.into_iter().take(opts.gpus).collect()
    };
    let n = devices.len();
    if n < 2 {
        return Err(format!("sendrecv needs at least 2 GPUs, found {n}"));
    }
    let comms = Communicator::init_all(&devices).map_err(|e| e.to_string())?;
    let bytes_max = opts.max_bytes.max(1);
    let setup = |mode: NcclMode, window_bytes: usize| {
        if !opts.nccl {
            return None;
        }
        match NcclGroup::init(&devices, mode, window_bytes, 1) {
            Ok(g) => Some(g),
            Err(e) => {
                eprintln!(
                    "sendrecv: NCCL ({}) could not be set up, running without it: {e}",
                    mode.name()
                );
                None
            }
        }
    };
    let nccl = setup(NcclMode::Plain, 0);
    let nccl_mem = setup(NcclMode::Symmetric, bytes_max * opts.pattern.parts(n));
    let mem_bufs = nccl_mem
        .as_ref()
        .and_then(NcclGroup::window_bufs)
        .unwrap_or_default();
    let mut ranks = Vec::with_capacity(n);
    for d in &devices {
        let e = |e: p2p_mem::Error| e.to_string();
        ranks.push(Rank {
            timer: timing::Timer::new(d)?,
            send: DeviceBuffer::zeroed(d, bytes_max * opts.pattern.parts(n)).map_err(e)?,
            recv: DeviceBuffer::zeroed(d, bytes_max * opts.pattern.parts(n)).map_err(e)?,
        });
    }
    let bufs = ranks
        .iter()
        .map(|r| Bufs {
            send: r.send.device_ptr(),
            recv: r.recv.device_ptr(),
        })
        .collect();
    let streams = ranks.iter().map(|r| r.timer.stream.cu_stream()).collect();
    let mut h = Harness {
        pattern: opts.pattern,
        comms: &comms,
        nccl: nccl.as_ref(),
        nccl_mem: nccl_mem.as_ref(),
        ops: (0..n).map(|r| opts.pattern.ops(r, n)).collect(),
        ranks,
        bufs,
        mem_bufs,
        streams,
        gate: Some(crate::gate::Gate::load(&devices).map_err(|e| e.to_string())?),
    };
    let imps: Vec<_> = IMPS
        .into_iter()
        .filter(|(imp, _)| match imp {
            Imp::Ours => true,
            Imp::Nccl => h.nccl.is_some(),
            Imp::NcclMem => h.nccl_mem.is_some(),
        })
        .collect();
    let sizes = sizes(opts.min_bytes, bytes_max, opts.factor);
    let mut rows = Vec::new();
    for (i, &bytes) in sizes.iter().enumerate() {
        let iters = timing::iters_for(bytes);
        let mut row = json!({ "bytes": bytes });
        for &(imp, name) in &imps {
            let wrong = h.check(imp, bytes, 1000 + i as u64)?;
            // Microseconds per exchange: the slowest rank, median over samples; eager, then
            // `iters` exchanges captured in one CUDA graph per rank.
            let eager = timing::eager(&mut h, iters, opts.samples, |h| h.issue(imp, bytes))?.median;
            let replays = timing::Sampling {
                iters,
                samples: opts.samples.min(10),
                gated: true,
            };
            let graph = timing::graph(&mut h, replays, |h| h.issue(imp, bytes))?.median;
            row[name] = json!({
                "wrong": wrong,
                "eager_us": eager,
                "graph_us": graph,
                "eager_gbps": bytes as f64 / eager / 1e3,
                "graph_gbps": bytes as f64 / graph / 1e3,
            });
        }
        eprintln!(
            "[{:>2}/{}] {:>10} B: ours {:.2} us eager, {:.2} us graph{}",
            i + 1,
            sizes.len(),
            bytes,
            row["ours"]["eager_us"].as_f64().unwrap_or(f64::NAN),
            row["ours"]["graph_us"].as_f64().unwrap_or(f64::NAN),
            NCCL_MODES
                .iter()
                .filter_map(|(key, mode)| row.get(*key).map(|x| format!(
                    "; NCCL {mode} {:.2} us eager, {:.2} us graph",
                    x["eager_us"].as_f64().unwrap_or(f64::NAN),
                    x["graph_us"].as_f64().unwrap_or(f64::NAN)
                )))
                .collect::<String>()
        );
        rows.push(row);
    }
    let gpu = devices[0].name().to_string();
    let result = json!({
        "gpus": n,
        "gpu": gpu,
        "nccl": crate::nccl::version().unwrap_or_else(|e| format!("unavailable ({e})")),
        "pattern": opts.pattern.name(),
        "method": format!("{}; ours: one P2pGroup per rank (Communicator::group); NCCL: ncclSend + ncclRecv per rank in one group, plain on our buffers (`nccl`) and on its own ncclMemAlloc buffers registered as symmetric windows (`nccl_mem`; under graph capture NCCL registers them for zero-copy send/recv, as in nccl-tests -G); ours/NCCL is against the faster NCCL mode of each timing; CUDA events around `iters` exchanges after 3 warm-ups, slowest rank, median of samples (graph: up to 10); GB/s = bytes per message / time; one checked exchange of random bytes per size and implementation", match opts.pattern {
            Pattern::Ring => "a ring exchange (rank r sends to r + 1, receives from r - 1; GB/s per direction of each link)",
            Pattern::AllToAll => "all-to-all as sends and receives (rank r sends `bytes` to every rank, itself included, and receives `bytes` from every rank)",
        }),
        "rows": rows,
    });
    std::fs::create_dir_all(&opts.out)
        .map_err(|e| format!("creating {}: {e}", opts.out.display()))?;
    let date: String = crate::utc_now().chars().take(10).collect();
    let slug = crate::gpu_slug(devices[0].name());
    let stem = match opts.pattern {
        Pattern::Ring => format!("sendrecv-{date}-{n}x{slug}"),
        Pattern::AllToAll => format!("sendrecv-alltoall-{date}-{n}x{slug}"),
    };
    let json_path = opts.out.join(format!("{stem}.json"));
    let md_path = opts.out.join(format!("{stem}.md"));
    std::fs::write(
        &json_path,
        serde_json::to_string_pretty(&result).unwrap_or_default(),
    )
    .map_err(|e| format!("writing {}: {e}", json_path.display()))?;
    std::fs::write(&md_path, render(&result))
        .map_err(|e| format!("writing {}: {e}", md_path.display()))?;
    eprintln!("wrote {} and {}", json_path.display(), md_path.display());
    let wrong: u64 = result["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|row| IMPS.map(|(_, name)| &row[name]["wrong"]))
        .filter_map(Value::as_u64)
        .sum();
    if wrong > 0 {
        return Err(format!(
            "{wrong} wrong bytes received (see the #wrong column of {})",
            md_path.display()
        ));
    }
    Ok(result)
}

/// The faster NCCL mode for `key` (`eager_us` or `graph_us`) in a row: (microseconds, mode).
fn best_nccl(row: &Value, key: &str) -> Option<(f64, &'static str)> {
    NCCL_MODES
        .into_iter()
        .filter_map(|(name, mode)| row[name][key].as_f64().map(|t| (t, mode)))
        .min_by(|a, b| a.0.total_cmp(&b.0))
}

/// The Markdown table of a result.
pub fn render(r: &Value) -> String {
    let mut s = format!(
        "# Send/recv, {}, {} x {} (NCCL {})\n\n{}\n\n\
         | bytes | ours eager us | GB/s | ours graph us | GB/s | NCCL eager us (plain, ncclMemAlloc) | NCCL graph us (plain, ncclMemAlloc) | best NCCL graph GB/s | ours/best NCCL eager | ours/best NCCL graph | wrong (ours, plain, ncclMemAlloc) |\n\
         |---|---|---|---|---|---|---|---|---|---|---|\n",
        r["pattern"].as_str().unwrap_or("ring"), r["gpus"], r["gpu"].as_str().unwrap_or("?"),
        r["nccl"].as_str().unwrap_or("?"), r["method"].as_str().unwrap_or("")
    );
    let f = |v: &Value, d: usize| v.as_f64().map_or("-".to_string(), |x| format!("{x:.d$}"));
    let wrong = |v: &Value| {
        if v.is_null() {
            "-".to_string()
        } else {
            v["wrong"].to_string()
        }
    };
    for row in r["rows"].as_array().into_iter().flatten() {
        let o = &row["ours"];
        let bytes = row["bytes"].as_f64().unwrap_or(0.0);
        let ratio = |key: &str| match (o[key].as_f64(), best_nccl(row, key)) {
            (Some(a), Some((b, mode))) if b > 0.0 => format!("{:.2} ({mode})", a / b),
            _ => "-".into(),
        };
        let best_gbps = best_nccl(row, "graph_us")
            .filter(|(t, _)| *t > 0.0)
            .map_or("-".to_string(), |(t, _)| format!("{:.1}", bytes / t / 1e3));
        s += &format!(
            "| {} | {} | {} | {} | {} | {}, {} | {}, {} | {} | {} | {} | {}, {}, {} |\n",
            row["bytes"],
            f(&o["eager_us"], 2),
            f(&o["eager_gbps"], 1),
            f(&o["graph_us"], 2),
            f(&o["graph_gbps"], 1),
            f(&row["nccl"]["eager_us"], 2),
            f(&row["nccl_mem"]["eager_us"], 2),
            f(&row["nccl"]["graph_us"], 2),
            f(&row["nccl_mem"]["graph_us"], 2),
            best_gbps,
            ratio("eager_us"),
            ratio("graph_us"),
            o["wrong"],
            wrong(&row["nccl"]),
            wrong(&row["nccl_mem"]),
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_grow_by_the_factor_up_to_the_largest() {
        assert_eq!(sizes(8, 100, 4), vec![8, 32]);
        assert_eq!(sizes(1, 1, 2), vec![1]);
        assert_eq!(sizes(0, 4, 0), vec![1, 2, 4]);
    }

    #[test]
    fn the_table_compares_ours_with_the_faster_nccl_mode() {
        let r = json!({
            "gpus": 2, "gpu": "H200", "nccl": "2.28.9", "method": "m",
            "rows": [
                {"bytes": 8000, "ours": {"wrong": 0, "eager_us": 4.0, "graph_us": 3.0, "eager_gbps": 2.0, "graph_gbps": 2.7},
                 "nccl": {"wrong": 0, "eager_us": 8.0, "graph_us": 6.0},
                 "nccl_mem": {"wrong": 1, "eager_us": 10.0, "graph_us": 4.0}},
                {"bytes": 16, "ours": {"wrong": 0, "eager_us": 4.0, "graph_us": 3.0, "eager_gbps": 0.004, "graph_gbps": 0.005}}
            ]
        });
        let t = render(&r);
        // Eager: plain is faster (8 < 10); graph: ncclMemAlloc is (4 < 6), 8000 B / 4 us.
        assert!(
            t.contains(
                "| 8000 | 4.00 | 2.0 | 3.00 | 2.7 | 8.00, 10.00 | 6.00, 4.00 | 2.0 | 0.50 (plain) | 0.75 (ncclMemAlloc) | 0, 0, 1 |"
            ),
            "{t}"
        );
        assert!(
            t.contains("| 16 | 4.00 | 0.0 | 3.00 | 0.0 | -, - | -, - | - | - | - | 0, -, - |"),
            "{t}"
        );
    }

    #[test]
    fn every_send_of_a_pattern_has_its_receive() {
        for pattern in [Pattern::Ring, Pattern::AllToAll] {
            assert_eq!(Pattern::parse(pattern.name()), Ok(pattern));
            for n in 2..=8 {
                let mut sends = Vec::new();
                let mut recvs = Vec::new();
                for r in 0..n {
                    for (send, peer, part) in pattern.ops(r, n) {
                        assert!(part < pattern.parts(n));
                        if send {
                            assert_eq!(part, pattern.sent_part(r, peer));
                            sends.push((r, peer));
                        } else {
                            recvs.push((peer, r));
                        }
                    }
                }
                sends.sort_unstable();
                recvs.sort_unstable();
                assert_eq!(sends, recvs, "{} on {n} ranks", pattern.name());
            }
        }
        assert!(Pattern::parse("star").is_err());
    }

    #[test]
    fn random_bytes_are_repeatable_and_differ_by_seed() {
        assert_eq!(random_bytes(3, 64), random_bytes(3, 64));
        assert_ne!(random_bytes(3, 64), random_bytes(4, 64));
    }
}
