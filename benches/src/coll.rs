//! `p2p-bench coll`: every collective from 8 B to 1 GiB, ours beside NCCL's, nccl-tests style.
//!
//! Both run in this process on the same GPUs, streams and buffers, timed the same way: CUDA
//! events on every rank's stream around `iters` back-to-back calls, the slowest rank's time,
//! median of `samples`. Eager (one launch per call from the host) and, up to
//! `graph_max_bytes`, CUDA graph (the same calls captured once, replayed). Before timing, each
//! implementation runs each call once on exact inputs and every output element is checked
//! (`#wrong`, as nccl-tests does).

use std::io::IsTerminal;
use std::time::Instant;

use p2p_collective::verify::{
    build, class, compare, expected, in_place_input_offset, result_region, value, Class,
};
use p2p_collective::{Call, Communicator, DataType, Op, Options as CommOptions};
use p2p_mem::{Device, DeviceBuffer, DeviceMemory, DeviceMemoryMut, Event, GraphExec, Stream};
use serde_json::{json, Value};

use crate::nccl::{Bufs, NcclGroup};
use crate::p2p::{size_name, Stat};

/// What to measure.
#[derive(Debug, Clone)]
pub struct Options {
    /// Collectives to run.
    pub ops: Vec<Op>,
    /// Smallest size, bytes.
    pub min_bytes: usize,
    /// Largest size, bytes.
    pub max_bytes: usize,
    /// Samples per figure (median reported).
    pub samples: usize,
    /// Largest size also timed as a CUDA graph.
    pub graph_max_bytes: usize,
    /// How many GPUs (0: all).
    pub gpus: usize,
    /// Also run NCCL.
    pub nccl: bool,
    /// Types for all-reduce (the other collectives run float).
    pub all_reduce_types: Vec<DataType>,
    /// Planner knobs for our communicators (`None`: the defaults), for tuning experiments.
    pub tuning: Option<p2p_collective::plan::Tuning>,
    /// Check every result before timing it (the `#wrong` columns).
    pub check: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            ops: Op::ALL.to_vec(),
            min_bytes: 8,
            max_bytes: 1 << 30,
            samples: 20,
            graph_max_bytes: 64 << 20,
            gpus: 0,
            nccl: true,
            all_reduce_types: vec![DataType::F32, DataType::BF16],
            tuning: None,
            check: true,
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Imp {
    Ours,
    Nccl,
    /// An empty kernel per rank, launched as ours are: the floor under any one-kernel collective.
    Floor,
}

struct Rank {
    stream: Stream,
    /// Exact inputs for the whole buffer, built once per (type, pattern) and copied from.
    pristine: DeviceBuffer<u8>,
    input: DeviceBuffer<u8>,
    output: DeviceBuffer<u8>,
    start: Event,
    stop: Event,
}

struct Harness<'a> {
    comms: &'a [Communicator],
    nccl: Option<&'a NcclGroup>,
    ranks: Vec<Rank>,
    /// Every rank's buffers and stream as NCCL takes them, built once (not per call).
    nccl_bufs: Vec<Bufs>,
    nccl_streams: Vec<p2p_sys::cuda::CUstream>,
    pristine_holds: Option<(DataType, Class)>,
    /// Per rank, loaded on first use.
    floor: Vec<p2p_transport::kernels::EmptyKernel>,
}

/// Calls per timed sample: about 1 GiB of traffic, between 5 and 100.
fn iters_for(bytes: usize) -> usize {
    ((1usize << 30) / bytes.max(1)).clamp(5, 100)
}

impl Harness<'_> {
    fn issue(&mut self, imp: Imp, call: &Call, in_place: bool) -> Result<(), String> {
        match imp {
            Imp::Ours => {
                for (comm, r) in self.comms.iter().zip(self.ranks.iter_mut()) {
                    let res = if in_place {
                        comm.call_in_place(call, &mut r.output, &r.stream)
                    } else {
                        comm.call(call, &r.input, &mut r.output, &r.stream)
                    };
                    res.map_err(|e| e.to_string())?;
                }
                Ok(())
            }
            Imp::Floor => {
                if self.floor.is_empty() {
                    self.floor = self
                        .ranks
                        .iter()
                        .map(|r| p2p_transport::kernels::EmptyKernel::load(r.stream.device()))
                        .collect::<Result<_, _>>()
                        .map_err(|e| e.to_string())?;
                }
                for (k, r) in self.floor.iter().zip(&self.ranks) {
                    k.launch(1, 512, &r.stream).map_err(|e| e.to_string())?;
                }
                Ok(())
            }
            Imp::Nccl => {
                let nccl = self.nccl.ok_or("NCCL is not loaded")?;
                nccl.issue(
                    call.op,
                    call.dtype,
                    call.redop,
                    call.root,
                    call.count,
                    in_place,
                    &self.nccl_bufs,
                    &self.nccl_streams,
                )
            }
        }
    }

    fn sync(&self) -> Result<(), String> {
        for r in &self.ranks {
            r.stream.synchronize().map_err(|e| e.to_string())?;
        }
        for c in self.comms {
            c.check().map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Runs `call` once on exact inputs and counts wrong elements over every rank.
    fn check(&mut self, imp: Imp, call: &Call, in_place: bool) -> Result<usize, String> {
        let n = self.ranks.len();
        let size = call.dtype.size();
        let c = class(call.op, call.redop);
        let e = |e: p2p_mem::Error| e.to_string();
        if self.pristine_holds != Some((call.dtype, c)) {
            for (rank, r) in self.ranks.iter_mut().enumerate() {
                let len = r.pristine.len() / size;
                let host = build(call.dtype, len, |j| value(c, call.dtype, rank, n, j));
                r.pristine
                    .slice_mut(..host.len())
                    .map_err(e)?
                    .copy_from_host(&host)
                    .map_err(e)?;
            }
            self.pristine_holds = Some((call.dtype, c));
        }
        for (rank, r) in self.ranks.iter_mut().enumerate() {
            let (in_len, out_len) = call.op.buffer_lens(call.count, n, rank, call.root);
            let bytes = in_len * size;
            r.output
                .slice_mut(..in_len.max(out_len) * size)
                .map_err(e)?
                .memset_u8(0xff)
                .map_err(e)?;
            let (buf, off) = if in_place {
                (&mut r.output, in_place_input_offset(call, rank) * size)
            } else {
                (&mut r.input, 0)
            };
            if bytes > 0 {
                let src = r.pristine.slice(..bytes).map_err(e)?;
                buf.slice_mut(off..off + bytes)
                    .map_err(e)?
                    .copy_from_device(&src)
                    .map_err(e)?;
            }
        }
        self.issue(imp, call, in_place)?;
        self.sync()?;
        let mut wrong = 0;
        for (rank, r) in self.ranks.iter().enumerate() {
            let (off, len) = result_region(call, n, rank, in_place);
            let got = r
                .output
                .slice(off * size..(off + len) * size)
                .and_then(|v| v.to_host_vec::<u8>())
                .map_err(|e| e.to_string())?;
            wrong += compare(call.dtype, &got, |j| expected(call, n, rank, in_place, j)).0;
        }
        Ok(wrong)
    }

    /// Microseconds per call, eager: the slowest rank, median over samples.
    fn time_eager(
        &mut self,
        imp: Imp,
        call: &Call,
        in_place: bool,
        iters: usize,
        samples: usize,
    ) -> Result<Stat, String> {
        for _ in 0..3 {
            self.issue(imp, call, in_place)?;
        }
        self.sync()?;
        self.sample(iters, samples, |h| {
            for _ in 0..iters {
                h.issue(imp, call, in_place)?;
            }
            Ok(())
        })
    }

    /// `samples` times: events around `body` (which queues `iters` calls) on every rank.
    fn sample(
        &mut self,
        iters: usize,
        samples: usize,
        mut body: impl FnMut(&mut Self) -> Result<(), String>,
    ) -> Result<Stat, String> {
        let mut v = Vec::with_capacity(samples);
        for _ in 0..samples {
            for r in &self.ranks {
                r.start.record(&r.stream).map_err(|e| e.to_string())?;
            }
            body(self)?;
            for r in &self.ranks {
                r.stop.record(&r.stream).map_err(|e| e.to_string())?;
            }
            v.push(self.slowest_us(iters)?);
        }
        Ok(Stat::of(v))
    }

    fn slowest_us(&self, iters: usize) -> Result<f64, String> {
        self.sync()?;
        let mut worst = 0.0f64;
        for r in &self.ranks {
            let ms = r.start.elapsed_ms(&r.stop).map_err(|e| e.to_string())?;
            worst = worst.max(ms as f64 * 1000.0 / iters as f64);
        }
        Ok(worst)
    }

    /// Microseconds per call with `iters` calls captured in one CUDA graph per rank.
    fn time_graph(
        &mut self,
        imp: Imp,
        call: &Call,
        in_place: bool,
        iters: usize,
        samples: usize,
    ) -> Result<Stat, String> {
        for r in &self.ranks {
            r.stream.begin_capture().map_err(|e| e.to_string())?;
        }
        let mut issued = Ok(());
        for _ in 0..iters {
            issued = self.issue(imp, call, in_place);
            if issued.is_err() {
                break;
            }
        }
        // End every capture before instantiating any: instantiating while another stream of
        // this thread still captures invalidates that capture.
        let captured: Vec<_> = self.ranks.iter().map(|r| r.stream.end_capture()).collect();
        let mut graphs: Vec<GraphExec> = Vec::new();
        let mut ended = Ok(());
        for g in captured {
            match g.and_then(|g| g.instantiate()) {
                Ok(g) => graphs.push(g),
                Err(e) => ended = Err(e.to_string()),
            }
        }
        issued?;
        ended?;
        let launch = |h: &Self| -> Result<(), String> {
            for (g, r) in graphs.iter().zip(&h.ranks) {
                g.launch(&r.stream).map_err(|e| e.to_string())?;
            }
            Ok(())
        };
        launch(self)?;
        self.sync()?;
        self.sample(iters, samples, |h| launch(h))
    }

    /// Host microseconds to issue one call on one rank (enqueue only).
    fn host_cost_us(&mut self, imp: Imp, call: &Call) -> Result<f64, String> {
        let calls = 200;
        self.sync()?;
        let t = Instant::now();
        for _ in 0..calls {
            self.issue(imp, call, false)?;
        }
        let us = t.elapsed().as_secs_f64() * 1e6 / (calls * self.ranks.len()) as f64;
        self.sync()?;
        Ok(us)
    }
}

/// Sizes from `min` to `max` by factors of 2.
pub fn sizes(min: usize, max: usize) -> Vec<usize> {
    std::iter::successors(Some(min.max(1)), |s| s.checked_mul(2))
        .take_while(|s| *s <= max)
        .collect()
}

/// Runs the benchmark; the JSON holds every row.
pub fn run(opts: &Options) -> Result<Value, String> {
    let mut devices = Device::all().map_err(|e| e.to_string())?;
    if opts.gpus > 0 {
        devices.truncate(opts.gpus);
    }
    let n = devices.len();
    if n < 2 {
        return Err(format!("coll needs at least 2 GPUs, found {n}"));
    }
    let mut comm_options = CommOptions::from_env().map_err(|e| e.to_string())?;
    comm_options.tuning = opts.tuning;
    let comms = Communicator::init_all_with(&devices, comm_options).map_err(|e| e.to_string())?;
    let nccl = if opts.nccl {
        match NcclGroup::init_all(&devices) {
            Ok(g) => Some(g),
            Err(e) => {
                eprintln!("coll: NCCL is not available, running ours only: {e}");
                None
            }
        }
    } else {
        None
    };
    let nccl_version = crate::nccl::version().unwrap_or_else(|e| format!("unavailable ({e})"));
    let mut ranks = Vec::new();
    for d in &devices {
        let e = |e: p2p_mem::Error| e.to_string();
        ranks.push(Rank {
            stream: Stream::new(d).map_err(e)?,
            pristine: DeviceBuffer::new(d, opts.max_bytes.max(64)).map_err(e)?,
            input: DeviceBuffer::new(d, opts.max_bytes.max(64)).map_err(e)?,
            output: DeviceBuffer::new(d, opts.max_bytes.max(64)).map_err(e)?,
            start: Event::timing(d).map_err(e)?,
            stop: Event::timing(d).map_err(e)?,
        });
    }
    let mut h = Harness {
        comms: &comms,
        nccl: nccl.as_ref(),
        nccl_bufs: ranks
            .iter()
            .map(|r| Bufs {
                send: r.input.device_ptr(),
                recv: r.output.device_ptr(),
            })
            .collect(),
        nccl_streams: ranks.iter().map(|r| r.stream.cu_stream()).collect(),
        ranks,
        pristine_holds: None,
        floor: Vec::new(),
    };
    let imps: Vec<Imp> = if h.nccl.is_some() {
        vec![Imp::Ours, Imp::Nccl]
    } else {
        vec![Imp::Ours]
    };
    let mut jobs: Vec<(Op, DataType)> = Vec::new();
    for &op in &opts.ops {
        if op == Op::AllReduce {
            jobs.extend(opts.all_reduce_types.iter().map(|&d| (op, d)));
        } else {
            jobs.push((op, DataType::F32));
        }
    }
    let sizes = sizes(opts.min_bytes, opts.max_bytes);
    let total = jobs.len() * sizes.len();
    let tty = std::io::stderr().is_terminal();
    let started = Instant::now();
    let mut rows = Vec::new();
    let mut done = 0;
    for &(op, dtype) in &jobs {
        let per_rank_parts = matches!(op, Op::AllGather | Op::ReduceScatter | Op::AllToAll);
        for &bytes in &sizes {
            done += 1;
            let elems = bytes / dtype.size();
            let count = if per_rank_parts { elems / n } else { elems };
            if count == 0 || (per_rank_parts && elems % n != 0) {
                continue;
            }
            let call = Call::new(op, dtype, count);
            let iters = iters_for(bytes);
            let mut row = json!({
                "op": op.name(), "bytes": bytes, "count": elems, "type": dtype.name(),
                "redop": if op.reduces() { "sum" } else { "none" }, "root": if op.rooted() { 0 } else { -1 },
                "iters": iters, "plan": format!("{:?}", comms[0].plan(&call).kind),
            });
            for &imp in &imps {
                let key = if imp == Imp::Ours { "ours" } else { "nccl" };
                for in_place in [false, true] {
                    let place = if in_place { "in_place" } else { "out_of_place" };
                    if imp == Imp::Nccl && in_place && op == Op::AllToAll {
                        // NCCL's all-to-all has no in-place form (its results are wrong when
                        // send and receive buffers are the same): not measured.
                        row[key][place] = json!({"skipped": "NCCL has no in-place all-to-all"});
                        continue;
                    }
                    let wrong = if opts.check {
                        h.check(imp, &call, in_place)
                    } else {
                        Err("not checked (--no-check)".to_string())
                    };
                    let eager = h.time_eager(imp, &call, in_place, iters, opts.samples);
                    let graph = if bytes <= opts.graph_max_bytes && !in_place {
                        Some(h.time_graph(imp, &call, in_place, iters, opts.samples.min(10)))
                    } else {
                        None
                    };
                    let fig = |s: &Result<Stat, String>| match s {
                        Ok(s) => {
                            let algbw = bytes as f64 / (s.median * 1e3);
                            json!({"us": s.median, "us_min": s.min, "us_max": s.max, "algbw": algbw, "busbw": algbw * op.bus_factor(n)})
                        }
                        Err(e) => json!({"error": e}),
                    };
                    row[key][place] = json!({
                        "wrong": match &wrong { Ok(w) => json!(w), Err(e) => json!({"error": e}) },
                        "eager": fig(&eager),
                    });
                    if let Some(g) = &graph {
                        row[key][place]["graph"] = fig(g);
                    }
                }
            }
            let line = format!(
                "[{done:>3}/{total}] {:>6.1}s {} {} {}: ours {} us, nccl {} us",
                started.elapsed().as_secs_f64(),
                op.name(),
                dtype,
                size_name(bytes),
                fmt_us(&row["ours"]["out_of_place"]["eager"]),
                fmt_us(&row["nccl"]["out_of_place"]["eager"]),
            );
            if tty {
                eprint!("\r{line:<100}");
            } else {
                eprintln!("{line}");
            }
            rows.push(row);
        }
    }
    if tty {
        eprintln!();
    }
    // Host cost of issuing one call (8 KiB float all-reduce, eager).
    let small = Call::new(Op::AllReduce, DataType::F32, 2048);
    let mut host = json!({});
    for &imp in &imps {
        let key = if imp == Imp::Ours { "ours" } else { "nccl" };
        host[key] = match h.host_cost_us(imp, &small) {
            Ok(us) => json!(us),
            Err(e) => json!({"error": e}),
        };
    }
    // The floor: an empty kernel per rank, launched like ours (one block, programmatic
    // dependent launch), eager and in a graph. No one-kernel collective can beat it.
    let floor_call = Call::new(Op::AllReduce, DataType::F32, 1);
    let floor = {
        let fig = |s: Result<Stat, String>| match s {
            Ok(s) => json!({"us": s.median, "us_min": s.min, "us_max": s.max}),
            Err(e) => json!({"error": e}),
        };
        let eager = fig(h.time_eager(Imp::Floor, &floor_call, false, 100, opts.samples));
        let graph = fig(h.time_graph(Imp::Floor, &floor_call, false, 100, opts.samples.min(10)));
        json!({"eager": eager, "graph": graph})
    };
    let driver = p2p_sys::driver_version().unwrap_or(0);
    Ok(json!({
        "benchmark": "coll",
        "date": p2p_transport::utc_now(),
        "commit": env!("P2PBUILD_COMMIT"),
        "host": p2p_transport::hostname(),
        "gpus": devices.iter().map(|d| json!({"ordinal": d.ordinal(), "name": d.name(), "pci_bus_id": d.pci_bus_id()})).collect::<Vec<_>>(),
        "world": n,
        "cuda_driver": format!("{}.{}", driver / 1000, driver % 1000 / 10),
        "nccl_version": nccl_version,
        "nccl_env": {"NCCL_NVLS_ENABLE": std::env::var("NCCL_NVLS_ENABLE").unwrap_or_default()},
        "tuning": format!("{:?}", comms[0].tuning()),
        "options": {"samples": opts.samples, "min_bytes": opts.min_bytes, "max_bytes": opts.max_bytes, "graph_max_bytes": opts.graph_max_bytes},
        "method": "one process drives every GPU; CUDA events on each rank's stream around `iters` back-to-back calls after 3 warm-up calls; the slowest rank's time per call; median of `samples` (graph: up to 10 samples of one graph replay holding `iters` calls). NCCL: ncclCommInitAll, one ncclGroupStart/End per call across ranks. #wrong: one call on exact inputs, every output element of every rank compared.",
        "host_us_per_call": host,
        "floor_empty_kernel": floor,
        "rows": rows,
    }))
}

/// The (collective, type) pairs of `rows`, in first-seen order.
fn groups(rows: &[Value]) -> Vec<(String, String)> {
    let mut groups: Vec<(String, String)> = Vec::new();
    for row in rows {
        let g = (
            row["op"].as_str().unwrap_or("").to_string(),
            row["type"].as_str().unwrap_or("").to_string(),
        );
        if !groups.contains(&g) {
            groups.push(g);
        }
    }
    groups
}

fn fmt_us(v: &Value) -> String {
    v.get("us")
        .and_then(Value::as_f64)
        .map_or("-".into(), |u| format!("{u:.1}"))
}

fn num(v: &Value, k: &str, digits: usize) -> String {
    v.get(k)
        .and_then(Value::as_f64)
        .map_or("-".into(), |x| format!("{x:.digits$}"))
}

fn wrong(v: &Value) -> String {
    match v.get("wrong") {
        Some(Value::Number(n)) => n.to_string(),
        Some(_) => "ERR".into(),
        None => "-".into(),
    }
}

/// The results as Markdown: one nccl-tests style table per collective and type.
pub fn render(r: &Value) -> String {
    let mut s = format!(
        "# p2p collectives beside NCCL\n\n{} x {} | CUDA driver {} | NCCL {} | commit {} | {}\n\n{}\n\n\
         Host cost of issuing one call (8 KiB all-reduce, per rank): ours {} us, NCCL {} us.\n\n\
         Floor (an empty kernel per rank, launched as ours are): eager {} us, graph {} us per call.\n\n\
         Columns as nccl-tests: time in us, algbw and busbw in GB/s, #wrong elements. `ours/nccl` is\n\
         our time over NCCL's (below 1: we are faster). `graph`: the same calls captured in a CUDA graph.\n",
        r["world"],
        r["gpus"][0]["name"].as_str().unwrap_or("?"),
        r["cuda_driver"].as_str().unwrap_or("?"),
        r["nccl_version"].as_str().unwrap_or("?"),
        r["commit"].as_str().unwrap_or("?"),
        r["date"].as_str().unwrap_or("?"),
        r["method"].as_str().unwrap_or(""),
        num(&r["host_us_per_call"], "ours", 2),
        num(&r["host_us_per_call"], "nccl", 2),
        num(&r["floor_empty_kernel"]["eager"], "us", 2),
        num(&r["floor_empty_kernel"]["graph"], "us", 2),
    );
    let rows = r["rows"].as_array().cloned().unwrap_or_default();
    let groups = groups(&rows);
    for (op, ty) in groups {
        s += &format!("\n## {op} {ty}\n\n");
        s += "| size | count | type | redop | root | plan | time | algbw | busbw | #wrong | in-place time | busbw | #wrong | NCCL time | busbw | #wrong | in-place time | busbw | #wrong | ours/nccl | graph: ours | NCCL | ours/nccl |\n";
        s += "|---:|---:|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
        for row in rows
            .iter()
            .filter(|x| x["op"] == op.as_str() && x["type"] == ty.as_str())
        {
            let o = &row["ours"]["out_of_place"];
            let oi = &row["ours"]["in_place"];
            let nc = &row["nccl"]["out_of_place"];
            let ni = &row["nccl"]["in_place"];
            let ratio = |a: &Value, b: &Value| match (
                a.get("us").and_then(Value::as_f64),
                b.get("us").and_then(Value::as_f64),
            ) {
                (Some(x), Some(y)) if y > 0.0 => format!("{:.2}", x / y),
                _ => "-".into(),
            };
            s += &format!(
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                size_name(row["bytes"].as_u64().unwrap_or(0) as usize),
                row["count"],
                ty,
                row["redop"].as_str().unwrap_or(""),
                row["root"],
                row["plan"].as_str().unwrap_or(""),
                num(&o["eager"], "us", 1),
                num(&o["eager"], "algbw", 2),
                num(&o["eager"], "busbw", 2),
                wrong(o),
                num(&oi["eager"], "us", 1),
                num(&oi["eager"], "busbw", 2),
                wrong(oi),
                num(&nc["eager"], "us", 1),
                num(&nc["eager"], "busbw", 2),
                wrong(nc),
                num(&ni["eager"], "us", 1),
                num(&ni["eager"], "busbw", 2),
                wrong(ni),
                ratio(&o["eager"], &nc["eager"]),
                num(&o["graph"], "us", 1),
                num(&nc["graph"], "us", 1),
                ratio(&o["graph"], &nc["graph"]),
            );
        }
    }
    s
}

/// busbw against size, ours beside NCCL's, one panel per collective and type, as SVG.
pub fn svg(r: &Value) -> String {
    let rows = r["rows"].as_array().cloned().unwrap_or_default();
    let groups = groups(&rows);
    let (pw, ph, cols) = (420.0, 260.0, 2usize);
    let nrows = groups.len().div_ceil(cols);
    let (w, hgt) = (pw * cols as f64, ph * nrows as f64 + 40.0);
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{hgt}\" font-family=\"sans-serif\" font-size=\"11\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"20\" font-size=\"12\">busbw (GB/s) against size: p2p (blue) and NCCL {} (orange), {} x {}, commit {}, {}</text>\n",
        r["nccl_version"].as_str().unwrap_or("?"),
        r["world"],
        r["gpus"][0]["name"].as_str().unwrap_or("?"),
        r["commit"].as_str().unwrap_or("?"),
        r["date"].as_str().unwrap_or("?").chars().take(10).collect::<String>(),
    );
    for (gi, (op, ty)) in groups.iter().enumerate() {
        let (ox, oy) = ((gi % cols) as f64 * pw, (gi / cols) as f64 * ph + 40.0);
        let pts = |key: &str| -> Vec<(f64, f64)> {
            rows.iter()
                .filter(|x| x["op"] == op.as_str() && x["type"] == ty.as_str())
                .filter_map(|x| {
                    Some((
                        (x["bytes"].as_f64()?).log2(),
                        x[key]["out_of_place"]["eager"]["busbw"].as_f64()?,
                    ))
                })
                .collect()
        };
        let (ours, theirs) = (pts("ours"), pts("nccl"));
        let all: Vec<&(f64, f64)> = ours.iter().chain(&theirs).collect();
        let xmin = all.iter().map(|p| p.0).fold(f64::MAX, f64::min);
        let xmax = all.iter().map(|p| p.0).fold(f64::MIN, f64::max);
        let ymax = all.iter().map(|p| p.1).fold(1.0, f64::max) * 1.1;
        let (l, t, pwid, phei) = (ox + 50.0, oy + 20.0, pw - 70.0, ph - 60.0);
        let map = |p: &(f64, f64)| {
            (
                l + (p.0 - xmin) / (xmax - xmin).max(1.0) * pwid,
                t + phei - p.1 / ymax * phei,
            )
        };
        s += &format!(
            "<text x=\"{}\" y=\"{}\" font-size=\"12\">{op} {ty}</text>\n",
            l,
            oy + 14.0
        );
        s += &format!("<rect x=\"{l}\" y=\"{t}\" width=\"{pwid}\" height=\"{phei}\" fill=\"none\" stroke=\"#999\"/>\n");
        for k in 0..=4 {
            let y = ymax * k as f64 / 4.0;
            let py = t + phei - phei * k as f64 / 4.0;
            s += &format!(
                "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{:.0}</text>\n",
                l - 4.0,
                py + 4.0,
                y
            );
        }
        let mut x = xmin.ceil();
        while x <= xmax {
            if (x as i64) % 4 == 3 || x == xmin.ceil() {
                let px = map(&(x, 0.0)).0;
                s += &format!(
                    "<text x=\"{px}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                    t + phei + 14.0,
                    size_name(2f64.powf(x) as usize).replace(' ', "")
                );
            }
            x += 1.0;
        }
        for (p, color) in [(&ours, "#1f77b4"), (&theirs, "#ff7f0e")] {
            if p.is_empty() {
                continue;
            }
            let d: Vec<String> = p
                .iter()
                .map(|q| {
                    let (a, b) = map(q);
                    format!("{a:.1},{b:.1}")
                })
                .collect();
            s += &format!(
                "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>\n",
                d.join(" ")
            );
        }
    }
    s + "</svg>\n"
}
