//! The tools' own kernels (the doctor's probe, the latency ping-pong, the launch floor's empty
//! kernel) compile for sm_80 and sm_90. Needs libnvrtc but no GPU: CI installs it from PyPI
//! and runs this with `--ignored`.

#[test]
#[ignore = "needs libnvrtc (CI installs it from PyPI)"]
fn the_tools_kernels_compile_for_sm80_and_sm90() {
    for source in p2p_benches::kernels::SOURCES {
        for arch in ["sm_80", "sm_90"] {
            let cubin = p2p_mem::kernel::compile(&source, arch)
                .unwrap_or_else(|e| panic!("{} for {arch}: {e}", source.name));
            assert_eq!(
                &cubin[..4],
                b"\x7fELF",
                "{} for {arch} is not an ELF cubin",
                source.name
            );
        }
    }
}
