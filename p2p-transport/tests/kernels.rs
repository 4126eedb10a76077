//! Every kernel source compiles for sm_80 and sm_90. Needs libnvrtc but no GPU: CI installs it
//! from PyPI (`nvidia-cuda-nvrtc==13.0.88`) and runs this with `--ignored`; the bundle's run.sh
//! runs it on GPU machines, which have libnvrtc.

use p2p_mem::kernel::{compile, Source};
use p2p_transport::kernels::SOURCES;

#[test]
#[ignore = "needs libnvrtc (CI installs it from PyPI)"]
fn every_kernel_compiles_for_sm80_and_sm90() {
    for source in SOURCES {
        for arch in ["sm_80", "sm_90"] {
            let cubin = compile(&source, arch).unwrap_or_else(|e| panic!("{}: {e}", source.name));
            assert!(
                cubin.len() > 64,
                "{} for {arch}: {} bytes",
                source.name,
                cubin.len()
            );
            assert_eq!(
                &cubin[..4],
                b"\x7fELF",
                "{} for {arch} is not an ELF cubin",
                source.name
            );
            eprintln!("{} -> {arch}: {} bytes", source.name, cubin.len());
        }
    }
}

/// Compiles `code` for `arch`, expecting NVRTC to refuse: the error's text.
fn refusal(name: &'static str, code: &'static str, arch: &str) -> String {
    let source = Source {
        name,
        code,
        defines: &[],
        shipped: &[],
    };
    compile(&source, arch)
        .expect_err("must not compile")
        .to_string()
}

#[test]
#[ignore = "needs libnvrtc (CI installs it from PyPI)"]
fn a_broken_kernel_fails_with_the_compiler_log() {
    let code = "extern \"C\" __global__ void k() { undefined_thing(); }";
    let text = refusal("broken.cu", code, "sm_90");
    assert!(
        text.starts_with("NVRTC could not compile broken.cu for sm_90"),
        "{text}"
    );
    assert!(
        text.contains("undefined_thing"),
        "the log names the problem: {text}"
    );
}

#[test]
#[ignore = "needs libnvrtc (CI installs it from PyPI)"]
fn a_virtual_target_is_refused_not_an_empty_cubin() {
    const TINY: &str = "extern \"C\" __global__ void k() {}";
    let text = refusal("tiny.cu", TINY, "compute_90");
    assert!(text.contains("a virtual architecture?"), "{text}");
    let tiny = Source {
        name: "tiny.cu",
        code: TINY,
        defines: &[],
        shipped: &[],
    };
    assert_eq!(
        &compile(&tiny, "sm_90").expect("a real target")[..4],
        b"\x7fELF"
    );
}
