//! `p2p-bench kernels --ship DIR`: compiles every crate's kernel sources for the shipped targets
//! with the NVRTC this process loads and writes one archive per crate
//! (`p2p_mem::kernel::shipped`), for `cargo xtask kernels` to compress into the crates.

use std::path::Path;

use p2p_mem::kernel::{compile_all, compiler, shipped, Source};

/// The crates' kernel sources: (archive name, sources).
pub fn crates() -> [(&'static str, Vec<Source>); 3] {
    [
        ("transport", p2p_transport::kernels::SOURCES.to_vec()),
        ("collective", p2p_collective::comm::COLL_PARTS.to_vec()),
        ("tools", crate::kernels::SOURCES.to_vec()),
    ]
}

/// Writes `dir/<crate>.p2pk` for every crate, each holding its sources for every one of `archs`.
pub fn ship(dir: &Path, archs: &[String]) -> Result<(), String> {
    let nvrtc = compiler().map_err(|e| e.to_string())?;
    let (major, minor) = nvrtc.version;
    let name = format!("NVRTC {major}.{minor}");
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    for (krate, sources) in crates() {
        let t = std::time::Instant::now();
        let mut compiled = Vec::new();
        for arch in archs {
            let cubins = compile_all(&sources, arch).map_err(|e| format!("{arch}: {e}"))?;
            compiled.push((arch.as_str(), cubins));
        }
        let images: Vec<shipped::Image<'_>> = compiled
            .iter()
            .flat_map(|(arch, cubins)| {
                sources
                    .iter()
                    .zip(cubins)
                    .map(move |(source, cubin)| shipped::Image {
                        source,
                        arch,
                        cubin,
                    })
            })
            .collect();
        let archive = shipped::write(&name, &images);
        let file = dir.join(format!("{krate}.p2pk"));
        std::fs::write(&file, &archive).map_err(|e| format!("writing {}: {e}", file.display()))?;
        crate::outln!(
            "{krate}: {} images ({} sources x {} targets), {} bytes, with {name}, in {:.1} s",
            images.len(),
            sources.len(),
            archs.len(),
            archive.len(),
            t.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
