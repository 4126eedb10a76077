//! Mode selection on every topology fixture and every configuration override.

use p2p_testkit::assert_contains;
use p2p_transport::config::{Config, ForcedMode, PathLevel, Switch};
use p2p_transport::mode::{
    one_process, process_per_gpu, select, Direction, Endpoint, Engine, Mode, ModeError, Route,
};

use super::load;

fn route(routes: &[Route], from: usize, to: usize) -> &Route {
    routes
        .iter()
        .find(|r| r.from.rank == from && r.to.rank == to)
        .expect("route")
}

fn with(f: impl FnOnce(&mut Config)) -> Config {
    let mut c = Config::default();
    f(&mut c);
    c
}

/// The configuration that forces `mode` (`P2P_MODE`).
fn forced(mode: ForcedMode) -> Config {
    with(|c| c.force_mode = Some(mode))
}

#[test]
fn h200_pair_reads_directly_over_nvlink() {
    let t = load("h200x2-nv18.json");
    let r = select(&t, &one_process(2), &Config::default()).expect("routes");
    assert_eq!(r.len(), 2);
    assert_eq!(
        r[0].to_string(),
        "0[0] -> 1[1] via P2P/direct pointer/read (NVLink x18)"
    );
    assert_eq!(
        (r[0].mode, r[0].engine),
        (Mode::DirectPointer, Engine::SmKernel)
    );
    // One process per GPU: cuMem fds (this fixture predates the recorded flag; sm_90 is assumed to support them).
    let r = select(&t, &process_per_gpu(2), &Config::default()).expect("routes");
    assert_eq!(
        r[1].to_string(),
        "1[1] -> 0[0] via P2P/cuMem/read (NVLink x18)"
    );
    let r = select(&t, &process_per_gpu(2), &with(|c| c.cumem = false)).expect("routes");
    assert_eq!(r[0].mode, Mode::LegacyIpc);
    assert!(r[0].reason.contains("P2P_CUMEM=0"), "{}", r[0].reason);
}

#[test]
fn overrides_change_each_dimension() {
    let t = load("h200x2-nv18.json");
    let ranks = one_process(2);
    let r = select(&t, &ranks, &with(|c| c.read = Switch::Off)).expect("routes");
    assert_eq!(r[0].direction, Direction::Write);
    let r = select(&t, &ranks, &with(|c| c.use_copy_engine = true)).expect("routes");
    assert_eq!(
        r[0].to_string(),
        "0[0] -> 1[1] via P2P/direct pointer/read/CE (NVLink x18)"
    );
    let r = select(&t, &ranks, &with(|c| c.direct_disable = true)).expect("routes");
    assert_eq!(r[0].mode, Mode::CuMem);
    for cfg in [
        with(|c| c.p2p_disable = true),
        with(|c| c.p2p_level = PathLevel::Loc),
    ] {
        let r = select(&t, &ranks, &cfg).expect("routes");
        assert_eq!(r[0].mode, Mode::HostStaged, "{}", r[0].reason);
    }
    // NVL allows NVLink; PIX is farther than NVL, so it allows NVLink too.
    for level in [PathLevel::Nvl, PathLevel::Pix] {
        assert_eq!(
            select(&t, &ranks, &with(|c| c.p2p_level = level)).expect("routes")[0].mode,
            Mode::DirectPointer
        );
    }
}

#[test]
fn forced_modes_work_or_fail_clearly() {
    let t = load("h200x2-nv18.json");
    let r = select(&t, &one_process(2), &forced(ForcedMode::HostStaged)).expect("routes");
    assert_eq!(
        r[0].to_string(),
        "0[0] -> 1[1] via host-staged (pinned double buffer) (NVLink x18)"
    );
    let r = select(&t, &one_process(2), &forced(ForcedMode::Ipc)).expect("routes");
    assert_eq!(r[0].mode, Mode::LegacyIpc);
    let e = select(&t, &process_per_gpu(2), &forced(ForcedMode::Direct))
        .expect_err("direct across processes");
    assert!(e.to_string().starts_with("P2P_MODE=direct is impossible for rank 0 (GPU 0) -> rank 1 (GPU 1): the ranks are in different processes"), "{e}");
    let e =
        select(&t, &one_process(2), &forced(ForcedMode::Intermediate)).expect_err("no third GPU");
    assert!(
        e.to_string()
            .contains("no third GPU has usable P2P to both"),
        "{e}"
    );
    let e = select(
        &t,
        &one_process(2),
        &with(|c| {
            c.force_mode = Some(ForcedMode::Direct);
            c.p2p_disable = true;
        }),
    )
    .expect_err("direct with P2P disabled");
    assert!(e.to_string().ends_with("P2P_DISABLE=1"), "{e}");
    let c = with(|c| {
        c.force_mode = Some(ForcedMode::CuMem);
        c.cumem = false;
    });
    assert!(matches!(
        select(&t, &process_per_gpu(2), &c),
        Err(ModeError::Impossible {
            forced: "cumem",
            ..
        })
    ));
}

#[test]
fn dgx_every_pair_direct_over_nvswitch() {
    let t = load("dgx-h100-8gpu-nvswitch.json");
    let r = select(&t, &one_process(8), &Config::default()).expect("routes");
    assert_eq!(r.len(), 56);
    assert!(r
        .iter()
        .all(|r| r.mode == Mode::DirectPointer && r.direction == Direction::Read));
    assert_eq!(
        route(&r, 3, 6).to_string(),
        "3[3] -> 6[6] via P2P/direct pointer/read (NVSwitch, NVLink x18)"
    );
    // Limiting P2P to one PCIe switch does not stop NVLink.
    assert!(
        select(&t, &one_process(8), &with(|c| c.p2p_level = PathLevel::Nvl))
            .expect("routes")
            .iter()
            .all(|r| r.mode == Mode::DirectPointer)
    );
}

#[test]
fn a100_pcie_writes_within_a_socket_and_stages_across() {
    let t = load("a100-pcie-4gpu-2socket.json");
    let r = select(&t, &one_process(4), &Config::default()).expect("routes");
    assert_eq!(
        route(&r, 0, 1).to_string(),
        "0[0] -> 1[1] via P2P/direct pointer/write (PCIe PIX)"
    );
    let x = route(&r, 1, 2);
    assert_eq!(x.mode, Mode::HostStaged);
    assert!(
        x.reason.contains("cuDeviceCanAccessPeer = 0") && x.reason.contains("no third GPU"),
        "{}",
        x.reason
    );
    // P2P_LEVEL=NVL forbids PCIe P2P even within a socket.
    let r = select(&t, &one_process(4), &with(|c| c.p2p_level = PathLevel::Nvl)).expect("routes");
    let x = route(&r, 0, 1);
    assert_eq!(x.mode, Mode::HostStaged);
    assert_contains(&x.reason, "the path is PIX, beyond P2P_LEVEL=NVL");
}

#[test]
fn ring_relays_opposite_gpus_unless_told_not_to() {
    let t = load("ring-4gpu-nvlink.json");
    let r = select(&t, &one_process(4), &Config::default()).expect("routes");
    let x = route(&r, 0, 2);
    assert_eq!(x.mode, Mode::Intermediate { via: 1 });
    assert_eq!(
        x.to_string(),
        "0[0] -> 2[2] via P2P/intermediate GPU 1/write (NVLink x6 + NVLink x6 via GPU 1)"
    );
    assert_eq!(route(&r, 0, 1).direction, Direction::Read);
    let r = select(&t, &one_process(4), &with(|c| c.intermediate = false)).expect("routes");
    assert_eq!(route(&r, 0, 2).mode, Mode::HostStaged);
    assert!(route(&r, 0, 2).reason.contains("P2P_INTERMEDIATE=0"));
    // With P2P disabled there is no relay either.
    let r = select(&t, &one_process(4), &with(|c| c.p2p_disable = true)).expect("routes");
    assert!(r.iter().all(|r| r.mode == Mode::HostStaged));
}

#[test]
fn consumer_gpus_go_host_staged_and_single_gpus_copy_locally() {
    let t = load("consumer-2gpu-no-p2p.json");
    let r = select(&t, &one_process(2), &Config::default()).expect("routes");
    assert_eq!(r[0].mode, Mode::HostStaged);
    assert!(r[0].reason.contains("consumer GPUs"), "{}", r[0].reason);
    let e = select(&t, &one_process(2), &forced(ForcedMode::Direct)).expect_err("no P2P");
    assert!(e.to_string().contains("cuDeviceCanAccessPeer = 0"), "{e}");

    let t = load("single-h100.json");
    let two_ranks = [
        Endpoint {
            rank: 0,
            gpu: 0,
            process: 0,
        },
        Endpoint {
            rank: 1,
            gpu: 0,
            process: 1,
        },
    ];
    let r = select(&t, &two_ranks, &Config::default()).expect("routes");
    assert_eq!(r[0].to_string(), "0[0] -> 1[0] via local copy (same GPU)");
    let bad = [Endpoint {
        rank: 0,
        gpu: 3,
        process: 0,
    }];
    assert_eq!(
        select(&t, &bad, &Config::default()),
        Err(ModeError::NoSuchGpu {
            rank: 0,
            gpu: 3,
            count: 1
        })
    );
}

#[test]
#[cfg(feature = "conn")]
fn every_route_between_processes_has_a_connection_but_relays() {
    use p2p_transport::conn::Sharing;
    // The consumer pair has no P2P: one process per GPU gets host-staged, which a connection carries.
    let t = load("consumer-2gpu-no-p2p.json");
    let r = select(&t, &process_per_gpu(2), &Config::default()).expect("routes");
    assert_eq!(r[0].mode, Mode::HostStaged);
    assert_eq!(Sharing::for_mode(r[0].mode), Some(Sharing::HostStaged));
    let t = load("h200x2-nv18.json");
    let r = select(&t, &process_per_gpu(2), &Config::default()).expect("routes");
    assert_eq!(Sharing::for_mode(r[0].mode), Some(Sharing::CuMem));
    assert_eq!(Sharing::for_mode(Mode::LegacyIpc), Some(Sharing::LegacyIpc));
    assert_eq!(Sharing::for_mode(Mode::Intermediate { via: 1 }), None);
    assert_eq!(Sharing::for_mode(Mode::DirectPointer), None);
}

#[test]
#[cfg(feature = "conn")]
fn connection_options_follow_the_route() {
    use p2p_transport::conn::ConnOptions;
    let t = load("h200x2-nv18.json");
    let r = select(&t, &process_per_gpu(2), &Config::default()).expect("routes");
    let o = ConnOptions::for_route(&r[0]);
    assert_eq!((o.engine, o.direction), (Engine::SmKernel, Direction::Read));
    let r = select(
        &t,
        &process_per_gpu(2),
        &with(|c| {
            c.use_copy_engine = true;
            c.read = Switch::Off;
        }),
    )
    .expect("routes");
    let o = ConnOptions::for_route(&r[0]);
    assert_eq!(
        (o.engine, o.direction),
        (Engine::CopyEngine, Direction::Write)
    );
}

/// The rule communicators share with mode selection (`peer::limit_to_level`): the level, P2P
/// being disabled, and GPUs outside the topology, each refused with its reason.
#[test]
fn p2p_allowed_applies_the_level_and_refuses_unknown_gpus() {
    use p2p_transport::mode::{p2p_allowed, NoP2p};
    let t = load("h200x2-nv18.json");
    assert_eq!(p2p_allowed(&t, &Config::default(), 0, 1), Ok(()));
    assert_eq!(
        p2p_allowed(&t, &with(|c| c.p2p_level = PathLevel::Nvl), 0, 1),
        Ok(())
    );
    let loc = p2p_allowed(&t, &with(|c| c.p2p_level = PathLevel::Loc), 0, 1).expect_err("LOC");
    assert!(
        matches!(
            loc,
            NoP2p::BeyondLevel {
                level: PathLevel::Nvl,
                limit: PathLevel::Loc
            }
        ),
        "{loc:?}"
    );
    assert!(loc.to_string().contains("beyond P2P_LEVEL=LOC"), "{loc}");
    let off = p2p_allowed(&t, &with(|c| c.p2p_disable = true), 0, 1).expect_err("disabled");
    assert_eq!(off, NoP2p::Disabled);
    assert!(off.to_string().contains("P2P_DISABLE=1"), "{off}");
    let unknown = p2p_allowed(&t, &Config::default(), 0, 5).expect_err("GPU 5");
    assert_eq!(
        unknown,
        NoP2p::NotInTopology {
            a: 0,
            b: 5,
            gpus: 2
        }
    );
    assert!(
        unknown.to_string().contains("not in the topology"),
        "{unknown}"
    );
    // What the topology says of a pair without P2P, in its own words.
    let consumer = load("consumer-2gpu-no-p2p.json");
    let no = p2p_allowed(&consumer, &Config::default(), 0, 1).expect_err("no P2P");
    assert!(
        matches!(no, NoP2p::NotPossible { a: 0, b: 1, ref why } if why.contains("consumer GPUs")),
        "{no:?}"
    );
    assert_eq!(no.to_string(), consumer.direct_p2p(0, 1).1);
}
