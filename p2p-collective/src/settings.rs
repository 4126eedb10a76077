//! The collectives' own settings, from `P2P_*` variables (the transport's are in
//! `p2p_transport::config`, which accepts these names and leaves them to this module).
//!
//! | variable | values | default | effect |
//! | --- | --- | --- | --- |
//! | `P2P_ALGO` | `auto`, `oneshot`, `twoshot`, `ring`, `ll`, `pipe` | `auto` | force one all-reduce algorithm (`pipe`: not yet run on a GPU) |
//! | `P2P_CHECK` | boolean | `0` | compare every call's operation, type, reduction, root and count across ranks on the GPU and fail on a mismatch |
//! | `P2P_TIMEOUT_MS` | milliseconds, 1 to 86400000 (one day) | `30000` | how long a collective's kernel waits for a peer before it gives up with an error |

use std::time::Duration;

/// The longest time limit a collective accepts (`P2P_TIMEOUT_MS`, `Options::timeout`): one day,
/// the transport's [`p2p_transport::MAX_TIMEOUT`].
pub const MAX_TIMEOUT: Duration = p2p_transport::MAX_TIMEOUT;

use p2p_transport::config::{invalid, parse_bool, parse_choice, ConfigError};

/// This crate's `P2P_*` variables, for the transport's reader, which accepts them and leaves
/// them to [`Settings`] (the one list: [`p2p_transport::config::SETTINGS`]).
#[linkme::distributed_slice(p2p_transport::config::SETTINGS)]
static COLLECTIVE_SETTINGS: &[&str] = &["P2P_ALGO", "P2P_CHECK", "P2P_TIMEOUT_MS"];

/// An all-reduce algorithm forced with `P2P_ALGO`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Algorithm {
    /// Every rank pushes its whole input to every peer and reduces locally: one step, least
    /// latency; moves (n-1) x the data per rank.
    OneShot,
    /// Reduce-scatter then all-gather over the full mesh: two steps, 2(n-1)/n x the data.
    TwoShot,
    /// Reduce-scatter then all-gather around a ring: 2(n-1) steps, 2(n-1)/n x the data, only
    /// neighbours exchange data.
    Ring,
    /// One-shot with the flags inside the data (NCCL's LL layout: 8 data bytes and two flags per
    /// 16-byte store): no separate flag and no fence, for messages up to
    /// [`LL_MAX_BYTES`](crate::plan::LL_MAX_BYTES) per source (larger ones run one-shot).
    Ll,
    /// One-shot with each block's push and reduction overlapped: half its warps push
    /// sub-pieces into the peers' scratch and flag each, the other half reduce each sub-piece
    /// as its flags arrive. Up to one round of the scratch (`max_blocks x piece_bytes`, 16 MiB
    /// on H200); larger calls run one-shot. Compiled and planned, not yet run on a GPU
    /// (docs/perf-notes.md §33).
    Pipe,
}

impl Algorithm {
    /// The names `P2P_ALGO` uses (`None` is `auto`).
    pub const NAMES: [(&'static str, Option<Algorithm>); 6] = [
        ("auto", None),
        ("oneshot", Some(Algorithm::OneShot)),
        ("twoshot", Some(Algorithm::TwoShot)),
        ("ring", Some(Algorithm::Ring)),
        ("ll", Some(Algorithm::Ll)),
        ("pipe", Some(Algorithm::Pipe)),
    ];

    /// The name, e.g. `oneshot`.
    pub fn name(self) -> &'static str {
        match self {
            Algorithm::OneShot => "oneshot",
            Algorithm::TwoShot => "twoshot",
            Algorithm::Ring => "ring",
            Algorithm::Ll => "ll",
            Algorithm::Pipe => "pipe",
        }
    }
}

/// The collectives' settings as the environment gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// `P2P_ALGO` (`None`: chosen by size and world size).
    pub algorithm: Option<Algorithm>,
    /// `P2P_CHECK`.
    pub check: bool,
    /// `P2P_TIMEOUT_MS`.
    pub timeout: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            algorithm: None,
            check: false,
            timeout: Duration::from_millis(30_000),
        }
    }
}

impl Settings {
    /// Reads `(name, value)` pairs; every other variable is left alone (the transport's
    /// `Config::from_vars` refuses unknown `P2P_*` names).
    pub fn from_vars(
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Settings, ConfigError> {
        let mut s = Settings::default();
        // Only this crate's own names (the list the transport's reader accepts them from; read
        // here, so the list is linked into every program that reads these settings).
        for (name, value) in vars
            .into_iter()
            .filter(|(n, _)| COLLECTIVE_SETTINGS.contains(&n.as_str()))
        {
            match name.as_str() {
                "P2P_ALGO" => s.algorithm = parse_choice(&name, &value, &Algorithm::NAMES)?,
                "P2P_CHECK" => s.check = parse_bool(&name, &value)?,
                "P2P_TIMEOUT_MS" => {
                    s.timeout = match value.trim().parse::<u64>() {
                        Ok(ms) if ms > 0 && ms <= MAX_TIMEOUT.as_millis() as u64 => {
                            Duration::from_millis(ms)
                        }
                        _ => {
                            return Err(invalid(
                                &name,
                                &value,
                                "a whole number of milliseconds, 1 to 86400000 (one day)",
                            ))
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(s)
    }

    /// Reads the process environment.
    pub fn from_env() -> Result<Settings, ConfigError> {
        Self::from_vars(std::env::vars_os().filter_map(|(k, v)| {
            Some((k.into_string().ok()?, v.into_string().unwrap_or_default()))
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(vars: &[(&str, &str)]) -> Result<Settings, ConfigError> {
        Settings::from_vars(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    }

    #[test]
    fn the_collective_settings_are_read_here() {
        let s = read(&[
            ("P2P_ALGO", "Ring"),
            ("P2P_CHECK", "1"),
            ("P2P_TIMEOUT_MS", "250"),
        ])
        .expect("valid");
        assert_eq!(
            (s.algorithm, s.check, s.timeout),
            (Some(Algorithm::Ring), true, Duration::from_millis(250))
        );
        assert_eq!(
            read(&[("P2P_LEVEL", "NVL")]).expect("not ours"),
            Settings::default()
        );
    }

    #[test]
    fn the_transport_reader_accepts_this_crates_variables_from_its_own_list() {
        // The transport does not name them: this crate's slice entry is what it reads.
        let vars = [
            ("P2P_ALGO", "ring"),
            ("P2P_CHECK", "1"),
            ("P2P_TIMEOUT_MS", "250"),
        ];
        let cfg = p2p_transport::config::Config::from_vars(
            vars.iter().map(|(k, v)| (k.to_string(), v.to_string())),
        );
        assert_eq!(cfg, Ok(p2p_transport::config::Config::default()));
        for (name, _) in vars {
            assert!(p2p_transport::config::variables().contains(&name), "{name}");
        }
        // A bad value is still refused, by this crate's reader.
        assert!(read(&[("P2P_CHECK", "maybe")]).is_err());
    }

    #[test]
    fn a_zero_or_unparsable_timeout_is_refused() {
        for bad in ["0", "-5", "1.5", "soon"] {
            let e = read(&[("P2P_TIMEOUT_MS", bad)]).expect_err(bad);
            assert!(e.to_string().contains("P2P_TIMEOUT_MS"), "{e}");
        }
        let e = read(&[("P2P_ALGO", "fast")]).expect_err("fast");
        assert!(e.to_string().contains("oneshot"), "{e}");
    }
}
