//! Every kernel source compiles for sm_80 and sm_90. Needs libnvrtc but no GPU: CI installs it
//! from PyPI (`nvidia-cuda-nvrtc==13.0.88`) and runs this with `--ignored`; the bundle's run.sh
//! runs it on GPU machines, which have libnvrtc.

use p2p_transport::kernels::{compile, SOURCES};

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

#[test]
#[ignore = "needs libnvrtc (CI installs it from PyPI)"]
fn a_broken_kernel_fails_with_the_compiler_log() {
    let broken = p2p_transport::kernels::Source {
        name: "broken.cu",
        code: "extern \"C\" __global__ void k() { undefined_thing(); }",
        defines: &[],
    };
    let err = compile(&broken, "sm_90").expect_err("must not compile");
    let text = err.to_string();
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
    let tiny = p2p_transport::kernels::Source {
        name: "tiny.cu",
        code: "extern \"C\" __global__ void k() {}",
        defines: &[],
    };
    let err = compile(&tiny, "compute_90").expect_err("no cubin for a virtual target");
    let text = err.to_string();
    assert!(text.contains("a virtual architecture?"), "{text}");
    assert_eq!(
        &compile(&tiny, "sm_90").expect("a real target")[..4],
        b"\x7fELF"
    );
}
