//! Progress of a long run on stderr: on a terminal a bar (indicatif) with the last step beside
//! it, in a log one line a step, each `[done/total] seconds what`.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A run of `total` steps, shown as it goes.
pub struct Progress {
    /// Counts the steps and the time on a terminal and in a log alike (hidden in a log).
    bar: ProgressBar,
    tty: bool,
}

impl Progress {
    /// A run of `total` steps: a bar where stderr is a terminal, lines where it is not.
    pub fn new(total: usize) -> Progress {
        let tty = std::io::stderr().is_terminal();
        let bar = ProgressBar::new(total as u64);
        if tty {
            let style = ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] {pos}/{len} eta {eta} {msg}",
            )
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar());
            bar.set_style(style);
        } else {
            bar.set_draw_target(ProgressDrawTarget::hidden());
        }
        Progress { bar, tty }
    }

    /// One step done, `what` saying which.
    pub fn step(&self, what: &str) {
        self.bar.inc(1);
        let done = self.bar.position();
        let line = format!(
            "[{done:>3}/{}] {:>6.1}s {what}",
            self.bar.length().unwrap_or(done),
            self.bar.elapsed().as_secs_f64()
        );
        if self.tty {
            self.bar.set_message(line);
            if Some(done) == self.bar.length() {
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
