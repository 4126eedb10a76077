//! The one polling loop under every host wait with a deadline here: a stream's
//! ([`Stream::synchronize_within`](crate::Stream::synchronize_within)), an event's
//! ([`Event::synchronize_within`](crate::Event::synchronize_within)) and a whole device's
//! ([`Device::synchronize_within`](crate::Device::synchronize_within)). Polling a query
//! (`cuStreamQuery`, `cuEventQuery`) instead of blocking in the driver is what lets a wait give
//! up at its deadline with no thread left behind.

use std::time::{Duration, Instant};

use p2p_sys::cuda::CUresult;

use crate::error::{OnDevice, Result};

/// How long the loop spins before it starts sleeping: a short wait then costs no more than
/// the driver's own blocking wait would.
const SPIN: Duration = Duration::from_micros(100);
/// The first and the longest sleep between two polls.
const FIRST_PAUSE: Duration = Duration::from_micros(20);
const LONGEST_PAUSE: Duration = Duration::from_millis(1);

/// What a CUDA query (`call`: `cuStreamQuery`, `cuEventQuery`) that returned `r` on `device`
/// says: `Ok(false)` while the work still runs (`CUDA_ERROR_NOT_READY`), `Ok(true)` once it has
/// finished, and the error of a fault (of the queried work or of the call).
pub(crate) fn query_done(call: &'static str, r: CUresult, device: i32) -> Result<bool> {
    if r == CUresult::CUDA_ERROR_NOT_READY {
        return Ok(false);
    }
    p2p_sys::check_cu(call, r).on(device)?;
    Ok(true)
}

/// Calls `done` until it answers `true` (`Ok(true)`) or `limit` has passed (`Ok(false)`, after
/// one last call at or past the deadline). Spins for the first 100 µs, then sleeps between
/// calls, doubling the pause from 20 µs up to 1 ms. An error of `done` ends the wait at once.
/// A zero `limit` calls `done` once.
pub(crate) fn poll_within(limit: Duration, mut done: impl FnMut() -> Result<bool>) -> Result<bool> {
    let start = Instant::now();
    let mut pause = FIRST_PAUSE;
    loop {
        if done()? {
            return Ok(true);
        }
        let waited = start.elapsed();
        if waited >= limit {
            return Ok(false);
        }
        if waited < SPIN {
            std::hint::spin_loop();
        } else {
            std::thread::sleep(pause.min(limit - waited));
            pause = (pause * 2).min(LONGEST_PAUSE);
        }
    }
}

/// The host waits of a stream or an event (a type with fields `device` and `raw`), as
/// methods, each binding the device first: `synchronize`, the blocking call `$sync`;
/// `synchronize_within`, [`poll_within`] over the query; and the query itself, `$done`, over
/// `$query` (see [`query_done`]). Invoked inside the type's `impl`; the docs are the invoker's.
macro_rules! host_waits {
    (
        $(#[$sync_doc:meta])* fn synchronize = $sync:ident;
        $(#[$within_doc:meta])* fn synchronize_within;
        $(#[$done_doc:meta])* fn $done:ident = $query:ident;
    ) => {
        $(#[$sync_doc])*
        pub fn synchronize(&self) -> $crate::error::Result<()> {
            self.device.bind_to_thread()?;
            // SAFETY: the handle is alive for as long as `self`.
            let r = unsafe { p2p_sys::cu!($sync(self.raw)) };
            $crate::error::OnDevice::on(r, self.device.ordinal())
        }

        $(#[$within_doc])*
        pub fn synchronize_within(&self, limit: std::time::Duration) -> $crate::error::Result<bool> {
            $crate::wait::poll_within(limit, || self.$done())
        }

        $(#[$done_doc])*
        pub fn $done(&self) -> $crate::error::Result<bool> {
            self.device.bind_to_thread()?;
            // SAFETY: the handle is alive for as long as `self`.
            let r = unsafe { p2p_sys::cuda::$query(self.raw) };
            $crate::wait::query_done(stringify!($query), r, self.device.ordinal())
        }
    };
}
pub(crate) use host_waits;

/// Runs `job` in a new thread named `name` and waits for it at most `limit`: its answer,
/// `Timeout` at the deadline (the thread is then left to finish on its own: for work that ends
/// by itself, such as a compile, or a library call that has no deadline of its own, such as
/// NCCL's abort), or `Disconnected` if it panicked. Where no thread can start, `job` runs in
/// this one, unbounded.
///
/// ```
/// use std::time::Duration;
/// let answer = p2p_mem::in_thread_within("p2p-example", Duration::from_secs(5), || 6 * 7);
/// assert_eq!(answer, Ok(42));
/// ```
pub fn in_thread_within<T: Send + 'static>(
    name: &str,
    limit: std::time::Duration,
    job: impl FnOnce() -> T + Send + 'static,
) -> std::result::Result<T, std::sync::mpsc::RecvTimeoutError> {
    let (tx, rx) = std::sync::mpsc::channel();
    // The job moves into the thread; if the thread cannot start, it is taken back here.
    let slot = std::sync::Arc::new(std::sync::Mutex::new(Some(job)));
    let theirs = slot.clone();
    let started = std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let job = theirs.lock().ok().and_then(|mut j| j.take());
            if let Some(job) = job {
                let _ = tx.send(job());
            }
        });
    if let Err(e) = started {
        tracing::debug!("could not start thread {name} ({e}): running its work in this one");
        let job = slot.lock().ok().and_then(|mut j| j.take());
        return job
            .map(|job| job())
            .ok_or(std::sync::mpsc::RecvTimeoutError::Disconnected);
    }
    rx.recv_timeout(limit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_in_a_thread_is_waited_for_at_most_its_limit_and_finishes_after() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::mpsc::RecvTimeoutError;
        use std::sync::Arc;
        // Quick work: its answer.
        assert_eq!(
            in_thread_within("p2p-test", Duration::from_secs(10), || 7),
            Ok(7)
        );
        // Slow work (a compile that takes longer than its limit): given up at the limit, and
        // it still finishes afterwards, in its own thread (what fills the kernel cache later).
        let finished = Arc::new(AtomicBool::new(false));
        let flag = finished.clone();
        let limit = Duration::from_millis(100);
        let t = Instant::now();
        let r = in_thread_within("p2p-test", limit, move || {
            std::thread::sleep(Duration::from_millis(600));
            flag.store(true, Ordering::SeqCst);
            1
        });
        let took = t.elapsed();
        assert_eq!(r, Err(RecvTimeoutError::Timeout));
        assert!(
            took >= limit && took < limit + Duration::from_millis(300),
            "{took:?}"
        );
        assert!(!finished.load(Ordering::SeqCst));
        let t = Instant::now();
        while !finished.load(Ordering::SeqCst) && t.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            finished.load(Ordering::SeqCst),
            "the work went on and ended"
        );
        // A panic is not mistaken for a late answer.
        let r: std::result::Result<(), _> =
            in_thread_within("p2p-test", Duration::from_secs(10), || {
                panic!("in the test")
            });
        assert_eq!(r, Err(RecvTimeoutError::Disconnected));
    }

    #[test]
    fn a_query_is_running_done_or_the_fault() {
        assert!(!query_done("cuStreamQuery", CUresult::CUDA_ERROR_NOT_READY, 0).expect("runs"));
        assert!(query_done("cuEventQuery", CUresult::CUDA_SUCCESS, 0).expect("done"));
        let e = query_done("cuStreamQuery", CUresult::CUDA_ERROR_ILLEGAL_ADDRESS, 3)
            .expect_err("a fault");
        assert!(e.to_string().contains("GPU 3"), "{e}");
    }
    use crate::Error;

    #[test]
    fn a_query_that_turns_true_ends_the_wait_at_once() {
        let mut calls = 0;
        let t = Instant::now();
        let done = poll_within(Duration::from_secs(10), || {
            calls += 1;
            Ok(calls == 50)
        });
        assert!(matches!(done, Ok(true)));
        assert_eq!(calls, 50);
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    }

    #[test]
    fn a_query_that_never_turns_true_gives_up_at_the_limit_not_much_later() {
        let limit = Duration::from_millis(150);
        let mut calls = 0u32;
        let t = Instant::now();
        let done = poll_within(limit, || {
            calls += 1;
            Ok(false)
        });
        let took = t.elapsed();
        assert!(matches!(done, Ok(false)));
        assert!(
            took >= limit && took < limit + Duration::from_millis(100),
            "{took:?}"
        );
        // Sleeps of at most 1 ms between polls after the spin: at least ~one poll per ms,
        // and not a busy loop (which would make millions).
        assert!((50..1_000_000).contains(&calls), "{calls} polls");
    }

    #[test]
    fn a_zero_limit_asks_once_and_an_error_ends_the_wait() {
        let mut calls = 0;
        assert!(matches!(
            poll_within(Duration::ZERO, || {
                calls += 1;
                Ok(false)
            }),
            Ok(false)
        ));
        assert_eq!(calls, 1);
        let mut calls = 0;
        let e = poll_within(Duration::from_secs(10), || {
            calls += 1;
            if calls < 3 {
                Ok(false)
            } else {
                Err(Error::InvalidArgument("a fault of queued work".into()))
            }
        });
        assert!(matches!(e, Err(Error::InvalidArgument(_))));
        assert_eq!(calls, 3);
    }
}
