//! The tools' own kernels (the doctor's probe, the latency ping-pong, the launch floor's empty
//! kernel) compile for sm_80 and sm_90, and `p2p-bench kernels` fills the kernel cache. Needs
//! libnvrtc but no GPU: CI installs it from PyPI and runs this with `--ignored`.

mod support;
use support::{assert_fails, p2p_bench_line};

#[test]
#[ignore = "needs libnvrtc (CI installs it from PyPI)"]
fn the_tools_kernels_compile_for_sm80_and_sm90() {
    for source in p2p_bench::kernels::SOURCES {
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

#[test]
#[ignore = "needs libnvrtc (CI installs it from PyPI)"]
fn p2p_bench_kernels_fills_the_cache_once_and_names_a_bad_target() {
    let cache = std::env::temp_dir().join(format!("p2p-kernels-cli-{}", std::process::id()));
    let xdg = cache.to_str().expect("a UTF-8 temporary path");
    let env = [("XDG_CACHE_HOME", xdg), ("CUDA_CACHE_DISABLE", "1")];
    let (code, out, err) = p2p_bench_line("kernels --arch sm_90", &env);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("sm_90: compiled 8 of the 8 parts of the collective kernels in"),
        "{out}"
    );
    let cubins = std::fs::read_dir(cache.join("p2p").join("kernels"))
        .expect("the cache folder")
        .filter_map(|e| e.ok())
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with("coll.cu-sm_90-") && name.ends_with(".cubin")
        })
        .count();
    assert_eq!(cubins, 8, "one cubin per part");
    let (code, out, err) = p2p_bench_line("kernels --arch sm_90", &env);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("sm_90: the 8 parts of the collective kernels were cached already"),
        "{out}"
    );
    // The release the cache is keyed on: PyPI's libnvrtc has a GNU build ID.
    let build = out
        .lines()
        .find_map(|l| l.strip_prefix("compiler: NVRTC 13.0, "))
        .and_then(|l| l.split(", build ").nth(1))
        .unwrap_or_default();
    assert!(
        build.len() >= 16 && build.chars().all(|c| c.is_ascii_hexdigit()),
        "{out}"
    );
    let text = "p2p-bench kernels: sm_1: NVRTC could not compile coll.cu";
    assert_fails(&["kernels", "--arch", "sm_1"], &env, 1, text);
    // A cache that cannot be written (its folder is a file) is an error, not a silent compile.
    let blocked = cache.join("p2p").join("kernels").join(".keep");
    std::fs::write(&blocked, b"").expect("a file");
    let blocked = blocked.to_str().expect("a UTF-8 temporary path");
    let env = [("XDG_CACHE_HOME", blocked), ("CUDA_CACHE_DISABLE", "1")];
    let text = "does not hold the kernels: could not write";
    assert_fails(&["kernels", "--arch", "sm_90"], &env, 1, text);
    let _ = std::fs::remove_dir_all(&cache);
}
