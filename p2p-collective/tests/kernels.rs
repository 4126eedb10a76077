//! The collective kernels compile for sm_80 and sm_90, in the parts a communicator loads, with
//! every entry point the planner can name; and every kernel header compiles alone. Needs
//! libnvrtc but no GPU: CI installs it from PyPI and runs this with `--ignored`; the bundle's
//! run.sh runs it on GPU machines.

use p2p_collective::comm::{kernel_name, COLL_PARTS};
use p2p_collective::plan::Entry;
use p2p_collective::DataType;
use p2p_mem::kernel::{check_image, compile, compile_all, Source};

fn holds(cubin: &[u8], kernel: &str) -> bool {
    cubin
        .windows(kernel.len() + 1)
        .any(|w| &w[..kernel.len()] == kernel.as_bytes() && w[kernel.len()] == 0)
}

#[test]
#[ignore = "needs libnvrtc (CI installs it from PyPI)"]
fn every_part_of_the_collective_kernels_compiles_for_sm80_and_sm90_with_its_kernels_only() {
    assert_eq!(COLL_PARTS.len(), DataType::ALL.len() + 1);
    for arch in ["sm_80", "sm_90"] {
        let t = std::time::Instant::now();
        let cubins = compile_all(&COLL_PARTS, arch).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(cubins.len(), COLL_PARTS.len());
        for (part, cubin) in cubins.iter().enumerate() {
            assert_eq!(&cubin[..4], b"\x7fELF", "part {part}: not an ELF cubin");
            // What Module::load checks before the driver sees it (every table, section and
            // segment inside the image): NVRTC's own cubins must pass.
            check_image(cubin).unwrap_or_else(|e| panic!("part {part} for {arch}: {e}"));
            for (k, dtype) in DataType::ALL.into_iter().enumerate() {
                for entry in Entry::all() {
                    let kernel = kernel_name(entry, dtype);
                    assert_eq!(
                        holds(cubin, &kernel),
                        k == part,
                        "{kernel} in the {arch} cubin of part {part}"
                    );
                }
            }
            assert_eq!(
                holds(cubin, "p2p_sendrecv"),
                part == DataType::ALL.len(),
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

/// Every header of the kernels (`src/kernels/`, the interface header too) includes what it uses:
/// flattened from itself alone, each compiles (with the first part's kernels, to keep it short).
#[test]
#[ignore = "needs libnvrtc (CI installs it from PyPI)"]
fn every_kernel_header_compiles_alone() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/kernels");
    let mut headers = Vec::new();
    for sub in ["", "coll", "coll/algo", "coll/proto"] {
        for entry in std::fs::read_dir(dir.join(sub)).expect("the kernels' folder") {
            let path = entry.expect("an entry").path();
            if path.extension().is_some_and(|x| x == "cuh" || x == "h") {
                headers.push(
                    path.strip_prefix(&dir)
                        .expect("inside")
                        .display()
                        .to_string(),
                );
            }
        }
    }
    headers.sort();
    assert!(headers.len() >= 15, "{headers:?}");
    for header in &headers {
        let program =
            p2p_abigen::program::flatten(&dir, &[header]).unwrap_or_else(|e| panic!("{e}"));
        let source = Source {
            name: Box::leak(header.clone().into_boxed_str()),
            code: Box::leak(program.text.into_boxed_str()),
            defines: &["COLL_PART=0"],
            shipped: &[],
        };
        compile(&source, "sm_90").unwrap_or_else(|e| panic!("{header} alone: {e}"));
        eprintln!("{header}: compiles alone ({} files)", program.files.len());
    }
}

/// A compile at first use that meets its limit is an error at the limit that says what to do
/// (`CompileTimeout`), while the compile goes on in its thread and fills the kernel cache (and
/// the process's memo) when it ends, so that the next call finds the kernel without compiling.
/// A zero limit makes any real compile late, without relying on how fast this machine is.
#[test]
#[ignore = "needs libnvrtc (CI installs it from PyPI)"]
fn a_compile_past_its_limit_is_an_error_at_once_and_still_fills_the_cache() {
    use p2p_mem::kernel::{cache_file, compile_cached_all_within, Source};
    use std::time::{Duration, Instant};
    // A source no cache holds: its text is new to every run.
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let code: &'static str = Box::leak(
        format!(
            "// compile-limit test {} {stamp}\nextern \"C\" __global__ void k(int* p) {{ *p = 7; }}\n",
            std::process::id()
        )
        .into_boxed_str(),
    );
    let source = Source {
        name: "compile-limit-test.cu",
        code,
        defines: &[],
        shipped: &[],
    };
    let arch = "sm_90";
    let t = Instant::now();
    let e = compile_cached_all_within(&[source], arch, Duration::ZERO)
        .expect_err("a compile cannot finish in no time");
    assert!(matches!(e, p2p_mem::Error::CompileTimeout { .. }), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let text = e.to_string();
    assert!(
        text.contains("P2P_KERNELS=shipped") && text.contains("p2p-bench kernels"),
        "{text}"
    );
    // The compile goes on and lands in the cache.
    let file = cache_file(&source, arch).expect("the cache's file name");
    if let Some(file) = &file {
        while !file.exists() && t.elapsed() < Duration::from_secs(120) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(file.exists(), "{} was not written", file.display());
        // Now it is remembered: no compile, so even a zero limit is met.
        let cubins = compile_cached_all_within(&[source], arch, Duration::ZERO).expect("cached");
        assert_eq!(&cubins[0][..4], b"\x7fELF");
        let _ = std::fs::remove_file(file);
    } else {
        eprintln!("no cache folder (neither XDG_CACHE_HOME nor HOME): the cache part is skipped");
    }
}
