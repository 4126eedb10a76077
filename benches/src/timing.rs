//! Timing shared by the benchmarks that drive every GPU of this process (`coll`, `sendrecv`):
//! CUDA events on each rank's stream around a batch of calls, the slowest rank's time per call,
//! and the same batch captured once in a CUDA graph per rank and replayed.

use p2p_collective::Communicator;
use p2p_mem::{Event, GraphExec, Stream};

use crate::p2p::Stat;

/// A benchmark harness whose ranks each have a stream and a start and a stop event.
pub trait Ranks {
    /// Every rank's (stream, start event, stop event).
    fn timers(&self) -> Vec<(&Stream, &Event, &Event)>;
    /// Waits for every rank's stream and reports a failed call.
    fn sync(&self) -> Result<(), String>;
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
        for (stream, start, _) in h.timers() {
            start.record(stream).map_err(|e| e.to_string())?;
        }
        body(h)?;
        for (stream, _, stop) in h.timers() {
            stop.record(stream).map_err(|e| e.to_string())?;
        }
        h.sync()?;
        let mut worst = 0.0f64;
        for (_, start, stop) in h.timers() {
            let ms = start.elapsed_ms(stop).map_err(|e| e.to_string())?;
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
    for (stream, _, _) in h.timers() {
        stream.begin_capture().map_err(|e| e.to_string())?;
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
    let captured: Vec<_> = h.timers().iter().map(|(s, _, _)| s.end_capture()).collect();
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
        for (g, (stream, _, _)) in graphs.iter().zip(h.timers()) {
            // SAFETY: the captured calls use the harness's buffers and communicators, which
            // live as long as `h` (borrowed for this whole function) and are only used by
            // these replays meanwhile.
            unsafe { g.launch(stream) }.map_err(|e| e.to_string())?;
        }
        Ok(())
    };
    launch(h)?;
    h.sync()?;
    sample(h, iters, samples, launch)
}
