//! The exit statuses of `p2p-bench`, the same in every command, and the one answer every command
//! gives where it needs a GPU and finds none.

use std::process::ExitCode;

/// The command could not do what it was asked: no GPU or no CUDA driver, a check or a run that
/// failed, a file that could not be read or written.
pub const FAILED: u8 = 1;

/// The command was given something it cannot use: an unknown argument or value, or a bad `P2P_*`
/// setting (clap's own usage errors exit with 2 too).
pub const USAGE: u8 = 2;

/// `coll` ended early (a deadline, a fatal error), or `faults` ran out of time before its targets
/// with nothing failed: the results so far are written.
pub const INCOMPLETE: u8 = 3;

/// `launch`: the job was stopped by a signal (SIGINT, SIGTERM, SIGHUP), every rank with it.
pub const SIGNALLED: u8 = 130;

/// `launch`: the job ran past `--time-limit` and was stopped, every rank with it.
pub const TIME_LIMIT: u8 = 124;

/// The exit statuses as `p2p-bench --help` lists them (and the README's section on the tool).
pub const HELP: &str = "\
Exit status (the same in every command):
  0  done (doctor: no check failed)
  1  could not do it: no GPU or no CUDA driver, a failed check or run, a file not read or written
  2  usage: an unknown argument or value, or a bad P2P_* setting (the message names it)
  3  coll: the run ended early; faults: nothing failed but the budget ended it before its
     targets; the results so far are written
  launch exits with the status of the rank that failed first; 124 past --time-limit, 130 when
  stopped by a signal (every rank's process group stopped).";

/// Why there is no GPU where the driver loaded and reports none.
pub const NO_DEVICE: &str =
    "the CUDA driver reports none; check nvidia-smi and CUDA_VISIBLE_DEVICES";

/// Why `devices` (what the driver answered) holds no GPU, or `None` where it holds one.
pub fn no_gpu_reason<T, E: std::fmt::Display>(devices: &Result<Vec<T>, E>) -> Option<String> {
    match devices {
        Ok(d) if !d.is_empty() => None,
        Ok(_) => Some(NO_DEVICE.to_string()),
        Err(e) => Some(e.to_string()),
    }
}

/// Says on stderr that `p2p-bench TOOL` found no GPU (`reason`) and what to do instead (`then`),
/// and returns [`FAILED`]: the one message and status of every command that needs a GPU.
pub fn no_gpu(tool: &str, reason: &str, then: &str) -> ExitCode {
    eprintln!("p2p-bench {tool}: no GPU found ({reason}): {then}");
    ExitCode::from(FAILED)
}

/// The number of GPUs, or the [`no_gpu`] answer for `p2p-bench TOOL`, which `needs` them. Asks
/// the driver for the count only: no GPU is opened.
pub fn require_gpus(tool: &str, needs: &str) -> Result<usize, ExitCode> {
    let reason = match p2p_mem::Device::count() {
        Ok(n) if n > 0 => return Ok(usize::try_from(n).unwrap_or(0)),
        Ok(_) => NO_DEVICE.to_string(),
        Err(e) => e.to_string(),
    };
    Err(no_gpu(tool, &reason, needs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_device_and_no_driver_are_both_no_gpu() {
        assert_eq!(no_gpu_reason::<(), String>(&Ok(vec![()])), None);
        assert_eq!(
            no_gpu_reason::<(), String>(&Ok(vec![])).as_deref(),
            Some(NO_DEVICE)
        );
        assert_eq!(
            no_gpu_reason::<(), _>(&Err("libcuda was not found")).as_deref(),
            Some("libcuda was not found")
        );
    }

    #[test]
    fn the_help_lists_every_status() {
        for code in [0, FAILED, USAGE, INCOMPLETE] {
            assert!(HELP.contains(&format!("\n  {code}  ")), "{code}: {HELP}");
        }
    }
}
