//! The plan view as text: a heading for the machine, then one Markdown table per collective.

use comfy_table::{presets::ASCII_MARKDOWN, Table};

use super::{model, Report, Row};
use crate::p2p::size_name;

/// The report as Markdown: the machine, how its GPUs are reached, then a table per collective
/// (size, algorithm/protocol, what moves the bytes, blocks and the SMs they occupy, chunks,
/// barrier steps, the cost
/// model's time, the measured figures where the tool has them, and the planner's reason).
pub fn render(r: &Report) -> String {
    let mut out = format!(
        "# p2p plan: {} ({})\n\n{} rank(s), one per GPU ({}, {} SMs); {} buffers, {}; f32.\n\n",
        r.machine,
        r.source,
        r.world,
        r.gpu,
        r.sm_count,
        if r.registered { "registered" } else { "plain" },
        if r.in_place {
            "in place"
        } else {
            "out of place"
        },
    );
    if r.links.is_empty() {
        out.push_str(
            "Links: none (one rank: each call is a copy or a reduction on the one GPU; \
             `--machine` shows a machine of several).\n\n",
        );
    } else {
        out.push_str("Links (each ordered pair of GPUs, one process per GPU):\n");
        for (how, n) in &r.links {
            out.push_str(&format!("- {n} pair(s): {how}\n"));
        }
        out.push('\n');
    }
    if let Some(m) = r.model {
        out.push_str(&format!(
            "Model: {:.0} GB/s from each GPU to its peers at once, {:.0} GB/s in its own memory, \
             {:.1} us a barrier step, {:.1} us to start a kernel ({:.0} us for the copy engines); \
             docs/performance.md, \"The plan view's model\".\n\n",
            m.links_gbps,
            model::LOCAL_GBPS,
            model::barrier_us(m.world),
            model::START_US,
            model::COPY_ENGINE_US,
        ));
    }
    let measured = r.rows.iter().any(|row| row.measured.is_some());
    if measured {
        out.push_str(
            "Measured: `p2p-bench coll` on this machine beside NCCL 2.28.3 (NVLink multicast off), \
             out of place, f32, the median us of a call; graph replay up to 64 MiB, eager above. \
             p2p's plan when it was measured may differ from the one shown.\n\n",
        );
    }
    let mut ops: Vec<&str> = r.rows.iter().map(|row| row.op).collect();
    ops.dedup();
    for op in ops {
        out.push_str(&format!("## {op}\n\n"));
        let mut t = Table::new();
        t.load_preset(ASCII_MARKDOWN);
        let mut header = vec![
            "size",
            "algorithm",
            "moved by",
            "blocks",
            "SMs busy",
            "chunks",
            "steps",
            "model us",
        ];
        if measured {
            header.extend(["p2p us", "registered us", "NCCL best us"]);
        }
        header.push("why");
        t.set_header(header);
        for row in r.rows.iter().filter(|row| row.op == op) {
            t.add_row(cells(row, measured, r.sm_count));
        }
        out.push_str(&format!("{t}\n\n"));
    }
    out
}

/// One row's cells.
fn cells(row: &Row, measured: bool, sm_count: i32) -> Vec<String> {
    let mut c = vec![
        size_name(row.bytes),
        if row.overlap {
            format!("{} (overlapped)", row.route)
        } else {
            row.route.clone()
        },
        row.engine.to_string(),
        row.blocks.to_string(),
        format!("{} of {sm_count}", row.sms),
        row.chunks.to_string(),
        row.steps.to_string(),
        row.model_us
            .map_or_else(|| "-".to_string(), |us| format!("{us:.1}")),
    ];
    if measured {
        match row.measured {
            Some(m) => c.extend([
                format!("{:.1} ({})", m.ours_us, m.timing),
                m.ours_registered_us
                    .map_or_else(|| "-".to_string(), |us| format!("{us:.1}")),
                format!("{:.1} ({})", m.nccl_best_us, m.nccl_best_mode),
            ]),
            None => c.extend(["-".to_string(), "-".to_string(), "-".to_string()]),
        }
    }
    c.push(match row.refused {
        Some(why) => format!("{}; forced path refused: {why}", row.reason),
        None => row.reason.to_string(),
    });
    c
}
