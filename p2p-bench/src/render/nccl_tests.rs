//! A `coll` results file as nccl-tests prints its results, for scripts written to parse
//! nccl-tests' text: per collective, its header lines, then a line per size with `size count
//! type redop root`, and for out of place and in place `time algbw busbw #wrong`, in the
//! widths nccl-tests gives them (`N/A` where a figure was not measured), then the average bus
//! bandwidth. The figures are p2p's own (`ours`), eager or under graph replay.
//!
//! The widths are nccl-tests' `printf` formats (`%12li %12li %8s %6s %6i`, then `%7.2f %6.2f
//! %6.2f %5s` twice), written out here since no crate prints nccl-tests' layout.

use serde_json::Value;

/// Which of a row's timings to print.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timing {
    /// Calls issued one after the other, as nccl-tests times them by default.
    Eager,
    /// A CUDA graph's replay, as nccl-tests times them with `-G`.
    Graph,
}

impl Timing {
    fn key(self) -> &'static str {
        match self {
            Timing::Eager => "eager",
            Timing::Graph => "graph",
        }
    }
}

/// `results` (a `coll` results file, as [`super::read`] accepts it) in nccl-tests' text.
pub fn text(results: &Value, timing: Timing) -> String {
    let rows = results["rows"].as_array().map_or(&[][..], |r| &r[..]);
    let mut ops: Vec<&str> = rows.iter().filter_map(|r| r["op"].as_str()).collect();
    ops.dedup();
    let mut out = format!(
        "# p2p-bench coll, {} rank(s), commit {}, {}: p2p's figures ({})\n",
        results["world"],
        results["commit"].as_str().unwrap_or("?"),
        results["date"].as_str().unwrap_or("?"),
        timing.key(),
    );
    for op in ops {
        out.push_str(&format!("#\n# Collective: {op}\n"));
        out.push_str(
            "#                                                              out-of-place                       in-place          \n\
             #       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong\n\
             #        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)       \n",
        );
        let mut busbw = Vec::new();
        for row in rows.iter().filter(|r| r["op"] == op) {
            out.push_str(&format!(
                "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}",
                row["bytes"].as_u64().unwrap_or(0),
                row["count"].as_u64().unwrap_or(0),
                row["type"].as_str().unwrap_or("?"),
                row["redop"].as_str().unwrap_or("none"),
                row["root"].as_i64().unwrap_or(-1),
            ));
            for place in ["out_of_place", "in_place"] {
                let side = &row["ours"][place];
                let fig = &side[timing.key()];
                match (
                    fig["us"].as_f64(),
                    fig["algbw"].as_f64(),
                    fig["busbw"].as_f64(),
                ) {
                    (Some(us), Some(alg), Some(bus)) => {
                        if place == "out_of_place" {
                            busbw.push(bus);
                        }
                        let wrong = side["wrong"]
                            .as_u64()
                            .map_or_else(|| "N/A".to_string(), |w| w.to_string());
                        out.push_str(&format!("  {us:>7.2}  {alg:>6.2}  {bus:>6.2}  {wrong:>5}"));
                    }
                    _ => out.push_str(&format!(
                        "  {:>7}  {:>6}  {:>6}  {:>5}",
                        "N/A", "N/A", "N/A", "N/A"
                    )),
                }
            }
            out.push('\n');
        }
        let avg = if busbw.is_empty() {
            0.0
        } else {
            busbw.iter().sum::<f64>() / busbw.len() as f64
        };
        out.push_str(&format!("# Avg bus bandwidth    : {avg:.4} \n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn results() -> Value {
        serde_json::json!({
            "benchmark": "coll", "world": 2, "commit": "abc", "date": "2026-12-03",
            "gpus": [{"name": "NVIDIA H200"}],
            "rows": [
                {"op": "all_reduce", "type": "float", "redop": "sum", "root": -1,
                 "bytes": 1048576, "count": 262144,
                 "ours": {"out_of_place": {"eager": {"us": 12.5, "algbw": 83.89, "busbw": 83.89}, "wrong": 0},
                          "in_place": {"eager": {"us": 12.75, "algbw": 82.24, "busbw": 82.24}, "wrong": 0}}},
                {"op": "all_reduce", "type": "float", "redop": "sum", "root": -1,
                 "bytes": 4194304, "count": 1048576,
                 "ours": {"out_of_place": {"eager": {"us": 30.0, "algbw": 139.81, "busbw": 139.81}, "wrong": 3}}},
                {"op": "broadcast", "type": "float", "redop": "none", "root": 0,
                 "bytes": 8, "count": 2,
                 "ours": {"out_of_place": {"eager": {"us": 2.3, "algbw": 0.0, "busbw": 0.0}, "wrong": 0}}}
            ]
        })
    }

    #[test]
    fn rows_stand_in_nccl_tests_columns() {
        let t = text(&results(), Timing::Eager);
        let lines: Vec<&str> = t.lines().collect();
        let row = lines
            .iter()
            .find(|l| l.trim_start().starts_with("1048576"))
            .expect("the 1 MiB row");
        // nccl-tests' widths: 12, 12, 8, 6, 6, then 7, 6, 6, 5 twice, two spaces between.
        assert_eq!(
            *row,
            "     1048576        262144     float     sum      -1    12.50   83.89   83.89      0    12.75   82.24   82.24      0"
        );
        // Split at white space, as the scripts do: 13 fields.
        assert_eq!(row.split_whitespace().count(), 13);
        let missing = lines
            .iter()
            .find(|l| l.trim_start().starts_with("4194304"))
            .expect("the 4 MiB row");
        assert!(
            missing.ends_with("      3      N/A     N/A     N/A    N/A"),
            "{missing}"
        );
        assert!(t.contains("# Collective: broadcast"), "{t}");
        assert!(t.contains("# Avg bus bandwidth    : 111.8500"), "{t}");
        assert!(lines[0].contains("p2p's figures (eager)"));
    }

    #[test]
    fn graph_figures_where_the_run_took_none_are_not_available() {
        let t = text(&results(), Timing::Graph);
        let row = t
            .lines()
            .find(|l| l.trim_start().starts_with("1048576"))
            .expect("the row");
        assert_eq!(row.matches("N/A").count(), 8, "{row}");
    }
}
