//! The fault matrix: the call a trial's ranks make, drawn afresh for each trial by the suite and
//! handed to every rank in `FAULT_CALL`, so that faults meet every operation, element type,
//! size (8 B to 256 MiB, log-uniform), algorithm (forced through `P2P_ALGO`), buffer placement
//! (in place or not, plain or registered), launch (eager or a CUDA graph replayed) and
//! communicator (the job's own or one split from it). The ranks run it with exact inputs
//! (`p2p_collective::verify`) and check every element of every result.

use p2p_collective::verify::{compare, expected, in_place_input_offset, input, result_region};
use p2p_collective::{Algo, Call, Collectives, Communicator, DataType, Op, RedOp};
use p2p_mem::{DeviceBuffer, DeviceMemory, DeviceMemoryMut, GraphExec, Stream};

/// The largest size a trial draws, bytes (a rank's part for all-gather, reduce-scatter and
/// all-to-all, as `p2p-bench coll` counts sizes).
pub const MAX_BYTES: u64 = 256 << 20;

/// The smallest, bytes.
pub const MIN_BYTES: u64 = 8;

/// One trial's call and how it is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// The call (operation, element type, count, reduction, root).
    pub call: Call,
    /// The algorithm forced on every rank (`P2P_ALGO`); `None`: the planner's choice. An
    /// algorithm that cannot run the call leaves it to the planner (`p2p_collective::settings`).
    pub algo: Option<Algo>,
    /// One buffer, in place.
    pub in_place: bool,
    /// Captured once into a CUDA graph, then each call a replay of it.
    pub graph: bool,
    /// The buffers registered with the communicator (zero-copy windows).
    pub registered: bool,
    /// Made on a communicator split from the job's (every rank, same order).
    pub split: bool,
}

impl Shape {
    /// The trial every trial was before the matrix, and the control trials' call: a 4 MiB f32
    /// sum all-reduce, eager, on plain buffers.
    pub fn classic() -> Shape {
        Shape {
            call: Call::new(Op::AllReduce, DataType::F32, 1 << 20).redop(RedOp::Sum),
            algo: None,
            in_place: false,
            graph: false,
            registered: false,
            split: false,
        }
    }

    /// A shape drawn from `rand` (uniform 64-bit draws) for `world` ranks: every field at
    /// random, the size log-uniform from [`MIN_BYTES`] to `max_bytes` (at most [`MAX_BYTES`]).
    pub fn draw(rand: &mut impl FnMut() -> u64, world: usize, max_bytes: u64) -> Shape {
        let mut pick = |n: usize| (rand() % n as u64) as usize;
        let op = Op::ALL[pick(Op::ALL.len())];
        let dtype = DataType::ALL[pick(DataType::ALL.len())];
        let redop = RedOp::ALL[pick(RedOp::ALL.len())];
        let root = pick(world.max(1));
        // log2 of the size, uniform in 1/16 steps.
        let max_bytes = max_bytes.clamp(MIN_BYTES, MAX_BYTES);
        let (lo, hi) = (
            MIN_BYTES.ilog2() as usize * 16,
            max_bytes.ilog2() as usize * 16,
        );
        let bytes = 2f64.powf((lo + pick(hi - lo + 1)) as f64 / 16.0) as usize;
        let count = (bytes / dtype.size()).max(1);
        let algos: Vec<Algo> = Algo::ALL.into_iter().filter(|a| a.runs(op)).collect();
        let algo = match pick(algos.len() + 1) {
            0 => None,
            i => Some(algos[i - 1]),
        };
        Shape {
            call: Call::new(op, dtype, count).redop(redop).root(root),
            algo,
            in_place: pick(2) == 1,
            graph: pick(2) == 1,
            registered: pick(2) == 1,
            split: pick(2) == 1,
        }
    }

    /// The words `FAULT_CALL` carries, which [`parse`](Self::parse) reads back.
    pub fn to_words(&self) -> String {
        let c = &self.call;
        let flag = |b: bool| if b { "1" } else { "0" };
        format!(
            "op={} type={} count={} redop={} root={} algo={} in_place={} graph={} registered={} split={}",
            c.op.name(),
            c.dtype.name(),
            c.count,
            c.redop.name(),
            c.root,
            self.algo.map_or("auto", Algo::name),
            flag(self.in_place),
            flag(self.graph),
            flag(self.registered),
            flag(self.split)
        )
    }

    /// A shape from the words of [`to_words`](Self::to_words), or what is wrong with them.
    pub fn parse(words: &str) -> Result<Shape, String> {
        let mut s = Shape::classic();
        let (mut op, mut dtype, mut count, mut redop, mut root) = (
            s.call.op,
            s.call.dtype,
            s.call.count,
            s.call.redop,
            s.call.root,
        );
        for word in words.split_whitespace() {
            let (key, value) = word
                .split_once('=')
                .ok_or_else(|| format!("FAULT_CALL: `{word}` is not KEY=VALUE"))?;
            let bad = || format!("FAULT_CALL: {key}={value} is not understood");
            let flag = || match value {
                "0" => Ok(false),
                "1" => Ok(true),
                _ => Err(bad()),
            };
            match key {
                "op" => op = named(&Op::ALL, Op::name, value).ok_or_else(bad)?,
                "type" => dtype = named(&DataType::ALL, DataType::name, value).ok_or_else(bad)?,
                "count" => count = value.parse().map_err(|_| bad())?,
                "redop" => redop = named(&RedOp::ALL, RedOp::name, value).ok_or_else(bad)?,
                "root" => root = value.parse().map_err(|_| bad())?,
                "algo" if value == "auto" => s.algo = None,
                "algo" => s.algo = Some(Algo::from_name(value).ok_or_else(bad)?),
                "in_place" => s.in_place = flag()?,
                "graph" => s.graph = flag()?,
                "registered" => s.registered = flag()?,
                "split" => s.split = flag()?,
                _ => return Err(bad()),
            }
        }
        s.call = Call::new(op, dtype, count).redop(redop).root(root);
        Ok(s)
    }

    /// This rank's buffers for the call on `world` ranks: the input (none in place) and the
    /// output, both as bytes; the output is also where an in-place call's input goes.
    pub fn buffers(
        &self,
        device: &p2p_mem::Device,
        world: usize,
        rank: usize,
    ) -> Result<Buffers, String> {
        let c = &self.call;
        let e = |e: p2p_mem::Error| e.to_string();
        let size = c.dtype.size();
        // Every rank's buffers as large as any rank's (a broadcast's send, a reduce's recv are
        // used on the root only), so that registered buffers have one size on every rank, as
        // registration asks.
        let (in_len, out_len) = (0..world.max(1))
            .map(|r| c.op.buffer_lens(c.count, world, r, c.root))
            .fold((0, 0), |(i, o), (ri, ro)| (i.max(ri), o.max(ro)));
        let out_bytes = (in_len.max(out_len) * size).max(1);
        let input = input(c, world, rank, in_len.max(1));
        let send = if self.in_place {
            None
        } else {
            Some(
                DeviceBuffer::<u8>::from_host(device, &input[..(in_len * size).max(1)])
                    .map_err(e)?,
            )
        };
        let recv = DeviceBuffer::<u8>::zeroed(device, out_bytes).map_err(e)?;
        Ok(Buffers { send, recv, input })
    }
}

/// The member of `all` whose `name` is `value`.
fn named<T: Copy>(all: &[T], name: fn(T) -> &'static str, value: &str) -> Option<T> {
    all.iter().copied().find(|&x| name(x) == value)
}

/// One rank's buffers for a [`Shape`]'s call, and its exact input on the host.
pub struct Buffers {
    /// The input (out of place only).
    pub send: Option<DeviceBuffer<u8>>,
    /// The output; in place, the one buffer.
    pub recv: DeviceBuffer<u8>,
    /// This rank's input, as `verify::input` gives it.
    pub input: Vec<u8>,
}

/// A [`Shape`]'s call made again and again on one communicator, each time on fresh data, and
/// checked: the buffers, and for a graph shape the graph captured once.
pub struct Calls<'a> {
    shape: Shape,
    comm: &'a Communicator,
    stream: &'a Stream,
    bufs: &'a mut Buffers,
    graph: Option<GraphExec>,
}

impl<'a> Calls<'a> {
    /// Ready to make `shape`'s call on `comm` (its buffers registered if the shape says so:
    /// every rank registers the same buffers in the same order).
    #[allow(unsafe_code)] // registration's contract: the buffers outlive the communicator
    pub fn new(
        shape: Shape,
        comm: &'a Communicator,
        stream: &'a Stream,
        bufs: &'a mut Buffers,
    ) -> Result<Calls<'a>, String> {
        if shape.registered {
            if let Some(send) = &bufs.send {
                // SAFETY: the buffer outlives the communicator (it is dropped after it), which
                // deregisters it when dropped.
                unsafe { comm.register(send) }.map_err(|e| e.to_string())?;
            }
            // SAFETY: as above.
            unsafe { comm.register(&bufs.recv) }.map_err(|e| e.to_string())?;
        }
        Ok(Calls {
            shape,
            comm,
            stream,
            bufs,
            graph: None,
        })
    }

    /// Resets the output (in place: to this rank's input), then queues the call `times` times
    /// (a graph's replays, or eager calls); returns the first error.
    #[allow(unsafe_code)] // a graph's replay: its captured buffers live in `self`
    pub fn queue(&mut self, times: usize) -> p2p_collective::Result<()> {
        let c = self.shape.call;
        let size = c.dtype.size();
        if self.shape.in_place {
            let at = in_place_input_offset(&c, self.comm.rank()) * size;
            let n = self.bufs.input.len().min(self.bufs.recv.len() - at);
            let mut part = self.bufs.recv.slice_mut(at..at + n)?;
            part.copy_from_host(&self.bufs.input[..n])?;
        } else {
            self.bufs.recv.memset_u8(0xff)?;
        }
        if self.shape.graph && self.graph.is_none() {
            self.stream.begin_capture()?;
            let queued = self.once();
            let graph = self.stream.end_capture()?;
            queued?;
            self.graph = Some(graph.instantiate()?);
        }
        for _ in 0..times {
            match &self.graph {
                // SAFETY: the captured call's buffers and communicator live in `self` (borrowed
                // for 'a), and replays are queued on one stream, one after another.
                Some(exec) => unsafe { exec.launch(self.stream) }?,
                None => self.once()?,
            }
        }
        Ok(())
    }

    fn once(&mut self) -> p2p_collective::Result<()> {
        let c = self.shape.call;
        match &self.bufs.send {
            Some(send) => self.comm.call(&c, send, &mut self.bufs.recv, self.stream),
            None => self
                .comm
                .call_in_place(&c, &mut self.bufs.recv, self.stream),
        }
    }

    /// The elements of this rank's result that differ from the exact result (after the work
    /// queued has finished: call `synchronize` first).
    pub fn wrong(&self) -> Result<usize, String> {
        let c = self.shape.call;
        let (world, rank) = (self.comm.world_size(), self.comm.rank());
        let size = c.dtype.size();
        let (off, len) = result_region(&c, world, rank, self.shape.in_place);
        let got = self
            .bufs
            .recv
            .to_host_vec::<u8>()
            .map_err(|e| e.to_string())?;
        let region = got
            .get(off * size..(off + len) * size)
            .ok_or("the output is shorter than the call's result")?;
        let in_place = self.shape.in_place;
        let (wrong, _) = compare(c.dtype, region, |j| expected(&c, world, rank, in_place, j));
        Ok(wrong)
    }
}

/// How often each value of each axis of the matrix was drawn over `shapes` (the trials' calls),
/// as JSON (`{"op": {"all_reduce": 12, ...}, ...}`) and as Markdown lines.
pub fn tally(shapes: &[Shape]) -> (serde_json::Value, String) {
    use std::collections::BTreeMap;
    let mut axes: BTreeMap<&str, BTreeMap<String, usize>> = BTreeMap::new();
    let mut count = |axis: &'static str, value: String| {
        *axes.entry(axis).or_default().entry(value).or_default() += 1;
    };
    for s in shapes {
        let bytes = s.call.count as u64 * s.call.dtype.size() as u64;
        count("op", s.call.op.name().into());
        count("type", s.call.dtype.name().into());
        count("algo", s.algo.map_or("auto", Algo::name).into());
        count(
            "size",
            match bytes {
                0..=4095 => "under 4 KiB",
                4096..=1048575 => "4 KiB to 1 MiB",
                1048576..=33554431 => "1 to 32 MiB",
                _ => "32 MiB and up",
            }
            .into(),
        );
        let yes_no = |b: bool| if b { "yes" } else { "no" }.to_string();
        count("in place", yes_no(s.in_place));
        count("graph replay", yes_no(s.graph));
        count("registered", yes_no(s.registered));
        count("split", yes_no(s.split));
    }
    let mut md = format!("\nThe calls drawn ({} trials):\n", shapes.len());
    for (axis, values) in &axes {
        let list: Vec<String> = values.iter().map(|(v, n)| format!("{v} {n}")).collect();
        md.push_str(&format!("- {axis}: {}\n", list.join(", ")));
    }
    (serde_json::json!(axes), md)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_go_through_their_words_and_cover_the_matrix() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rand = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut ops = std::collections::HashSet::new();
        let (mut small, mut large, mut forced) = (0, 0, 0);
        for _ in 0..2000 {
            let s = Shape::draw(&mut rand, 4, MAX_BYTES);
            assert_eq!(Shape::parse(&s.to_words()), Ok(s), "{}", s.to_words());
            ops.insert(s.call.op);
            let bytes = s.call.count as u64 * s.call.dtype.size() as u64;
            assert!(bytes <= MAX_BYTES, "{}", s.to_words());
            small += usize::from(bytes <= 64);
            large += usize::from(bytes >= 64 << 20);
            forced += usize::from(s.algo.is_some());
            if let Some(a) = s.algo {
                assert!(a.runs(s.call.op), "{}", s.to_words());
            }
            assert!(s.call.root < 4);
        }
        assert_eq!(ops.len(), Op::ALL.len());
        // Log-uniform over 25 doublings: about 3/25 of draws at most 64 B, 2/25 from 64 MiB.
        assert!(small > 100 && large > 60, "{small} {large}");
        assert!(forced > 1000, "{forced}");
    }

    #[test]
    fn the_tally_counts_every_axis() {
        let shapes = [Shape::classic(), Shape::classic()];
        let (json, md) = tally(&shapes);
        assert_eq!(json["op"]["all_reduce"], 2);
        assert_eq!(json["size"]["1 to 32 MiB"], 2);
        assert_eq!(json["graph replay"]["no"], 2);
        assert!(md.contains("- op: all_reduce 2"), "{md}");
    }

    #[test]
    fn bad_words_are_refused() {
        assert!(Shape::parse("op=all_reduce").is_ok());
        assert!(Shape::parse("op=frobnicate").is_err());
        assert!(Shape::parse("graph=2").is_err());
        assert!(Shape::parse("count").is_err());
        assert!(Shape::parse("colour=red").is_err());
    }
}
