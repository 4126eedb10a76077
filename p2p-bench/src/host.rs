//! `p2p-bench host`: where the host's time goes when it issues one collective
//! (docs/performance.md, "Host cost of a call").
//!
//! Every variant is issued round-robin over the ranks, `calls` times per rank, in one timed
//! batch (host clock around the issuing only: the streams are synchronised before and after,
//! outside the timing), and reported as host microseconds per call and rank: the median, the
//! smallest and the largest of `samples` batches, the variants interleaved so that drift hits
//! them alike. Each variant adds one thing to the one before it, so their differences split
//! the cost: binding the rank's context alone; an empty kernel launched as ours are; the same
//! with an argument block the size of ours; our all-reduce, small and 8 KiB, out of place and
//! in place.

use std::time::Instant;

use p2p_collective::{Call, Collectives, Communicator, DataType, Op, Options as CommOptions};
use p2p_mem::{DeviceBuffer, Stream};
use serde_json::{json, Value};

use crate::floor::{EmptyKernel, Launch};
use crate::p2p::Stat;

/// What to measure.
#[derive(Debug, Clone)]
pub struct Options {
    /// How many GPUs, one rank each (0: all).
    pub gpus: usize,
    /// Instead: this many ranks on GPU 0 (0: off). Ranks sharing a GPU launch plainly (no
    /// programmatic dependent launch), and the empty kernels do the same.
    pub share_gpu: usize,
    /// Timed batches per variant.
    pub samples: usize,
    /// Calls per rank in one batch.
    pub calls: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            gpus: 0,
            share_gpu: 0,
            samples: 30,
            calls: 200,
        }
    }
}

/// One thing timed.
#[derive(Debug, Clone, Copy)]
enum Variant {
    /// `cuCtxSetCurrent` of the rank's GPU, no launch.
    Bind,
    /// An empty kernel launched as ours are (or, `other`, the other way: plain where ours
    /// use programmatic dependent launch and the reverse), with or without an argument block
    /// of our size.
    Empty { args: bool, other: bool },
    /// Our f32 all-reduce of `bytes` (0: a call with nothing to do, which returns after the
    /// argument checks).
    AllReduce { bytes: usize, in_place: bool },
    /// `Communicator::plan` of an 8 KiB f32 all-reduce: the planner alone.
    Plan,
}

impl Variant {
    const ALL: [Variant; 9] = [
        Variant::Bind,
        Variant::Plan,
        Variant::AllReduce {
            bytes: 0,
            in_place: false,
        },
        Variant::Empty {
            args: false,
            other: false,
        },
        Variant::Empty {
            args: true,
            other: false,
        },
        Variant::Empty {
            args: true,
            other: true,
        },
        Variant::AllReduce {
            bytes: 8,
            in_place: false,
        },
        Variant::AllReduce {
            bytes: 8192,
            in_place: false,
        },
        Variant::AllReduce {
            bytes: 8192,
            in_place: true,
        },
    ];

    fn name(self) -> String {
        match self {
            Variant::Bind => "bind".into(),
            Variant::Plan => "plan".into(),
            Variant::Empty { args, other } => format!(
                "empty{}{}",
                if args { "_args" } else { "" },
                if other { "_other_launch" } else { "" }
            ),
            Variant::AllReduce { bytes, in_place } => format!(
                "all_reduce_{}{}",
                crate::p2p::size_name(bytes),
                if in_place { "_in_place" } else { "" }
            )
            .replace(' ', ""),
        }
    }

    fn what(self) -> String {
        match self {
            Variant::Bind => "cuCtxSetCurrent of the rank's GPU, no launch".into(),
            Variant::Plan => "Communicator::plan of an 8 KiB f32 all-reduce, no launch".into(),
            Variant::AllReduce { bytes: 0, .. } => {
                "Communicator::call with count 0: the checks, no launch".into()
            }
            Variant::Empty { args, other } => format!(
                "an empty kernel {}, launched {}",
                if args {
                    format!(
                        "with a {}-byte argument block (ours)",
                        p2p_collective::comm::KERNEL_ARGS_BYTES
                    )
                } else {
                    "with no parameters".into()
                },
                if other {
                    "the other way (plain <-> programmatic dependent launch)"
                } else {
                    "as ours are"
                }
            ),
            Variant::AllReduce { bytes, in_place } => format!(
                "Communicator::{} f32 all-reduce of {}",
                if in_place { "call_in_place" } else { "call" },
                crate::p2p::size_name(bytes)
            ),
        }
    }
}

struct Rank {
    stream: Stream,
    input: DeviceBuffer<u8>,
    output: DeviceBuffer<u8>,
    floor: EmptyKernel,
}

struct Harness {
    comms: Vec<Communicator>,
    ranks: Vec<Rank>,
    launch: Launch,
}

impl Harness {
    fn issue(&mut self, v: Variant) -> Result<(), String> {
        let e = |e: &dyn std::fmt::Display| e.to_string();
        for (comm, r) in self.comms.iter().zip(self.ranks.iter_mut()) {
            match v {
                Variant::Bind => r.stream.device().bind_to_thread().map_err(|x| e(&x))?,
                Variant::Plan => {
                    let call = Call::new(Op::AllReduce, DataType::F32, 2048);
                    std::hint::black_box(comm.plan(std::hint::black_box(&call)));
                }
                Variant::Empty { args, other } => {
                    let how = Launch {
                        args,
                        overlapped: self.launch.overlapped != other,
                    };
                    r.floor
                        .launch_as(how, 1, 512, &r.stream)
                        .map_err(|x| e(&x))?
                }
                Variant::AllReduce { bytes, in_place } => {
                    let call = Call::new(Op::AllReduce, DataType::F32, bytes / 4);
                    if in_place {
                        comm.call_in_place(&call, &mut r.output, &r.stream)
                    } else {
                        comm.call(&call, &r.input, &mut r.output, &r.stream)
                    }
                    .map_err(|x| e(&x))?
                }
            }
        }
        Ok(())
    }

    fn sync(&self) -> Result<(), String> {
        crate::timing::sync_all(
            self.ranks.iter().map(|r| &r.stream),
            &self.comms,
            crate::timing::DEFAULT_WAIT,
            || Ok(()),
        )
    }

    /// Host microseconds per call and rank of one batch of `calls` calls per rank.
    fn sample(&mut self, v: Variant, calls: usize) -> Result<f64, String> {
        self.sync()?;
        let t = Instant::now();
        for _ in 0..calls {
            self.issue(v)?;
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / (calls * self.ranks.len()) as f64;
        self.sync()?;
        Ok(us)
    }
}

/// Runs the experiment; the JSON holds every figure.
pub fn run(opts: &Options) -> Result<Value, String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    let devices = crate::rank_devices("host", opts.gpus, opts.share_gpu)?;
    let comm_options = CommOptions::from_env().map_err(|x| e(&x))?;
    let comms = Communicator::init_all_with(&devices, comm_options).map_err(|x| e(&x))?;
    let shared = comms[0].ranks_per_gpu() > 1;
    let mut ranks = Vec::new();
    for d in &devices {
        ranks.push(Rank {
            stream: Stream::new(d).map_err(|x| e(&x))?,
            input: DeviceBuffer::new(d, 8192).map_err(|x| e(&x))?,
            output: DeviceBuffer::new(d, 8192).map_err(|x| e(&x))?,
            floor: EmptyKernel::load(d).map_err(|x| e(&x))?,
        });
    }
    let mut h = Harness {
        comms,
        ranks,
        launch: Launch {
            overlapped: !shared,
            args: false,
        },
    };
    // Warm up: the kernels' first launches (module loads, the planner's first calls).
    for v in Variant::ALL {
        h.sample(v, 3)?;
    }
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); Variant::ALL.len()];
    for _ in 0..opts.samples.max(1) {
        for (i, v) in Variant::ALL.into_iter().enumerate() {
            times[i].push(h.sample(v, opts.calls.max(1))?);
        }
    }
    let rows: Vec<Value> = Variant::ALL
        .into_iter()
        .zip(&mut times)
        .map(|(v, t)| {
            let s = Stat::of(std::mem::take(t));
            json!({
                "variant": v.name(),
                "what": v.what(),
                "us_median": s.median,
                "us_min": s.min,
                "us_max": s.max,
            })
        })
        .collect();
    let d0 = &devices[0];
    Ok(json!({
        "device": d0.name(),
        "ranks": devices.len(),
        "gpus": if shared { 1 } else { devices.len() },
        "ranks_share_a_gpu": shared,
        "dependent_launch": h.launch.overlapped && d0.compute_capability().0 >= 9,
        "calls_per_batch_and_rank": opts.calls.max(1),
        "samples": opts.samples.max(1),
        "rows": rows,
    }))
}

/// The result as a Markdown table, with the differences that split the cost.
pub fn markdown(v: &Value) -> String {
    let mut s = format!(
        "Host microseconds per call and rank: {} rank(s) on {} x {}{}; dependent launch {}; {} batches of {} calls per rank (median, min-max).\n\n| variant | median | min | max | what |\n| --- | --- | --- | --- | --- |\n",
        v["ranks"],
        v["gpus"],
        v["device"].as_str().unwrap_or("?"),
        if v["ranks_share_a_gpu"] == json!(true) { " (sharing it)" } else { "" },
        if v["dependent_launch"] == json!(true) { "on" } else { "off" },
        v["samples"],
        v["calls_per_batch_and_rank"],
    );
    let mut median = std::collections::HashMap::new();
    for r in v["rows"].as_array().into_iter().flatten() {
        let name = r["variant"].as_str().unwrap_or("?");
        let f = |k: &str| r[k].as_f64().unwrap_or(f64::NAN);
        median.insert(name.to_string(), f("us_median"));
        s += &format!(
            "| {name} | {:.3} | {:.3} | {:.3} | {} |\n",
            f("us_median"),
            f("us_min"),
            f("us_max"),
            r["what"].as_str().unwrap_or("")
        );
    }
    let m = |k: &str| median.get(k).copied().unwrap_or(f64::NAN);
    s += &format!(
        "\nOf the medians: the argument block adds {:.3} us to an empty launch; the other launch kind {:+.3} us; our 8 KiB all-reduce costs {:.3} us more than the empty launch with arguments (8 B: {:.3}; in place: {:.3}).\n",
        m("empty_args") - m("empty"),
        m("empty_args_other_launch") - m("empty_args"),
        m("all_reduce_8KiB") - m("empty_args"),
        m("all_reduce_8B") - m("empty_args"),
        m("all_reduce_8KiB_in_place") - m("empty_args"),
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variant_names_are_those_the_summary_reads() {
        let names: Vec<String> = Variant::ALL.iter().map(|v| v.name()).collect();
        for n in [
            "empty",
            "empty_args",
            "empty_args_other_launch",
            "all_reduce_8B",
            "all_reduce_8KiB",
        ] {
            assert!(names.iter().any(|x| x == n), "{n} not in {names:?}");
        }
        assert!(names.contains(&"all_reduce_8KiB_in_place".to_string()));
    }

    #[test]
    fn the_summary_splits_the_medians() {
        let row = |n: &str, us: f64| json!({"variant": n, "what": "", "us_median": us, "us_min": us, "us_max": us});
        let v = json!({
            "ranks": 2, "gpus": 1, "device": "GPU", "ranks_share_a_gpu": true,
            "dependent_launch": false, "samples": 3, "calls_per_batch_and_rank": 10,
            "rows": [row("bind", 0.05), row("empty", 2.0), row("empty_args", 2.25), row("empty_args_other_launch", 2.375),
                     row("all_reduce_8B", 2.5), row("all_reduce_8KiB", 2.75),
                     row("all_reduce_8KiB_in_place", 3.0)],
        });
        let md = markdown(&v);
        assert!(
            md.contains("2 rank(s) on 1 x GPU (sharing it); dependent launch off"),
            "{md}"
        );
        assert!(md.contains("the argument block adds 0.250 us"), "{md}");
        assert!(md.contains("the other launch kind +0.125 us"), "{md}");
        assert!(md.contains("costs 0.500 us more"), "{md}");
        assert!(md.contains("(8 B: 0.250; in place: 0.750)"), "{md}");
    }
}
