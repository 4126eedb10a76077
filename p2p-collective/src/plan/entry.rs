//! Which entry point of the collective program runs a plan: `coll_<type>_<name>`, defined by
//! `COLL_ENTRY(name, ...)` in the kernel file of the algorithm (`kernels/coll/algo/`) or
//! protocol (`kernels/coll/proto/`). An algorithm's entry is named after it, so a new
//! algorithm brings its entry with its variant.

use crate::types::Op;

use super::algo::{Algo, Proto};

/// An entry point of the collective program, one per element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Entry {
    /// The algorithm's own kernel through the scratch or the registered buffers
    /// (`coll_<type>_<algo>`, [`Algo::name`]).
    Algo(Algo),
    /// One-shot all-gather, reduce-scatter and all-to-all where a rank's part or a buffer lies
    /// off a 16-byte boundary: copies that realign their words (`coll_<type>_oneshot_unaligned`;
    /// the realigning code in the plain kernel costs aligned copies 2-3 %).
    OneShotUnaligned,
    /// One-shot all-gather, reduce-scatter and all-to-all, aligned, with their chunks' steps
    /// overlapped ([`Plan::overlap`](super::Plan::overlap); `coll_<type>_oneshot_overlapped`).
    OneShotOverlapped,
    /// LL, every collective on any world size (`coll_<type>_ll`).
    Ll,
    /// LL all-reduce on two ranks, the collective and world size compiled in
    /// (`coll_<type>_ll2`: 0.45 us faster a call at 8 B-4 KiB).
    LlAllReduceTwoRanks,
    /// The barrier kernel around a copy-engine plan's copies (`coll_<type>_ce_barrier`).
    CeBarrier,
    /// The reduction of a copy-engine all-reduce, chunk by chunk as the copies land
    /// (`coll_<type>_ce_reduce`).
    CeReduce,
}

/// The entries besides the algorithms' own, in index order.
const OTHERS: [Entry; 6] = [
    Entry::OneShotUnaligned,
    Entry::OneShotOverlapped,
    Entry::Ll,
    Entry::LlAllReduceTwoRanks,
    Entry::CeBarrier,
    Entry::CeReduce,
];

impl Entry {
    /// How many entries there are (per element type).
    pub const COUNT: usize = Algo::ALL.len() + OTHERS.len();

    /// Every entry, in index order: the algorithms', then the others.
    pub fn all() -> impl Iterator<Item = Entry> {
        Algo::ALL.into_iter().map(Entry::Algo).chain(OTHERS)
    }

    /// Its place in [`all`](Self::all).
    pub fn index(self) -> usize {
        match self {
            Entry::Algo(a) => a.index(),
            Entry::OneShotUnaligned => Algo::ALL.len(),
            Entry::OneShotOverlapped => Algo::ALL.len() + 1,
            Entry::Ll => Algo::ALL.len() + 2,
            Entry::LlAllReduceTwoRanks => Algo::ALL.len() + 3,
            Entry::CeBarrier => Algo::ALL.len() + 4,
            Entry::CeReduce => Algo::ALL.len() + 5,
        }
    }

    /// The name after `coll_<type>_`: the algorithm's name, `oneshot_unaligned`,
    /// `oneshot_overlapped`, `ll`, `ll2`, `ce_barrier` or `ce_reduce`.
    pub fn name(self) -> &'static str {
        match self {
            Entry::Algo(a) => a.name(),
            Entry::OneShotUnaligned => "oneshot_unaligned",
            Entry::OneShotOverlapped => "oneshot_overlapped",
            Entry::Ll => "ll",
            Entry::LlAllReduceTwoRanks => "ll2",
            Entry::CeBarrier => "ce_barrier",
            Entry::CeReduce => "ce_reduce",
        }
    }

    /// The entry that runs `op` by `(algo, proto)` on `world` ranks; `unaligned`: a rank's part
    /// or a buffer of the call lies off a 16-byte boundary; `overlap`: the chunks' steps overlap
    /// (the planner overlaps a one-shot call only where it is aligned). A copy-engine plan's
    /// entry is its barrier (its all-reduce also runs [`CeReduce`](Self::CeReduce)).
    pub fn of(
        op: Op,
        (algo, proto): (Algo, Proto),
        world: usize,
        (unaligned, overlap): (bool, bool),
    ) -> Entry {
        let scattered = matches!(op, Op::AllGather | Op::ReduceScatter | Op::AllToAll);
        match proto {
            Proto::CopyEngine => Entry::CeBarrier,
            Proto::Ll if op == Op::AllReduce && world == 2 => Entry::LlAllReduceTwoRanks,
            Proto::Ll => Entry::Ll,
            Proto::Simple if algo == Algo::OneShot && scattered && unaligned => {
                Entry::OneShotUnaligned
            }
            Proto::Simple if algo == Algo::OneShot && scattered && overlap => {
                Entry::OneShotOverlapped
            }
            Proto::Simple => Entry::Algo(algo),
        }
    }
}

impl std::fmt::Display for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
