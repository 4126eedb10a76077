//! The collective kernels compile for sm_80 and sm_90, in the parts a communicator loads. Needs
//! libnvrtc but no GPU: CI installs it from PyPI and runs this with `--ignored`; the bundle's
//! run.sh runs it on GPU machines.

use p2p_collective::comm::COLL_PARTS;
use p2p_mem::kernel::{check_image, compile_all};

const TYPES: [&str; 7] = ["f32", "f64", "f16", "bf16", "i32", "i64", "u8"];
const FAMILIES: [&str; 8] = [
    "", "_ll", "_ll2", "_direct", "_split", "_ce", "_pipe", "_shift",
];

fn holds(cubin: &[u8], kernel: &str) -> bool {
    cubin
        .windows(kernel.len() + 1)
        .any(|w| &w[..kernel.len()] == kernel.as_bytes() && w[kernel.len()] == 0)
}

#[test]
#[ignore = "needs libnvrtc (CI installs it from PyPI)"]
fn every_part_of_the_collective_kernels_compiles_for_sm80_and_sm90_with_its_kernels_only() {
    assert_eq!(COLL_PARTS.len(), TYPES.len() + 1);
    for arch in ["sm_80", "sm_90"] {
        let t = std::time::Instant::now();
        let cubins = compile_all(&COLL_PARTS, arch).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cubins.len(), COLL_PARTS.len());
        for (part, cubin) in cubins.iter().enumerate() {
            assert_eq!(&cubin[..4], b"\x7fELF", "part {part}: not an ELF cubin");
            // What Module::load checks before the driver sees it (every table, section and
            // segment inside the image): NVRTC's own cubins must pass.
            check_image(cubin).unwrap_or_else(|e| panic!("part {part} for {arch}: {e}"));
            for (k, ty) in TYPES.iter().enumerate() {
                for family in FAMILIES {
                    let kernel = format!("coll_{ty}{family}");
                    assert_eq!(
                        holds(cubin, &kernel),
                        k == part,
                        "{kernel} in the {arch} cubin of part {part}"
                    );
                }
            }
            assert_eq!(
                holds(cubin, "p2p_sendrecv"),
                part == TYPES.len(),
                "p2p_sendrecv in the {arch} cubin of part {part}"
            );
        }
        eprintln!(
            "coll.cu -> {arch}: {} parts, {} bytes, in {:?}",
            cubins.len(),
            cubins.iter().map(Vec::len).sum::<usize>(),
            t.elapsed()
        );
    }
}
