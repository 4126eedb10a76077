//! Small-message one-way latency between two GPUs: SM store + flag, half a ping-pong.
//!
//! Two single-thread kernels, one per GPU, bounce a counter: each stores the next value into a
//! flag in the other GPU's memory and spins on its own flag. The time of many round trips,
//! taken with the GPU's global timer inside the kernel (so launch overhead is excluded), over
//! twice the number of trips is the one-way latency. Every spin has a deadline: if the partner
//! never answers, the kernels end and an error says so.

use p2p_mem::{Device, DeviceBuffer, DeviceMemory, DeviceMemoryMut, Stream};

use crate::kernels::{self, abi};
use p2p_mem::kernel::{Function, LaunchConfig, Module};
use p2p_transport::{Error, Result};

/// How long one wait may spin before the measurement is abandoned.
pub const TIMEOUT_NS: u64 = 2_000_000_000;

/// One-way latency from `a` to `b` and back, in nanoseconds: the mean over `iters` round trips
/// (after `warmup` untimed ones) of half a round trip.
pub fn one_way_ns(a: &Device, b: &Device, warmup: u32, iters: u32) -> Result<f64> {
    // The kernel counts rounds in 32 bits, to warmup + iters inclusive.
    if a == b || iters == 0 || warmup.checked_add(iters).is_none_or(|t| t == u32::MAX) {
        return Err(Error::InvalidArgument(
            "latency needs two distinct GPUs, iters > 0 and warmup + iters below 2^32 - 1".into(),
        ));
    }
    a.enable_peer_access(b)?;
    b.enable_peer_access(a)?;
    let (ma, mb) = (
        Module::build(a, &kernels::LATENCY)?,
        Module::build(b, &kernels::LATENCY)?,
    );
    let (fa, fb) = (ma.function("p2p_pingpong")?, mb.function("p2p_pingpong")?);
    let mut flag_a = DeviceBuffer::<u32>::zeroed(a, 64)?;
    let mut flag_b = DeviceBuffer::<u32>::zeroed(b, 64)?;
    flag_a.memset_u8(0)?;
    flag_b.memset_u8(0)?;
    let res_a = DeviceBuffer::<u64>::zeroed(a, 2)?;
    let res_b = DeviceBuffer::<u64>::zeroed(b, 2)?;
    let (sa, sb) = (Stream::new(a)?, Stream::new(b)?);
    let launch = |m: &Module,
                  f: &Function<abi::PingPongArgs>,
                  s: &Stream,
                  mine: u64,
                  theirs: u64,
                  starter: i32,
                  res: u64|
     -> Result<()> {
        let args = abi::PingPongArgs {
            mine,
            theirs,
            result: res,
            timeout_ns: TIMEOUT_NS,
            warmup,
            iters,
            starter,
        };
        // SAFETY: p2p_pingpong takes one PingPongArgs (the layout generated from bench_abi.h);
        // `mine` is this GPU's flag, `theirs` the peer's (peer access enabled above), `res` two
        // u64 on this GPU; all stay allocated until both streams are synchronised below.
        Ok(unsafe { m.launch(f, LaunchConfig::new(1, 32), &args, s) }?)
    };
    // The responder first, so it is spinning when the starter's first store lands.
    launch(
        &mb,
        &fb,
        &sb,
        flag_b.device_ptr(),
        flag_a.device_ptr(),
        0,
        res_b.device_ptr(),
    )?;
    launch(
        &ma,
        &fa,
        &sa,
        flag_a.device_ptr(),
        flag_b.device_ptr(),
        1,
        res_a.device_ptr(),
    )?;
    sa.synchronize()?;
    sb.synchronize()?;
    let (ra, rb) = (res_a.to_host_vec::<u64>()?, res_b.to_host_vec::<u64>()?);
    if ra[1] != 0 || rb[1] != 0 {
        return Err(Error::Mem(p2p_mem::Error::Unsupported {
            what: "the latency ping-pong",
            reason: format!(
                "GPU {} or GPU {} waited over {} s for the other's flag: stores through the peer mapping did not arrive",
                a.ordinal(),
                b.ordinal(),
                TIMEOUT_NS / 1_000_000_000
            ),
        }));
    }
    Ok(ra[0] as f64 / (2.0 * iters as f64))
}
