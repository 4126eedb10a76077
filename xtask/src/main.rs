//! `cargo xtask`: the project's chores in one binary.
//!
//! - `cargo xtask bench [ARGS]`: builds the release `p2p-bench` and runs it (`list` by default).
//! - `cargo xtask topo [ARGS]`, `cargo xtask doctor [ARGS]`: the same for `p2p-bench topo|doctor`.
//! - `cargo xtask bundle`: builds every test executable and `p2p-bench` in release, stripped,
//!   into `target/bundle` with `run.sh` (every test), `coll-worlds.sh` (the collective
//!   suites and benchmark at every world size) and the suites of `scripts/gpu` (tests.sh,
//!   bench.sh, faults.sh, sweep.sh, one-gpu.sh, their nvcc harnesses), for a GPU machine that
//!   has no Rust toolchain.
//! - `cargo xtask bindgen`: regenerates p2p-sys's driver, NVRTC and checkpoint bindings from
//!   pinned CUDA headers (module `bindgen`).
//! - `cargo xtask kernels`: compiles every kernel for sm_80 and sm_90 into the archives the
//!   crates ship (module `kernels`); run it after changing a kernel.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use clap::Parser;

mod bindgen;
mod kernels;
mod readme;

type Result<T> = std::result::Result<T, String>;

/// The project's chores.
#[derive(Parser)]
#[command(
    name = "cargo xtask",
    bin_name = "cargo xtask",
    about = "The p2p workspace's chores",
    version
)]
enum Task {
    /// Build and run the release p2p-bench with ARGS (default: `list`, the GPUs found).
    #[command(disable_help_flag = true)]
    Bench {
        /// p2p-bench's own arguments, as `p2p-bench --help` lists them.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// p2p-bench topo: how the GPUs are joined (--json, --load FILE).
    #[command(disable_help_flag = true)]
    Topo {
        /// p2p-bench topo's arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// p2p-bench doctor: does P2P work between each pair, why not, what to do.
    #[command(disable_help_flag = true)]
    Doctor {
        /// p2p-bench doctor's arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Build the tests and p2p-bench into target/bundle with run.sh, for a GPU machine.
    Bundle,
    /// Compile the README's Rust programs as new crates (CI runs this).
    Readme,
    /// Regenerate p2p-sys's CUDA bindings from pinned headers (needs bindgen-cli, libclang,
    /// pip).
    Bindgen,
    /// Compile every kernel for sm_80 and sm_90 with NVRTC 12.4 into the crates' shipped
    /// archives (needs pip, zstd).
    Kernels,
}

fn main() -> ExitCode {
    // The alias (`.cargo/config.toml`) runs `cargo run -p xtask --`: the arguments start
    // with the task.
    let result = match Task::parse() {
        Task::Bench { args } => bench(&args),
        Task::Topo { args } => bench(&[&["topo".to_string()], &args[..]].concat()),
        Task::Doctor { args } => bench(&[&["doctor".to_string()], &args[..]].concat()),
        Task::Bundle => bundle(),
        Task::Bindgen => bindgen::bindgen(&root()),
        Task::Kernels => kernels::kernels(&root()),
        Task::Readme => readme::check(&root(), &cargo()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
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

/// `cargo build --release --package PACKAGE TARGETS..` in the workspace `root`.
fn build_release(root: &Path, package: &str, targets: &[&str]) -> Result<()> {
    run(Command::new(cargo())
        .current_dir(root)
        .args(["build", "--release", "--package", package])
        .args(targets))
}

fn bench(args: &[String]) -> Result<()> {
    let mut cmd = Command::new(cargo());
    cmd.current_dir(root()).args([
        "run",
        "--release",
        "--quiet",
        "--package",
        "p2p-bench",
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

    build_release(&root, "p2p-bench", &["--bin", "p2p-bench"])?;
    copy(
        &root.join("target/release/p2p-bench"),
        &out.join("p2p-bench"),
    )?;

    // The example programs (examples/src/bin), which run.sh runs after the tests.
    std::fs::create_dir_all(out.join("examples"))
        .map_err(|e| format!("creating {}: {e}", out.display()))?;
    build_release(&root, "p2p-examples", &["--bins"])?;
    for example in EXAMPLES {
        copy(
            &root.join("target/release").join(example),
            &out.join("examples").join(example),
        )?;
    }

    // A user's program outside the workspace, built with each cudarc configuration
    // (.ci/downstream): run on the GPU machine, it shows p2p working beside the application's
    // own cudarc (and, from the cold start, without a compiler).
    run(Command::new("bash")
        .current_dir(&root)
        .arg(".ci/downstream/check.sh")
        .arg("build")
        .arg(out.join("downstream")))?;

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
    // The GPU machine's suites by purpose (scripts/gpu: tests.sh, bench.sh, faults.sh,
    // sweep.sh, one-gpu.sh; README.md) and their nvcc harnesses, beside the tools.
    let scripts = copy_scripts(&root.join("scripts/gpu"), &out)?;
    eprintln!("xtask: bundled {scripts} scripts of scripts/gpu");
    eprintln!(
        "xtask: bundled p2p-bench and {count} test executables into {}",
        out.display()
    );
    eprintln!(
        "xtask: on the GPU machine run `target/bundle/run.sh` (optionally a test-name filter), \
         or the suites of target/bundle/README.md"
    );
    Ok(())
}

/// The folder of `scripts/gpu` that `copy_scripts` carries whole: the nvcc harnesses.
const HARNESS: &str = "harness";

/// Copies the scripts of `from` (scripts/gpu) into `to` (the bundle): every `*.sh` and `*.py`,
/// made executable, `README.md`, and the files of `from/harness` into `to/harness`. Nothing else:
/// the results and builds the scripts leave beside themselves when run from the repository
/// stay out. Returns the number of scripts.
fn copy_scripts(from: &Path, to: &Path) -> Result<usize> {
    let read = |dir: &Path| -> Result<Vec<PathBuf>> {
        let mut paths = Vec::new();
        for entry in
            std::fs::read_dir(dir).map_err(|e| format!("reading {}: {e}", dir.display()))?
        {
            paths.push(
                entry
                    .map_err(|e| format!("reading {}: {e}", dir.display()))?
                    .path(),
            );
        }
        Ok(paths)
    };
    let mut scripts = 0;
    for path in read(from)? {
        let Some(file) = path.file_name() else {
            continue;
        };
        if path.is_dir() {
            if file == HARNESS {
                let dir = to.join(HARNESS);
                std::fs::create_dir_all(&dir)
                    .map_err(|e| format!("creating {}: {e}", dir.display()))?;
                for source in read(&path)? {
                    if let (true, Some(name)) = (source.is_file(), source.file_name()) {
                        copy(&source, &dir.join(name))?;
                    }
                }
            }
        } else if path.extension().is_some_and(|x| x == "sh" || x == "py") {
            let script = to.join(file);
            copy(&path, &script)?;
            make_executable(&script)?;
            scripts += 1;
        } else if file == "README.md" {
            copy(&path, &to.join(file))?;
        }
    }
    Ok(scripts)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A folder of its own under the system's temporary folder, removed when dropped.
    struct Scratch(PathBuf);
    impl Scratch {
        fn new(name: &str) -> Scratch {
            let dir = std::env::temp_dir().join(format!("xtask-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).expect("creating a scratch folder");
            Scratch(dir)
        }
    }
    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn the_bundle_gets_the_scripts_their_readme_and_harnesses_only() {
        use std::os::unix::fs::PermissionsExt;
        let scratch = Scratch::new("copy-scripts");
        let (from, to) = (scratch.0.join("gpu"), scratch.0.join("bundle"));
        for (path, text) in [
            ("tests.sh", "#!/usr/bin/env bash\n"),
            ("common.sh", "set -u\n"),
            ("README.md", "# scripts\n"),
            ("notes.txt", "not bundled\n"),
            ("harness/harness.cuh", "// harness\n"),
            ("harness/ll_floor.cu", "// floor\n"),
            ("sweep-p2p/summary.txt", "a result left by a run\n"),
            ("build/sweep-p2p/current.cu", "a build left by a run\n"),
        ] {
            let path = from.join(path);
            std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
            std::fs::write(&path, text).expect("write");
        }
        std::fs::create_dir_all(&to).expect("mkdir");

        assert_eq!(copy_scripts(&from, &to), Ok(2));
        let mut got: Vec<String> = Vec::new();
        for dir in [to.clone(), to.join("harness")] {
            for entry in std::fs::read_dir(&dir).expect("read") {
                let path = entry.expect("entry").path();
                if path.is_file() {
                    let rel = path.strip_prefix(&to).expect("inside");
                    got.push(rel.display().to_string());
                }
            }
        }
        got.sort();
        assert_eq!(
            got,
            [
                "README.md",
                "common.sh",
                "harness/harness.cuh",
                "harness/ll_floor.cu",
                "tests.sh"
            ]
        );
        let mode = std::fs::metadata(to.join("tests.sh"))
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o755);
        assert_eq!(
            std::fs::read_to_string(to.join("harness/ll_floor.cu"))
                .ok()
                .as_deref(),
            Some("// floor\n")
        );

        // A missing folder is an error that names it, not a panic.
        let missing = scratch.0.join("none");
        let err = copy_scripts(&missing, &to).expect_err("a missing folder");
        assert!(err.contains("none"), "{err}");
    }
}
