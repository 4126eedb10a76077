//! The collective kernels compile for sm_80 and sm_90. Needs libnvrtc but no GPU: CI installs
//! it from PyPI and runs this with `--ignored`; the bundle's run.sh runs it on GPU machines.

use p2p_collective::comm::COLL;
use p2p_transport::kernels::compile;

#[test]
#[ignore = "needs libnvrtc (CI installs it from PyPI)"]
fn the_collective_kernels_compile_for_sm80_and_sm90() {
    for arch in ["sm_80", "sm_90"] {
        let t = std::time::Instant::now();
        let cubin = compile(&COLL, arch).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(&cubin[..4], b"\x7fELF", "not an ELF cubin");
        for kernel in [
            "coll_f32",
            "coll_f64",
            "coll_f16",
            "coll_bf16",
            "coll_i32",
            "coll_i64",
            "coll_u8",
        ] {
            assert!(
                cubin.windows(kernel.len()).any(|w| w == kernel.as_bytes()),
                "{kernel} missing from the {arch} cubin"
            );
        }
        eprintln!(
            "coll.cu -> {arch}: {} bytes in {:?}",
            cubin.len(),
            t.elapsed()
        );
    }
}
