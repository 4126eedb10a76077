//! The benchmarks' own kernel (the launch floor's empty kernel) compiles for sm_80 and sm_90.
//! Needs libnvrtc but no GPU: CI installs it from PyPI and runs this with `--ignored`.

#[test]
#[ignore = "needs libnvrtc (CI installs it from PyPI)"]
fn the_empty_kernel_compiles_for_sm80_and_sm90() {
    for arch in ["sm_80", "sm_90"] {
        let cubin = p2p_mem::kernel::compile(&p2p_benches::floor::EMPTY, arch)
            .unwrap_or_else(|e| panic!("empty.cu for {arch}: {e}"));
        assert_eq!(
            &cubin[..4],
            b"\x7fELF",
            "empty.cu for {arch} is not an ELF cubin"
        );
    }
}
