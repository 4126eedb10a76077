//! When the planner picks which algorithm and protocol: one arm per choice, each with the
//! measured reason it is logged with (docs/performance.md gives the cost model behind each
//! threshold, the `Tuning` knob that holds it, and the runs that set it).

use crate::types::Op;

use super::algo::{fits, Algo, Forced, Need, Proto};
use super::shape::{ll_fits, pipe_shape};
use super::{Tuning, RS_DIRECT_MAX_BYTES_TWO_RANKS};

/// The pair that runs `need`, why, and, where a forced pair could not run it, why not.
pub(super) fn choose(
    need: Need,
    forced: Forced,
    tuning: &Tuning,
) -> (Algo, Proto, &'static str, Option<&'static str>) {
    let (algo, proto, reason) = planners_choice(need, tuning);
    if forced.is_auto() {
        return (algo, proto, reason, None);
    }
    let want_algo = forced.algo.unwrap_or(match forced.proto {
        Some(p) if p != proto => Algo::OneShot,
        _ => algo,
    });
    let want_proto = forced.proto.unwrap_or(if forced.algo.is_some() {
        Proto::Simple
    } else {
        proto
    });
    match fits(want_algo, want_proto, need, tuning) {
        None => (
            want_algo,
            want_proto,
            "forced (P2P_ALGO, P2P_PROTO or Options::forced)",
            None,
        ),
        Some(why) => (algo, proto, reason, Some(why)),
    }
}

/// What the planner picks for `need` with nothing forced.
fn planners_choice(need: Need, tuning: &Tuning) -> (Algo, Proto, &'static str) {
    let (op, seg_bytes, world, access) = (need.op, need.seg_bytes, need.world, need.access);
    // All ranks' parts together, for the collectives of parts.
    let all_parts = seg_bytes.saturating_mul(world);
    // The direct kernels on rank parts need the parts 16-byte aligned (else they copy bytes: 3
    // ranks of a power-of-two size measured 1.5x slower than the scratch path) and enough data
    // to pay for their start and end barriers across every peer.
    let direct_min = if world > 2 {
        tuning.direct_min_bytes
    } else {
        tuning.direct_min_bytes.saturating_mul(2)
    };
    let parts_direct = seg_bytes % 16 == 0 && all_parts >= direct_min;
    let ce_min = if world > 2 {
        tuning.ce_min_bytes_more_ranks
    } else {
        tuning.ce_min_bytes
    };
    let ce_parts = world >= 2 && all_parts >= ce_min;
    const LL: &str = "small: flags inside the data (LL), one crossing, no fence or flag";
    if seg_bytes <= tuning.ll_limit(world) && ll_fits(seg_bytes, world, tuning) {
        return (Algo::OneShot, Proto::Ll, LL);
    }
    match op {
        Op::AllReduce => all_reduce(seg_bytes, world, access, tuning),
        Op::Broadcast if world > 2 && seg_bytes >= tuning.split_min_bytes => (
            Algo::Split,
            Proto::Simple,
            "large on > 2 ranks: the root sends each non-root a part, which it forwards to the others",
        ),
        Op::Broadcast => (Algo::OneShot, Proto::Simple, "the root pushes to every peer"),
        Op::Reduce if world > 2 && seg_bytes >= tuning.split_min_bytes => (
            Algo::Split,
            Proto::Simple,
            "large on > 2 ranks: each non-root reduces a part over every rank and sends it to the root",
        ),
        Op::Reduce => (Algo::OneShot, Proto::Simple, "every peer pushes to the root"),
        Op::AllGather if access.output && ce_parts => (
            Algo::OneShot,
            Proto::CopyEngine,
            if world == 2 {
                "registered, large, 2 ranks: the copy engines write into the peer's buffer"
            } else {
                "registered, large (ce_min_bytes_more_ranks): the copy engines write into every peer's buffer"
            },
        ),
        Op::AllGather if access.output && parts_direct => (
            Algo::Direct,
            Proto::Simple,
            "registered output: every rank writes into every peer's output",
        ),
        Op::AllGather => (Algo::OneShot, Proto::Simple, "every rank pushes to every peer"),
        Op::ReduceScatter
            if access.input
                && parts_direct
                && (world != 2 || all_parts < RS_DIRECT_MAX_BYTES_TWO_RANKS) =>
        {
            (
                Algo::Direct,
                Proto::Simple,
                "registered input: every rank reads its part from every peer's input",
            )
        }
        Op::ReduceScatter if access.input && parts_direct => (
            Algo::OneShot,
            Proto::Simple,
            "registered input, but 1 GiB or more on 2 ranks: pushing through the scratch measured faster than reading the peer's input",
        ),
        Op::ReduceScatter => (
            Algo::OneShot,
            Proto::Simple,
            "every rank pushes each part to its owner",
        ),
        Op::AllToAll if access.output && !access.in_place && ce_parts => (
            Algo::OneShot,
            Proto::CopyEngine,
            if world == 2 {
                "registered output, large, 2 ranks: the copy engines write the peer's part into its output"
            } else {
                "registered output, large (ce_min_bytes_more_ranks): the copy engines write each peer's part into its output"
            },
        ),
        Op::AllToAll if access.output && !access.in_place && world > 2 && parts_direct => (
            Algo::Direct,
            Proto::Simple,
            "registered output: every rank writes each part into its owner's output",
        ),
        Op::AllToAll => (
            Algo::OneShot,
            Proto::Simple,
            "every rank pushes each part to its owner",
        ),
    }
}

/// The all-reduce above LL's sizes.
fn all_reduce(
    bytes: usize,
    world: usize,
    access: super::Access,
    tuning: &Tuning,
) -> (Algo, Proto, &'static str) {
    if world == 2 && access.output && !access.in_place && bytes >= tuning.ce_all_reduce_min_bytes {
        (
            Algo::OneShot,
            Proto::CopyEngine,
            "registered output, out of place, large, 2 ranks: the copy engines carry each input into the peer's output while a kernel reduces each chunk as it lands",
        )
    } else if world == 2 && bytes <= tuning.pipe_max_bytes && pipe_shape(bytes, 1, tuning).is_some()
    {
        (
            Algo::Pipe,
            Proto::Simple,
            "2 ranks, within one round of the scratch: one-shot with each block's push and reduction overlapped",
        )
    } else if access.input && access.output && world > 2 {
        // On two ranks one-shot already moves each byte once; direct measured no faster.
        (
            Algo::Direct,
            Proto::Simple,
            "registered buffers: each rank reads its part from every peer, reduces it and writes it into every peer",
        )
    } else if world <= 2 {
        (
            Algo::OneShot,
            Proto::Simple,
            "2 ranks: one-shot sends each byte once, as a ring would, in one step",
        )
    } else if bytes <= tuning.oneshot_max_bytes / world {
        (
            Algo::OneShot,
            Proto::Simple,
            "small: one step beats the extra bytes",
        )
    } else {
        (
            Algo::TwoShot,
            Proto::Simple,
            "large: two-shot moves 2(n-1)/n of the data in two steps",
        )
    }
}
