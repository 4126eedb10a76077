//! Small helpers with no better home.

use comfy_table::{presets, CellAlignment, ContentArrangement, Table};

/// This machine's host name (from `/proc/sys/kernel/hostname`), or `unknown host`.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown host".into())
}

/// `rows` as aligned text columns two spaces apart, without borders (laid out by comfy-table),
/// as the topology views and p2p's tools print them; the columns whose index is in `right` are
/// right-aligned. Every line ends in a newline, with no trailing spaces.
///
/// ```
/// let rows = vec![
///     vec!["GPU".to_string(), "SMs".to_string()],
///     vec!["0".to_string(), "132".to_string()],
/// ];
/// assert_eq!(p2p_transport::text_columns(rows, &[1]), "GPU  SMs\n0    132\n");
/// ```
pub fn text_columns(rows: Vec<Vec<String>>, right: &[usize]) -> String {
    let mut table = Table::new();
    table
        .load_preset(presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled);
    for row in rows {
        table.add_row(row);
    }
    for (i, column) in table.column_iter_mut().enumerate() {
        column.set_padding((0, 2));
        if right.contains(&i) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    table
        .lines()
        .map(|l| l.trim_end().to_string() + "\n")
        .collect()
}
