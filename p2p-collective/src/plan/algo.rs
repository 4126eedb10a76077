//! What each algorithm and protocol is: the two axes of a plan, the collectives each carries
//! out, whether it can run a given call, and the steps it takes. When the planner picks which
//! is `choose.rs`; how a call is cut into blocks is `shape.rs`.
//!
//! A new algorithm is a variant here (its name is its kernel's: `coll_<type>_<name>`, defined
//! in `kernels/coll/algo/<name>.cuh`), with its arms in the matches below, an arm in
//! `choose.rs`, and its kernel file.

use crate::types::Op;

use super::{Access, Tuning};

/// How the bytes of a call travel between the ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algo {
    /// Every rank sends its data straight to every rank that needs it, in one step: one-shot
    /// all-reduce (each rank reduces every rank's input), the root pushing to every peer
    /// (broadcast) or every peer to the root (reduce), every rank pushing each part to its
    /// owner (all-gather, reduce-scatter, all-to-all).
    OneShot,
    /// All-reduce in two steps over the full mesh: each rank reduces its part of every rank's
    /// input (reduce-scatter), then hands its part to everyone (all-gather); 2(n-1)/n of the
    /// data per rank.
    TwoShot,
    /// All-reduce around a ring: reduce-scatter then all-gather between neighbours, 2(n-1)
    /// steps, 2(n-1)/n of the data per rank.
    Ring,
    /// Broadcast and reduce on more than two ranks, the data split among the non-roots: the
    /// root sends part j to the j-th non-root, which forwards it to the others (broadcast); the
    /// j-th non-root reduces part j over every rank and sends it to the root (reduce).
    Split,
    /// On buffers every rank registered: peers' buffers read and written directly, with no
    /// staging through the scratch and one barrier at each end of the call.
    Direct,
    /// One-shot all-reduce with each block's push and reduction overlapped: half its warps push
    /// sub-pieces and flag each, the other half reduce each sub-piece as its flags arrive. Up to
    /// one round of the scratch (`max_blocks x piece_bytes`).
    Pipe,
    /// All-reduce into a registered output, by writes only: each rank pushes part q of its
    /// input into rank q's scratch (two-shot's first step), then reduces its own part and
    /// writes the sum straight into every rank's output, with no copy out of the scratch.
    /// Forced only (`P2P_ALGO=push`) until measured across GPUs.
    Push,
    /// The split broadcast and reduce of [`Split`](Self::Split) landing in registered outputs,
    /// with no copy out of the scratch: the root writes part j straight into the j-th
    /// non-root's output, which forwards it from there into the other non-roots' outputs
    /// (broadcast); each non-root reduces its part over every rank straight into the root's
    /// output (reduce). Forced only (`P2P_ALGO=splitout`) until measured across GPUs.
    SplitOut,
    /// The broadcast and reduce of [`SplitOut`](Self::SplitOut) and the all-reduce of
    /// [`Push`](Self::Push) with a ready flag per chunk instead of a barrier over every peer
    /// between chunks. Broadcast: the root writes part j of each chunk straight into the j-th
    /// non-root's output and flags it without waiting; each non-root forwards its part as its
    /// flag lands, so the root's next chunk travels while the non-roots forward this one.
    /// Reduce: every rank pushes part j of each chunk into the j-th non-root's scratch and
    /// flags it; each non-root reduces its part as the flags land, straight into the root's
    /// output, and flags the root. All-reduce: every rank pushes part q of each chunk into rank
    /// q's scratch and flags it, reduces its own part as the flags land straight into every
    /// rank's output, and flags each. Cut into at least
    /// [`Tuning::overlap_chunks`](super::Tuning::overlap_chunks) chunks. Forced only
    /// (`P2P_ALGO=relay`) until measured across GPUs.
    Relay,
}

/// How each move of a call is carried and signalled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Proto {
    /// Flags inside the data (NCCL's LL layout: 8 data bytes and two flags per 16-byte store):
    /// one crossing, no fence and no separate flag. Small calls only (its lines take twice the
    /// data's size).
    Ll,
    /// Stores, then a flag per step that the peers wait for (a release fence before it).
    Simple,
    /// The copy engines move the data (`cuMemcpyAsync` into the peers' registered buffers),
    /// between barrier kernels; SMs only reduce, where the collective reduces.
    CopyEngine,
}

impl Algo {
    /// Every algorithm, in code order.
    pub const ALL: [Algo; 9] = [
        Algo::OneShot,
        Algo::TwoShot,
        Algo::Ring,
        Algo::Split,
        Algo::Direct,
        Algo::Pipe,
        Algo::Push,
        Algo::SplitOut,
        Algo::Relay,
    ];

    /// The name `P2P_ALGO` and the logs use, which is also its kernel's (`coll_<type>_<name>`):
    /// `oneshot`, `twoshot`, `ring`, `split`, `direct`, `pipe`, `push`, `splitout`, `relay`.
    pub fn name(self) -> &'static str {
        match self {
            Algo::OneShot => "oneshot",
            Algo::TwoShot => "twoshot",
            Algo::Ring => "ring",
            Algo::Split => "split",
            Algo::Direct => "direct",
            Algo::Pipe => "pipe",
            Algo::Push => "push",
            Algo::SplitOut => "splitout",
            Algo::Relay => "relay",
        }
    }

    /// The algorithm named `name` ([`name`](Self::name)).
    pub fn from_name(name: &str) -> Option<Algo> {
        Algo::ALL.into_iter().find(|a| a.name() == name)
    }

    /// Its number in a call's code and signature, and of its kernel (its place in
    /// [`ALL`](Self::ALL)).
    pub fn index(self) -> usize {
        self as usize
    }

    /// Whether it carries out `op` at all (whatever the call's size and buffers).
    pub fn runs(self, op: Op) -> bool {
        match self {
            Algo::OneShot => true,
            Algo::TwoShot | Algo::Ring | Algo::Pipe | Algo::Push => op == Op::AllReduce,
            Algo::Split | Algo::SplitOut => matches!(op, Op::Broadcast | Op::Reduce),
            Algo::Relay => matches!(op, Op::Broadcast | Op::Reduce | Op::AllReduce),
            Algo::Direct => matches!(
                op,
                Op::AllReduce | Op::AllGather | Op::ReduceScatter | Op::AllToAll
            ),
        }
    }

    /// Barrier steps each block takes per chunk with `proto` on `world` ranks (each a flag
    /// exchange with every peer, or for LL one exchange of lines); `piece` and `sub` are the
    /// plan's, for the pipelined one-shot (one flag per sub-piece, the count rounded up to odd:
    /// see `run_pipe`).
    pub fn steps_per_chunk(self, proto: Proto, world: usize, piece: u64, sub: u64) -> u64 {
        match (self, proto) {
            // Two barrier kernels of two barriers each, or for all-reduce one barrier kernel
            // (its reduce kernel waits for flags, not steps).
            (_, Proto::CopyEngine) => 4,
            (_, Proto::Ll) => 1,
            // (The push all-reduce and the split into outputs add one closing barrier a call,
            // the split broadcast into outputs and the relay one opening barrier: `Plan::steps`.
            // The relay's step a chunk is a flag, not a barrier.)
            (Algo::OneShot | Algo::Push | Algo::SplitOut | Algo::Relay, Proto::Simple) => 1,
            (Algo::TwoShot | Algo::Split | Algo::Direct, Proto::Simple) => 2,
            (Algo::Ring, Proto::Simple) => (world as u64).saturating_sub(1).saturating_mul(2),
            (Algo::Pipe, Proto::Simple) => piece.div_ceil(sub.max(1)) | 1,
        }
    }
}

impl Proto {
    /// Every protocol, in code order.
    pub const ALL: [Proto; 3] = [Proto::Ll, Proto::Simple, Proto::CopyEngine];

    /// The name `P2P_PROTO` and the logs use: `ll`, `simple`, `ce`.
    pub fn name(self) -> &'static str {
        match self {
            Proto::Ll => "ll",
            Proto::Simple => "simple",
            Proto::CopyEngine => "ce",
        }
    }

    /// The protocol named `name` ([`name`](Self::name)).
    pub fn from_name(name: &str) -> Option<Proto> {
        Proto::ALL.into_iter().find(|p| p.name() == name)
    }

    /// Its number in a call's code and signature.
    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for Algo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::fmt::Display for Proto {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a call asks of the algorithm that runs it: the facts [`fits`] checks.
#[derive(Debug, Clone, Copy)]
pub(super) struct Need {
    pub op: Op,
    /// Bytes of one source's data: the whole buffer, or one rank's part.
    pub seg_bytes: usize,
    pub world: usize,
    pub access: Access,
}

/// Why `(algo, proto)` cannot run `need` with `tuning`, or `None` where it can. The kernels
/// behind each pair are correct wherever this says yes; which one is fastest is the planner's
/// choice (`choose.rs`), and a forced pair that cannot run is planned as usual, with this
/// reason logged.
pub(super) fn fits(algo: Algo, proto: Proto, need: Need, tuning: &Tuning) -> Option<&'static str> {
    let Need {
        op,
        seg_bytes,
        world,
        access,
    } = need;
    if !algo.runs(op) {
        return Some("it does not run this collective");
    }
    // The direct kernels on rank parts need the parts 16-byte aligned.
    let parts_aligned =
        !matches!(op, Op::AllGather | Op::ReduceScatter | Op::AllToAll) || seg_bytes % 16 == 0;
    match (algo, proto) {
        (Algo::OneShot, Proto::Ll) if !super::shape::ll_fits(seg_bytes, world, tuning) => {
            Some("LL carries at most 512 KiB per source, within the resident blocks")
        }
        (Algo::OneShot, Proto::Ll | Proto::Simple) => None,
        (Algo::OneShot, Proto::CopyEngine) => match op {
            _ if world < 2 => Some("the copy engines move data between ranks: one rank has none to move"),
            Op::AllGather if access.output => None,
            Op::AllToAll if access.output && !access.in_place => None,
            Op::AllReduce if world == 2 && access.output && !access.in_place => None,
            Op::AllGather | Op::AllToAll | Op::AllReduce => Some(
                "the copy engines need a registered output (out of place for all-to-all and all-reduce; all-reduce on two ranks only)",
            ),
            _ => Some("the copy engines carry all-gather, all-to-all and the two-rank all-reduce only"),
        },
        (_, Proto::Ll | Proto::CopyEngine) => Some("only one-shot runs LL or the copy engines"),
        // The ring's steps are 2(n-1): on one rank none, and its last copy would read a slot
        // that nothing wrote.
        (Algo::Ring, Proto::Simple) if world < 2 => Some("a ring of one rank has no steps"),
        (Algo::Split | Algo::SplitOut, Proto::Simple) if world <= 2 => {
            Some("a split needs more than two ranks (one non-root has nobody to forward to)")
        }
        (Algo::Relay, Proto::Simple) if world <= 2 && op != Op::AllReduce => Some(
            "the relayed broadcast and reduce need more than two ranks (one non-root has nobody to forward to)",
        ),
        (Algo::SplitOut | Algo::Relay, Proto::Simple) if !access.output => Some(
            "the split into outputs and the relay write into the peers' outputs: they need the output registered",
        ),
        (Algo::Relay, Proto::Simple) if world < 2 => {
            Some("the relay moves data between ranks: one rank has none to move")
        }
        (Algo::Direct, Proto::Simple) => {
            let reach = match op {
                Op::AllReduce => access.input && access.output,
                Op::ReduceScatter => access.input,
                Op::AllGather => access.output,
                _ => access.output && !access.in_place,
            };
            if !reach {
                Some("the direct kernels need the buffers they reach registered (all-to-all out of place)")
            } else if !parts_aligned {
                Some("the direct kernels need each rank's part on a 16-byte boundary")
            } else {
                None
            }
        }
        (Algo::Pipe, Proto::Simple) if super::shape::pipe_shape(seg_bytes, 1, tuning).is_none() => {
            Some("the pipelined one-shot runs up to one round of the scratch (max_blocks x piece_bytes)")
        }
        (Algo::Push, Proto::Simple) if !access.output => {
            Some("the push all-reduce writes into every rank's output: it needs the output registered")
        }
        (
            Algo::TwoShot
            | Algo::Ring
            | Algo::Split
            | Algo::Pipe
            | Algo::Push
            | Algo::SplitOut
            | Algo::Relay,
            Proto::Simple,
        ) => None,
    }
}

/// An algorithm, a protocol or both forced (`P2P_ALGO`, `P2P_PROTO`, [`Options`]'s `forced`):
/// wherever the forced pair can run a call it does, else the call is planned as usual and the
/// reason logged. The test hook of every path.
///
/// [`Options`]: crate::Options
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Forced {
    /// The algorithm (`None`: the planner's).
    pub algo: Option<Algo>,
    /// The protocol (`None`: the planner's, or `Simple` where an algorithm is forced).
    pub proto: Option<Proto>,
}

impl Forced {
    /// Nothing forced: the planner chooses.
    pub const AUTO: Forced = Forced {
        algo: None,
        proto: None,
    };

    /// `algo` forced, the protocol the planner's.
    pub fn algo(algo: Algo) -> Forced {
        Forced {
            algo: Some(algo),
            proto: None,
        }
    }

    /// `algo` with `proto`.
    pub fn pair(algo: Algo, proto: Proto) -> Forced {
        Forced {
            algo: Some(algo),
            proto: Some(proto),
        }
    }

    /// Whether nothing is forced.
    pub fn is_auto(self) -> bool {
        self == Forced::AUTO
    }

    /// As `P2P_ALGO` and `P2P_PROTO` would say it, e.g. `P2P_ALGO=ring P2P_PROTO=auto`.
    pub fn describe(self) -> String {
        format!(
            "P2P_ALGO={} P2P_PROTO={}",
            self.algo.map_or("auto", Algo::name),
            self.proto.map_or("auto", Proto::name)
        )
    }
}
