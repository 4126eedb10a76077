//! Configuration: built in code, or read from `P2P_*` environment variables.
//!
//! Every variable, its values and its default:
//!
//! | variable | values | default | effect |
//! | --- | --- | --- | --- |
//! | `P2P_DISABLE` | `0`/`1` (also `true`/`false`, `yes`/`no`, `on`/`off`) | `0` | never use direct P2P between GPUs; go host-staged |
//! | `P2P_LEVEL` | `LOC`, `NVL`, `PIX`, `PXB`, `PHB`, `SYS` | `SYS` | the farthest path class over which P2P is used: `NVL` = NVLink only, `PIX` = one PCIe switch, ... `SYS` = any; `LOC` = never across GPUs |
//! | `P2P_READ` | `on`, `off`, `auto` | `auto` | receiver pulls (read) instead of sender pushes (write); `auto` picks per path |
//! | `P2P_DIRECT_DISABLE` | boolean | `0` | within one process, share memory through IPC handles instead of plain pointers |
//! | `P2P_USE_COPY_ENGINE` | boolean | `0` | move bulk data with the copy engines instead of SM kernels |
//! | `P2P_CUMEM` | boolean | `1` | between processes, share cuMem allocations (fds) rather than legacy IPC handles |
//! | `P2P_INTERMEDIATE` | boolean | `1` | relay through a third GPU where two have no direct P2P |
//! | `P2P_MODE` | `auto`, `direct`, `ipc`, `cumem`, `intermediate`, `host` | `auto` | force one mode for every pair; impossible on a pair is an error |
//! | `P2P_DEBUG` | `off`, `error`, `warn`, `info`, `debug`, `trace` | `warn` | how much `tracing` output the tools print |
//! | `P2P_DEBUG_SUBSYS` | comma list of `all`, `mem`, `topo`, `config`, `transport`, `doctor`, `coll` | `all` | which parts log at `P2P_DEBUG` level |
//!
//! Other crates' settings (p2p-collective's `P2P_ALGO`, `P2P_CHECK`, `P2P_TIMEOUT_MS`) belong to
//! those crates, which read them and list them in [`SETTINGS`]; here they are accepted and left
//! alone, and this crate does not name them.
//!
//! Nothing is silently ignored: a bad value is an error naming the variable, the value and what
//! is accepted, and so is an unknown `P2P_*` variable (a typo such as `P2P_LEVLE` would otherwise
//! do nothing).
//!
//! ```
//! use p2p_transport::config::{Config, PathLevel};
//! let vars = [("P2P_LEVEL", "NVL"), ("P2P_USE_COPY_ENGINE", "1")];
//! let cfg = Config::from_vars(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())))?;
//! assert_eq!(cfg.p2p_level, PathLevel::Nvl);
//! assert!(cfg.use_copy_engine);
//! # Ok::<(), p2p_transport::config::ConfigError>(())
//! ```

use serde::{Deserialize, Serialize};

/// How far apart two GPUs may be for direct P2P, in the order NCCL uses (nearest first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum PathLevel {
    /// The same GPU only: never P2P across GPUs.
    Loc,
    /// Over NVLink (directly or through NVSwitch).
    Nvl,
    /// Through at most one PCIe switch.
    Pix,
    /// Through several PCIe switches, without the host bridge.
    Pxb,
    /// Through a PCIe host bridge (the CPU's root complex).
    Phb,
    /// Between host bridges of one NUMA node.
    Node,
    /// Across NUMA nodes (the SMP interconnect).
    Sys,
}

impl PathLevel {
    /// The names `nvidia-smi topo -m` and `P2P_LEVEL` use.
    pub const NAMES: [(&'static str, PathLevel); 7] = [
        ("LOC", PathLevel::Loc),
        ("NVL", PathLevel::Nvl),
        ("PIX", PathLevel::Pix),
        ("PXB", PathLevel::Pxb),
        ("PHB", PathLevel::Phb),
        ("NODE", PathLevel::Node),
        ("SYS", PathLevel::Sys),
    ];

    /// The short name, e.g. `PHB`.
    pub fn name(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(_, l)| *l == self)
            .map(|(n, _)| *n)
            .unwrap_or("?")
    }
}

impl std::fmt::Display for PathLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// On, off, or chosen per path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Switch {
    /// Always.
    On,
    /// Never.
    Off,
    /// Decided per path from the topology.
    Auto,
}

/// A transport mode forced for every pair with `P2P_MODE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ForcedMode {
    /// Plain device pointers within one process.
    Direct,
    /// Legacy CUDA IPC handles.
    Ipc,
    /// cuMem allocations shared as POSIX fds.
    CuMem,
    /// Relay through a third GPU.
    Intermediate,
    /// Through pinned host memory.
    HostStaged,
}

/// Logging verbosity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum DebugLevel {
    /// Nothing.
    Off,
    /// Errors only.
    Error,
    /// Warnings and errors.
    Warn,
    /// Mode decisions and other notable events.
    Info,
    /// Details of every step.
    Debug,
    /// Everything.
    Trace,
}

impl DebugLevel {
    fn name(self) -> &'static str {
        match self {
            DebugLevel::Off => "off",
            DebugLevel::Error => "error",
            DebugLevel::Warn => "warn",
            DebugLevel::Info => "info",
            DebugLevel::Debug => "debug",
            DebugLevel::Trace => "trace",
        }
    }
}

/// The parts of p2p that log, as `P2P_DEBUG_SUBSYS` names them.
pub const SUBSYSTEMS: [(&str, &str); 6] = [
    ("mem", "p2p_mem"),
    ("topo", "p2p_transport::topo"),
    ("config", "p2p_transport::config"),
    ("transport", "p2p_transport"),
    ("doctor", "p2p_bench::doctor"),
    ("coll", "p2p_collective"),
];

/// The p2p configuration. `Config::default()` is what an empty environment gives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Config {
    /// `P2P_DISABLE`: no direct P2P between GPUs at all.
    pub p2p_disable: bool,
    /// `P2P_LEVEL`: the farthest path class over which P2P is used.
    pub p2p_level: PathLevel,
    /// `P2P_READ`: read (pull) or write (push) mode.
    pub read: Switch,
    /// `P2P_DIRECT_DISABLE`: no plain-pointer sharing within a process.
    pub direct_disable: bool,
    /// `P2P_USE_COPY_ENGINE`: copy engines instead of SM kernels.
    pub use_copy_engine: bool,
    /// `P2P_CUMEM`: cuMem fd sharing between processes where supported.
    pub cumem: bool,
    /// `P2P_INTERMEDIATE`: relay through a third GPU where needed.
    pub intermediate: bool,
    /// `P2P_MODE`: force one transport mode for every pair (`None`: choose per pair).
    pub force_mode: Option<ForcedMode>,
    /// `P2P_DEBUG`: log verbosity.
    pub debug: DebugLevel,
    /// `P2P_DEBUG_SUBSYS`: which subsystems log at `debug` level (empty = all).
    pub debug_subsystems: Vec<String>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            p2p_disable: false,
            p2p_level: PathLevel::Sys,
            read: Switch::Auto,
            direct_disable: false,
            use_copy_engine: false,
            cumem: true,
            intermediate: true,
            force_mode: None,
            debug: DebugLevel::Warn,
            debug_subsystems: Vec::new(),
        }
    }
}

/// A configuration variable that could not be used.
#[derive(Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The value is not one of those accepted.
    #[error("{variable}={value:?} is not valid: accepted values are {accepted}")]
    Invalid {
        /// The variable.
        variable: String,
        /// The value given.
        value: String,
        /// What would have been accepted.
        accepted: String,
    },
    /// A `P2P_*` variable that p2p does not know.
    #[error("{variable} is not a p2p setting (a typo?); the settings are: {known}")]
    Unknown {
        /// The variable.
        variable: String,
        /// Every known variable.
        known: String,
    },
}
p2p_sys::debug_as_display!(ConfigError);

/// Every crate's `P2P_*` variables, one list per crate, gathered at link time: a crate adds its
/// own with `#[linkme::distributed_slice(p2p_transport::config::SETTINGS)]` on a
/// `static NAME: &[&str]`. The reader of [`Config`] accepts every name in it and reports any
/// other `P2P_*` name as unknown, without one crate naming another's settings. A crate that is
/// not linked into the program adds nothing (and nothing reads its variables).
#[linkme::distributed_slice]
pub static SETTINGS: [&'static [&'static str]];

/// The transport's own variables (those [`Config`] reads), the rendezvous's (`P2P_JOB_ID`,
/// `P2P_JOB_SECRET`, `P2P_ALLOW_NO_SECRET`, `P2P_RENDEZVOUS_DIR`, `P2P_RENDEZVOUS_TIMEOUT_MS`, `P2P_HOST_ID`, read by
/// [`crate::rendezvous`]; `P2P_LAUNCH_FD` and `P2P_LAUNCHER_PID`, set by a launcher for
/// [`crate::launch`]), and the kernel runtime's `P2P_KERNELS` (p2p-mem, below the transport:
/// checked here so that a bad value is an error like any other setting's).
#[linkme::distributed_slice(SETTINGS)]
static TRANSPORT_SETTINGS: &[&str] = &[
    "P2P_DISABLE",
    "P2P_LEVEL",
    "P2P_READ",
    "P2P_DIRECT_DISABLE",
    "P2P_USE_COPY_ENGINE",
    "P2P_CUMEM",
    "P2P_INTERMEDIATE",
    "P2P_MODE",
    "P2P_JOB_ID",
    "P2P_JOB_SECRET",
    "P2P_ALLOW_NO_SECRET",
    "P2P_RENDEZVOUS_DIR",
    "P2P_RENDEZVOUS_TIMEOUT_MS",
    "P2P_HOST_ID",
    "P2P_LAUNCH_FD",
    "P2P_LAUNCHER_PID",
    "P2P_DEBUG",
    "P2P_DEBUG_SUBSYS",
    "P2P_KERNELS",
];

/// Whether a crate of this program reads the variable `name` ([`SETTINGS`]); no allocation, as
/// the reader asks for every `P2P_*` variable each time a configuration is read.
pub fn is_known(name: &str) -> bool {
    SETTINGS.iter().any(|list| list.contains(&name))
}

/// Every `P2P_*` variable a crate of this program reads ([`SETTINGS`]), in link order.
pub fn variables() -> Vec<&'static str> {
    SETTINGS
        .iter()
        .flat_map(|list| list.iter().copied())
        .collect()
}

/// The error for `variable=value` where `accepted` says what would do.
pub fn invalid(variable: &str, value: &str, accepted: &str) -> ConfigError {
    ConfigError::Invalid {
        variable: variable.into(),
        value: value.into(),
        accepted: accepted.into(),
    }
}

/// `P2P_RENDEZVOUS_TIMEOUT_MS`: how long the rendezvous waits for the other ranks, 1 ms to
/// [`crate::MAX_TIMEOUT`] (one day), or an error naming the variable and the range.
pub(crate) fn rendezvous_timeout(value: &str) -> Result<std::time::Duration, ConfigError> {
    value
        .trim()
        .parse::<u64>()
        .ok()
        .map(std::time::Duration::from_millis)
        .filter(|t| !t.is_zero() && *t <= crate::MAX_TIMEOUT)
        .ok_or_else(|| {
            invalid(
                "P2P_RENDEZVOUS_TIMEOUT_MS",
                value,
                "a whole number of milliseconds from 1 to 86400000 (one day)",
            )
        })
}

/// `P2P_JOB_SECRET`: at least [`crate::rendezvous::MIN_SECRET_LEN`] characters. The error gives
/// its length, never the value (it would land in logs).
pub(crate) fn check_secret(value: &str) -> Result<(), ConfigError> {
    let min = crate::rendezvous::MIN_SECRET_LEN;
    if value.len() >= min {
        return Ok(());
    }
    Err(invalid(
        "P2P_JOB_SECRET",
        &format!("<{} characters>", value.len()),
        &format!("at least {min} characters (e.g. `openssl rand -hex 16`)"),
    ))
}

/// Reads a boolean setting (`0`/`1`, `true`/`false`, `yes`/`no`, `on`/`off`), or an error naming
/// the variable, the value and what is accepted. For the settings of higher layers too.
pub fn parse_bool(variable: &str, value: &str) -> Result<bool, ConfigError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Ok(true),
        "0" | "false" | "no" | "off" => Ok(false),
        _ => Err(invalid(
            variable,
            value,
            "0, 1, true, false, yes, no, on, off",
        )),
    }
}

/// Reads one of `choices` (by name, any case), or an error naming the variable, the value and
/// the choices. For the settings of higher layers too.
pub fn parse_choice<T: Copy>(
    variable: &str,
    value: &str,
    choices: &[(&str, T)],
) -> Result<T, ConfigError> {
    let v = value.trim();
    choices
        .iter()
        .find(|(name, _)| name.eq_ignore_ascii_case(v))
        .map(|(_, t)| *t)
        .ok_or_else(|| {
            invalid(
                variable,
                value,
                &choices
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(", "),
            )
        })
}

/// The process environment as `(name, value)` pairs, what every crate's settings are read
/// from (a name that is not text is left out; a value that is not text reads as empty, which
/// every setting refuses).
pub fn environment() -> impl Iterator<Item = (String, String)> {
    std::env::vars_os()
        .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().unwrap_or_default())))
}

/// Reads a time limit in whole milliseconds, 1 up to `max`, or an error naming the variable,
/// the value and the range. For the settings of higher layers too.
pub fn parse_millis(
    variable: &str,
    value: &str,
    max: std::time::Duration,
) -> Result<std::time::Duration, ConfigError> {
    let most = max.as_millis().min(u64::MAX as u128) as u64;
    match value.trim().parse::<u64>() {
        Ok(ms) if ms > 0 && ms <= most => Ok(std::time::Duration::from_millis(ms)),
        _ => Err(invalid(
            variable,
            value,
            &format!("a whole number of milliseconds, 1 to {most}"),
        )),
    }
}

impl Config {
    /// Reads the process environment.
    pub fn from_env() -> Result<Config, ConfigError> {
        Self::from_vars(environment())
    }

    /// As [`from_env`](Self::from_env), for libraries inside a user's program: an unknown
    /// `P2P_*` variable is a warning naming it (a typo must not stop someone's training job),
    /// a bad value of a known one is still an error. `p2p-bench` reads its settings this way
    /// too, so the tool and the library treat a variable alike.
    pub fn from_env_lenient() -> Result<Config, ConfigError> {
        Self::read(environment(), false)
    }

    /// Reads `(name, value)` pairs; names not starting with `P2P_` are ignored, an unknown
    /// `P2P_*` name is an error.
    pub fn from_vars(
        vars: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        Self::read(vars, true)
    }

    fn read(
        vars: impl IntoIterator<Item = (String, String)>,
        strict: bool,
    ) -> Result<Config, ConfigError> {
        let mut cfg = Config::default();
        for (name, value) in vars {
            if !name.starts_with("P2P_") {
                continue;
            }
            match name.as_str() {
                "P2P_DISABLE" => cfg.p2p_disable = parse_bool(&name, &value)?,
                "P2P_LEVEL" => cfg.p2p_level = parse_choice(&name, &value, &PathLevel::NAMES)?,
                "P2P_READ" => {
                    cfg.read = parse_choice(
                        &name,
                        &value,
                        &[
                            ("on", Switch::On),
                            ("off", Switch::Off),
                            ("auto", Switch::Auto),
                        ],
                    )?
                }
                "P2P_DIRECT_DISABLE" => cfg.direct_disable = parse_bool(&name, &value)?,
                "P2P_USE_COPY_ENGINE" => cfg.use_copy_engine = parse_bool(&name, &value)?,
                "P2P_CUMEM" => cfg.cumem = parse_bool(&name, &value)?,
                "P2P_INTERMEDIATE" => cfg.intermediate = parse_bool(&name, &value)?,
                "P2P_MODE" => {
                    let choices = [
                        ("auto", None),
                        ("direct", Some(ForcedMode::Direct)),
                        ("ipc", Some(ForcedMode::Ipc)),
                        ("cumem", Some(ForcedMode::CuMem)),
                        ("intermediate", Some(ForcedMode::Intermediate)),
                        ("host", Some(ForcedMode::HostStaged)),
                    ];
                    cfg.force_mode = parse_choice(&name, &value, &choices)?
                }
                // The rendezvous's: `rendezvous::Rendezvous::from_env` reads them when a job
                // starts; the values it would refuse are refused here too, at once.
                "P2P_RENDEZVOUS_TIMEOUT_MS" => {
                    rendezvous_timeout(&value)?;
                }
                "P2P_JOB_SECRET" => check_secret(&value)?,
                "P2P_ALLOW_NO_SECRET" => {
                    parse_bool(&name, &value)?;
                }
                "P2P_HOST_ID" if value.trim().is_empty() => {
                    return Err(invalid(
                        &name,
                        &value,
                        "a name for this host (or leave it unset: the host name is used)",
                    ))
                }
                "P2P_JOB_ID" | "P2P_RENDEZVOUS_DIR" | "P2P_HOST_ID" | "P2P_LAUNCH_FD"
                | "P2P_LAUNCHER_PID" => {}
                "P2P_DEBUG" => {
                    let levels = [
                        DebugLevel::Off,
                        DebugLevel::Error,
                        DebugLevel::Warn,
                        DebugLevel::Info,
                        DebugLevel::Debug,
                        DebugLevel::Trace,
                    ];
                    let choices: Vec<(&str, DebugLevel)> =
                        levels.iter().map(|l| (l.name(), *l)).collect();
                    cfg.debug = parse_choice(&name, &value, &choices)?
                }
                "P2P_DEBUG_SUBSYS" => cfg.debug_subsystems = parse_subsystems(&name, &value)?,
                // The kernel runtime's (`p2p_mem::kernel::prefer_compile` reads it): checked
                // here so that a bad value is an error like any other setting's.
                "P2P_KERNELS" => {
                    parse_choice(&name, &value, &[("shipped", ()), ("compile", ())])?;
                }
                // Another crate's (p2p-collective's, ...): that crate reads it.
                other if is_known(other) => {}
                _ => {
                    let known = variables().join(", ");
                    if strict {
                        return Err(ConfigError::Unknown {
                            variable: name,
                            known,
                        });
                    }
                    crate::warn_user!(
                        "{name} is not a p2p setting (a typo?) and is ignored; the settings are: {known}"
                    );
                }
            }
        }
        Ok(cfg)
    }

    /// A `tracing` filter directive for this configuration, e.g. `warn,p2p_mem=debug`.
    pub fn tracing_filter(&self) -> String {
        let level = self.debug.name();
        if self.debug_subsystems.is_empty() {
            return format!(
                "warn,p2p_sys={level},p2p_mem={level},p2p_transport={level},p2p_collective={level}"
            );
        }
        let mut f = String::from("warn");
        for s in &self.debug_subsystems {
            if let Some((_, target)) = SUBSYSTEMS.iter().find(|(n, _)| n == s) {
                f += &format!(",{target}={level}");
            }
        }
        f
    }
}

/// Whether this thread's `tracing` events reach a subscriber: `false` in a program that set up
/// no logging (no global default and no scoped one), where the library's log goes nowhere.
pub fn log_is_heard() -> bool {
    !tracing::dispatcher::get_default(|d| d.is::<tracing::subscriber::NoSubscriber>())
}

/// The second half of [`warn_user!`](crate::warn_user): prints `message` to stderr as one line
/// `p2p warning: ...` where no `tracing` subscriber would receive it, once per process for each
/// distinct message (the configuration is read again for every pair of GPUs a copy meets, and
/// a misspelt variable would otherwise be reported that often).
#[doc(hidden)]
pub fn warn_unheard(message: &str) {
    static PRINTED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
    if log_is_heard() {
        return;
    }
    let mut printed = PRINTED.lock().unwrap_or_else(|p| p.into_inner());
    // At most a few distinct messages a process: a list is enough, and bounded anyway.
    if printed.iter().any(|m| m == message) || printed.len() >= 256 {
        return;
    }
    printed.push(message.to_string());
    eprintln!("p2p warning: {message}");
}

/// Logs a warning that asks the user to act (a misspelt `P2P_*` variable, a job without a
/// secret, ranks sharing a GPU) at `warn`, as the library logs everything, and also prints it
/// to stderr (once per distinct message) where the program installed no `tracing` subscriber. With
/// a subscriber they go only through the program's log, under its filter.
#[doc(hidden)]
#[macro_export]
macro_rules! warn_user {
    ($($arg:tt)+) => {{
        let message = ::std::format!($($arg)+);
        $crate::__tracing::warn!("{message}");
        $crate::config::warn_unheard(&message);
    }};
}

fn parse_subsystems(variable: &str, value: &str) -> Result<Vec<String>, ConfigError> {
    let mut out = Vec::new();
    for part in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let part = part.to_ascii_lowercase();
        if part == "all" {
            return Ok(Vec::new());
        }
        if !SUBSYSTEMS.iter().any(|(n, _)| *n == part) {
            let accepted: Vec<&str> = std::iter::once("all")
                .chain(SUBSYSTEMS.iter().map(|(n, _)| *n))
                .collect();
            return Err(invalid(
                variable,
                value,
                &format!("a comma list of {}", accepted.join(", ")),
            ));
        }
        out.push(part);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(vars: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::from_vars(vars.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    }

    /// The error of reading `vars`, which must be refused with a message that says `words`.
    #[track_caller]
    fn refused(vars: &[(&str, &str)], words: &str) -> ConfigError {
        let e = cfg(vars).expect_err("refused");
        assert!(e.to_string().contains(words), "{e}");
        e
    }

    #[test]
    fn an_empty_environment_gives_the_defaults() {
        assert_eq!(
            cfg(&[("PATH", "/bin"), ("NCCL_P2P_LEVEL", "NVL")]),
            Ok(Config::default())
        );
    }

    #[test]
    fn every_variable_is_read() {
        let c = cfg(&[
            ("P2P_DISABLE", "yes"),
            ("P2P_LEVEL", "pxb"),
            ("P2P_READ", "ON"),
            ("P2P_DIRECT_DISABLE", "1"),
            ("P2P_USE_COPY_ENGINE", "true"),
            ("P2P_CUMEM", "0"),
            ("P2P_INTERMEDIATE", "off"),
            ("P2P_MODE", "host"),
            ("P2P_DEBUG", "debug"),
            ("P2P_DEBUG_SUBSYS", "mem, topo"),
        ])
        .expect("valid");
        assert!(c.p2p_disable && c.direct_disable && c.use_copy_engine);
        assert!(!c.cumem && !c.intermediate);
        assert_eq!(c.force_mode, Some(ForcedMode::HostStaged));
        assert_eq!(
            (c.p2p_level, c.read, c.debug),
            (PathLevel::Pxb, Switch::On, DebugLevel::Debug)
        );
        assert_eq!(c.debug_subsystems, ["mem", "topo"]);
        assert_eq!(
            c.tracing_filter(),
            "warn,p2p_mem=debug,p2p_transport::topo=debug"
        );
    }

    #[test]
    fn the_rendezvous_settings_are_checked_at_start_and_a_secret_is_never_echoed() {
        for ok in [
            ("P2P_RENDEZVOUS_TIMEOUT_MS", "1"),
            ("P2P_RENDEZVOUS_TIMEOUT_MS", " 86400000 "),
            ("P2P_JOB_SECRET", "0123456789abcdef"),
            ("P2P_HOST_ID", "host-a"),
            ("P2P_JOB_ID", ""),
        ] {
            assert_eq!(cfg(&[ok]), Ok(Config::default()), "{ok:?}");
        }
        for bad in ["0", "86400001", "abc", "-5", "1.5"] {
            refused(
                &[("P2P_RENDEZVOUS_TIMEOUT_MS", bad)],
                "a whole number of milliseconds from 1 to 86400000",
            );
        }
        let e = refused(&[("P2P_JOB_SECRET", "hunter2")], "at least 16 characters");
        assert!(e.to_string().contains("<7 characters>"), "{e}");
        assert!(!e.to_string().contains("hunter2"), "{e}");
        refused(&[("P2P_HOST_ID", "  ")], "a name for this host");
    }

    #[test]
    fn bad_values_name_the_variable_the_value_and_the_choices() {
        let e = cfg(&[("P2P_LEVEL", "NVLINK")]).expect_err("invalid");
        assert_eq!(e.to_string(), "P2P_LEVEL=\"NVLINK\" is not valid: accepted values are LOC, NVL, PIX, PXB, PHB, NODE, SYS");
        let e = cfg(&[("P2P_DISABLE", "maybe")]).expect_err("invalid");
        assert!(
            e.to_string()
                .starts_with("P2P_DISABLE=\"maybe\" is not valid: accepted values are 0, 1"),
            "{e}"
        );
        let e = cfg(&[("P2P_READ", "")]).expect_err("invalid");
        assert!(matches!(e, ConfigError::Invalid { ref variable, .. } if variable == "P2P_READ"));
        refused(
            &[("P2P_DEBUG_SUBSYS", "mem,net")],
            "a comma list of all, mem, topo",
        );
    }

    #[test]
    fn p2p_kernels_takes_shipped_or_compile() {
        assert!(cfg(&[("P2P_KERNELS", "compile")]).is_ok());
        assert!(cfg(&[("P2P_KERNELS", "shipped")]).is_ok());
        refused(
            &[("P2P_KERNELS", "nvcc")],
            "P2P_KERNELS=\"nvcc\" is not valid",
        );
    }

    #[test]
    fn unknown_p2p_variables_only_warn_in_the_lenient_reader() {
        let vars = vec![("P2P_LEVLE".to_string(), "NVL".to_string())];
        assert!(Config::read(vars.clone(), false).is_ok());
        assert!(Config::read(vars, true).is_err());
        // A bad value of a known variable stays an error.
        let bad = vec![("P2P_LEVEL".to_string(), "nowhere".to_string())];
        assert!(Config::read(bad, false).is_err());
    }

    #[test]
    fn unknown_p2p_variables_are_errors_not_ignored() {
        let e = refused(&[("P2P_LEVLE", "NVL")], "P2P_LEVEL");
        assert!(matches!(&e, ConfigError::Unknown { variable, .. } if variable == "P2P_LEVLE"));
        // The collectives' variables are p2p-collective's to list: in a program without it
        // (this test binary) nothing reads them, so they are unknown here like any other.
        assert!(variables().contains(&"P2P_KERNELS") && variables().contains(&"P2P_JOB_ID"));
        assert!(!variables().contains(&"P2P_ALGO"));
        let e = cfg(&[("P2P_ALGO", "ring")]).expect_err("not linked");
        assert!(matches!(&e, ConfigError::Unknown { variable, .. } if variable == "P2P_ALGO"));
    }

    #[test]
    fn levels_are_ordered_nearest_first() {
        assert!(PathLevel::Loc < PathLevel::Nvl && PathLevel::Nvl < PathLevel::Pix);
        assert!(PathLevel::Phb < PathLevel::Node && PathLevel::Node < PathLevel::Sys);
        assert_eq!(PathLevel::Node.to_string(), "NODE");
        assert_eq!(
            cfg(&[("P2P_DEBUG_SUBSYS", "all")])
                .map(|c| c.tracing_filter())
                .ok()
                .map(|f| f.contains("p2p_mem=warn")),
            Some(true)
        );
    }
}
