use super::*;
use p2p_collective::plan::Algo;

fn reference() -> Options {
    Options::new(Machine::reference(reference::DEFAULT).expect("the default reference machine"))
}

#[test]
fn the_default_reference_machine_plans_every_call_with_its_measured_figures() {
    let r = run(&reference()).expect("plans");
    assert_eq!((r.world, r.sm_count), (4, 132));
    // Six collectives, 8 B to 1 GiB by 8: ten sizes each, but 8 B of all-gather,
    // reduce-scatter and all-to-all, less than one f32 a rank's part.
    assert_eq!(r.rows.len(), 57);
    // Twelve ordered pairs, all over the NVSwitch.
    assert_eq!(r.links.iter().map(|(_, n)| n).sum::<usize>(), 12);
    let ar = |bytes: usize| {
        r.rows
            .iter()
            .find(|row| row.op == "all_reduce" && row.bytes == bytes)
            .expect("planned")
    };
    assert!(ar(8).route.ends_with("/ll"), "{}", ar(8).route);
    assert!(!ar(1 << 30).route.ends_with("/ll"), "{}", ar(1 << 30).route);
    let m = ar(1 << 30).measured.expect("measured at 1 GiB");
    assert_eq!(m.timing, "eager");
    assert!(m.ours_us > 1000.0 && m.nccl_best_us > 1000.0, "{m:?}");
    // Every row has its figures: the view plans the sizes as `coll` measured them.
    let missing: Vec<(&str, usize)> = r
        .rows
        .iter()
        .filter(|row| row.measured.is_none())
        .map(|row| (row.op, row.bytes))
        .collect();
    assert!(missing.is_empty(), "{missing:?}");
}

#[test]
fn registered_buffers_take_the_direct_kernels_at_large_sizes() {
    let opts = Options {
        registered: true,
        ops: vec![Op::AllReduce],
        min_bytes: 1 << 30,
        ..reference()
    };
    let r = run(&opts).expect("plans");
    assert_eq!(r.rows.len(), 1);
    assert_eq!(r.rows[0].route, "direct/simple", "{:?}", r.rows[0]);
}

#[test]
fn a_forced_path_that_cannot_run_says_why_and_hides_the_measured_figures() {
    let opts = Options {
        forced: Forced::algo(Algo::Push),
        ops: vec![Op::AllReduce],
        min_bytes: 16 << 20,
        max_bytes: 16 << 20,
        ..reference()
    };
    let r = run(&opts).expect("plans");
    let row = &r.rows[0];
    assert!(
        row.refused.is_some_and(|w| w.contains("registered")),
        "{row:?}"
    );
    assert!(row.measured.is_none());
    let shown = render(&r);
    assert!(shown.contains("forced path refused"), "{shown}");
    assert!(!shown.contains("NCCL best us"), "{shown}");
}

#[test]
fn fewer_ranks_plan_for_fewer_and_too_many_are_refused() {
    let two = Options {
        gpus: Some(2),
        ..reference()
    };
    let r = run(&two).expect("plans");
    assert_eq!(r.world, 2);
    assert!(r.rows.iter().all(|row| row.measured.is_none()));
    for gpus in [0, 5] {
        let e = run(&Options {
            gpus: Some(gpus),
            ..reference()
        })
        .expect_err("refused");
        assert!(e.to_string().contains("has 4 GPU(s)"), "{e}");
    }
}

#[test]
fn sizes_that_give_no_row_are_refused() {
    for (min, max, factor) in [(8, 1024, 1), (0, 1024, 2), (4096, 8, 2)] {
        let e = run(&Options {
            min_bytes: min,
            max_bytes: max,
            factor,
            ..reference()
        })
        .expect_err("refused");
        assert!(matches!(e, PlanError::Sizes { .. }), "{e}");
    }
}

#[test]
fn every_reference_machine_plans() {
    for name in reference::names() {
        let r = run(&Options::new(Machine::reference(name).expect(name))).expect(name);
        // 8 B is one f32 a part on 2 ranks, less on more.
        let rows = if r.world > 2 { 57 } else { 60 };
        assert_eq!(r.rows.len(), rows, "{name}");
        assert_eq!(
            r.links.iter().map(|(_, n)| n).sum::<usize>(),
            r.world * (r.world - 1),
            "{name}"
        );
    }
    let e = Machine::reference("no-such-machine").expect_err("unknown");
    assert!(e.to_string().contains(reference::DEFAULT), "{e}");
}

#[test]
fn the_built_in_figures_all_parse() {
    let lines = measured::h200x4_text()
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("op,") && !l.is_empty())
        .count();
    assert_eq!(measured::h200x4().len(), lines);
    // Every collective from 64 B to 1 GiB by 8 at least.
    for op in Op::ALL {
        let sizes = measured::h200x4()
            .iter()
            .filter(|s| s.op == op.name())
            .count();
        assert!(sizes >= 9, "{}: {sizes}", op.name());
    }
}

#[test]
fn the_view_has_a_table_per_collective_and_a_line_per_size() {
    let r = run(&reference()).expect("plans");
    let shown = render(&r);
    for op in Op::ALL {
        assert!(shown.contains(&format!("## {}\n", op.name())), "{shown}");
    }
    // The header and separator of each table, then its rows.
    assert_eq!(
        shown.lines().filter(|l| l.starts_with('|')).count(),
        6 * 2 + r.rows.len()
    );
    assert!(shown.contains("model us") && shown.contains("The plan view's model"));
    assert!(shown.contains("NCCL best us"));
}

#[test]
fn the_model_prices_the_bytes_and_the_steps_of_each_plan() {
    let r = run(&reference()).expect("plans");
    let rates = r.model.expect("4 ranks");
    // 18 NVLinks behind the switch, 478 GB/s raw.
    assert!(
        (rates.links_gbps - 478.125 * model::LINK_EFFICIENCY).abs() < 1.0,
        "{rates:?}"
    );
    let row = |op: &str, bytes: usize| {
        r.rows
            .iter()
            .find(|row| row.op == op && row.bytes == bytes)
            .expect("planned")
    };
    // A call that moves almost nothing costs the start.
    let tiny = row("all_reduce", 8).model_us.expect("modelled");
    assert!((tiny - model::START_US).abs() < 0.01, "{tiny}");
    // Two-shot at 16 MiB: 2(n-1)/n of the buffer over the links (68 us), its copies (10 us),
    // two barriers and the start: the performance document's 82 us.
    let ar = row("all_reduce", 16 << 20);
    assert_eq!(ar.route, "twoshot/simple");
    let us = ar.model_us.expect("modelled");
    assert!((80.0..100.0).contains(&us), "{us}");
    // Larger calls take longer, on every collective.
    for op in Op::ALL {
        let times: Vec<f64> = r
            .rows
            .iter()
            .filter(|row| row.op == op.name())
            .map(|row| row.model_us.expect("modelled"))
            .collect();
        assert!(
            times.windows(2).all(|w| w[0] <= w[1]),
            "{}: {times:?}",
            op.name()
        );
    }
    // One rank: nothing crosses, nothing to model.
    let one = run(&Options {
        gpus: Some(1),
        ..reference()
    })
    .expect("plans");
    assert!(one.model.is_none() && one.rows.iter().all(|row| row.model_us.is_none()));
}

#[test]
fn each_plan_says_how_many_sms_it_keeps_from_the_callers_kernels() {
    let r = run(&reference()).expect("plans");
    let row = |op: &str, bytes: usize| {
        r.rows
            .iter()
            .find(|row| row.op == op && row.bytes == bytes)
            .expect("planned")
    };
    // 256 blocks at two a SM: 128 of the 132 SMs; one LL block: one.
    assert_eq!(row("all_reduce", 16 << 20).sms, 128);
    assert_eq!(row("all_reduce", 8).sms, 1);
    // The copy engines move the bytes: a barrier block on one SM.
    let ce = run(&Options {
        forced: Forced {
            proto: Some(Proto::CopyEngine),
            ..Forced::AUTO
        },
        registered: true,
        ops: vec![Op::AllGather],
        min_bytes: 1 << 30,
        ..reference()
    })
    .expect("plans");
    assert_eq!(ce.rows[0].engine, "copy engines", "{:?}", ce.rows[0]);
    assert_eq!(ce.rows[0].sms, 1);
    assert!(render(&ce).contains("| 1 of 132 "), "{}", render(&ce));
}
