//! A region of device memory as a call sees it, and the check that it holds what the call needs.

use p2p_mem::{check_stream, Device, DeviceMemory, Stream};

use crate::error::{Error, Result};

use super::check::Shape;

/// A region of a buffer, as a call sees it.
#[derive(Clone, Copy)]
pub(crate) struct Region<'a> {
    pub(crate) ptr: u64,
    pub(crate) bytes: usize,
    pub(crate) device: &'a Device,
}

impl<'a> Region<'a> {
    /// The whole of `m`, checked to be usable on `stream` ([`check_stream`]).
    pub(crate) fn of<M: DeviceMemory + ?Sized>(m: &'a M, stream: &Stream) -> Result<Region<'a>> {
        check_stream(m, stream)?;
        Ok(Region {
            ptr: m.device_ptr(),
            bytes: m.byte_len(),
            device: m.device(),
        })
    }

    /// Refuses the region as `op`'s `what` buffer unless it is on the shape's GPU and holds
    /// `len` elements of `size` bytes (of the type named `name`).
    pub(crate) fn holds(
        &self,
        shape: &Shape<'_>,
        op: &'static str,
        what: &str,
        len: usize,
        (size, name): (usize, &str),
    ) -> Result<()> {
        let bad = |what: String| Error::InvalidArgument {
            op,
            rank: shape.rank,
            what,
        };
        if self.device != shape.device {
            return Err(bad(format!(
                "the {what} buffer is on GPU {}, this rank's GPU is {}",
                self.device.ordinal(),
                shape.device.ordinal()
            )));
        }
        let need = len * size;
        if self.bytes < need {
            return Err(bad(format!(
                "the {what} buffer holds {} bytes; {len} elements of {name} need {need}",
                self.bytes
            )));
        }
        Ok(())
    }
}
