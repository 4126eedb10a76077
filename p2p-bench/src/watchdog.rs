//! Deadlines for the benchmarks' steps: a thread that watches one armed step at a time and,
//! when the step outlives its limit, says so at once on stderr and runs the step's abort (for
//! NCCL, `ncclCommAbort` of the mode's communicators; for ours, the communicators' abort flag).
//! The abort makes a call blocked inside NCCL return and stuck kernels end, so the benchmark
//! goes on with the next step instead of hanging.
//!
//! The main thread arms a step ([`Watchdog::arm`]) before it and disarms it after
//! ([`Watchdog::disarm`]); the abort runs under the same lock as `disarm`, so once `disarm` says
//! the step did not fire, the abort can no longer run, and once it says it fired, the abort has
//! finished (the communicators are gone: the caller must not touch them again).

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What to do when an armed step outlives its limit (runs on the watchdog's thread).
pub type OnFire = Box<dyn FnOnce() + Send>;

struct Armed {
    deadline: Instant,
    what: String,
    on_fire: OnFire,
}

#[derive(Default)]
struct State {
    armed: Option<Armed>,
    /// The step that fired since it was armed, until `disarm`.
    fired: Option<String>,
    stop: bool,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic on the watchdog's thread (in an abort) leaves the state as it was: go on.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The watchdog thread; stopped and joined on `Drop`.
pub struct Watchdog {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Starts the watchdog's thread (or, if the OS refuses a thread, a watchdog that never
    /// fires: the benchmark then runs without deadlines, and says so).
    pub fn start() -> Watchdog {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name("p2p-bench-watchdog".into())
            .spawn(move || watch(&s));
        let thread = match thread {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("p2p-bench: no watchdog thread ({e}): steps run without deadlines");
                None
            }
        };
        Watchdog { shared, thread }
    }

    /// Arms the deadline of one step: if [`disarm`](Self::disarm) is not called within
    /// `limit`, the watchdog prints `what` and runs `on_fire`. Arming again replaces the step.
    pub fn arm(&self, what: impl Into<String>, limit: Duration, on_fire: OnFire) {
        let mut st = self.shared.lock();
        st.fired = None;
        st.armed = Some(Armed {
            deadline: Instant::now() + limit,
            what: what.into(),
            on_fire,
        });
        self.shared.wake.notify_all();
    }

    /// Ends the armed step: `Some(what)` if it fired (its abort has run), `None` if it ended in
    /// time (its abort will never run).
    pub fn disarm(&self) -> Option<String> {
        let mut st = self.shared.lock();
        st.armed = None;
        st.fired.take()
    }

    /// Whether the armed step has fired (a wait polls this to end early).
    pub fn fired(&self) -> bool {
        self.shared.lock().fired.is_some()
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        {
            let mut st = self.shared.lock();
            st.stop = true;
            st.armed = None;
        }
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn watch(shared: &Shared) {
    let mut st = shared.lock();
    loop {
        if st.stop {
            return;
        }
        let now = Instant::now();
        match st.armed.as_ref().map(|a| a.deadline) {
            Some(deadline) if now >= deadline => {
                if let Some(a) = st.armed.take() {
                    eprintln!(
                        "p2p-bench: STALLED: {} did not finish within its limit; aborting it",
                        a.what
                    );
                    // Under the lock: `disarm` waits for the abort to finish.
                    (a.on_fire)();
                    st.fired = Some(a.what);
                }
            }
            Some(deadline) => {
                st = shared
                    .wake
                    .wait_timeout(st, deadline - now)
                    .map(|(g, _)| g)
                    .unwrap_or_else(|e| e.into_inner().0);
            }
            None => {
                st = shared.wake.wait(st).unwrap_or_else(|e| e.into_inner());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A watchdog armed for the step `what` with `limit`, and the flag its abort sets.
    fn armed(what: &str, limit: Duration) -> (Watchdog, Arc<AtomicBool>) {
        let wd = Watchdog::start();
        let aborted = Arc::new(AtomicBool::new(false));
        let a = aborted.clone();
        wd.arm(
            what,
            limit,
            Box::new(move || a.store(true, Ordering::SeqCst)),
        );
        (wd, aborted)
    }

    #[test]
    fn a_step_past_its_limit_fires_once_and_says_which() {
        let (wd, aborted) = armed("NCCL plain broadcast 2 MiB", Duration::from_millis(20));
        let until = Instant::now() + Duration::from_secs(5);
        while !wd.fired() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(aborted.load(Ordering::SeqCst));
        assert_eq!(wd.disarm().as_deref(), Some("NCCL plain broadcast 2 MiB"));
        // Disarmed: nothing fires any more.
        assert_eq!(wd.disarm(), None);
        assert!(!wd.fired());
    }

    #[test]
    fn a_step_disarmed_in_time_never_runs_its_abort() {
        let (wd, aborted) = armed("ours all-reduce 8 B", Duration::from_millis(50));
        assert_eq!(wd.disarm(), None);
        std::thread::sleep(Duration::from_millis(120));
        assert!(!aborted.load(Ordering::SeqCst));
        assert!(!wd.fired());
    }
}
