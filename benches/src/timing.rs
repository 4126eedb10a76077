//! Timing shared by the benchmarks that drive every GPU of this process (`coll`, `sendrecv`):
//! CUDA events on each rank's stream around a batch of calls, the slowest rank's time per call,
//! and the same batch captured once in a CUDA graph per rank and replayed.

use p2p_collective::Communicator;
use p2p_mem::{Device, Event, GraphExec, Stream};

use crate::p2p::Stat;

/// One rank's stream and the two timestamp events around a timed batch on it.
pub struct Timer {
    /// The rank's stream: every call of the benchmark is queued on it.
    pub stream: Stream,
    /// Recorded before a batch.
    pub start: Event,
    /// Recorded after a batch.
    pub stop: Event,
}

impl Timer {
    /// A new stream on `device` and two events that record timestamps.
    pub fn new(device: &Device) -> Result<Timer, String> {
        let e = |e: p2p_mem::Error| e.to_string();
        Ok(Timer {
            stream: Stream::new(device).map_err(e)?,
            start: Event::timing(device).map_err(e)?,
            stop: Event::timing(device).map_err(e)?,
        })
    }
}

/// A benchmark harness whose ranks each have a [`Timer`], run by communicators.
pub trait Ranks {
    /// Every rank's timer, in rank order.
    fn timers(&self) -> Vec<&Timer>;
    /// The communicators whose failed calls [`sync`](Self::sync) reports.
    fn comms(&self) -> &[Communicator];
    /// Waits for every rank's stream and reports a failed call.
    fn sync(&self) -> Result<(), String> {
        sync_all(self.timers().into_iter().map(|t| &t.stream), self.comms())
    }
}

/// Implements [`Ranks`] for a harness type whose `ranks` (a `Vec`) each hold a `timer` and
/// whose `comms` are the communicators.
macro_rules! impl_ranks {
    ($harness:ty) => {
        impl $crate::timing::Ranks for $harness {
            fn timers(&self) -> Vec<&$crate::timing::Timer> {
                self.ranks.iter().map(|r| &r.timer).collect()
            }

            fn comms(&self) -> &[p2p_collective::Communicator] {
                self.comms
            }
        }
    };
}
pub(crate) use impl_ranks;

/// Calls per timed sample: about 1 GiB of traffic, between 5 and 100.
pub fn iters_for(bytes: usize) -> usize {
    ((1usize << 30) / bytes.max(1)).clamp(5, 100)
}

/// Waits for every stream, then reports a call that failed on any communicator.
pub fn sync_all<'a>(
    streams: impl IntoIterator<Item = &'a Stream>,
    comms: &[Communicator],
) -> Result<(), String> {
    for s in streams {
        s.synchronize().map_err(|e| e.to_string())?;
    }
    for c in comms {
        c.check().map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// `samples` times: events around `body` (which queues `iters` calls) on every rank; each
/// sample is the slowest rank's microseconds per call.
pub fn sample<H: Ranks>(
    h: &mut H,
    iters: usize,
    samples: usize,
    mut body: impl FnMut(&mut H) -> Result<(), String>,
) -> Result<Stat, String> {
    if samples == 0 || iters == 0 {
        return Err("no samples to take".into());
    }
    let mut v = Vec::with_capacity(samples);
    for _ in 0..samples {
        for t in h.timers() {
            t.start.record(&t.stream).map_err(|e| e.to_string())?;
        }
        body(h)?;
        for t in h.timers() {
            t.stop.record(&t.stream).map_err(|e| e.to_string())?;
        }
        h.sync()?;
        let mut worst = 0.0f64;
        for t in h.timers() {
            let ms = t.start.elapsed_ms(&t.stop).map_err(|e| e.to_string())?;
            worst = worst.max(ms as f64 * 1000.0 / iters as f64);
        }
        v.push(worst);
    }
    Ok(Stat::of(v))
}

/// Eager timing: 3 warm-up calls of `issue`, then [`sample`] over batches of `iters` calls.
pub fn eager<H: Ranks>(
    h: &mut H,
    iters: usize,
    samples: usize,
    mut issue: impl FnMut(&mut H) -> Result<(), String>,
) -> Result<Stat, String> {
    for _ in 0..3 {
        issue(h)?;
    }
    h.sync()?;
    sample(h, iters, samples, |h| {
        for _ in 0..iters {
            issue(h)?;
        }
        Ok(())
    })
}

/// Captures `iters` calls of `issue` in one CUDA graph per rank, replays it once, then times
/// `samples` replays with [`sample`].
pub fn graph<H: Ranks>(
    h: &mut H,
    iters: usize,
    samples: usize,
    mut issue: impl FnMut(&mut H) -> Result<(), String>,
) -> Result<Stat, String> {
    for t in h.timers() {
        t.stream.begin_capture().map_err(|e| e.to_string())?;
    }
    let mut issued = Ok(());
    for _ in 0..iters {
        issued = issue(h);
        if issued.is_err() {
            break;
        }
    }
    // End every capture before instantiating any: instantiating while another stream of this
    // thread still captures invalidates that capture.
    let captured: Vec<_> = h.timers().iter().map(|t| t.stream.end_capture()).collect();
    let mut graphs: Vec<GraphExec> = Vec::new();
    let mut ended = Ok(());
    for g in captured {
        match g.and_then(|g| g.instantiate()) {
            Ok(g) => graphs.push(g),
            Err(e) => ended = Err(e.to_string()),
        }
    }
    issued?;
    ended?;
    #[allow(unsafe_code)] // a graph replay (its contract: what it captured is alive)
    let launch = |h: &mut H| -> Result<(), String> {
        for (g, t) in graphs.iter().zip(h.timers()) {
            // SAFETY: the captured calls use the harness's buffers and communicators, which
            // live as long as `h` (borrowed for this whole function) and are only used by
            // these replays meanwhile.
            unsafe { g.launch(&t.stream) }.map_err(|e| e.to_string())?;
        }
        Ok(())
    };
    launch(h)?;
    h.sync()?;
    sample(h, iters, samples, launch)
}
