//! `cargo xtask`: the project's chores in one binary.
//!
//! - `cargo xtask bench [ARGS]`: builds the release `p2p-bench` and runs it (`list` by default).
//! - `cargo xtask topo [ARGS]`, `cargo xtask doctor [ARGS]`: the same for `p2p-bench topo|doctor`.
//! - `cargo xtask bundle`: builds every test executable and `p2p-bench` in release, stripped,
//!   into `target/bundle` with `run.sh` (every test) and `coll-worlds.sh` (the collective
//!   suites and benchmark at every world size), for a GPU machine that has no Rust toolchain.
//! - `cargo xtask bindgen`: regenerates `p2p-sys/src/checkpoint.rs` from pinned CUDA headers.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

mod readme;

type Result<T> = std::result::Result<T, String>;

/// The headers bindings are generated from: PyPI's `nvidia-cuda-runtime`, pinned.
const CUDA_HEADERS_WHEEL: &str = "nvidia-cuda-runtime==13.0.96";
/// What `cargo xtask bindgen` writes.
const CHECKPOINT_RS: &str = "p2p-sys/src/checkpoint.rs";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("bench") => bench(&args[1..]),
        Some(cmd @ ("topo" | "doctor")) => bench(&[&[cmd.to_string()], &args[1..]].concat()),
        Some("bundle") => bundle(),
        Some("bindgen") => bindgen(),
        Some("readme") => readme::check(&root(), &cargo()),
        Some("-h") | Some("--help") | None => {
            println!("{}", usage());
            Ok(())
        }
        Some(other) => Err(format!("unknown task `{other}`\n\n{}", usage())),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

fn usage() -> &'static str {
    "usage: cargo xtask <task>\n\n\
     tasks:\n  \
     bench [ARGS]  build and run the release p2p-bench (default: `list`, the GPUs found)\n  \
     topo [ARGS]   p2p-bench topo: how the GPUs are joined (--json, --load FILE)\n  \
     doctor [ARGS] p2p-bench doctor: does P2P work between each pair, why not, what to do\n  \
     bundle        build tests and p2p-bench into target/bundle with run.sh, for a GPU machine\n  \
     readme        compile the README's Rust programs as new crates (CI runs this)\n  \
     bindgen       regenerate p2p-sys/src/checkpoint.rs from pinned CUDA headers (needs bindgen-cli, libclang, pip)"
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: running {cmd:?}");
    let status = cmd
        .status()
        .map_err(|e| format!("could not start {cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed with {status}"))
    }
}

fn bench(args: &[String]) -> Result<()> {
    let mut cmd = Command::new(cargo());
    cmd.current_dir(root()).args([
        "run",
        "--release",
        "--quiet",
        "--package",
        "p2p-benches",
        "--bin",
        "p2p-bench",
        "--",
    ]);
    if args.is_empty() {
        cmd.arg("list");
    } else {
        cmd.args(args);
    }
    run(&mut cmd)
}

/// Builds everything a GPU machine needs into `target/bundle`.
fn bundle() -> Result<()> {
    let root = root();
    let out = root.join("target/bundle");
    if out.exists() {
        std::fs::remove_dir_all(&out).map_err(|e| format!("clearing {}: {e}", out.display()))?;
    }
    std::fs::create_dir_all(out.join("tests"))
        .map_err(|e| format!("creating {}: {e}", out.display()))?;

    run(Command::new(cargo()).current_dir(&root).args([
        "build",
        "--release",
        "--package",
        "p2p-benches",
        "--bin",
        "p2p-bench",
    ]))?;
    copy(
        &root.join("target/release/p2p-bench"),
        &out.join("p2p-bench"),
    )?;

    // The example programs (examples/src/bin), which run.sh runs after the tests.
    std::fs::create_dir_all(out.join("examples"))
        .map_err(|e| format!("creating {}: {e}", out.display()))?;
    run(Command::new(cargo()).current_dir(&root).args([
        "build",
        "--release",
        "--package",
        "p2p-examples",
        "--bins",
    ]))?;
    for example in EXAMPLES {
        copy(
            &root.join("target/release").join(example),
            &out.join("examples").join(example),
        )?;
    }

    eprintln!("xtask: building test executables (release)");
    let output = Command::new(cargo())
        .current_dir(&root)
        .args([
            "test",
            "--release",
            "--workspace",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("could not start cargo test: {e}"))?;
    if !output.status.success() {
        return Err(format!("cargo test --no-run failed with {}", output.status));
    }
    let mut count = 0;
    let mut seen = std::collections::HashMap::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] != "compiler-artifact" || msg["profile"]["test"] != true {
            continue;
        }
        let Some(exe) = msg["executable"].as_str() else {
            continue;
        };
        let crate_name = msg["target"]["name"].as_str().unwrap_or("test");
        let kind = msg["target"]["kind"][0].as_str().unwrap_or("test");
        let package = msg["package_id"]
            .as_str()
            .and_then(package_name)
            .unwrap_or_else(|| crate_name.to_string());
        // A library's unit tests are named after the package, integration tests after package
        // and file, a binary's unit tests after package and binary (a package's library and
        // binaries once shared one name, and the last one built replaced the others).
        let name = match kind {
            "lib" | "rlib" | "proc-macro" => package,
            "test" => format!("{package}--{crate_name}"),
            _ => format!("{package}--{kind}-{crate_name}"),
        };
        match seen.insert(name.clone(), exe.to_string()) {
            Some(first) if first != exe => {
                return Err(format!(
                    "{first} and {exe} would both be bundled as tests/{name}"
                ))
            }
            Some(_) => continue,
            None => {}
        }
        copy(Path::new(exe), &out.join("tests").join(&name))?;
        count += 1;
    }
    if count == 0 {
        return Err("cargo produced no test executables".into());
    }
    let fixtures = out.join("fixtures");
    std::fs::create_dir_all(&fixtures)
        .map_err(|e| format!("creating {}: {e}", fixtures.display()))?;
    for entry in std::fs::read_dir(root.join("p2p-transport/fixtures"))
        .map_err(|e| format!("reading fixtures: {e}"))?
    {
        let path = entry.map_err(|e| format!("reading fixtures: {e}"))?.path();
        if path.extension().is_some_and(|x| x == "json") {
            copy(&path, &fixtures.join(path.file_name().unwrap_or_default()))?;
        }
    }
    for (name, text) in [("run.sh", RUNNER), ("coll-worlds.sh", COLL_WORLDS)] {
        let script = out.join(name);
        std::fs::write(&script, text).map_err(|e| format!("writing {}: {e}", script.display()))?;
        make_executable(&script)?;
    }
    // The batch scripts that produced the committed results (scripts/gpu), beside the tools.
    for entry in std::fs::read_dir(root.join("scripts/gpu"))
        .map_err(|e| format!("reading scripts/gpu: {e}"))?
    {
        let path = entry
            .map_err(|e| format!("reading scripts/gpu: {e}"))?
            .path();
        if path.extension().is_some_and(|x| x == "sh") {
            let to = out.join(path.file_name().unwrap_or_default());
            copy(&path, &to)?;
            make_executable(&to)?;
        }
    }
    eprintln!(
        "xtask: bundled p2p-bench and {count} test executables into {}",
        out.display()
    );
    eprintln!(
        "xtask: on the GPU machine run `target/bundle/run.sh` (optionally a test-name filter)"
    );
    Ok(())
}

/// `path+file:///work/main/p2p-mem#p2p-mem@0.1.0` or `path+file:///x#0.1.0` -> the package name.
fn package_name(id: &str) -> Option<String> {
    let frag = id.rsplit('#').next()?;
    match frag.split_once('@') {
        Some((name, _)) => Some(name.to_string()),
        None => id.split('#').next()?.rsplit('/').next().map(str::to_string),
    }
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    std::fs::copy(from, to)
        .map_err(|e| format!("copying {} to {}: {e}", from.display(), to.display()))?;
    Ok(())
}

fn make_executable(path: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| format!("chmod {}: {e}", path.display()))
}

/// The script that runs the bundle on a GPU machine. It fails when no GPU is found, runs every
/// test executable with the GPU tests included, and ends with `N passed, N failed`.
const RUNNER: &str = include_str!("run.sh");
/// The example programs the bundle carries (the binaries of `examples/src/bin`).
const EXAMPLES: [&str; 4] = [
    "data_parallel",
    "tensor_parallel_graph",
    "torchrun_job",
    "moe_dispatch",
];

/// The collective suites and benchmark at every world size from 2 to the GPU count (for 4- and
/// 8-GPU machines).
const COLL_WORLDS: &str = include_str!("coll-worlds.sh");

/// Regenerates the committed bindings for what cudarc lacks.
fn bindgen() -> Result<()> {
    let root = root();
    let work = root.join("target/bindgen");
    std::fs::create_dir_all(&work).map_err(|e| format!("creating {}: {e}", work.display()))?;
    let include = work.join("nvidia/cu13/include");
    if !include.join("cuda.h").exists() {
        run(Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--quiet",
                "--no-deps",
                "--only-binary=:all:",
            ])
            .args(["--platform", "manylinux2014_x86_64", "-d"])
            .arg(&work)
            .arg(CUDA_HEADERS_WHEEL))?;
        let wheel = std::fs::read_dir(&work)
            .map_err(|e| format!("reading {}: {e}", work.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|x| x == "whl"))
            .ok_or("pip downloaded no wheel")?;
        run(Command::new("python3")
            .args(["-m", "zipfile", "-e"])
            .arg(&wheel)
            .arg(&work))?;
    }
    let header = include.join("cuda.h");
    let output = Command::new("bindgen")
        .arg(&header)
        .args(["--dynamic-loading", "CudaCheckpoint"])
        .args(["--allowlist-function", "cuCheckpointProcess.*"])
        // The argument types already exist in cudarc's driver bindings: reuse them, so values
        // pass between the two without casts.
        .args(["--blocklist-type", ".*"])
        .args(["--no-doc-comments", "--use-core", "--merge-extern-blocks"])
        .args(["--raw-line", "#[allow(unused_imports)] use crate::cuda::*;"])
        .arg("--")
        .arg(format!("-I{}", include.display()))
        .output()
        .map_err(|e| format!("could not start bindgen (cargo install bindgen-cli; apt-get install libclang-dev): {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "bindgen failed:\n{}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    // bindgen 0.72 writes the libloading 0.8 bound; cudarc (and so this crate) uses 0.9.
    let generated = String::from_utf8_lossy(&output.stdout).replace(
        "P: AsRef<::std::ffi::OsStr>,",
        "P: ::libloading::AsFilename,",
    );
    // Every entry point that `load` must find: bindgen's wrappers panic on a missing one.
    let symbols: Vec<&str> = generated
        .split("pub cuCheckpoint")
        .skip(1)
        .filter_map(|rest| rest.split_once(':'))
        .map(|(tail, _)| tail.trim())
        .filter(|tail| tail.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
        .collect();
    if symbols.is_empty() {
        return Err("bindgen's output has no cuCheckpoint* entry point".into());
    }
    let checks: String = symbols
        .iter()
        .map(|s| format!("(\"{s}\", api.cuCheckpoint{s}.is_ok()),\n        "))
        .collect();
    let text = format!(
        "//! The CUDA process checkpoint API (`cuCheckpointProcess*`), which cudarc 0.19.10 lacks.\n\
         //!\n\
         //! GENERATED by `cargo xtask bindgen` from `cuda.h` of PyPI `{CUDA_HEADERS_WHEEL}`; do not\n\
         //! edit. Loaded at run time: use [`load`], which probes libcuda first.\n\
         #![allow(non_camel_case_types, non_snake_case, missing_docs, dead_code, clippy::all)]\n\
         #![allow(clippy::undocumented_unsafe_blocks, unsafe_op_in_unsafe_fn)]\n\n\
         {generated}\n\
         /// Loads the checkpoint entry points from libcuda, probing it first. Fails with\n\
         /// [`crate::Error::MissingEntryPoints`] where the driver lacks any of them (it predates the\n\
         /// API), so that the wrappers above, which panic on a missing entry point, never meet one.\n\
         pub fn load() -> Result<&'static CudaCheckpoint, crate::Error> {{\n    \
             static API: std::sync::OnceLock<Result<CudaCheckpoint, libloading::Error>> = std::sync::OnceLock::new();\n    \
             let name = crate::probe::require(crate::Library::Cuda)?;\n    \
             // SAFETY: libcuda is loadable (probed); loading resolves symbols without calling them.\n    \
             let api = API.get_or_init(|| unsafe {{ CudaCheckpoint::new(name) }})\n        \
                 .as_ref()\n        \
                 .map_err(|e| crate::Error::LibraryNotFound {{ library: \"libcuda (checkpoint API)\", searched: vec![format!(\"{{name}}: {{e}}\")] }})?;\n    \
             let missing: Vec<String> = [\n        {checks}]\n        \
                 .into_iter()\n        \
                 .filter(|&(_, found)| !found)\n        \
                 .map(|(symbol, _)| format!(\"cuCheckpoint{{symbol}}\"))\n        \
                 .collect();\n    \
             if missing.is_empty() {{\n        \
                 Ok(api)\n    \
             }} else {{\n        \
                 Err(crate::Error::MissingEntryPoints {{ library: \"libcuda (checkpoint API)\", file: name.to_string(), symbols: missing }})\n    \
             }}\n\
         }}\n"
    );
    let dest = root.join(CHECKPOINT_RS);
    std::fs::write(&dest, text).map_err(|e| format!("writing {}: {e}", dest.display()))?;
    run(Command::new("rustfmt").arg("--edition=2021").arg(&dest))?;
    eprintln!("xtask: wrote {}", dest.display());
    Ok(())
}
