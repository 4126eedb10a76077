use super::*;
use crate::types::RedOp;

/// The paths the planner picks, by algorithm and protocol.
const ONESHOT: (Algo, Proto) = (Algo::OneShot, Proto::Simple);
const TWOSHOT: (Algo, Proto) = (Algo::TwoShot, Proto::Simple);
const RING: (Algo, Proto) = (Algo::Ring, Proto::Simple);
const SPLIT: (Algo, Proto) = (Algo::Split, Proto::Simple);
const DIRECT: (Algo, Proto) = (Algo::Direct, Proto::Simple);
const PIPE: (Algo, Proto) = (Algo::Pipe, Proto::Simple);
const LL: (Algo, Proto) = (Algo::OneShot, Proto::Ll);
const CE: (Algo, Proto) = (Algo::OneShot, Proto::CopyEngine);

/// Which of a call's buffers are registered, and whether it is in place (aligned).
fn access(input: bool, output: bool, in_place: bool) -> Access {
    Access {
        input,
        output,
        in_place,
        unaligned: false,
    }
}

/// The plan of `op` over `count` elements of `dtype` on `world` ranks with `forced`, on plain
/// buffers.
fn plan(op: Op, dtype: DataType, count: usize, world: usize, forced: Forced, t: &Tuning) -> Plan {
    plan_with(op, dtype, count, world, forced, t, Access::NONE)
}

/// As `plan`, with the buffers `access` describes.
fn plan_with(
    op: Op,
    dtype: DataType,
    count: usize,
    world: usize,
    forced: Forced,
    tuning: &Tuning,
    access: Access,
) -> Plan {
    let planner = Planner {
        world,
        forced,
        tuning: *tuning,
    };
    planner.plan(&Call::new(op, dtype, count), access)
}

/// The plan of an f32 call with nothing forced.
fn auto_f32(op: Op, count: usize, world: usize, tuning: &Tuning, access: Access) -> Plan {
    plan_with(
        op,
        DataType::F32,
        count,
        world,
        Forced::AUTO,
        tuning,
        access,
    )
}

fn t() -> Tuning {
    Tuning::for_device(132, 1)
}

/// The plan of an all-reduce of `count` elements of `dtype` on `world` ranks with
/// `forced` forced.
fn forced(dtype: DataType, count: usize, world: usize, forced: Forced, tuning: &Tuning) -> Plan {
    plan(Op::AllReduce, dtype, count, world, forced, tuning)
}

/// The path of an f32 all-reduce of `count` elements on `world` ranks, nothing forced.
fn all_reduce_path(count: usize, world: usize, tuning: &Tuning) -> (Algo, Proto) {
    plan(
        Op::AllReduce,
        DataType::F32,
        count,
        world,
        Forced::AUTO,
        tuning,
    )
    .path()
}

/// As `t()` with LL off: the plans of the pushed-data kinds at every size.
fn no_ll() -> Tuning {
    Tuning {
        ll_max_bytes: 0,
        ..t()
    }
}

#[test]
fn without_ll_two_ranks_go_one_shot_and_more_go_two_shot_when_large() {
    for count in [1, 1000, 1 << 28] {
        assert_eq!(all_reduce_path(count, 2, &no_ll()), ONESHOT);
    }
    assert_eq!(all_reduce_path(1024, 8, &no_ll()), ONESHOT);
    assert_eq!(all_reduce_path(1 << 20, 8, &no_ll()), TWOSHOT);
    assert_eq!(
        forced(DataType::F32, 7, 2, Forced::algo(Algo::Ring), &no_ll()).path(),
        RING
    );
}

#[test]
fn pieces_cover_every_element_in_whole_vectors_and_fit_the_scratch() {
    let pipelined = Tuning {
        pipe_max_bytes: 16 << 20,
        ..no_ll()
    };
    for (tuning, op) in [no_ll(), pipelined]
        .into_iter()
        .flat_map(|t| Op::ALL.map(|op| (t, op)))
    {
        for dtype in DataType::ALL {
            for count in [1usize, 7, 1023, 65537, (1 << 20) + 3, 64 << 20] {
                for world in [2, 3, 8] {
                    let p = plan(op, dtype, count, world, Forced::AUTO, &tuning);
                    let elem = p.kernel_type.size();
                    assert_eq!(p.units as usize * elem, count * dtype.size());
                    assert!(p.grid >= 1 && p.grid <= tuning.max_blocks);
                    assert_eq!(p.piece as usize * elem % 16, 0, "{op} {dtype} {count}");
                    assert!(p.piece as usize * elem <= tuning.piece_bytes);
                    assert!(p.chunks * p.piece * p.grid as u64 >= p.units);
                    // No chunk is wholly empty.
                    assert!((p.chunks - 1) * p.piece * (p.grid as u64) < p.units);
                    assert!(p.grid as usize * p.piece as usize * elem <= tuning.slot_bytes());
                }
            }
        }
    }
}

#[test]
fn small_calls_use_one_block_and_large_ones_all() {
    let p = plan(
        Op::AllReduce,
        DataType::F32,
        2048,
        2,
        Forced::AUTO,
        &no_ll(),
    );
    assert_eq!((p.grid, p.chunks), (1, 1));
    let p = plan(
        Op::AllReduce,
        DataType::F32,
        1 << 28,
        2,
        Forced::AUTO,
        &no_ll(),
    );
    assert_eq!(p.grid, 132);
    assert_eq!(p.piece * 4, 64 << 10);
    // Two resident blocks per SM double the grid, within MAX_BLOCKS.
    let two = Tuning::for_device(132, 2);
    assert_eq!(two.max_blocks, 256);
    assert_eq!(
        plan(Op::AllReduce, DataType::F32, 1 << 28, 2, Forced::AUTO, &two).grid,
        256
    );
    assert_eq!(Tuning::for_device(100, 4).max_blocks, 200);
}

#[test]
fn copies_move_bytes_and_reductions_elements() {
    let p = plan(Op::AllGather, DataType::F64, 10, 2, Forced::AUTO, &t());
    assert_eq!((p.kernel_type, p.units), (DataType::U8, 80));
    let p = plan(Op::ReduceScatter, DataType::BF16, 10, 2, Forced::AUTO, &t());
    assert_eq!((p.kernel_type, p.units), (DataType::BF16, 10));
}

#[test]
fn the_planner_never_overflows_on_extreme_counts_or_tunings() {
    // A tuning that turns the direct kernels off with the largest value, as the other
    // thresholds are turned off (`direct_min_bytes * 2` used to overflow), and counts no
    // communicator accepts: every plan is still made, and makes sense.
    let t = Tuning {
        direct_min_bytes: usize::MAX,
        ..Tuning::for_device(132, 2)
    };
    assert!(t.validate(264, 2).is_ok());
    let registered = Access {
        input: true,
        output: true,
        ..Access::NONE
    };
    for world in [1, 2, 3, 8] {
        for op in Op::ALL {
            for count in [1024, 1 << 40, usize::MAX] {
                let p = auto_f32(op, count, world, &t, registered);
                // (All-reduce has thresholds of its own.)
                if matches!(op, Op::AllGather | Op::ReduceScatter | Op::AllToAll) {
                    assert!(
                        p.algo != Algo::Direct,
                        "{op:?} {count} on {world}: {:?}",
                        p.path()
                    );
                }
                assert!(p.steps(world) >= 1);
            }
        }
    }
    assert_eq!(ce_chunk(63, 1000, 4), (1000, 1000));
    assert_eq!(ce_chunk(CE_CHUNKS, 1000, 4), (1000, 1000));
    let wide = Tuning {
        ll_max_bytes: usize::MAX,
        piece_bytes: usize::MAX,
        ..t
    };
    assert_eq!(wide.ll_limit(4), usize::MAX / 4);
    assert_eq!(wide.slot_bytes(), usize::MAX);
}

#[test]
fn a_forced_ring_on_one_rank_runs_one_shot() {
    let p = forced(DataType::F32, 1 << 20, 1, Forced::algo(Algo::Ring), &t());
    assert_eq!(p.path(), ONESHOT);
    let why = p.refused.unwrap_or_default();
    assert!(why.contains("ring of one rank"), "{why}");
    let p = forced(DataType::F32, 1 << 20, 2, Forced::algo(Algo::Ring), &t());
    assert_eq!(p.path(), RING);
}

#[test]
fn steps_count_the_barriers_per_block() {
    let p = forced(DataType::F32, 1 << 26, 4, Forced::algo(Algo::Ring), &t());
    assert_eq!(p.steps(4), p.chunks * 6);
    let p = forced(DataType::F32, 1 << 26, 4, Forced::algo(Algo::TwoShot), &t());
    assert_eq!(p.steps(4), p.chunks * 2);
}

#[test]
fn two_shot_and_split_overlap_their_chunks_only_from_the_tuned_size() {
    let default = t();
    assert_eq!(default.overlap_min_bytes, usize::MAX, "off until measured");
    let tuning = Tuning {
        overlap_min_bytes: 2 << 20,
        ..default
    };
    let at = |op, bytes: usize, world, tuning: &Tuning| {
        plan(
            op,
            DataType::F32,
            bytes / 4,
            world,
            Forced::default(),
            tuning,
        )
    };
    // 16 MiB on 4 ranks: split and two-shot (forced) cut into overlap_chunks chunks or more,
    // a barrier a step: chunks + 2 steps of 3 stages, less one.
    for (op, path, forced) in [
        (Op::Reduce, SPLIT, Forced::default()),
        (Op::Broadcast, SPLIT, Forced::default()),
        (Op::AllReduce, TWOSHOT, Forced::algo(Algo::TwoShot)),
    ] {
        let p = plan(op, DataType::F32, 4 << 20, 4, forced, &tuning);
        assert_eq!(p.path(), path, "{op:?}");
        assert!(p.overlap, "{op:?}");
        assert!(p.chunks >= tuning.overlap_chunks as u64, "{op:?}: {p:?}");
        assert_eq!(p.steps(4), p.chunks + 1, "{op:?}");
        // The same call untuned: chunks of pieces of 64 KiB, two barriers each.
        let q = plan(op, DataType::F32, 4 << 20, 4, forced, &default);
        assert!(!q.overlap);
        assert_eq!(
            q.piece * q.kernel_type.size() as u64,
            default.piece_bytes as u64
        );
        assert_eq!(q.steps(4), 2 * q.chunks, "{op:?}");
    }
    // Below the tuned size, and the algorithms that have no stages to overlap, as before.
    let below = at(Op::Reduce, 1 << 20, 4, &tuning);
    assert_eq!((below.path(), below.overlap), (SPLIT, false));
    let p = at(Op::AllReduce, 16 << 20, 2, &tuning);
    assert!(!p.overlap, "{p:?}");
    // One-shot all-gather, reduce-scatter and all-to-all: two stages, chunks barriers, their
    // own entry; where a part lies off a 16-byte boundary, the realigning kernel in turn.
    for op in [Op::AllGather, Op::ReduceScatter, Op::AllToAll] {
        let p = at(op, 4 << 20, 4, &tuning);
        assert_eq!((p.path(), p.overlap), (ONESHOT, true), "{op:?}");
        assert_eq!(p.entry, Entry::OneShotOverlapped, "{op:?}");
        assert!(p.chunks >= tuning.overlap_chunks as u64, "{op:?}: {p:?}");
        assert_eq!(p.steps(4), p.chunks, "{op:?}");
        let off = Access {
            unaligned: true,
            ..Access::NONE
        };
        let q = plan_with(
            op,
            DataType::F32,
            1 << 20,
            4,
            Forced::default(),
            &tuning,
            off,
        );
        assert_eq!(
            (q.entry, q.overlap),
            (Entry::OneShotUnaligned, false),
            "{op:?}"
        );
        let r = at(op, 4 << 20, 4, &default);
        assert_eq!(
            (r.entry, r.overlap),
            (Entry::Algo(Algo::OneShot), false),
            "{op:?}"
        );
    }
    let ring = forced(DataType::F32, 4 << 20, 4, Forced::algo(Algo::Ring), &tuning);
    assert_eq!((ring.path(), ring.overlap), (RING, false));
    // Large calls: pieces stay within piece_bytes, so more chunks than asked.
    let big = at(Op::Reduce, 1 << 30, 4, &tuning);
    assert!(big.overlap);
    assert_eq!(big.piece * 4, tuning.piece_bytes as u64);
    assert_eq!(
        big.chunks,
        (1u64 << 30).div_ceil(tuning.piece_bytes as u64 * big.grid as u64)
    );
}

#[test]
fn the_push_all_reduce_runs_forced_on_a_registered_output_only() {
    let out = access(false, true, false);
    let push = Forced::algo(Algo::Push);
    let p = plan_with(Op::AllReduce, DataType::F32, 1 << 22, 4, push, &t(), out);
    assert_eq!(p.path(), (Algo::Push, Proto::Simple));
    assert_eq!(p.entry, Entry::Algo(Algo::Push));
    assert!(p.uses_windows());
    // A barrier a chunk and one closing the call.
    assert_eq!(p.steps(4), p.chunks + 1);
    // Plain buffers: planned as usual, the reason logged.
    let plain = plan(Op::AllReduce, DataType::F32, 1 << 22, 4, push, &t());
    assert_eq!(plain.path(), TWOSHOT);
    assert!(plain.refused.unwrap_or_default().contains("registered"));
    assert_never_picked(Algo::Push, &[Op::AllReduce], &[2, 4, 8]);
    // Overlapped: two stages, chunks + 1 steps with the closing one.
    let tuning = Tuning {
        overlap_min_bytes: 0,
        ..t()
    };
    let o = plan_with(Op::AllReduce, DataType::F32, 1 << 22, 4, push, &tuning, out);
    assert!(
        o.overlap && o.chunks >= tuning.overlap_chunks as u64,
        "{o:?}"
    );
    assert_eq!(o.steps(4), o.chunks + 1);
}

/// Asserts that the planner, with nothing forced and registered outputs, never picks `algo` for
/// `ops` on `worlds` ranks at 1 Ki, 4 Mi and 256 Mi f32 elements.
fn assert_never_picked(algo: Algo, ops: &[Op], worlds: &[usize]) {
    let out = access(false, true, false);
    for &op in ops {
        for &world in worlds {
            for count in [1 << 10, 1 << 22, 1 << 28] {
                let auto = plan_with(
                    op,
                    DataType::F32,
                    count,
                    world,
                    Forced::default(),
                    &t(),
                    out,
                );
                assert_ne!(auto.algo, algo, "{op}, {world} ranks, {count}");
            }
        }
    }
}

#[test]
fn the_split_into_outputs_runs_forced_on_more_than_two_ranks_with_registered_outputs() {
    let out = access(false, true, false);
    let split_out = Forced::algo(Algo::SplitOut);
    for op in [Op::Broadcast, Op::Reduce] {
        let dtype = DataType::F32;
        let p = plan_with(op, dtype, 1 << 22, 4, split_out, &t(), out);
        assert_eq!(p.path(), (Algo::SplitOut, Proto::Simple), "{op}");
        assert_eq!(p.entry, Entry::Algo(Algo::SplitOut));
        assert!(p.uses_windows());
        // Not overlapped: one barrier a chunk between its two stages, and one closing the call
        // (the broadcast one opening it too).
        let opening = u64::from(op == Op::Broadcast);
        assert!(!p.overlap);
        assert_eq!(p.steps(4), p.chunks + 1 + opening, "{p:?}");
        // Plain buffers, or two ranks: planned as usual, the reason logged.
        let plain = plan(op, dtype, 1 << 22, 4, split_out, &t());
        assert_eq!(plain.path(), SPLIT);
        assert!(plain.refused.unwrap_or_default().contains("registered"));
        let two = plan_with(op, dtype, 1 << 22, 2, split_out, &t(), out);
        assert_eq!(two.path(), ONESHOT);
        assert!(two.refused.unwrap_or_default().contains("more than two"));
        // It runs no other collective.
        let ar = plan_with(Op::AllReduce, dtype, 1 << 22, 4, split_out, &t(), out);
        assert_ne!(ar.algo, Algo::SplitOut);
        assert!(ar.refused.is_some());
        assert_never_picked(Algo::SplitOut, &[op], &[3, 4, 8]);
        // Overlapped: two stages, chunks + 1 steps with the closing one (and the opening one).
        let tuning = Tuning {
            overlap_min_bytes: 0,
            ..t()
        };
        let o = plan_with(op, dtype, 1 << 22, 4, split_out, &tuning, out);
        assert!(
            o.overlap && o.chunks >= tuning.overlap_chunks as u64,
            "{o:?}"
        );
        assert_eq!(o.steps(4), o.chunks + 1 + opening);
    }
}

#[test]
fn the_relay_runs_forced_with_registered_outputs_rooted_calls_on_more_than_two_ranks() {
    let out = access(false, true, false);
    let relay = Forced::algo(Algo::Relay);
    for op in [Op::Broadcast, Op::Reduce, Op::AllReduce] {
        let dtype = DataType::F32;
        for (count, chunks) in [(1 << 10, 4), (1 << 22, 4), (1 << 22, 16), (1 << 28, 4)] {
            let tuning = Tuning {
                overlap_chunks: chunks,
                ..t()
            };
            let p = plan_with(op, dtype, count, 4, relay, &tuning, out);
            assert_eq!(p.path(), (Algo::Relay, Proto::Simple), "{op} {count}");
            assert_eq!(p.entry, Entry::Algo(Algo::Relay));
            assert!(p.uses_windows());
            // Always cut into `overlap_chunks` chunks at least (its flags pipeline them), with
            // no stages to overlap; more where a piece would pass `piece_bytes`.
            assert!(!p.overlap);
            assert!(p.chunks >= chunks as u64, "{op} {count}: {p:?}");
            assert!(
                p.piece as usize * p.kernel_type.size() <= tuning.piece_bytes,
                "{p:?}"
            );
            // A flag a chunk (the last chunk's standing for the close), and for the broadcast
            // one opening barrier; the reduce's counter passes two steps more; the
            // all-reduce flags twice a chunk.
            let steps = match op {
                Op::Broadcast => p.chunks + 1,
                Op::Reduce => p.chunks + 2,
                _ => 2 * p.chunks,
            };
            assert_eq!(p.steps(4), steps, "{p:?}");
        }
        // Plain buffers: planned as usual, the reason logged.
        let plain = plan(op, dtype, 1 << 22, 4, relay, &t());
        assert_ne!(plain.algo, Algo::Relay, "{op}");
        assert!(plain.refused.unwrap_or_default().contains("registered"));
        // Two ranks: the all-reduce runs; broadcast and reduce are planned as usual.
        let two = plan_with(op, dtype, 1 << 22, 2, relay, &t(), out);
        if op == Op::AllReduce {
            assert_eq!(two.path(), (Algo::Relay, Proto::Simple));
        } else {
            assert_eq!(two.path(), ONESHOT);
            assert!(two.refused.unwrap_or_default().contains("more than two"));
        }
    }
    for op in [Op::AllGather, Op::ReduceScatter, Op::AllToAll] {
        let other = plan_with(op, DataType::F32, 1 << 22, 4, relay, &t(), out);
        assert_ne!(other.algo, Algo::Relay, "{op}");
        assert!(other.refused.is_some(), "{op}");
    }
    assert_never_picked(Algo::Relay, &Op::ALL, &[2, 3, 4, 8]);
}

#[test]
fn tuning_round_trips_through_words() {
    let t = Tuning {
        ll_max_bytes: 12345,
        overlap_min_bytes: 1 << 21,
        overlap_chunks: 7,
        ..t()
    };
    assert_eq!(Tuning::from_words(&t.to_words()), Some(t));
    assert_eq!(Tuning::from_words(&t.to_words()[..4]), None);
}

#[test]
fn auto_picks_ll_up_to_the_tuned_size_and_only_where_the_grid_fits() {
    let mut tuning = t();
    // Measured crossovers: 512 KiB on 2 and 3 ranks, 256 KiB on 4.
    for (world, limit) in [
        (2, 512 << 10),
        (3, 512 << 10),
        (4, 256 << 10),
        (8, 128 << 10),
    ] {
        assert_eq!(tuning.ll_limit(world), limit);
        let most = limit / 4;
        let p = plan(
            Op::AllReduce,
            DataType::F32,
            most,
            world,
            Forced::AUTO,
            &tuning,
        );
        assert_eq!(p.path(), LL, "world {world}");
        assert!(p.reason.contains("LL"));
        let p = plan(
            Op::AllReduce,
            DataType::F32,
            most + 1,
            world,
            Forced::AUTO,
            &tuning,
        );
        assert_ne!(p.path(), LL, "world {world}");
    }
    tuning.ll_max_bytes = 0;
    let p = plan(Op::AllReduce, DataType::F32, 1, 2, Forced::AUTO, &tuning);
    assert_eq!(p.path(), ONESHOT);
    // A GPU with few resident blocks: LL only where its grid is resident.
    tuning.ll_max_bytes = LL_MAX_BYTES;
    tuning.max_blocks = 4;
    let fits = 4 * THREADS as usize * 8;
    assert_eq!(
        plan(Op::AllReduce, DataType::U8, fits, 2, Forced::AUTO, &tuning).path(),
        LL
    );
    assert_eq!(
        plan(
            Op::AllReduce,
            DataType::U8,
            fits + 1,
            2,
            Forced::AUTO,
            &tuning
        )
        .path(),
        ONESHOT
    );
}

#[test]
fn two_ranks_pipeline_all_reduces_from_ll_up_to_one_round_of_the_scratch() {
    // Off by default until measured across GPUs (docs/performance.md, "The pipelined one-shot
    // all-reduce").
    let default = Tuning::for_device(132, 2);
    assert_eq!(default.pipe_max_bytes, 0);
    let p = plan(
        Op::AllReduce,
        DataType::F32,
        1 << 20,
        2,
        Forced::AUTO,
        &default,
    );
    assert_eq!(p.path(), ONESHOT);
    let tuning = Tuning {
        pipe_max_bytes: 16 << 20,
        ..default
    };
    let round = tuning.slot_bytes();
    assert_eq!(round, 16 << 20, "H200: 256 blocks of 64 KiB");
    for dtype in [DataType::F32, DataType::BF16, DataType::F64, DataType::U8] {
        let e = dtype.size();
        for bytes in [
            LL_MAX_BYTES + 16,
            1 << 20,
            (3 << 20) + 48,
            4 << 20,
            tuning.pipe_max_bytes,
        ] {
            let count = bytes / e;
            let p = plan(Op::AllReduce, dtype, count, 2, Forced::AUTO, &tuning);
            assert_eq!(p.path(), PIPE, "{dtype} {bytes}");
            assert_eq!(p.chunks, 1);
            assert!(
                p.grid as u64 * p.piece >= p.units,
                "{dtype} {bytes}: one round"
            );
            assert!(p.piece as usize * e <= tuning.piece_bytes);
            assert_eq!(p.piece as usize * e % 16, 0);
            assert_eq!(
                p.sub as usize * e,
                tuning.pipe_sub_bytes.min(p.piece as usize * e)
            );
            assert_eq!(p.steps(2) % 2, 1, "the counter moves on by an odd number");
            assert_eq!(p.steps(2), p.piece.div_ceil(p.sub) | 1);
        }
        // Past the knob or one round: one-shot; more ranks: not by default.
        let big = plan(
            Op::AllReduce,
            dtype,
            (round + 16) / e,
            2,
            Forced::AUTO,
            &tuning,
        );
        assert_eq!(big.path(), ONESHOT);
        let four = plan(
            Op::AllReduce,
            dtype,
            (4 << 20) / e,
            4,
            Forced::AUTO,
            &tuning,
        );
        assert_ne!(four.path(), PIPE);
    }
    // Forced (whatever the knob): on any world size within one round; past it, one-shot,
    // saying why.
    let forced = |count, world| {
        forced(
            DataType::F32,
            count,
            world,
            Forced::algo(Algo::Pipe),
            &default,
        )
    };
    assert_eq!(forced(1 << 20, 4).path(), PIPE);
    // No data: no pipe shape (the public planner must not panic on a count of 0): planned as
    // usual, saying why.
    let empty = forced(0, 2);
    assert_ne!(empty.path(), PIPE);
    assert!(empty.refused.is_some(), "{empty:?}");
    for op in Op::ALL {
        for algorithm in [
            Forced::AUTO,
            Forced::algo(Algo::Ring),
            Forced::algo(Algo::TwoShot),
        ] {
            for world in [1, 2, 3, 8] {
                let p = plan(op, DataType::F32, 0, world, algorithm, &default);
                assert_eq!(p.units, 0, "{op} {world} {p:?}");
            }
        }
    }
    let p = forced(64 << 20, 2);
    assert_eq!(p.path(), ONESHOT);
    let why = p.refused.unwrap_or_default();
    assert!(why.contains("one round of the scratch"), "{why}");
}

#[test]
fn the_own_part_goes_to_the_copy_engine_only_out_of_place_through_the_scratch() {
    let default = Tuning::for_device(132, 2);
    assert_eq!(default.ce_own_min_bytes, usize::MAX, "off until measured");
    let on = Tuning {
        ce_own_min_bytes: 64 << 20,
        ..default
    };
    let out_of_place = Access::NONE;
    let in_place = access(false, false, true);
    let registered = access(true, true, false);
    // 32 MiB per part on 2 ranks: 64 MiB in all.
    let count = 8 << 20;
    let own =
        |op, tuning: &Tuning, access| auto_f32(op, count, 2, tuning, access).own_by_copy_engine;
    for op in [Op::AllGather, Op::AllToAll] {
        assert!(!own(op, &default, out_of_place), "{op}");
        assert!(own(op, &on, out_of_place), "{op}");
        assert!(!own(op, &on, in_place), "{op}");
        // Registered: the direct kinds (all-gather), which copy the own part their way; an
        // all-to-all on two ranks stays on the scratch below the copy engines' size.
        let r = auto_f32(op, count, 2, &on, registered);
        assert_eq!(r.own_by_copy_engine, r.path() == ONESHOT, "{op}: {r:?}");
        // Below the knob (all parts together), and LL-sized calls.
        let small = auto_f32(op, count / 2 - 4, 2, &on, out_of_place);
        assert!(!small.own_by_copy_engine, "{op}");
        let ll = auto_f32(op, 16, 2, &on, out_of_place);
        assert!(ll.proto == Proto::Ll && !ll.own_by_copy_engine, "{op}");
    }
    for op in [Op::AllReduce, Op::Broadcast, Op::Reduce, Op::ReduceScatter] {
        assert!(!own(op, &on, out_of_place), "{op}");
    }
}

#[test]
fn every_collective_runs_ll_while_each_source_sends_little() {
    let tuning = t();
    for op in Op::ALL {
        for world in [2, 3, 4, 8] {
            // `count` is per rank for the parted collectives: the limit is per source.
            let most = tuning.ll_limit(world) / 4;
            let p = plan(op, DataType::F32, most, world, Forced::AUTO, &tuning);
            assert!(p.proto == Proto::Ll, "{op} world {world}: {:?}", p.path());
            assert_eq!(p.op, op);
            assert_eq!(p.steps(world), 1);
            let p = plan(op, DataType::F32, most + 1, world, Forced::AUTO, &tuning);
            assert!(p.proto != Proto::Ll, "{op} world {world}");
        }
    }
    // Checking mode turns LL off through the tuning.
    let off = Tuning {
        ll_max_bytes: 0,
        ..tuning
    };
    assert_eq!(
        plan(Op::AllGather, DataType::F32, 1, 4, Forced::AUTO, &off).path(),
        ONESHOT
    );
}

#[test]
fn large_broadcasts_and_reduces_split_among_the_non_roots_on_more_than_two_ranks() {
    let tuning = no_ll();
    let big = tuning.split_min_bytes / 4;
    for (op, split, plain) in [
        (Op::Broadcast, SPLIT, ONESHOT),
        (Op::Reduce, SPLIT, ONESHOT),
    ] {
        assert_eq!(
            plan(op, DataType::F32, big, 4, Forced::AUTO, &tuning).path(),
            split
        );
        assert_eq!(
            plan(op, DataType::F32, big, 3, Forced::AUTO, &tuning).path(),
            split
        );
        assert_eq!(
            plan(op, DataType::F32, big, 2, Forced::AUTO, &tuning).path(),
            plain
        );
        assert_eq!(
            plan(op, DataType::F32, big - 1, 4, Forced::AUTO, &tuning).path(),
            plain
        );
        let p = plan(op, DataType::F32, 1 << 28, 4, Forced::AUTO, &tuning);
        assert_eq!(p.steps(4), 2 * p.chunks);
    }
}

#[test]
fn one_shot_gives_way_to_two_shot_at_three_mib_over_n() {
    let tuning = no_ll();
    let f = |count, world| all_reduce_path(count, world, &tuning);
    // 3 ranks: one-shot up to 1 MiB; 4 ranks: up to 768 KiB.
    assert_eq!(f(256 << 10, 3), ONESHOT);
    assert_eq!(f((256 << 10) + 1, 3), TWOSHOT);
    assert_eq!(f(192 << 10, 4), ONESHOT);
    assert_eq!(f((192 << 10) + 1, 4), TWOSHOT);
}

#[test]
fn registered_buffers_go_direct_where_the_kernel_can_reach_them() {
    let tuning = t();
    let big = 1 << 24; // 64 MiB of f32
    let both = access(true, true, false);
    let f = |op, access| auto_f32(op, big, 4, &tuning, access);
    assert_eq!(f(Op::AllReduce, both).path(), DIRECT);
    assert_eq!(f(Op::AllGather, both).path(), DIRECT);
    assert_eq!(f(Op::ReduceScatter, both).path(), DIRECT);
    assert_eq!(f(Op::AllToAll, both).path(), DIRECT);
    // What each needs: all-reduce both sides, all-gather and all-to-all the output,
    // reduce-scatter the input; all-to-all never in place.
    let only_in = access(true, false, false);
    let only_out = access(false, true, false);
    assert_eq!(f(Op::AllReduce, only_in).path(), TWOSHOT);
    assert_eq!(f(Op::AllGather, only_in).path(), ONESHOT);
    assert_eq!(f(Op::ReduceScatter, only_out).path(), ONESHOT);
    assert_eq!(f(Op::AllGather, only_out).path(), DIRECT);
    let in_place = access(true, true, true);
    assert_eq!(f(Op::AllToAll, in_place).path(), ONESHOT);
    assert_eq!(f(Op::AllReduce, in_place).path(), DIRECT);
    // Below the direct threshold, with parts not 16-byte aligned, and on two ranks for
    // all-reduce and all-to-all, the scratch path (measured faster there).
    let small = auto_f32(Op::AllGather, 1 << 19, 4, &tuning, both);
    assert_eq!(small.path(), ONESHOT);
    let odd = auto_f32(Op::AllGather, (1 << 22) + 1, 4, &tuning, both);
    assert_eq!(odd.path(), ONESHOT);
    let two = |op| auto_f32(op, big, 2, &tuning, both).path();
    assert_eq!(two(Op::AllReduce), ONESHOT);
    assert_eq!(two(Op::AllToAll), ONESHOT);
    assert_eq!(two(Op::AllGather), DIRECT);
    assert_eq!(two(Op::ReduceScatter), DIRECT);
    // Reduce-scatter on two ranks reads directly only below RS_DIRECT_MAX_BYTES_TWO_RANKS
    // (all parts); on more ranks at any size.
    let rs = |count, world| auto_f32(Op::ReduceScatter, count, world, &tuning, both).path();
    let under = (RS_DIRECT_MAX_BYTES_TWO_RANKS - 16 * 2) / 4 / 2;
    let at = RS_DIRECT_MAX_BYTES_TWO_RANKS / 4 / 2;
    assert_eq!(rs(under, 2), DIRECT);
    assert_eq!(rs(at, 2), ONESHOT);
    assert_eq!(rs(at, 4), DIRECT);
    // Small calls still run LL; a forced algorithm wins over registration.
    assert!(auto_f32(Op::AllReduce, 16, 4, &tuning, both).proto == Proto::Ll);
    assert_eq!(
        plan_with(
            Op::AllReduce,
            DataType::F32,
            big,
            4,
            Forced::algo(Algo::Ring),
            &tuning,
            both
        )
        .path(),
        RING
    );
}

#[test]
fn direct_shares_cover_every_element_in_whole_vectors() {
    let tuning = t();
    let both = access(true, true, false);
    for op in [
        Op::AllReduce,
        Op::AllGather,
        Op::ReduceScatter,
        Op::AllToAll,
    ] {
        for dtype in DataType::ALL {
            for count in [(1usize << 22) + 4, 64 << 20] {
                for world in [3, 4, 8] {
                    let p = plan_with(op, dtype, count * 16, world, Forced::AUTO, &tuning, both);
                    assert!(p.algo == Algo::Direct, "{op} {dtype} {count} {world}");
                    let elem = p.kernel_type.size() as u64;
                    assert_eq!(p.piece * elem % 16, 0);
                    let share = if p.path() == DIRECT {
                        p.units.div_ceil(world as u64)
                    } else {
                        p.units
                    };
                    assert!(
                        p.piece * p.grid as u64 >= share,
                        "{op} {dtype} {count} {world}"
                    );
                    assert_eq!((p.chunks, p.steps(world)), (1, 2));
                }
            }
        }
    }
}

#[test]
fn every_plans_code_names_its_op_algorithm_and_protocol() {
    let mut codes = Vec::new();
    for op in Op::ALL {
        for algo in Algo::ALL {
            for proto in Proto::ALL {
                let c = code::code(op, algo, proto);
                assert_eq!(describe_code(c), Some((op, algo, proto)));
                assert!(c >= crate::abi::CODE_TAG as u64, "{c}");
                assert!(!codes.contains(&c), "{op} {algo} {proto}: {c} taken");
                codes.push(c);
            }
        }
    }
    // The send/recv codes, and anything else, are no plan's.
    for other in [
        0,
        crate::abi::K_SEND as u64,
        crate::abi::K_RECV_ORDER as u64,
        1 << 20,
    ] {
        assert_eq!(describe_code(other), None, "{other}");
    }
}

#[test]
fn every_entry_has_its_own_index_and_name() {
    let all: Vec<Entry> = Entry::all().collect();
    assert_eq!(all.len(), Entry::COUNT);
    for (i, e) in all.iter().enumerate() {
        assert_eq!(e.index(), i, "{e}");
        assert!(all[..i].iter().all(|o| o.name() != e.name()), "{e}");
    }
    // An algorithm's own kernel is named after it.
    for a in Algo::ALL {
        assert_eq!(Entry::Algo(a).name(), a.name());
    }
}

/// The kernel of one-shot parts off a 16-byte boundary runs only all-gather, all-to-all and
/// reduce-scatter (its file returns at once for the others, and their peers would wait): the
/// planner picks it for those collectives off a boundary, and for nothing else.
#[test]
fn the_unaligned_kernel_is_picked_only_off_a_boundary_and_only_for_what_it_runs() {
    let unaligned = Access {
        unaligned: true,
        ..Access::NONE
    };
    for op in Op::ALL {
        for world in 1..=8 {
            for forced in [Forced::AUTO, Forced::algo(Algo::OneShot)] {
                for bytes in [8usize, 1 << 20, 1 << 30] {
                    let count = bytes / 4;
                    let aligned =
                        plan_with(op, DataType::F32, count, world, forced, &t(), Access::NONE);
                    assert_ne!(
                        aligned.entry,
                        Entry::OneShotUnaligned,
                        "{op} {world} {bytes}"
                    );
                    let off = plan_with(op, DataType::F32, count, world, forced, &t(), unaligned);
                    let runs = matches!(op, Op::AllGather | Op::ReduceScatter | Op::AllToAll)
                        && off.path() == ONESHOT;
                    assert_eq!(
                        off.entry == Entry::OneShotUnaligned,
                        runs,
                        "{op} {world} {bytes}: {off:?}"
                    );
                    if !runs {
                        assert_eq!(off.entry, aligned.entry, "{op} {world} {bytes}");
                    }
                }
            }
        }
    }
}

#[test]
fn copy_engines_for_large_registered_calls_on_two_ranks_and_more_when_asked() {
    let mut tuning = t();
    let in_place = access(true, true, true);
    let out = access(true, true, false);
    let out_only = access(false, true, false);
    assert_eq!(tuning.ce_min_bytes, 256 << 20);
    assert_eq!(tuning.ce_all_reduce_min_bytes, 256 << 20);
    // The all-reduce has its own threshold: not with ce_min_bytes alone.
    let whole = (64 << 20) / 4;
    tuning.ce_min_bytes = 64 << 20;
    let p = auto_f32(Op::AllReduce, whole, 2, &tuning, out_only);
    assert_eq!(p.path(), ONESHOT);
    tuning.ce_all_reduce_min_bytes = 64 << 20;
    for world in [2, 3, 4] {
        let two = world == 2;
        let count = (64 << 20) / 4 / world;
        let kind = |op, count, access| auto_f32(op, count, world, &tuning, access).path();
        let p = auto_f32(Op::AllGather, count, world, &tuning, in_place);
        if two {
            assert_eq!((p.path(), p.grid, p.threads), (CE, 1, THREADS));
            assert_eq!((p.proto, p.op), (Proto::CopyEngine, Op::AllGather));
        } else {
            // More ranks: off by default (not measured), the kernels.
            assert!(p.proto != Proto::CopyEngine, "{p:?}");
        }
        for access in [out, out_only] {
            let k = kind(Op::AllGather, count, access);
            assert_eq!(k == CE, two, "{k:?}");
        }
        // All-to-all and all-reduce: out of place only, into a registered output.
        let a2a = kind(Op::AllToAll, count, out_only);
        assert_eq!(a2a == CE, two, "{a2a:?}");
        assert_ne!(kind(Op::AllToAll, count, in_place), CE);
        let whole = count * world; // an all-reduce's count is the whole buffer
        let ar = auto_f32(Op::AllReduce, whole, world, &tuning, out_only);
        assert_eq!(ar.path() == CE, two, "{ar:?}");
        if two {
            assert_eq!(
                (ar.grid, ar.threads, ar.kernel_type),
                (tuning.max_blocks / 2, THREADS, DataType::F32)
            );
            assert_eq!(ar.op, Op::AllReduce);
            // Forcing an algorithm turns the copy engines off.
            let forced = plan_with(
                Op::AllReduce,
                DataType::F32,
                whole,
                world,
                Forced::algo(Algo::OneShot),
                &tuning,
                out_only,
            );
            assert_eq!(forced.path(), ONESHOT);
        }
        assert_ne!(kind(Op::AllReduce, whole, in_place), CE);
        // Below the threshold or not registered: no copy engines.
        for op in [Op::AllGather, Op::AllToAll] {
            assert_ne!(kind(op, count - 4, out), CE, "{op}");
            assert_ne!(kind(op, count, Access::NONE), CE, "{op}");
        }
        assert_ne!(kind(Op::AllReduce, whole - 4, out), CE);
        assert_ne!(kind(Op::AllReduce, whole, Access::NONE), CE);
        // The other collectives never.
        for op in [Op::ReduceScatter, Op::Broadcast, Op::Reduce] {
            for access in [in_place, out] {
                assert_ne!(kind(op, count, access), CE, "{op} {access:?}");
            }
        }
    }
    // Small calls stay LL.
    let p = auto_f32(Op::AllGather, 16, 2, &tuning, in_place);
    assert_eq!(p.path(), LL);

    // More ranks with their own threshold: all-gather and all-to-all (the all-reduce by the
    // copy engines is for two ranks only); two ranks keep theirs.
    assert_eq!(t().ce_min_bytes_more_ranks, usize::MAX);
    let more = Tuning {
        ce_min_bytes: usize::MAX,
        ce_min_bytes_more_ranks: 64 << 20,
        ..tuning
    };
    for world in [2, 3, 4, 8] {
        let count = (64usize << 20).div_ceil(4 * world);
        let kind = |op, count, access| auto_f32(op, count, world, &more, access).path();
        for access in [in_place, out, out_only] {
            let k = kind(Op::AllGather, count, access);
            assert_eq!(k == CE, world > 2, "{world} {k:?}");
            assert_ne!(kind(Op::AllGather, count - 4, access), CE);
        }
        let a2a = kind(Op::AllToAll, count, out_only);
        assert_eq!(a2a == CE, world > 2, "{world} {a2a:?}");
        assert_ne!(kind(Op::AllToAll, count, in_place), CE);
        assert_ne!(kind(Op::AllToAll, count, Access::NONE), CE);
        let ar = kind(Op::AllReduce, count * world, out_only);
        assert_eq!(ar == CE, world == 2, "{world} {ar:?}");
        if world > 2 {
            let p = auto_f32(Op::AllGather, count, world, &more, out);
            assert_eq!(
                (p.grid, p.threads, p.kernel_type),
                (1, THREADS, DataType::U8)
            );
            assert!(p.reason.contains("ce_min_bytes_more_ranks"), "{}", p.reason);
        }
    }
}

#[test]
fn copy_engine_all_reduce_chunks_halve_and_cover_the_buffer() {
    for elem in [1usize, 2, 4, 8] {
        for n in [0u64, 1, 7, 16_383, 70_001, 1 << 20, (1 << 28) + 3] {
            let mut next = 0;
            for k in 0..CE_CHUNKS {
                let (lo, hi) = ce_chunk(k, n, elem);
                assert_eq!(lo, next, "elem {elem} n {n} chunk {k}");
                assert!(hi >= lo && hi <= n, "elem {elem} n {n} chunk {k}");
                if hi != n {
                    assert_eq!(hi * elem as u64 % CE_ALIGN as u64, 0);
                }
                next = hi;
            }
            assert_eq!(next, n, "elem {elem} n {n}");
        }
    }
    // Halving: at 1 GiB of f32, 512 MiB, 256, 128, 64, 32 and the last 32.
    let n = (1u64 << 30) / 4;
    let mibs: Vec<u64> = (0..CE_CHUNKS)
        .map(|k| {
            let (lo, hi) = ce_chunk(k, n, 4);
            ((hi - lo) * 4) >> 20
        })
        .collect();
    assert_eq!(mibs, [512, 256, 128, 64, 32, 32]);
}

#[test]
fn two_rank_ll_runs_small_blocks_and_more_ranks_full_ones() {
    let tuning = t();
    // (bytes, grid, piece, threads) on two ranks: LL2_PIECE units a block while the grid
    // stays within the slot's 128 blocks, then bigger pieces.
    for (bytes, grid, piece, threads) in [
        (8, 1, 1, 32),
        (4096, 4, 128, 128),
        (4100, 5, 103, 128),
        (64 << 10, 64, 128, 128),
        (128 << 10, 128, 128, 128),
        (256 << 10, 128, 256, 256),
        (LL_MAX_BYTES, 128, 512, 512),
    ] {
        let p = forced(
            DataType::U8,
            bytes,
            2,
            Forced::pair(Algo::OneShot, Proto::Ll),
            &tuning,
        );
        assert_eq!(p.path(), LL, "{bytes}");
        assert_eq!(
            (p.grid, p.piece, p.threads),
            (grid, piece, threads),
            "{bytes}"
        );
    }
    // More ranks: one block per THREADS units, THREADS threads, as before.
    let p = forced(
        DataType::U8,
        4096,
        4,
        Forced::pair(Algo::OneShot, Proto::Ll),
        &tuning,
    );
    assert_eq!((p.grid, p.piece, p.threads), (1, 512, THREADS));
    let p = plan(
        Op::AllGather,
        DataType::U8,
        64 << 10,
        3,
        Forced::AUTO,
        &tuning,
    );
    assert_eq!((p.path(), p.grid, p.threads), (LL, 16, THREADS));
    // Every other kind launches THREADS threads.
    let p = plan(
        Op::AllReduce,
        DataType::F32,
        1 << 24,
        2,
        Forced::AUTO,
        &tuning,
    );
    assert_eq!(p.threads, THREADS);
}

#[test]
fn ll_covers_every_byte_in_one_round_and_only_small_calls() {
    let tuning = t();
    for dtype in DataType::ALL {
        for count in [1usize, 7, 1023, 8191, 50_001, LL_MAX_BYTES / dtype.size()] {
            let p = plan(
                Op::AllReduce,
                dtype,
                count,
                2,
                Forced::pair(Algo::OneShot, Proto::Ll),
                &tuning,
            );
            assert_eq!(p.path(), LL, "{dtype} {count}");
            let units = (count * dtype.size()).div_ceil(8) as u64;
            assert_eq!((p.chunks, p.units), (1, count as u64));
            assert!(p.piece * p.grid as u64 >= units && p.piece * (p.grid as u64 - 1) < units);
            assert!(units * 16 <= LL_SLOT_BYTES as u64);
            // Each block's lines stay inside its own THREADS-line part of the slot, one
            // thread per unit.
            assert!(p.piece <= p.threads as u64 && p.threads <= THREADS);
            assert_eq!(p.threads % 32, 0);
            assert!(p.grid as u64 * THREADS as u64 * 16 <= LL_SLOT_BYTES as u64);
            assert_eq!(p.steps(2), 1);
        }
    }
    let big = forced(
        DataType::F32,
        LL_MAX_BYTES / 4 + 1,
        2,
        Forced::pair(Algo::OneShot, Proto::Ll),
        &tuning,
    );
    assert_eq!(big.path(), ONESHOT);
    let why = big.refused.unwrap_or_default();
    assert!(why.contains("512 KiB"), "{why}");
}

#[test]
fn signatures_round_trip_into_words() {
    let sig =
        |op, (algo, proto): (Algo, Proto), call: Call| code::signature((op, algo, proto), &call);
    let s = sig(
        Op::AllReduce,
        ONESHOT,
        Call::new(Op::AllReduce, DataType::F32, 1024),
    );
    assert_eq!(
        describe(s),
        "all_reduce (oneshot/simple) float sum, count 1024"
    );
    let s = sig(
        Op::Broadcast,
        ONESHOT,
        Call::new(Op::Broadcast, DataType::BF16, 7).root(3),
    );
    assert_eq!(
        describe(s),
        "broadcast (oneshot/simple) bfloat16 root 3, count 7"
    );
    let s = sig(
        Op::AllToAll,
        DIRECT,
        Call::new(Op::AllToAll, DataType::F16, 1 << 40),
    );
    assert_eq!(
        describe(s),
        "all_to_all (direct/simple) half, count 1099511627776"
    );
    let s = sig(
        Op::Reduce,
        SPLIT,
        Call::new(Op::Reduce, DataType::I64, 3)
            .redop(RedOp::Avg)
            .root(7),
    );
    assert_eq!(
        describe(s),
        "reduce (split/simple) int64 avg root 7, count 3"
    );
    let reduce = |count| Call::new(Op::Reduce, DataType::I32, count).redop(RedOp::Prod);
    assert_ne!(
        sig(Op::Reduce, ONESHOT, reduce(5)),
        sig(Op::Reduce, ONESHOT, reduce(6))
    );
    // A reduction or root the collective has none of is left out: ranks agree whatever they
    // pass there.
    let gather = Call::new(Op::AllGather, DataType::U8, 9);
    assert_eq!(
        sig(Op::AllGather, ONESHOT, gather),
        sig(Op::AllGather, ONESHOT, gather.redop(RedOp::Max).root(2))
    );
}
