//! Every crate's `P2P_*` settings, checked before any command runs, by each crate's own reader:
//! the transport's (`p2p_transport::config::Config`, which also checks p2p-mem's `P2P_KERNELS`)
//! and the collectives' (`p2p_collective::Settings`: `P2P_ALGO`, `P2P_PROTO`, `P2P_CHECK`,
//! `P2P_TIMEOUT_MS`). A bad value is an error naming the variable, the value and what is
//! accepted; `p2p-bench` exits with [`crate::exit::USAGE`] on it.

use p2p_transport::config::{Config, ConfigError};

/// Reads and checks every crate's settings from the process environment; returns the
/// transport's configuration (the log filter comes from it). An unknown `P2P_*` name is a
/// warning, as in the library ([`Config::from_env_lenient`]).
pub fn check() -> Result<Config, ConfigError> {
    let config = Config::from_env_lenient()?;
    p2p_collective::Settings::from_env()?;
    Ok(config)
}
