//! The copy engines' path: `cuMemcpyPeerAsync` in large chunks (used by [`Path::CopyEngine`]
//! (super::Path::CopyEngine) and by both legs of the staged paths).

use p2p_mem::{Device, Stream};
use p2p_sys::cu;

use crate::error::Result;

/// Copy-engine calls are split into chunks of this size, so a very long copy does not hold a
/// copy engine against other streams for its whole length. Each chunk costs a little: 64 MiB
/// chunks lost 1.5% at 256 MiB against one call (docs/performance.md, "The transport's
/// paths"), so chunks are large.
pub const CE_CHUNK: usize = 1 << 30;
/// `cuMemcpyPeerAsync` in [`CE_CHUNK`] pieces on `stream`.
pub(crate) fn copy_engine(
    dst: u64,
    dd: &Device,
    src: u64,
    sd: &Device,
    bytes: usize,
    stream: &Stream,
) -> Result<()> {
    stream.device().bind_to_thread()?;
    let mut off = 0;
    while off < bytes {
        let len = CE_CHUNK.min(bytes - off);
        // SAFETY: both ranges lie inside live allocations of `bytes` bytes; the contexts are retained.
        unsafe {
            cu!(cuMemcpyPeerAsync(
                dst + off as u64,
                dd.cu_context(),
                src + off as u64,
                sd.cu_context(),
                len,
                stream.cu_stream()
            ))
        }
        .map_err(crate::error::cuda(sd.ordinal(), Some(dd.ordinal())))?;
        off += len;
    }
    Ok(())
}
