//! The collectives' own settings, from `P2P_*` variables (the transport's are in
//! `p2p_transport::config`, which accepts these names and leaves them to this module).
//!
//! | variable | values | default | effect |
//! | --- | --- | --- | --- |
//! | `P2P_ALGO` | `auto` or an algorithm's name ([`Algo::name`]: `oneshot`, `twoshot`, `ring`, `split`, `direct`, `pipe`, `push`, `splitout`, `relay`) | `auto` | run every call that algorithm can run with it |
//! | `P2P_PROTO` | `auto` or a protocol's name ([`Proto::name`]: `ll`, `simple`, `ce`) | `auto` | run every call that protocol can carry with it |
//! | `P2P_CHECK` | boolean | `0` | compare every call's operation, type, reduction, root and count across ranks on the GPU and fail on a mismatch |
//! | `P2P_TIMEOUT_MS` | milliseconds, 1 to 86400000 (one day) | `30000` | how long a collective's kernel waits for a peer before it gives up with an error |
//!
//! A forced algorithm or protocol that cannot run a call (see [`Forced`]) leaves that call to
//! the planner, which logs why.

use std::time::Duration;

use crate::plan::{Algo, Forced, Proto};

/// The longest time limit a collective accepts (`P2P_TIMEOUT_MS`, `Options::timeout`): one day,
/// the transport's [`p2p_transport::MAX_TIMEOUT`].
pub const MAX_TIMEOUT: Duration = p2p_transport::MAX_TIMEOUT;

use p2p_transport::config::{environment, invalid, parse_bool, parse_millis, ConfigError};

/// This crate's `P2P_*` variables, for the transport's reader, which accepts them and leaves
/// them to [`Settings`] (the one list: [`p2p_transport::config::SETTINGS`]).
#[linkme::distributed_slice(p2p_transport::config::SETTINGS)]
static COLLECTIVE_SETTINGS: &[&str] = &["P2P_ALGO", "P2P_PROTO", "P2P_CHECK", "P2P_TIMEOUT_MS"];

/// The collectives' settings as the environment gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// `P2P_ALGO` and `P2P_PROTO`.
    pub forced: Forced,
    /// `P2P_CHECK`.
    pub check: bool,
    /// `P2P_TIMEOUT_MS`.
    pub timeout: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            forced: Forced::AUTO,
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
                "P2P_ALGO" => s.forced.algo = parse_algo(&name, &value)?,
                "P2P_PROTO" => s.forced.proto = parse_proto(&name, &value)?,
                "P2P_CHECK" => s.check = parse_bool(&name, &value)?,
                "P2P_TIMEOUT_MS" => s.timeout = parse_millis(&name, &value, MAX_TIMEOUT)?,
                _ => {}
            }
        }
        Ok(s)
    }

    /// Reads the process environment.
    pub fn from_env() -> Result<Settings, ConfigError> {
        Self::from_vars(environment())
    }
}

/// `auto` (`None`) or an algorithm by its name, any case.
fn parse_algo(name: &str, value: &str) -> Result<Option<Algo>, ConfigError> {
    let v = value.trim().to_ascii_lowercase();
    if v == "auto" {
        return Ok(None);
    }
    if let Some(a) = Algo::from_name(&v) {
        return Ok(Some(a));
    }
    let names: Vec<&str> = Algo::ALL.iter().map(|a| a.name()).collect();
    let lead = if Proto::from_name(&v).is_some() {
        format!("{v} is a protocol (P2P_PROTO={v}); P2P_ALGO is auto or one of ")
    } else {
        "auto or one of ".to_string()
    };
    Err(invalid(name, value, &(lead + &names.join(", "))))
}

/// `auto` (`None`) or a protocol by its name, any case.
fn parse_proto(name: &str, value: &str) -> Result<Option<Proto>, ConfigError> {
    let v = value.trim().to_ascii_lowercase();
    if v == "auto" {
        return Ok(None);
    }
    Proto::from_name(&v).map(Some).ok_or_else(|| {
        let names: Vec<&str> = Proto::ALL.iter().map(|p| p.name()).collect();
        invalid(name, value, &format!("auto or one of {}", names.join(", ")))
    })
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
            ("P2P_PROTO", "simple"),
            ("P2P_CHECK", "1"),
            ("P2P_TIMEOUT_MS", "250"),
        ])
        .expect("valid");
        assert_eq!(
            (s.forced, s.check, s.timeout),
            (
                Forced::pair(Algo::Ring, Proto::Simple),
                true,
                Duration::from_millis(250)
            )
        );
        assert_eq!(
            read(&[("P2P_PROTO", "LL")]).expect("valid").forced,
            Forced {
                algo: None,
                proto: Some(Proto::Ll)
            }
        );
        assert_eq!(
            read(&[("P2P_ALGO", "auto"), ("P2P_PROTO", "auto")])
                .expect("valid")
                .forced,
            Forced::AUTO
        );
        assert_eq!(
            read(&[("P2P_LEVEL", "NVL")]).expect("not ours"),
            Settings::default()
        );
    }

    #[test]
    fn every_algorithm_and_protocol_is_named_by_its_setting() {
        for a in Algo::ALL {
            let s = read(&[("P2P_ALGO", a.name())]).expect("an algorithm");
            assert_eq!(s.forced, Forced::algo(a));
        }
        for p in Proto::ALL {
            let s = read(&[("P2P_PROTO", p.name())]).expect("a protocol");
            assert_eq!(s.forced.proto, Some(p));
        }
    }

    #[test]
    fn the_transport_reader_accepts_this_crates_variables_from_its_own_list() {
        // The transport does not name them: this crate's slice entry is what it reads.
        let vars = [
            ("P2P_ALGO", "ring"),
            ("P2P_PROTO", "ll"),
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
    fn bad_values_are_refused_with_what_is_allowed() {
        for bad in ["0", "-5", "1.5", "soon", "86400001"] {
            let e = read(&[("P2P_TIMEOUT_MS", bad)]).expect_err(bad);
            assert!(e.to_string().contains("P2P_TIMEOUT_MS"), "{e}");
        }
        let e = read(&[("P2P_ALGO", "fast")]).expect_err("fast");
        assert!(e.to_string().contains("oneshot"), "{e}");
        // LL is a protocol: the refusal says where it belongs.
        let e = read(&[("P2P_ALGO", "ll")]).expect_err("ll");
        assert!(e.to_string().contains("P2P_PROTO=ll"), "{e}");
        let e = read(&[("P2P_PROTO", "ring")]).expect_err("ring");
        assert!(e.to_string().contains("simple"), "{e}");
    }
}
