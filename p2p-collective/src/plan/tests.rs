use super::*;

/// Which of a call's buffers are registered, and whether it is in place.
fn access(input: bool, output: bool, in_place: bool) -> Access {
    Access {
        input,
        output,
        in_place,
    }
}

fn t() -> Tuning {
    Tuning::for_device(132, 1)
}

/// The plan of an all-reduce of `count` elements of `dtype` on `world` ranks with
/// `algorithm` forced.
fn forced(
    dtype: DataType,
    count: usize,
    world: usize,
    algorithm: Algorithm,
    tuning: &Tuning,
) -> Plan {
    plan(Op::AllReduce, dtype, count, world, Some(algorithm), tuning)
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
        assert_eq!(
            plan(Op::AllReduce, DataType::F32, count, 2, None, &no_ll()).kind,
            Kind::AllReduceOneShot
        );
    }
    assert_eq!(
        plan(Op::AllReduce, DataType::F32, 1024, 8, None, &no_ll()).kind,
        Kind::AllReduceOneShot
    );
    assert_eq!(
        plan(Op::AllReduce, DataType::F32, 1 << 20, 8, None, &no_ll()).kind,
        Kind::AllReduceTwoShot
    );
    assert_eq!(
        forced(DataType::F32, 7, 2, Algorithm::Ring, &no_ll()).kind,
        Kind::AllReduceRing
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
                    let p = plan(op, dtype, count, world, None, &tuning);
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
    let p = plan(Op::AllReduce, DataType::F32, 2048, 2, None, &no_ll());
    assert_eq!((p.grid, p.chunks), (1, 1));
    let p = plan(Op::AllReduce, DataType::F32, 1 << 28, 2, None, &no_ll());
    assert_eq!(p.grid, 132);
    assert_eq!(p.piece * 4, 64 << 10);
    // Two resident blocks per SM double the grid, within MAX_BLOCKS.
    let two = Tuning::for_device(132, 2);
    assert_eq!(two.max_blocks, 256);
    assert_eq!(
        plan(Op::AllReduce, DataType::F32, 1 << 28, 2, None, &two).grid,
        256
    );
    assert_eq!(Tuning::for_device(100, 4).max_blocks, 200);
}

#[test]
fn copies_move_bytes_and_reductions_elements() {
    let p = plan(Op::AllGather, DataType::F64, 10, 2, None, &t());
    assert_eq!((p.kernel_type, p.units), (DataType::U8, 80));
    let p = plan(Op::ReduceScatter, DataType::BF16, 10, 2, None, &t());
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
        in_place: false,
    };
    for world in [1, 2, 3, 8] {
        for op in Op::ALL {
            for count in [1024, 1 << 40, usize::MAX] {
                let p = plan_with(op, DataType::F32, count, world, None, &t, registered);
                // (All-reduce has thresholds of its own.)
                if matches!(op, Op::AllGather | Op::ReduceScatter | Op::AllToAll) {
                    assert!(
                        !p.kind.is_direct(),
                        "{op:?} {count} on {world}: {:?}",
                        p.kind
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
    let p = forced(DataType::F32, 1 << 20, 1, Algorithm::Ring, &t());
    assert_eq!(p.kind, Kind::AllReduceOneShot);
    assert!(p.reason.contains("ring of one rank"), "{}", p.reason);
    let p = forced(DataType::F32, 1 << 20, 2, Algorithm::Ring, &t());
    assert_eq!(p.kind, Kind::AllReduceRing);
}

#[test]
fn steps_count_the_barriers_per_block() {
    let p = forced(DataType::F32, 1 << 26, 4, Algorithm::Ring, &t());
    assert_eq!(p.steps(4), p.chunks * 6);
    let p = forced(DataType::F32, 1 << 26, 4, Algorithm::TwoShot, &t());
    assert_eq!(p.steps(4), p.chunks * 2);
}

#[test]
fn tuning_round_trips_through_words() {
    let t = Tuning {
        ll_max_bytes: 12345,
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
        let p = plan(Op::AllReduce, DataType::F32, most, world, None, &tuning);
        assert_eq!(p.kind, Kind::AllReduceLl, "world {world}");
        assert!(p.reason.contains("LL"));
        let p = plan(Op::AllReduce, DataType::F32, most + 1, world, None, &tuning);
        assert_ne!(p.kind, Kind::AllReduceLl, "world {world}");
    }
    tuning.ll_max_bytes = 0;
    let p = plan(Op::AllReduce, DataType::F32, 1, 2, None, &tuning);
    assert_eq!(p.kind, Kind::AllReduceOneShot);
    // A GPU with few resident blocks: LL only where its grid is resident.
    tuning.ll_max_bytes = LL_MAX_BYTES;
    tuning.max_blocks = 4;
    let fits = 4 * THREADS as usize * 8;
    assert_eq!(
        plan(Op::AllReduce, DataType::U8, fits, 2, None, &tuning).kind,
        Kind::AllReduceLl
    );
    assert_eq!(
        plan(Op::AllReduce, DataType::U8, fits + 1, 2, None, &tuning).kind,
        Kind::AllReduceOneShot
    );
}

#[test]
fn two_ranks_pipeline_all_reduces_from_ll_up_to_one_round_of_the_scratch() {
    // Off by default until measured (perf-notes §33).
    let default = Tuning::for_device(132, 2);
    assert_eq!(default.pipe_max_bytes, 0);
    let p = plan(Op::AllReduce, DataType::F32, 1 << 20, 2, None, &default);
    assert_eq!(p.kind, Kind::AllReduceOneShot);
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
            let p = plan(Op::AllReduce, dtype, count, 2, None, &tuning);
            assert_eq!(p.kind, Kind::AllReducePipe, "{dtype} {bytes}");
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
        let big = plan(Op::AllReduce, dtype, (round + 16) / e, 2, None, &tuning);
        assert_eq!(big.kind, Kind::AllReduceOneShot);
        let four = plan(Op::AllReduce, dtype, (4 << 20) / e, 4, None, &tuning);
        assert_ne!(four.kind, Kind::AllReducePipe);
    }
    // Forced (whatever the knob): on any world size within one round; past it, one-shot,
    // saying why.
    let forced = |count, world| forced(DataType::F32, count, world, Algorithm::Pipe, &default);
    assert_eq!(forced(1 << 20, 4).kind, Kind::AllReducePipe);
    // No data: no pipe shape (the public planner must not panic on a count of 0).
    assert_eq!(forced(0, 2).kind, Kind::AllReduceOneShot);
    for op in Op::ALL {
        for algorithm in [None, Some(Algorithm::Ring), Some(Algorithm::TwoShot)] {
            for world in [1, 2, 3, 8] {
                let p = plan(op, DataType::F32, 0, world, algorithm, &default);
                assert_eq!(p.units, 0, "{op} {world} {p:?}");
            }
        }
    }
    let p = forced(64 << 20, 2);
    assert_eq!(p.kind, Kind::AllReduceOneShot);
    assert!(p.reason.contains("pipe forced"), "{}", p.reason);
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
    let own = |op, tuning: &Tuning, access| {
        plan_with(op, DataType::F32, count, 2, None, tuning, access).own_by_copy_engine
    };
    for op in [Op::AllGather, Op::AllToAll] {
        assert!(!own(op, &default, out_of_place), "{op}");
        assert!(own(op, &on, out_of_place), "{op}");
        assert!(!own(op, &on, in_place), "{op}");
        // Registered: the direct kinds (all-gather), which copy the own part their way; an
        // all-to-all on two ranks stays on the scratch below the copy engines' size.
        let r = plan_with(op, DataType::F32, count, 2, None, &on, registered);
        assert_eq!(
            r.own_by_copy_engine,
            r.kind == Kind::AllToAll,
            "{op}: {r:?}"
        );
        // Below the knob (all parts together), and LL-sized calls.
        let small = plan_with(op, DataType::F32, count / 2 - 4, 2, None, &on, out_of_place);
        assert!(!small.own_by_copy_engine, "{op}");
        let ll = plan_with(op, DataType::F32, 16, 2, None, &on, out_of_place);
        assert!(ll.kind.is_ll() && !ll.own_by_copy_engine, "{op}");
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
            let p = plan(op, DataType::F32, most, world, None, &tuning);
            assert!(p.kind.is_ll(), "{op} world {world}: {:?}", p.kind);
            assert_eq!(p.kind.op(), op);
            assert_eq!(p.steps(world), 1);
            let p = plan(op, DataType::F32, most + 1, world, None, &tuning);
            assert!(!p.kind.is_ll(), "{op} world {world}");
        }
    }
    // Checking mode turns LL off through the tuning.
    let off = Tuning {
        ll_max_bytes: 0,
        ..tuning
    };
    assert_eq!(
        plan(Op::AllGather, DataType::F32, 1, 4, None, &off).kind,
        Kind::AllGather
    );
}

#[test]
fn large_broadcasts_and_reduces_split_among_the_non_roots_on_more_than_two_ranks() {
    let tuning = no_ll();
    let big = tuning.split_min_bytes / 4;
    for (op, split, plain) in [
        (Op::Broadcast, Kind::BroadcastSplit, Kind::Broadcast),
        (Op::Reduce, Kind::ReduceSplit, Kind::Reduce),
    ] {
        assert_eq!(plan(op, DataType::F32, big, 4, None, &tuning).kind, split);
        assert_eq!(plan(op, DataType::F32, big, 3, None, &tuning).kind, split);
        assert_eq!(plan(op, DataType::F32, big, 2, None, &tuning).kind, plain);
        assert_eq!(
            plan(op, DataType::F32, big - 1, 4, None, &tuning).kind,
            plain
        );
        let p = plan(op, DataType::F32, 1 << 28, 4, None, &tuning);
        assert_eq!(p.steps(4), 2 * p.chunks);
    }
}

#[test]
fn one_shot_gives_way_to_two_shot_at_three_mib_over_n() {
    let tuning = no_ll();
    let f = |count, world| plan(Op::AllReduce, DataType::F32, count, world, None, &tuning).kind;
    // 3 ranks: one-shot up to 1 MiB; 4 ranks: up to 768 KiB.
    assert_eq!(f(256 << 10, 3), Kind::AllReduceOneShot);
    assert_eq!(f((256 << 10) + 1, 3), Kind::AllReduceTwoShot);
    assert_eq!(f(192 << 10, 4), Kind::AllReduceOneShot);
    assert_eq!(f((192 << 10) + 1, 4), Kind::AllReduceTwoShot);
}

#[test]
fn registered_buffers_go_direct_where_the_kernel_can_reach_them() {
    let tuning = t();
    let big = 1 << 24; // 64 MiB of f32
    let both = access(true, true, false);
    let f = |op, access| plan_with(op, DataType::F32, big, 4, None, &tuning, access);
    assert_eq!(f(Op::AllReduce, both).kind, Kind::AllReduceDirect);
    assert_eq!(f(Op::AllGather, both).kind, Kind::AllGatherDirect);
    assert_eq!(f(Op::ReduceScatter, both).kind, Kind::ReduceScatterDirect);
    assert_eq!(f(Op::AllToAll, both).kind, Kind::AllToAllDirect);
    // What each needs: all-reduce both sides, all-gather and all-to-all the output,
    // reduce-scatter the input; all-to-all never in place.
    let only_in = access(true, false, false);
    let only_out = access(false, true, false);
    assert_eq!(f(Op::AllReduce, only_in).kind, Kind::AllReduceTwoShot);
    assert_eq!(f(Op::AllGather, only_in).kind, Kind::AllGather);
    assert_eq!(f(Op::ReduceScatter, only_out).kind, Kind::ReduceScatter);
    assert_eq!(f(Op::AllGather, only_out).kind, Kind::AllGatherDirect);
    let in_place = access(true, true, true);
    assert_eq!(f(Op::AllToAll, in_place).kind, Kind::AllToAll);
    assert_eq!(f(Op::AllReduce, in_place).kind, Kind::AllReduceDirect);
    // Below the direct threshold, with parts not 16-byte aligned, and on two ranks for
    // all-reduce and all-to-all, the scratch path (measured faster there).
    let small = plan_with(
        Op::AllGather,
        DataType::F32,
        1 << 19,
        4,
        None,
        &tuning,
        both,
    );
    assert_eq!(small.kind, Kind::AllGather);
    let odd = plan_with(
        Op::AllGather,
        DataType::F32,
        (1 << 22) + 1,
        4,
        None,
        &tuning,
        both,
    );
    assert_eq!(odd.kind, Kind::AllGather);
    let two = |op| plan_with(op, DataType::F32, big, 2, None, &tuning, both).kind;
    assert_eq!(two(Op::AllReduce), Kind::AllReduceOneShot);
    assert_eq!(two(Op::AllToAll), Kind::AllToAll);
    assert_eq!(two(Op::AllGather), Kind::AllGatherDirect);
    assert_eq!(two(Op::ReduceScatter), Kind::ReduceScatterDirect);
    // Reduce-scatter on two ranks reads directly only below RS_DIRECT_MAX_BYTES_TWO_RANKS
    // (all parts); on more ranks at any size.
    let rs = |count, world| {
        plan_with(
            Op::ReduceScatter,
            DataType::F32,
            count,
            world,
            None,
            &tuning,
            both,
        )
        .kind
    };
    let under = (RS_DIRECT_MAX_BYTES_TWO_RANKS - 16 * 2) / 4 / 2;
    let at = RS_DIRECT_MAX_BYTES_TWO_RANKS / 4 / 2;
    assert_eq!(rs(under, 2), Kind::ReduceScatterDirect);
    assert_eq!(rs(at, 2), Kind::ReduceScatter);
    assert_eq!(rs(at, 4), Kind::ReduceScatterDirect);
    // Small calls still run LL; a forced algorithm wins over registration.
    assert!(
        plan_with(Op::AllReduce, DataType::F32, 16, 4, None, &tuning, both)
            .kind
            .is_ll()
    );
    assert_eq!(
        plan_with(
            Op::AllReduce,
            DataType::F32,
            big,
            4,
            Some(Algorithm::Ring),
            &tuning,
            both
        )
        .kind,
        Kind::AllReduceRing
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
                    let p = plan_with(op, dtype, count * 16, world, None, &tuning, both);
                    assert!(p.kind.is_direct(), "{op} {dtype} {count} {world}");
                    let elem = p.kernel_type.size() as u64;
                    assert_eq!(p.piece * elem % 16, 0);
                    let share = if p.kind == Kind::AllReduceDirect {
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
fn the_kernel_enum_matches_kind_code_for_code() {
    // `enum Kind` in coll_abi.h, e.g. `K_ALLREDUCE_LL = 8,`: same names (case and underscores
    // aside) and the same numbers, in order.
    let src = include_str!("../kernels/coll_abi.h");
    let start = src.find("enum Kind {").expect("enum Kind in coll_abi.h");
    let body = &src[start..start + src[start..].find("};").expect("end of enum Kind")];
    let entries: Vec<(String, usize)> = body
        .lines()
        .filter_map(|l| {
            let (name, value) = l.trim().trim_end_matches(',').split_once(" = ")?;
            Some((
                name.trim_start_matches("K_")
                    .replace('_', "")
                    .to_lowercase(),
                value.parse().ok()?,
            ))
        })
        .collect();
    assert_eq!(entries.len(), Kind::ALL.len(), "{entries:?}");
    for (k, (name, value)) in Kind::ALL.iter().zip(&entries) {
        assert_eq!(*k as usize, *value, "{k:?}");
        assert_eq!(format!("{k:?}").to_lowercase(), *name, "{k:?}");
    }
}

#[test]
fn every_kind_round_trips_through_its_code() {
    for (i, k) in Kind::ALL.iter().enumerate() {
        assert_eq!(*k as usize, i);
        assert_eq!(Kind::from_code(i as u64), Some(*k));
    }
    assert_eq!(Kind::from_code(Kind::ALL.len() as u64), None);
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
    let p = plan_with(
        Op::AllReduce,
        DataType::F32,
        whole,
        2,
        None,
        &tuning,
        out_only,
    );
    assert_eq!(p.kind, Kind::AllReduceOneShot);
    tuning.ce_all_reduce_min_bytes = 64 << 20;
    for world in [2, 3, 4] {
        let two = world == 2;
        let count = (64 << 20) / 4 / world;
        let kind = |op, count, access| {
            plan_with(op, DataType::F32, count, world, None, &tuning, access).kind
        };
        let p = plan_with(
            Op::AllGather,
            DataType::F32,
            count,
            world,
            None,
            &tuning,
            in_place,
        );
        if two {
            assert_eq!((p.kind, p.grid, p.threads), (Kind::AllGatherCe, 1, THREADS));
            assert_eq!((p.kind.variant(), p.kind.op()), ("ce", Op::AllGather));
        } else {
            // More ranks: off by default (not measured), the kernels.
            assert!(!p.kind.is_ce(), "{p:?}");
        }
        for access in [out, out_only] {
            let k = kind(Op::AllGather, count, access);
            assert_eq!(k == Kind::AllGatherCe, two, "{k:?}");
        }
        // All-to-all and all-reduce: out of place only, into a registered output.
        let a2a = kind(Op::AllToAll, count, out_only);
        assert_eq!(a2a == Kind::AllToAllCe, two, "{a2a:?}");
        assert!(!kind(Op::AllToAll, count, in_place).is_ce());
        let whole = count * world; // an all-reduce's count is the whole buffer
        let ar = plan_with(
            Op::AllReduce,
            DataType::F32,
            whole,
            world,
            None,
            &tuning,
            out_only,
        );
        assert_eq!(ar.kind == Kind::AllReduceCe, two, "{ar:?}");
        if two {
            assert_eq!(
                (ar.grid, ar.threads, ar.kernel_type),
                (tuning.max_blocks / 2, THREADS, DataType::F32)
            );
            assert_eq!(ar.kind.op(), Op::AllReduce);
            // Forcing an algorithm turns the copy engines off.
            let forced = plan_with(
                Op::AllReduce,
                DataType::F32,
                whole,
                world,
                Some(Algorithm::OneShot),
                &tuning,
                out_only,
            );
            assert_eq!(forced.kind, Kind::AllReduceOneShot);
        }
        assert!(!kind(Op::AllReduce, whole, in_place).is_ce());
        // Below the threshold or not registered: no copy engines.
        for op in [Op::AllGather, Op::AllToAll] {
            assert!(!kind(op, count - 4, out).is_ce(), "{op}");
            assert!(!kind(op, count, Access::NONE).is_ce(), "{op}");
        }
        assert!(!kind(Op::AllReduce, whole - 4, out).is_ce());
        assert!(!kind(Op::AllReduce, whole, Access::NONE).is_ce());
        // The other collectives never.
        for op in [Op::ReduceScatter, Op::Broadcast, Op::Reduce] {
            for access in [in_place, out] {
                assert!(!kind(op, count, access).is_ce(), "{op} {access:?}");
            }
        }
    }
    // Small calls stay LL.
    let p = plan_with(Op::AllGather, DataType::F32, 16, 2, None, &tuning, in_place);
    assert_eq!(p.kind, Kind::AllGatherLl);

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
        let kind = |op, count, access| {
            plan_with(op, DataType::F32, count, world, None, &more, access).kind
        };
        for access in [in_place, out, out_only] {
            let k = kind(Op::AllGather, count, access);
            assert_eq!(k == Kind::AllGatherCe, world > 2, "{world} {k:?}");
            assert!(!kind(Op::AllGather, count - 4, access).is_ce());
        }
        let a2a = kind(Op::AllToAll, count, out_only);
        assert_eq!(a2a == Kind::AllToAllCe, world > 2, "{world} {a2a:?}");
        assert!(!kind(Op::AllToAll, count, in_place).is_ce());
        assert!(!kind(Op::AllToAll, count, Access::NONE).is_ce());
        let ar = kind(Op::AllReduce, count * world, out_only);
        assert_eq!(ar == Kind::AllReduceCe, world == 2, "{world} {ar:?}");
        if world > 2 {
            let p = plan_with(Op::AllGather, DataType::F32, count, world, None, &more, out);
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
        let p = forced(DataType::U8, bytes, 2, Algorithm::Ll, &tuning);
        assert_eq!(p.kind, Kind::AllReduceLl, "{bytes}");
        assert_eq!(
            (p.grid, p.piece, p.threads),
            (grid, piece, threads),
            "{bytes}"
        );
    }
    // More ranks: one block per THREADS units, THREADS threads, as before.
    let p = forced(DataType::U8, 4096, 4, Algorithm::Ll, &tuning);
    assert_eq!((p.grid, p.piece, p.threads), (1, 512, THREADS));
    let p = plan(Op::AllGather, DataType::U8, 64 << 10, 3, None, &tuning);
    assert_eq!(
        (p.kind, p.grid, p.threads),
        (Kind::AllGatherLl, 16, THREADS)
    );
    // Every other kind launches THREADS threads.
    let p = plan(Op::AllReduce, DataType::F32, 1 << 24, 2, None, &tuning);
    assert_eq!(p.threads, THREADS);
}

#[test]
fn ll_covers_every_byte_in_one_round_and_only_small_calls() {
    let tuning = t();
    for dtype in DataType::ALL {
        for count in [1usize, 7, 1023, 8191, 50_001, LL_MAX_BYTES / dtype.size()] {
            let p = plan(Op::AllReduce, dtype, count, 2, Some(Algorithm::Ll), &tuning);
            assert_eq!(p.kind, Kind::AllReduceLl, "{dtype} {count}");
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
        Algorithm::Ll,
        &tuning,
    );
    assert_eq!(big.kind, Kind::AllReduceOneShot);
    assert!(big.reason.contains("512 KiB"));
}

#[test]
fn signatures_round_trip_into_words() {
    let s = signature(Kind::AllReduceOneShot, DataType::F32, 0, 0, 1024);
    assert_eq!(describe(s), "all_reduce (oneshot) float sum, count 1024");
    let s = signature(Kind::Broadcast, DataType::BF16, 0, 3, 7);
    assert_eq!(describe(s), "broadcast bfloat16 root 3, count 7");
    let s = signature(Kind::AllToAllDirect, DataType::F16, 0, 0, 1 << 40);
    assert_eq!(describe(s), "all_to_all (direct) half, count 1099511627776");
    let s = signature(Kind::ReduceSplit, DataType::I64, 4, 7, 3);
    assert_eq!(describe(s), "reduce (split) int64 avg root 7, count 3");
    assert_ne!(
        signature(Kind::Reduce, DataType::I32, 1, 0, 5),
        signature(Kind::Reduce, DataType::I32, 1, 0, 6)
    );
}
