//! Timing shared by the benchmarks that drive every GPU of this process (`coll`, `sendrecv`):
//! CUDA events on each rank's stream around a batch of calls, the slowest rank's time per call,
//! and the same batch captured once in a CUDA graph per rank and replayed.

use std::time::{Duration, Instant};

use p2p_collective::Communicator;
use p2p_mem::{Device, Event, GraphExec, Stream};

use crate::gate::Gate;
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
    /// The longest one wait for the streams may take.
    fn wait_limit(&self) -> Duration {
        DEFAULT_WAIT
    }
    /// Checked between polls while waiting (another library's asynchronous error, a watchdog
    /// that fired): an error ends the wait at once.
    fn poll(&self) -> Result<(), String> {
        Ok(())
    }
    /// The gate that graph timing queues in front of the replays ([`Gate`]), if loaded.
    fn gate(&self) -> Option<&Gate> {
        None
    }
    /// Waits (at most [`wait_limit`](Self::wait_limit)) for every rank's stream and reports a
    /// failed call.
    fn sync(&self) -> Result<(), String> {
        sync_all(
            self.timers().into_iter().map(|t| &t.stream),
            self.comms(),
            self.wait_limit(),
            || self.poll(),
        )
    }
}

/// The wait limit of a harness that sets none.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(60);

/// Implements [`Ranks`] for a harness type whose `ranks` (a `Vec`) each hold a `timer`, whose
/// `comms` are the communicators and whose `gate` (an `Option<Gate>`) gates graph timing.
macro_rules! impl_ranks {
    ($harness:ty) => {
        impl $crate::timing::Ranks for $harness {
            fn timers(&self) -> Vec<&$crate::timing::Timer> {
                self.ranks.iter().map(|r| &r.timer).collect()
            }

            fn comms(&self) -> &[p2p_collective::Communicator] {
                self.comms
            }

            fn gate(&self) -> Option<&$crate::gate::Gate> {
                self.gate.as_ref()
            }
        }
    };
}
pub(crate) use impl_ranks;

/// Calls per timed sample: about 1 GiB of traffic, between 5 and 100.
pub fn iters_for(bytes: usize) -> usize {
    ((1usize << 30) / bytes.max(1)).clamp(5, 100)
}

/// What [`sync_all`] says when a wait outlives its limit: it begins so, and the rest names the
/// ranks whose streams were still busy.
pub const STALLED: &str = "stalled:";

/// Waits for every stream (polling each, at most `limit` in all), then reports a call that
/// failed on any communicator. `poll` runs between polls; its error ends the wait. A wait past
/// `limit` is an error that begins with [`STALLED`] and names the ranks still busy (the work
/// goes on: stopping it is the caller's).
pub fn sync_all<'a>(
    streams: impl IntoIterator<Item = &'a Stream>,
    comms: &[Communicator],
    limit: Duration,
    poll: impl Fn() -> Result<(), String>,
) -> Result<(), String> {
    let streams: Vec<&Stream> = streams.into_iter().collect();
    let deadline = Instant::now() + limit;
    let mut pause = Duration::from_micros(20);
    loop {
        let mut busy = Vec::new();
        for (r, s) in streams.iter().enumerate() {
            if !s.is_idle().map_err(|e| format!("rank {r}: {e}"))? {
                busy.push(r);
            }
        }
        if busy.is_empty() {
            break;
        }
        poll().map_err(|e| format!("{e} (rank(s) {} still busy)", list(&busy)))?;
        if Instant::now() >= deadline {
            return Err(format!(
                "{STALLED} rank(s) {} did not finish within {:.0} s",
                list(&busy),
                limit.as_secs_f64()
            ));
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(1));
    }
    for c in comms {
        c.check().map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn list(ranks: &[usize]) -> String {
    ranks
        .iter()
        .map(|r| r.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// How a figure is sampled: `samples` samples of `iters` calls each, behind the harness's
/// [`Gate`] or not.
#[derive(Clone, Copy, Debug)]
pub struct Sampling {
    /// Calls a sample.
    pub iters: usize,
    /// Samples a figure.
    pub samples: usize,
    /// Whether the gate (where the harness has one) holds every stream until a sample's calls
    /// are queued, so that the figure holds the GPUs' time without the host's cost of queueing.
    pub gated: bool,
}

/// `how.samples` times: events around `body` (which queues `how.iters` calls) on every rank;
/// each sample is the slowest rank's microseconds per call.
pub fn sample<H: Ranks>(
    h: &mut H,
    how: Sampling,
    mut body: impl FnMut(&mut H) -> Result<(), String>,
) -> Result<Stat, String> {
    let Sampling {
        iters,
        samples,
        gated,
    } = how;
    if samples == 0 || iters == 0 {
        return Err("no samples to take".into());
    }
    let mut v = Vec::with_capacity(samples);
    for _ in 0..samples {
        let gate = gated && h.gate().is_some();
        if let Some(g) = h.gate().filter(|_| gate) {
            g.close(&h.timers().iter().map(|t| &t.stream).collect::<Vec<_>>())?;
        }
        let queued = queue_sample(h, &mut body);
        if let Some(g) = h.gate().filter(|_| gate) {
            g.open();
        }
        queued?;
        h.sync()?;
        if let Some(g) = h.gate().filter(|_| gate) {
            g.check()?;
        }
        let mut worst = 0.0f64;
        for t in h.timers() {
            let ms = t.start.elapsed_ms(&t.stop).map_err(|e| e.to_string())?;
            worst = worst.max(ms as f64 * 1000.0 / iters as f64);
        }
        v.push(worst);
    }
    Ok(Stat::of(v))
}

/// The start events, `body`, the stop events.
fn queue_sample<H: Ranks>(
    h: &mut H,
    body: &mut impl FnMut(&mut H) -> Result<(), String>,
) -> Result<(), String> {
    for t in h.timers() {
        t.start.record(&t.stream).map_err(|e| e.to_string())?;
    }
    body(h)?;
    for t in h.timers() {
        t.stop.record(&t.stream).map_err(|e| e.to_string())?;
    }
    Ok(())
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
    let how = Sampling {
        iters,
        samples,
        gated: false,
    };
    sample(h, how, |h| {
        for _ in 0..iters {
            issue(h)?;
        }
        Ok(())
    })
}

/// Captures `how.iters` calls of `issue` in one CUDA graph per rank, replays it once, then times
/// `how.samples` replays with [`sample`]: gated, behind the harness's [`Gate`] (the GPUs' time,
/// as nccl-tests `-G` measures it once its back-to-back launches hide their cost), or not (each
/// sample then also holds the host's cost of launching every rank's graph in turn).
pub fn graph<H: Ranks>(
    h: &mut H,
    how: Sampling,
    mut issue: impl FnMut(&mut H) -> Result<(), String>,
) -> Result<Stat, String> {
    for t in h.timers() {
        t.stream.begin_capture().map_err(|e| e.to_string())?;
    }
    let mut issued = Ok(());
    for _ in 0..how.iters {
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
    sample(h, how, launch)
}
