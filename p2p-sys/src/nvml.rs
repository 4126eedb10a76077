//! What nvml-wrapper gets wrong, called directly.
//!
//! nvml-wrapper 0.13's `NvLink::remote_device_type` passes NVML a pointer to a temporary and
//! returns its own initial value, so it always answers `Unknown`. On virtual machines that mask
//! the far end's PCI bus id (`ffffffff:ff:ff.0`), the device type is the only way to tell a link
//! to an NVSwitch from a direct link to a GPU.

use nvml_wrapper::error::{nvml_try, NvmlError};

/// The far end of an NVLink, as `nvmlDeviceGetNvLinkRemoteDeviceType` reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum NvLinkRemoteType {
    /// A GPU.
    Gpu,
    /// An IBM NPU (POWER9's NVLink to the CPU).
    IbmNpu,
    /// An NVSwitch.
    Switch,
    /// NVML does not know.
    Unknown,
}

/// The device type at the far end of `device`'s NVLink `link`.
pub fn nvlink_remote_type(
    device: &nvml_wrapper::Device<'_>,
    link: u32,
) -> Result<NvLinkRemoteType, NvmlError> {
    // The wrapper's method panics on a missing symbol; take the symbol and report its absence.
    let f = device
        .nvml()
        .lib()
        .nvmlDeviceGetNvLinkRemoteDeviceType
        .as_ref()
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let mut raw: u32 = 255;
    // SAFETY: `device.handle()` is a live NVML handle for as long as `device` borrows its `Nvml`
    // (held for the whole call); `raw` is a valid out-pointer of the enum's width (c_uint).
    let rc = unsafe { f(device.handle(), link, &mut raw) };
    nvml_try(rc)?;
    Ok(match raw {
        0 => NvLinkRemoteType::Gpu,
        1 => NvLinkRemoteType::IbmNpu,
        2 => NvLinkRemoteType::Switch,
        _ => NvLinkRemoteType::Unknown,
    })
}
