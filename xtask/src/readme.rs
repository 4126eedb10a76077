//! `cargo xtask readme`: the README's Rust snippets pasted into new crates and compiled, as a
//! user would (CI runs it). Each ```toml block with a `[dependencies]` table starts a group;
//! the ```rust blocks after it, up to the next such table, are that group's programs. Each
//! group becomes a crate outside the workspace with exactly those dependencies (the README's
//! path into a clone, `../p2p/CRATE`, replaced by this checkout's) and each program a binary of
//! it.

use std::path::Path;
use std::process::Command;

use crate::Result;

/// Where the README's dependency lines find the crates: a clone of this repository named `p2p`
/// beside the user's crate (`path = "../p2p/p2p-mem"`).
const CLONE: &str = "path = \"../p2p/";

/// One `[dependencies]` table of the README and the Rust programs that follow it.
#[derive(Debug, PartialEq, Eq)]
pub struct Group {
    /// The dependency lines, as written in the README.
    pub dependencies: Vec<String>,
    /// The programs, each a complete `main.rs`.
    pub programs: Vec<String>,
}

/// Splits the README's fenced blocks into groups. A Rust block before any dependency table, or
/// one with doctest-hidden lines (`# ...`), which do not paste, is an error.
pub fn groups(readme: &str) -> Result<Vec<Group>> {
    let mut groups: Vec<Group> = Vec::new();
    let mut lines = readme.lines().enumerate();
    while let Some((at, line)) = lines.next() {
        let Some(lang) = line.trim_start().strip_prefix("```") else {
            continue;
        };
        let lang = lang.trim().to_string();
        let mut body = Vec::new();
        for (_, l) in lines.by_ref() {
            if l.trim_start().starts_with("```") {
                break;
            }
            body.push(l);
        }
        match lang.split(',').next().unwrap_or("") {
            "toml" if body.iter().any(|l| l.trim() == "[dependencies]") => groups.push(Group {
                dependencies: body
                    .iter()
                    .filter(|l| !l.trim().is_empty() && l.trim() != "[dependencies]")
                    .map(|l| l.to_string())
                    .collect(),
                programs: Vec::new(),
            }),
            "rust" => {
                if let Some(hidden) = body.iter().find(|l| l.starts_with("# ") || **l == "#") {
                    return Err(format!(
                        "README line {}: the Rust block has a doctest-hidden line {hidden:?}, which does not paste",
                        at + 1
                    ));
                }
                if lang.contains("ignore") {
                    continue;
                }
                let group = groups.last_mut().ok_or_else(|| {
                    format!(
                        "README line {}: a Rust block before any ```toml [dependencies] block",
                        at + 1
                    )
                })?;
                group.programs.push(body.join("\n") + "\n");
            }
            _ => {}
        }
    }
    Ok(groups)
}

/// The dependency line with the clone's path replaced by this checkout's crate directory.
fn local(line: &str, root: &Path) -> Result<String> {
    let Some((name, _)) = line.split_once('=') else {
        return Err(format!("cannot read the dependency line {line:?}"));
    };
    let name = name.trim();
    if !name.starts_with("p2p-") {
        return Ok(line.to_string());
    }
    let dir = root.join(name);
    if !dir.join("Cargo.toml").exists() {
        return Err(format!(
            "the README depends on {name}, which is not a crate of this checkout"
        ));
    }
    let written = format!("{CLONE}{name}\"");
    if !line.contains(&written) {
        // Any other form (a registry version, a git address, another path) would build
        // something other than this checkout.
        return Err(format!(
            "the README's dependency line {line:?} must name the crate as {written}"
        ));
    }
    Ok(line.replace(&written, &format!("path = \"{}\"", dir.display())))
}

/// Builds every group as its own crate under `target/readme-check`.
pub fn check(root: &Path, cargo: &str) -> Result<()> {
    let readme = std::fs::read_to_string(root.join("README.md"))
        .map_err(|e| format!("reading README.md: {e}"))?;
    let groups = groups(&readme)?;
    let base = root.join("target/readme-check");
    let programs: usize = groups.iter().map(|g| g.programs.len()).sum();
    if programs == 0 {
        return Err("the README has no Rust programs to check".into());
    }
    for (i, g) in groups.iter().enumerate() {
        if g.programs.is_empty() {
            continue;
        }
        let dir = base.join(format!("group-{i}"));
        let bin = dir.join("src/bin");
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .map_err(|e| format!("clearing {}: {e}", dir.display()))?;
        }
        std::fs::create_dir_all(&bin).map_err(|e| format!("creating {}: {e}", bin.display()))?;
        let deps = g
            .dependencies
            .iter()
            .map(|l| local(l, root))
            .collect::<Result<Vec<_>>>()?;
        let manifest = format!(
            "[package]\nname = \"readme-group-{i}\"\nversion = \"0.0.0\"\nedition = \"2021\"\npublish = false\n\n\
             # Not part of the p2p workspace: built as a user's own crate.\n[workspace]\n\n[dependencies]\n{}\n",
            deps.join("\n")
        );
        write(&dir.join("Cargo.toml"), &manifest)?;
        // The workspace's lock file, so that the snippets build against the versions CI tests.
        std::fs::copy(root.join("Cargo.lock"), dir.join("Cargo.lock"))
            .map_err(|e| format!("copying Cargo.lock: {e}"))?;
        for (k, p) in g.programs.iter().enumerate() {
            write(&bin.join(format!("snippet_{k}.rs")), p)?;
        }
        eprintln!(
            "xtask: README group {i}: {} program(s) with {}",
            g.programs.len(),
            g.dependencies.join("; ")
        );
        crate::run(
            Command::new(cargo)
                .current_dir(&dir)
                .env("CARGO_TARGET_DIR", base.join("target"))
                // A snippet that warns (an unused import, a variable never read) is not as
                // shown. This also denies warnings in the p2p crates themselves (path
                // dependencies are not lint-capped), which CI's clippy step demands anyway.
                .env("RUSTFLAGS", "-D warnings")
                .args(["build", "--bins", "--quiet"]),
        )?;
    }
    eprintln!("xtask: all {programs} README programs compile in new crates");
    Ok(())
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|e| format!("writing {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const DOC: &str =
        "intro\n```toml\n[dependencies]\np2p-mem = { path = \"../p2p/p2p-mem\" }\n```\n\
        ```rust\nfn main() {}\n```\n```sh\ncargo test\n```\n```rust,ignore\nnot compiled\n```\n\
        ```toml\n[dependencies]\np2p-collective = { path = \"../p2p/p2p-collective\" }\n```\n\
        ```rust\nuse p2p_collective::Communicator;\nfn main() {}\n```\n";

    #[test]
    fn blocks_group_under_their_dependency_tables() {
        let g = groups(DOC).expect("groups");
        assert_eq!(g.len(), 2);
        assert_eq!(g[0].programs, ["fn main() {}\n"]);
        assert_eq!(g[1].dependencies.len(), 1);
        assert!(g[1].programs[0].starts_with("use p2p_collective"));
    }

    #[test]
    fn hidden_lines_and_orphan_programs_are_refused() {
        let hidden =
            "```toml\n[dependencies]\nx = \"1\"\n```\n```rust\n# let a = 1;\nfn main() {}\n```\n";
        assert!(groups(hidden)
            .expect_err("hidden")
            .contains("doctest-hidden"));
        let orphan = "```rust\nfn main() {}\n```\n";
        assert!(groups(orphan).expect_err("orphan").contains("before any"));
    }

    #[test]
    fn repository_dependencies_point_at_this_checkout() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("root");
        let l = local("p2p-mem = { path = \"../p2p/p2p-mem\" }", root).expect("line");
        assert_eq!(
            l,
            format!(
                "p2p-mem = {{ path = \"{}\" }}",
                root.join("p2p-mem").display()
            )
        );
        let l = local(
            "p2p-mem = { path = \"../p2p/p2p-mem\", features = [\"cudarc\"] }",
            root,
        )
        .expect("line");
        assert!(l.ends_with("p2p-mem\", features = [\"cudarc\"] }"), "{l}");
        assert_eq!(
            local("cudarc = \"0.19\"", root).expect("line"),
            "cudarc = \"0.19\""
        );
        assert!(local("p2p-nope = { path = \"../p2p/p2p-nope\" }", root).is_err());
        // Any other form would build something other than this checkout: refused.
        for other in [
            "p2p-mem = { git = \"https://github.com/p2p-rs/p2p\" }",
            "p2p-mem = \"0.1\"",
            "p2p-mem = { path = \"../other/p2p-mem\" }",
        ] {
            assert!(local(other, root).is_err(), "{other}");
        }
    }
}
