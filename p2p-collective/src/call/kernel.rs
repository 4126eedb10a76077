//! The work of a plan whose kernel moves the data (every protocol but the copy engines'): one
//! launch, and for an out-of-place all-gather or all-to-all through the scratch of a large
//! size, this rank's own part copied by the copy engine beside it on the second stream.

use crate::comm::launcher::{Args, Lane, Step, Work};
use crate::error::Result;
use crate::plan::Proto;

use super::Planned;

/// The work of a planned call whose kernel moves the data, into `work` (which holds its
/// argument block); `own` is its own part's copy (`args.rs`).
pub(super) fn kernel_work(
    planned: &Planned<'_>,
    own: (u64, u64, usize),
    work: &mut Work,
) -> Result<()> {
    let Planned { plan, .. } = planned;
    debug_assert!(plan.proto != Proto::CopyEngine, "{plan:?}");
    // LL runs one 8-byte unit per thread: a piece larger than the block would drop units.
    debug_assert!(
        plan.proto != Proto::Ll || plan.piece <= plan.threads as u64,
        "{plan:?}"
    );
    // Large out of place: this rank's own part by the copy engine on the side stream (the fork
    // orders it after the caller's earlier work), the kernel neither reading its destination
    // nor writing its source (`own_done`, set by `args.rs`). A partial overlap plans as in
    // place (`check.rs`), which keeps the kernel's copy.
    if plan.own_by_copy_engine {
        let (dst, src, bytes) = own;
        work.push(Step::Fork)?;
        work.push(Step::Copy {
            dst,
            src,
            bytes,
            lane: Lane::Side,
        })?;
    }
    work.push(Step::Kernel {
        entry: plan.entry,
        dtype: plan.kernel_type,
        grid: plan.grid,
        threads: plan.threads,
        args: Args::Call,
        lane: Lane::Caller,
    })?;
    if plan.own_by_copy_engine {
        work.push(Step::Join)?;
    }
    Ok(())
}
