//! Splitting communicators (issue 39): in one process (`Communicator::split_all`) and with one
//! process per GPU (`Communicator::split`, every rank calling). Each layout's children run the
//! correctness matrix byte-exact; the parent runs it after its children; one child outlives
//! its parent. Ignored in CI (they need GPUs); the bundle's run.sh runs them, and
//! `P2PTEST_WORLD=4` (4 GPUs) adds the layouts the issue names for four ranks: 2 x 2, {0, 2} and
//! {1, 3}, and one group of 3 with one rank left out.

mod common;

use common::{gpus, launch_or_run_comm, run_matrix, world, Local};
use p2p_collective::{Communicator, Op};

/// The counts of these tests: `P2PTEST_COUNTS`, else up to 65537 (every layout runs the whole
/// matrix, and a rank left out of a child waits in its next parent call for the others' child
/// matrix: at the suites' default counts, up to 64 Mi, that would pass the parent's time limit).
fn counts() -> Vec<usize> {
    match std::env::var("P2PTEST_COUNTS") {
        Ok(_) => common::counts(),
        Err(_) => vec![0, 1, 7, 1023, 65537],
    }
}

/// The layout whose child outlives its parent: a child of every rank (in reverse order), so
/// that it has peers at every world size.
const KEPT: &str = "one child in reverse order";

/// Every parent rank's `(color, key)`.
type Layout = Vec<(Option<u32>, i32)>;

/// The layouts for `world` ranks, each with its name.
fn layouts(world: usize) -> Vec<(&'static str, Layout)> {
    let mut l = Vec::new();
    if world >= 4 {
        // First: the rank left out goes on to the next split's exchange (its rendezvous limit,
        // 60 s), not to a parent call, while the others run their child's matrix.
        l.push((
            "all but the last rank",
            (0..world)
                .map(|r| ((r + 1 < world).then_some(0), r as i32))
                .collect(),
        ));
        l.push((
            "pairs",
            (0..world)
                .map(|r| (Some((r / 2) as u32), r as i32))
                .collect(),
        ));
    }
    l.extend([
        (
            "every rank alone",
            (0..world).map(|r| (Some(r as u32), 0)).collect(),
        ),
        (
            "one child in reverse order",
            (0..world).map(|r| (Some(7), -(r as i32))).collect(),
        ),
        (
            "even and odd ranks",
            (0..world)
                .map(|r| (Some((r % 2) as u32), r as i32))
                .collect(),
        ),
    ]);
    l
}

/// Where parent rank `me` lands in `how`: the child's (rank, world), from the rule the library
/// documents (same color, by key, then by parent rank), computed here on its own.
fn expected_place(how: &[(Option<u32>, i32)], me: usize) -> Option<(usize, usize)> {
    let color = how[me].0?;
    let mut members: Vec<(i32, usize)> = (0..how.len())
        .filter(|&r| how[r].0 == Some(color))
        .map(|r| (how[r].1, r))
        .collect();
    members.sort();
    let rank = members.iter().position(|&(_, r)| r == me)?;
    Some((rank, members.len()))
}

#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_split_all_makes_children_over_any_subset() {
    let n = world();
    let devices = gpus(n);
    let comms = Communicator::init_all(&devices).expect("init_all");
    let counts = counts();
    let max = counts.iter().copied().max().unwrap_or(1);
    let mut kept = None;
    for (name, how) in layouts(n) {
        let children = Communicator::split_all(&comms, &how).expect(name);
        assert_eq!(children.len(), n, "{name}");
        // Group the children by color, each group in child-rank order.
        let mut groups: Vec<(u32, Vec<Communicator>)> = Vec::new();
        for (r, child) in children.into_iter().enumerate() {
            let place = expected_place(&how, r);
            let Some(child) = child else {
                assert_eq!(place, None, "{name}: rank {r} got no child");
                continue;
            };
            let (rank, size) = place.expect("a rank with a color has a place");
            assert_eq!(
                (child.rank(), child.world_size()),
                (rank, size),
                "{name}: rank {r}"
            );
            assert_eq!(child.device(), &devices[r], "{name}: rank {r}'s GPU");
            let color = how[r].0.expect("a color");
            match groups.iter_mut().find(|(c, _)| *c == color) {
                Some((_, g)) => g.push(child),
                None => groups.push((color, vec![child])),
            }
        }
        for (color, mut members) in groups {
            members.sort_by_key(|c| c.rank());
            let mut ls: Vec<Local> = members.into_iter().map(|c| Local::new(c, max)).collect();
            run_matrix(&mut ls, &Op::ALL, &counts)
                .assert_exact(&format!("{name}: child of color {color}"));
            if name == KEPT && kept.is_none() {
                kept = Some(ls);
            }
        }
    }
    // The parent still works after its children, and a child outlives it.
    let mut parent: Vec<Local> = comms.into_iter().map(|c| Local::new(c, max)).collect();
    run_matrix(&mut parent, &Op::ALL, &counts).assert_exact("the parent after its splits");
    drop(parent);
    let mut kept = kept.expect("a child kept");
    run_matrix(&mut kept, &Op::ALL, &counts).assert_exact("a child after its parent's drop");
}

#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_process_per_gpu_split() {
    launch_or_run_comm("gpu2_process_per_gpu_split", |comm, rank| {
        let n = comm.world_size();
        let counts = counts();
        let max = counts.iter().copied().max().unwrap_or(1);
        let mut kept = None;
        for (name, how) in layouts(n) {
            let child = comm.split(how[rank].0, how[rank].1).expect(name);
            match (child, expected_place(&how, rank)) {
                (None, None) => eprintln!("rank {rank}: {name}: left out, as asked"),
                (Some(child), Some((r, size))) => {
                    assert_eq!((child.rank(), child.world_size()), (r, size), "{name}");
                    assert_eq!(child.device(), comm.device(), "{name}");
                    let mut ls = vec![Local::new(child, max)];
                    run_matrix(&mut ls, &Op::ALL, &counts)
                        .assert_exact(&format!("rank {rank}: {name}: child rank {r} of {size}"));
                    if name == KEPT {
                        kept = Some(ls);
                    }
                }
                (got, want) => panic!(
                    "{name}: rank {rank} got {:?}, expected {want:?}",
                    got.map(|c| (c.rank(), c.world_size()))
                ),
            }
        }
        // Every rank called split as often: a rank that calls once more than the others is
        // refused there, not left waiting (the others' next exchange would meet it), so this
        // test keeps the counts equal and ends with the parent's own matrix.
        let mut parent = vec![Local::new(comm, max)];
        run_matrix(&mut parent, &Op::ALL, &counts)
            .assert_exact(&format!("rank {rank}: the parent after its splits"));
        drop(parent);
        let mut kept = kept.expect("every rank is in the kept layout's child");
        run_matrix(&mut kept, &Op::ALL, &counts)
            .assert_exact(&format!("rank {rank}: a child after its parent's drop"));
    });
}

/// A communicator of one rank (what a split gives a rank alone), in one process: no suite runs
/// one elsewhere, so a failure here is told apart from a split's.
#[test]
#[ignore = "needs a GPU"]
fn gpu1_a_one_rank_communicator_runs_the_matrix() {
    let devices = gpus(1);
    let comms = Communicator::init_all(&devices).expect("init_all of one GPU");
    let counts = counts();
    let max = counts.iter().copied().max().unwrap_or(1);
    let mut ls: Vec<Local> = comms.into_iter().map(|c| Local::new(c, max)).collect();
    run_matrix(&mut ls, &Op::ALL, &counts).assert_exact("one rank");
}

#[test]
#[ignore = "needs 2 GPUs with P2P"]
fn gpu2_split_refuses_the_wrong_kind_and_mismatched_arguments() {
    let devices = gpus(2);
    let comms = Communicator::init_all(&devices).expect("init_all");
    // One process: split (every rank calling) is the process-per-GPU form.
    let e = comms[0].split(Some(0), 0).expect_err("one process");
    assert!(e.to_string().contains("split_all"), "{e}");
    // One (color, key) per rank, and the whole communicator in rank order.
    let e = Communicator::split_all(&comms, &[(Some(0), 0)]).expect_err("one pair short");
    assert!(e.to_string().contains("one per rank"), "{e}");
    let e = Communicator::split_all(&comms[1..], &[(Some(0), 0)]).expect_err("not rank order");
    assert!(e.to_string().contains("rank order"), "{e}");
    // Nobody with a color: no child, and nothing made.
    let none = Communicator::split_all(&comms, &[(None, 0), (None, 0)]).expect("no colors");
    assert!(none.iter().all(Option::is_none));
}
