//! `cargo xtask kernels`: compiles every crate's kernels for sm_80 and sm_90 with NVRTC 12.4
//! (from PyPI, so that any driver from CUDA 12.4 loads the cubins) and writes the archives the
//! crates ship (`p2p_mem::kernel::shipped`). Run it after changing a kernel source: a unit test
//! in each crate fails until the archive matches the sources again.

use std::path::Path;
use std::process::Command;

use crate::{cargo, run, Result};

/// The compiler of the shipped cubins: the oldest CUDA release p2p supports.
const NVRTC_WHEEL: &str = "nvidia-cuda-nvrtc-cu12==12.4.127";

/// Where each crate's archive goes, by the name `p2p-bench kernels --ship` gives it.
const ARCHIVES: [(&str, &str); 3] = [
    ("transport", "p2p-transport/src/kernels/shipped.p2pk.zst"),
    ("collective", "p2p-collective/src/kernels/shipped.p2pk.zst"),
    ("tools", "p2p-bench/src/kernels/shipped.p2pk.zst"),
];

pub fn kernels(root: &Path) -> Result<()> {
    let nvrtc = root.join("target/nvrtc12");
    let lib = nvrtc.join("nvidia/cuda_nvrtc/lib");
    if !lib.join("libnvrtc.so.12").exists() {
        run(Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .arg("--target")
            .arg(&nvrtc)
            .arg(NVRTC_WHEEL))?;
    }
    run(Command::new(cargo()).current_dir(root).args([
        "build",
        "--release",
        "-p",
        "p2p-bench",
        "--bin",
        "p2p-bench",
    ]))?;
    let out = root.join("target/shipped");
    // Only the pinned NVRTC: LD_LIBRARY_PATH first, and p2p loads libnvrtc.so.13 before .12,
    // so a newer NVRTC elsewhere would win; the tool reports the one it used, checked below.
    let output = Command::new(root.join("target/release/p2p-bench"))
        .args(["kernels", "--ship"])
        .arg(&out)
        .env("LD_LIBRARY_PATH", &lib)
        .output()
        .map_err(|e| format!("could not start p2p-bench: {e}"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    eprint!("{text}{}", String::from_utf8_lossy(&output.stderr));
    if !output.status.success() {
        return Err("p2p-bench kernels --ship failed".into());
    }
    if !text.contains("with NVRTC 12.4") {
        return Err(
            "the kernels were not compiled with NVRTC 12.4 (a newer libnvrtc.so.13 is on the \
             loader's path?): the shipped cubins must load on drivers from CUDA 12.4"
                .into(),
        );
    }
    for (name, dest) in ARCHIVES {
        let raw = out.join(format!("{name}.p2pk"));
        run(Command::new("zstd")
            .args(["-19", "-q", "-f", "-o"])
            .arg(root.join(dest))
            .arg(&raw))?;
        eprintln!("xtask: wrote {dest}");
    }
    Ok(())
}
