use super::init::{
    describe_planner_words, most_ranks_on_one_gpu, planner_words, queue_advice, unused_settings,
    warn_shared_gpus,
};
use super::Options;
use crate::plan::{Algo, Forced, Proto};
use p2p_transport::config::Config;

#[test]
fn the_shipped_cubins_are_those_of_the_sources() {
    p2p_testkit::assert_shipped_current(&super::COLL_PARTS);
}

#[test]
fn ranks_sharing_a_gpu_in_one_process_are_told_to_raise_the_hardware_queues() {
    let unset = queue_advice(None).expect("8 queues by default");
    assert!(unset.contains("unset (8 queues)"), "{unset}");
    assert!(unset.contains("set it to 32"), "{unset}");
    assert!(queue_advice(Some("8")).is_some_and(|a| a.contains("is \"8\"")));
    assert!(queue_advice(Some("junk")).is_some());
    assert_eq!(queue_advice(Some("32")), None);
    assert_eq!(queue_advice(Some(" 32 ")), None);
}

#[test]
fn the_most_ranks_on_one_gpu_sizes_every_ranks_grid() {
    let (a, b) = ([1u8; 16], [2u8; 16]);
    assert_eq!(most_ranks_on_one_gpu(&[]), 1);
    assert_eq!(most_ranks_on_one_gpu(&[a]), 1);
    assert_eq!(most_ranks_on_one_gpu(&[a, b]), 1);
    assert_eq!(most_ranks_on_one_gpu(&[a, a]), 2);
    // Three ranks on one GPU and one on another: every rank divides by 3.
    assert_eq!(most_ranks_on_one_gpu(&[a, b, a, a]), 3);
    assert_eq!(most_ranks_on_one_gpu(&[a, b, b, a]), 2);
    // The warning's share is the same whichever ranks this process drives.
    assert_eq!(warn_shared_gpus(&[a, b, a, a], |r| Some(r as i32)), 3);
    assert_eq!(
        warn_shared_gpus(&[a, b, a, a], |r| (r == 1).then_some(0)),
        3
    );
}

#[test]
fn ranks_compare_what_is_forced_and_checking_mode() {
    let auto = Options::from_settings(Default::default(), Config::default());
    assert_eq!(planner_words(&auto), [0, 0]);
    let mut seen = vec![planner_words(&auto)];
    let algos = Algo::ALL.map(Some).into_iter().chain([None]);
    for algo in algos {
        for proto in Proto::ALL.map(Some).into_iter().chain([None]) {
            if (algo, proto) == (None, None) {
                continue;
            }
            let forced = Options {
                forced: Forced { algo, proto },
                ..auto.clone()
            };
            let w = planner_words(&forced);
            assert!(!seen.contains(&w), "{algo:?} {proto:?}: {w:?} taken");
            assert_eq!(
                describe_planner_words(w),
                format!("{} P2P_CHECK=0", forced.forced.describe())
            );
            seen.push(w);
        }
    }
    let check = Options {
        check: true,
        ..auto.clone()
    };
    assert_ne!(planner_words(&check), planner_words(&auto));
    assert_eq!(
        describe_planner_words(planner_words(&check)),
        "P2P_ALGO=auto P2P_PROTO=auto P2P_CHECK=1"
    );
    assert_eq!(
        describe_planner_words([99, 0]),
        "P2P_ALGO=(unknown) P2P_PROTO=auto P2P_CHECK=0"
    );
}

fn cfg(vars: &[(&str, &str)]) -> Config {
    Config::from_vars(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())))
        .expect("valid settings")
}

#[test]
fn the_defaults_leave_nothing_unused() {
    assert!(unused_settings(&Config::default(), true).is_empty());
    assert!(unused_settings(&Config::default(), false).is_empty());
    // The settings the collectives do use are not reported.
    let used = cfg(&[
        ("P2P_LEVEL", "NVL"),
        ("P2P_CUMEM", "0"),
        ("P2P_MODE", "host"),
    ]);
    assert!(unused_settings(&used, false).is_empty());
}

#[test]
fn transport_only_settings_are_named() {
    let c = cfg(&[
        ("P2P_READ", "on"),
        ("P2P_USE_COPY_ENGINE", "1"),
        ("P2P_INTERMEDIATE", "0"),
    ]);
    let unused = unused_settings(&c, false);
    assert_eq!(unused.len(), 3, "{unused:?}");
    assert!(unused[0].starts_with("P2P_READ=on"), "{unused:?}");
    assert!(unused[1].starts_with("P2P_USE_COPY_ENGINE=1"));
    assert!(unused[2].starts_with("P2P_INTERMEDIATE=0"));
}

#[test]
fn forced_modes_that_cannot_apply_are_named() {
    let direct = cfg(&[("P2P_MODE", "direct")]);
    assert!(unused_settings(&direct, true).is_empty());
    assert!(unused_settings(&direct, false)[0].starts_with("P2P_MODE=direct"));
    let ipc = cfg(&[("P2P_MODE", "ipc")]);
    assert!(unused_settings(&ipc, false).is_empty());
    assert!(unused_settings(&ipc, true)[0].starts_with("P2P_MODE=ipc"));
    let relay = cfg(&[("P2P_MODE", "intermediate")]);
    assert!(unused_settings(&relay, false)[0].starts_with("P2P_MODE=intermediate"));
}
