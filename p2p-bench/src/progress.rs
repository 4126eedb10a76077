//! Progress of a long run on stderr: on a terminal a bar (indicatif) with the last step beside
//! it, in a log one line a step, each `[done/total] seconds what`.

use std::cell::Cell;
use std::io::IsTerminal;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};

/// A run of `total` steps, shown as it goes.
pub struct Progress {
    bar: ProgressBar,
    tty: bool,
    done: Cell<u64>,
    total: u64,
    started: Instant,
}

impl Progress {
    /// A run of `total` steps: a bar where stderr is a terminal, lines where it is not.
    pub fn new(total: usize) -> Progress {
        let tty = std::io::stderr().is_terminal();
        let bar = if tty {
            let style = ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] {pos}/{len} eta {eta} {msg}",
            )
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            ProgressBar::new(total as u64).with_style(style)
        } else {
            ProgressBar::hidden()
        };
        Progress {
            bar,
            tty,
            done: Cell::new(0),
            total: total as u64,
            started: Instant::now(),
        }
    }

    /// One step done, `what` saying which.
    pub fn step(&self, what: &str) {
        let done = self.done.get() + 1;
        self.done.set(done);
        let line = format!(
            "[{done:>3}/{}] {:>6.1}s {what}",
            self.total,
            self.started.elapsed().as_secs_f64()
        );
        if self.tty {
            self.bar.set_message(line);
            self.bar.inc(1);
            if done == self.total {
                self.bar.finish();
            }
        } else {
            eprintln!("{line}");
        }
    }

    /// A line of its own: above the bar on a terminal, in turn with the steps in a log.
    pub fn say(&self, line: &str) {
        if self.tty {
            self.bar.println(line);
        } else {
            eprintln!("{line}");
        }
    }

    /// The run is over: the bar leaves the terminal (a log keeps its lines).
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }
}
