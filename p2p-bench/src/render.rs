//! `p2p-bench render`: a `coll` results file read as one ([`CollFile`]), its Markdown table and
//! SVG plot written again beside it, or printed as nccl-tests prints its results
//! ([`nccl_tests`]). Anything else (`{}`, `[1, 2]`, another benchmark's
//! results, a run without rows) is refused with what it lacks, and nothing is written.

pub mod nccl_tests;

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// What every `coll` table and plot shows from a results file: a file without any of it is not
/// one. The figures of each row stay JSON, as [`crate::coll::render`] reads them (a row's
/// implementations and modes vary between runs).
#[derive(Debug, Deserialize)]
#[serde(
    expecting = "a `p2p-bench coll` results file (a JSON object with `benchmark`: \"coll\", \
                     `world`, `gpus`, `date`, `commit` and `rows`)"
)]
pub struct CollFile {
    /// Which benchmark wrote the file: `coll`.
    pub benchmark: Benchmark,
    /// Ranks in the run.
    pub world: u32,
    /// The GPUs of the run, at least one.
    pub gpus: Vec<Gpu>,
    /// When the run started (UTC, RFC 3339).
    pub date: String,
    /// The commit the tool was built from.
    pub commit: String,
    /// One row per collective, type and size, at least one.
    pub rows: Vec<Row>,
}

/// The benchmarks whose results `render` draws.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Benchmark {
    /// `p2p-bench coll`.
    #[serde(rename = "coll")]
    Coll,
}

/// Only which benchmark wrote a results file.
#[derive(Deserialize)]
struct Tagged {
    #[allow(dead_code)] // read to be checked, not used
    benchmark: Benchmark,
}

/// One GPU of the run.
#[derive(Debug, Deserialize)]
pub struct Gpu {
    /// Its name, e.g. `NVIDIA H200`.
    pub name: String,
}

/// One collective, type and size of the run.
#[derive(Debug, Deserialize)]
pub struct Row {
    /// The collective (`all_reduce`, ...).
    pub op: String,
    /// The element type (`float`, ...).
    #[serde(rename = "type")]
    pub ty: String,
    /// Bytes per rank.
    pub bytes: u64,
    /// Ours, out of place and in place.
    pub ours: serde_json::Map<String, serde_json::Value>,
}

/// Reads `text` as a `coll` results file: the JSON, once [`CollFile`] found all it needs in it,
/// else what is missing or wrong.
pub fn read(text: &str) -> Result<serde_json::Value, String> {
    use serde_json::Value;
    const NOT: &str = "not a `p2p-bench coll` results file";
    let value: Value = serde_json::from_str(text).map_err(|e| format!("{NOT}: not JSON: {e}"))?;
    // serde would read a struct from an array too, field by field: `[1, 2]` must not get that far.
    let kind = match &value {
        Value::Object(_) => None,
        Value::Array(_) => Some("an array"),
        Value::String(_) => Some("a string"),
        Value::Number(_) => Some("a number"),
        Value::Bool(_) => Some("a boolean"),
        Value::Null => Some("null"),
    };
    if let Some(kind) = kind {
        return Err(format!("{NOT}: it is {kind}, not a JSON object"));
    }
    // Which benchmark first: another's results fail on that, not on the first row they lack.
    Tagged::deserialize(&value).map_err(|e| format!("{NOT}: {e}"))?;
    let file = CollFile::deserialize(&value).map_err(|e| format!("{NOT}: {e}"))?;
    if file.gpus.is_empty() {
        return Err(format!("{NOT}: `gpus` is empty"));
    }
    if file.rows.is_empty() {
        return Err(
            "no rows: the run measured nothing, so there is no table or plot to draw".into(),
        );
    }
    Ok(value)
}

/// Reads the `coll` results file `json` ([`read`]) and gives it as nccl-tests prints its
/// results ([`nccl_tests::text`]).
pub fn nccl_tests_file(json: &Path, timing: nccl_tests::Timing) -> Result<String, String> {
    let text = std::fs::read_to_string(json).map_err(|e| format!("{}: {e}", json.display()))?;
    let results = read(&text).map_err(|e| format!("{}: {e}", json.display()))?;
    Ok(nccl_tests::text(&results, timing))
}

/// Reads the `coll` results file `json` ([`read`]) and writes its table and plot beside it
/// (`.md`, `.svg`); returns the Markdown file's path.
pub fn render_file(json: &Path) -> Result<PathBuf, String> {
    let text = std::fs::read_to_string(json).map_err(|e| format!("{}: {e}", json.display()))?;
    let results = read(&text).map_err(|e| format!("{}: {e}", json.display()))?;
    let md = json.with_extension("md");
    let svg = json.with_extension("svg");
    std::fs::write(&md, crate::coll::render(&results))
        .map_err(|e| format!("writing {}: {e}", md.display()))?;
    std::fs::write(&svg, crate::coll::svg(&results))
        .map_err(|e| format!("writing {}: {e}", svg.display()))?;
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROW: &str = r#"{"op": "all_reduce", "type": "float", "bytes": 8, "ours": {}}"#;

    fn file(benchmark: &str, gpus: &str, rows: &str) -> String {
        format!(
            r#"{{"benchmark": "{benchmark}", "world": 2, "gpus": {gpus}, "date": "d",
                "commit": "c", "rows": {rows}}}"#
        )
    }

    #[test]
    fn a_coll_file_is_read() {
        let text = file("coll", r#"[{"name": "NVIDIA H200"}]"#, &format!("[{ROW}]"));
        assert!(read(&text).is_ok_and(|v| v["rows"][0]["bytes"] == 8));
    }

    #[test]
    fn anything_else_is_refused_with_what_it_lacks() {
        let gpus = r#"[{"name": "NVIDIA H200"}]"#;
        let rows = format!("[{ROW}]");
        for (text, lacks) in [
            ("{}".to_string(), "missing field `benchmark`"),
            ("[1,2]".to_string(), "it is an array, not a JSON object"),
            ("null".to_string(), "it is null, not a JSON object"),
            (
                "not json".to_string(),
                "not a `p2p-bench coll` results file: not JSON",
            ),
            (
                file("hosts", gpus, &rows),
                "unknown variant `hosts`, expected `coll`",
            ),
            (r#"{"rows": [{}]}"#.to_string(), "missing field `benchmark`"),
            (file("coll", "[]", &rows), "`gpus` is empty"),
            (file("coll", gpus, "[]"), "no rows"),
            (
                file("coll", gpus, r#"[{"op": "all_reduce"}]"#),
                "missing field `type`",
            ),
            (
                r#"{"benchmark": "coll", "world": "two"}"#.to_string(),
                "invalid type: string \"two\"",
            ),
        ] {
            match read(&text) {
                Ok(_) => panic!("{text} was read"),
                Err(e) => assert!(e.contains(lacks), "{text}: {e}"),
            }
        }
    }
}
