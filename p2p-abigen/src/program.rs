//! A kernel program made of headers that each include what they use, flattened into the one
//! text NVRTC compiles (p2p compiles from memory, with no include paths, and keys its caches
//! and shipped cubins by that text).
//!
//! [`flatten`] starts from a list of roots and replaces each `#include "path"` (relative to the
//! file that says it) by that file's text the first time it is met, and by nothing after, as
//! `#pragma once` would; `#pragma once` lines are dropped. Each file's text is framed by
//! `#line` directives, so a compile error names the file and line it comes from. Includes in
//! angle brackets are left to the compiler. A root may be a folder's every header
//! (`algo/*.cuh`), taken in name order, so that a new file there joins the program with no list
//! to edit.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// A flattened program: its text, and the files it was made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Program {
    /// The one text to compile.
    pub text: String,
    /// Every file read, in the order first met.
    pub files: Vec<PathBuf>,
}

/// The program of `roots`, paths under `dir`, each a file or `FOLDER/*.EXT` (every file of
/// that folder ending in `.EXT`, in name order), or what cannot be read or included.
pub fn flatten(dir: &Path, roots: &[&str]) -> Result<Program, String> {
    let mut flat = Flattener {
        dir: dir.to_path_buf(),
        seen: BTreeSet::new(),
        program: Program {
            text: String::new(),
            files: Vec::new(),
        },
    };
    for root in roots {
        for file in expand(dir, root)? {
            flat.file(&file, None)?;
        }
    }
    Ok(flat.program)
}

/// For a build script: flattens `roots` of the folder `dir` (relative to the crate, as
/// [`flatten`] takes them) into `$OUT_DIR/out_name`, and tells Cargo to rerun when anything in
/// `dir` changes (a new file included). Panics (failing the build) with the reason.
pub fn generate_program(dir: &str, roots: &[&str], out_name: &str) {
    println!("cargo::rerun-if-changed={dir}");
    let program = flatten(Path::new(dir), roots).unwrap_or_else(|e| panic!("{dir}: {e}"));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    std::fs::write(out.join(out_name), program.text)
        .unwrap_or_else(|e| panic!("writing {out_name}: {e}"));
}

/// The files `root` names under `dir`.
fn expand(dir: &Path, root: &str) -> Result<Vec<PathBuf>, String> {
    let Some((folder, ext)) = root.split_once("/*.") else {
        return Ok(vec![dir.join(root)]);
    };
    let folder = dir.join(folder);
    let mut files = Vec::new();
    let entries =
        std::fs::read_dir(&folder).map_err(|e| format!("reading {}: {e}", folder.display()))?;
    for entry in entries {
        let path = entry
            .map_err(|e| format!("reading {}: {e}", folder.display()))?
            .path();
        if path.is_file() && path.extension().is_some_and(|x| x == ext) {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

struct Flattener {
    dir: PathBuf,
    /// Every file taken so far, by its canonical path.
    seen: BTreeSet<PathBuf>,
    program: Program,
}

impl Flattener {
    /// Appends `path`'s text (if not taken already), its includes inlined. `from` is the file and
    /// line that included it.
    fn file(&mut self, path: &Path, from: Option<(&Path, usize)>) -> Result<(), String> {
        let at = || match from {
            Some((f, l)) => format!(" (included at {}:{l})", f.display()),
            None => String::new(),
        };
        let canonical = path
            .canonicalize()
            .map_err(|e| format!("{}: {e}{}", path.display(), at()))?;
        if !self.seen.insert(canonical) {
            return Ok(());
        }
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("reading {}: {e}{}", path.display(), at()))?;
        self.program.files.push(path.to_path_buf());
        let name = self.name(path);
        self.line(1, &name);
        for (i, line) in text.lines().enumerate() {
            let trimmed = line.trim();
            if trimmed == "#pragma once" {
                self.program.text.push('\n');
                continue;
            }
            match quoted_include(trimmed) {
                Some(inc) => {
                    let target = normal(&path.parent().unwrap_or(Path::new(".")).join(inc));
                    self.file(&target, Some((path, i + 1)))?;
                    self.line(i + 2, &name);
                }
                None => {
                    self.program.text.push_str(line);
                    self.program.text.push('\n');
                }
            }
        }
        Ok(())
    }

    /// A `#line` directive: the next line is line `n` of `name`.
    fn line(&mut self, n: usize, name: &str) {
        self.program
            .text
            .push_str(&format!("#line {n} \"{name}\"\n"));
    }

    /// `path` as the directives name it: from `dir`, with `/` between parts.
    fn name(&self, path: &Path) -> String {
        let rel = path.strip_prefix(&self.dir).unwrap_or(path);
        rel.components()
            .map(|c| c.as_os_str().to_string_lossy())
            .collect::<Vec<_>>()
            .join("/")
    }
}

/// `path` with its `..` parts taken out where a part before them can go (`a/b/../c` is
/// `a/c`), so that a file has one name however it is reached.
fn normal(path: &Path) -> PathBuf {
    use std::path::Component;
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir
                if matches!(out.components().next_back(), Some(Component::Normal(_))) =>
            {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

/// The path of `#include "path"`, or `None` for any other line.
fn quoted_include(line: &str) -> Option<&str> {
    let rest = line
        .strip_prefix('#')?
        .trim_start()
        .strip_prefix("include")?;
    let rest = rest.trim_start().strip_prefix('"')?;
    rest.split_once('"').map(|(p, _)| p)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A folder of its own, removed when dropped.
    struct Dir(PathBuf);
    impl Dir {
        fn new(name: &str, files: &[(&str, &str)]) -> Dir {
            let dir = std::env::temp_dir().join(format!("abigen-{name}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            for (path, text) in files {
                let path = dir.join(path);
                std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
                std::fs::write(path, text).expect("write");
            }
            Dir(dir)
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// The text without its `#line` directives.
    fn code(p: &Program) -> String {
        p.text
            .lines()
            .filter(|l| !l.starts_with("#line") && !l.is_empty())
            .collect::<Vec<_>>()
            .join("\n")
    }

    #[test]
    fn each_file_comes_once_where_it_is_first_included() {
        let d = Dir::new(
            "once",
            &[
                ("abi.h", "#pragma once\nint abi;\n"),
                (
                    "k/base.cuh",
                    "#pragma once\n#include \"../abi.h\"\nint base;\n",
                ),
                ("k/algo/b.cuh", "#include \"../base.cuh\"\nint b;\n"),
                (
                    "k/algo/a.cuh",
                    "# include \"../base.cuh\"\n#include <cuda.h>\nint a;\n",
                ),
                ("k/algo/notes.md", "not code\n"),
                ("k/p2p.cuh", "#include \"base.cuh\"\nint p;\n"),
            ],
        );
        let p = flatten(&d.0, &["k/algo/*.cuh", "k/p2p.cuh"]).expect("flattens");
        assert_eq!(
            code(&p),
            "int abi;\nint base;\n#include <cuda.h>\nint a;\nint b;\nint p;"
        );
        let names: Vec<String> = p
            .files
            .iter()
            .map(|f| f.strip_prefix(&d.0).expect("inside").display().to_string())
            .collect();
        assert_eq!(
            names,
            [
                "k/algo/a.cuh",
                "k/base.cuh",
                "abi.h",
                "k/algo/b.cuh",
                "k/p2p.cuh"
            ]
        );
        // Errors point at the real file: after an include, the line of the next text.
        assert!(p.text.contains("#line 1 \"k/base.cuh\""), "{}", p.text);
        assert!(
            p.text.contains("#line 3 \"k/base.cuh\"\nint base;"),
            "{}",
            p.text
        );
    }

    #[test]
    fn a_missing_include_names_the_file_and_line_that_wants_it() {
        let d = Dir::new("missing", &[("a.cuh", "int a;\n#include \"gone.cuh\"\n")]);
        let e = flatten(&d.0, &["a.cuh"]).expect_err("gone.cuh is missing");
        assert!(e.contains("gone.cuh") && e.contains("a.cuh:2"), "{e}");
        assert!(flatten(&d.0, &["none/*.cuh"]).is_err());
    }

    #[test]
    fn includes_in_a_circle_end() {
        let d = Dir::new(
            "circle",
            &[
                ("a.cuh", "#include \"b.cuh\"\nint a;\n"),
                ("b.cuh", "#include \"a.cuh\"\nint b;\n"),
            ],
        );
        let p = flatten(&d.0, &["a.cuh"]).expect("flattens");
        assert_eq!(code(&p), "int b;\nint a;");
    }
}
