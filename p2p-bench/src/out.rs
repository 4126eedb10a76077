//! What the tool writes to the terminal: standard output that survives a reader who goes away,
//! and colour only where a person reads it.
//!
//! `p2p-bench topo | head -1` closes the pipe after one line. Rust ignores SIGPIPE, so the next
//! write fails with `BrokenPipe`, and `println!` panics on it. Here such a write is dropped, and
//! so is every later one: the command goes on to its end (a benchmark still writes its results
//! files) and exits with its own status. Restoring SIGPIPE's default action at start instead
//! would also kill the process on a write to a closed socket, where the transport and the
//! launcher must see `EPIPE` to report a dead peer.

use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once standard output's reader has gone; nothing more is written.
static CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes `args` to standard output; a reader that has gone is not an error ([`crate::out!`]).
pub fn write(args: std::fmt::Arguments<'_>) {
    if CLOSED.load(Ordering::Relaxed) {
        return;
    }
    match std::io::stdout().lock().write_fmt(args) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            CLOSED.store(true, Ordering::Relaxed);
        }
        // A full disk behind a redirect, say: said once, then nothing more is written.
        Err(e) => {
            CLOSED.store(true, Ordering::Relaxed);
            eprintln!("p2p-bench: writing to standard output: {e}");
        }
    }
}

/// Whether standard output's reader has gone (and what was written since was dropped).
pub fn closed() -> bool {
    CLOSED.load(Ordering::Relaxed)
}

/// `print!` that drops what it writes once the reader has gone, instead of panicking.
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::out::write(::std::format_args!($($arg)*))
    };
}

/// `println!` that drops what it writes once the reader has gone, instead of panicking.
#[macro_export]
macro_rules! outln {
    () => {
        $crate::out::write(::std::format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::out::write(::std::format_args!("{}\n", ::std::format_args!($($arg)*)))
    };
}

/// Whether to colour what goes to standard error: only on a terminal, and not when `NO_COLOR`
/// is set to anything but the empty string (<https://no-color.org>).
pub fn colour_stderr() -> bool {
    colour(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR").as_deref(),
    )
}

/// Whether to colour a stream that is a terminal (`terminal`) with `NO_COLOR` as given.
pub fn colour(terminal: bool, no_color: Option<&std::ffi::OsStr>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour(true, None));
        assert!(colour(true, Some("".as_ref())));
        assert!(!colour(true, Some("1".as_ref())));
        assert!(!colour(false, None));
    }
}
