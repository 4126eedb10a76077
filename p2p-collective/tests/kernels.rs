//! The collective kernels compile for sm_80 and sm_90. Needs libnvrtc but no GPU: CI installs
//! it from PyPI and runs this with `--ignored`; the bundle's run.sh runs it on GPU machines.

use p2p_collective::comm::COLL;
use p2p_mem::kernel::compile;

#[test]
#[ignore = "needs libnvrtc (CI installs it from PyPI)"]
fn the_collective_kernels_compile_for_sm80_and_sm90() {
    for arch in ["sm_80", "sm_90"] {
        let t = std::time::Instant::now();
        let cubin = compile(&COLL, arch).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(&cubin[..4], b"\x7fELF", "not an ELF cubin");
        for ty in ["f32", "f64", "f16", "bf16", "i32", "i64", "u8"] {
            for family in ["", "_ll", "_ll2", "_direct", "_split", "_ce", "_pipe"] {
                let kernel = format!("coll_{ty}{family}");
                let found = cubin
                    .windows(kernel.len() + 1)
                    .any(|w| &w[..kernel.len()] == kernel.as_bytes() && w[kernel.len()] == 0);
                assert!(found, "{kernel} missing from the {arch} cubin");
            }
        }
        eprintln!(
            "coll.cu -> {arch}: {} bytes in {:?}",
            cubin.len(),
            t.elapsed()
        );
    }
}
