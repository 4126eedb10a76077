//! Who a job is: its identity from the environment, its secret, and the key both sides prove.

use std::path::PathBuf;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

use super::*;

/// A job's secret: only processes that know it join the job. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret([u8; 32]);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// A secret from text (e.g. `P2P_JOB_SECRET`): at least [`MIN_SECRET_LEN`] characters.
    pub fn from_text(text: &str) -> Result<Secret> {
        if text.len() < MIN_SECRET_LEN {
            return Err(Error::Rendezvous {
                rank: None,
                why: format!(
                    "P2P_JOB_SECRET has {} characters; use at least {MIN_SECRET_LEN} (e.g. `openssl rand -hex 16`)",
                    text.len()
                ),
            });
        }
        Ok(Secret(Sha256::digest(text.as_bytes()).into()))
    }

    /// A fresh random secret as text (64 hex digits), for a launcher to hand to its ranks.
    pub fn generate_text() -> Result<String> {
        let bytes = random::<32>().map_err(|e| Error::Rendezvous {
            rank: None,
            why: format!("the OS random source failed: {e}"),
        })?;
        Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
    }
}

/// `N` bytes from the OS's random source; its failure as an `io::Error` (the OS's error where
/// there is one, so that it is described).
pub(super) fn random<const N: usize>() -> std::io::Result<[u8; N]> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| match e.raw_os_error() {
        Some(code) => std::io::Error::from_raw_os_error(code),
        None => std::io::Error::other(e.to_string()),
    })?;
    Ok(b)
}

/// Where and as whom a process joins a job.
#[derive(Debug, Clone)]
pub struct Rendezvous {
    /// This process's rank, `0..world`.
    pub rank: usize,
    /// How many processes join.
    pub world: usize,
    /// This process's rank among those on this host: its GPU ordinal by default.
    pub local_rank: usize,
    /// The job's identity: every rank of one job has the same, and no other job on this host
    /// does (see [`from_vars`](Self::from_vars) for how it is made from a launcher's variables).
    pub job: String,
    /// The job's secret, if the launcher gave one.
    pub secret: Option<Secret>,
    /// Whether a job of more than one rank may meet with no secret where its identity holds no
    /// random value (`P2P_ALLOW_NO_SECRET`): any process of this user that knows the identity
    /// could then join it. Off: such a job refuses to start, saying how to give it a secret.
    pub allow_no_secret: bool,
    /// The directory of the rendezvous socket (`None`: the default, see the module docs).
    pub dir: Option<PathBuf>,
    /// How long to wait for the others.
    pub timeout: Duration,
}

impl Rendezvous {
    /// Rank `rank` of `world` in the job `job`, with no secret, the default directory and a
    /// 60 s time limit.
    pub fn new(rank: usize, world: usize, job: impl Into<String>) -> Rendezvous {
        Rendezvous {
            rank,
            world,
            local_rank: rank,
            job: job.into(),
            secret: None,
            allow_no_secret: false,
            dir: None,
            timeout: Duration::from_secs(60),
        }
    }

    /// From the variables torchrun and `p2p-bench launch` set (see
    /// [`from_vars`](Self::from_vars)).
    pub fn from_env() -> Result<Rendezvous> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// From variables read through `get`:
    /// - `RANK`, `WORLD_SIZE` (required), `LOCAL_RANK` (default `RANK`); `LOCAL_WORLD_SIZE`, if
    ///   set, must equal `WORLD_SIZE` (this communicator spans one host; a job over several
    ///   hosts reads [`HostLayout`](super::HostLayout) and joins [`for_host`](Self::for_host));
    /// - the job's identity: `P2P_JOB_ID` if set, else `MASTER_ADDR` (default `127.0.0.1`),
    ///   `MASTER_PORT`, `TORCHELASTIC_RUN_ID` and `TORCHELASTIC_RESTART_COUNT` (so a restarted
    ///   torchrun job never meets its previous attempt) and `WORLD_SIZE`; one of `P2P_JOB_ID` and
    ///   `MASTER_PORT` must be set. No port is opened: `MASTER_PORT` only names the job;
    /// - `P2P_JOB_SECRET`: the job's secret (required for a job of more than one rank unless
    ///   its identity holds torchrun's random run id or `P2P_ALLOW_NO_SECRET` is set);
    /// - `P2P_RENDEZVOUS_DIR`: where the socket lives (optional);
    /// - `P2P_RENDEZVOUS_TIMEOUT_MS`: how long to wait for the other ranks (default 60000).
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Rendezvous> {
        let rv = Self::job_from_vars(&get)?;
        if let Some(lw) = get("LOCAL_WORLD_SIZE") {
            if lw.trim().parse::<usize>().ok() != Some(rv.world) {
                return Err(Error::Rendezvous {
                    rank: None,
                    why: format!(
                        "LOCAL_WORLD_SIZE={lw} but WORLD_SIZE={}: a job over several hosts needs p2p_collective::MultiHostCommunicator (one communicator per host, NCCL between them); Communicator spans one host",
                        rv.world
                    ),
                });
            }
        }
        Ok(rv)
    }

    /// [`from_vars`](Self::from_vars) without its one-host check: the whole job's identity,
    /// with `rank` and `world` over every host.
    pub(super) fn job_from_vars(get: &impl Fn(&str) -> Option<String>) -> Result<Rendezvous> {
        let bad = |why: String| Error::Rendezvous { rank: None, why };
        let num = |name: &str| -> Result<Option<usize>> {
            match get(name) {
                None => Ok(None),
                Some(v) => v
                    .trim()
                    .parse::<usize>()
                    .map(Some)
                    .map_err(|_| bad(format!("{name}={v:?} is not a whole number"))),
            }
        };
        let rank = num("RANK")?.ok_or_else(|| {
            bad("RANK is not set: start the processes with `p2p-bench launch -n N -- CMD` or torchrun".into())
        })?;
        let world = num("WORLD_SIZE")?.ok_or_else(|| bad("WORLD_SIZE is not set".into()))?;
        let local_rank = num("LOCAL_RANK")?.unwrap_or(rank);
        if world == 0 || rank >= world {
            return Err(bad(format!("RANK={rank} is not below WORLD_SIZE={world}")));
        }
        if world > MAX_WORLD {
            return Err(bad(format!("WORLD_SIZE={world} is above {MAX_WORLD}")));
        }
        let job = match get("P2P_JOB_ID") {
            Some(id) if !id.is_empty() => format!("id:{id}/{world}"),
            _ => {
                let port = num("MASTER_PORT")?.ok_or_else(|| {
                    bad("neither P2P_JOB_ID nor MASTER_PORT is set: the ranks cannot tell which job they belong to".into())
                })?;
                format!(
                    "torch:{}:{port}/{}/{}/{world}",
                    get("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into()),
                    get("TORCHELASTIC_RUN_ID").unwrap_or_default(),
                    get("TORCHELASTIC_RESTART_COUNT").unwrap_or_default(),
                )
            }
        };
        let secret = match get("P2P_JOB_SECRET") {
            Some(s) => Some(Secret::from_text(&s)?),
            None => None,
        };
        // The same reading as the configuration's check at start.
        let timeout = match get("P2P_RENDEZVOUS_TIMEOUT_MS") {
            None => Duration::from_secs(60),
            Some(ms) => crate::config::rendezvous_timeout(&ms).map_err(|e| bad(e.to_string()))?,
        };
        let allow_no_secret = match get("P2P_ALLOW_NO_SECRET") {
            Some(v) => crate::config::parse_bool("P2P_ALLOW_NO_SECRET", &v)
                .map_err(|e| bad(e.to_string()))?,
            None => false,
        };
        Ok(Rendezvous {
            rank,
            world,
            local_rank,
            job,
            secret,
            allow_no_secret,
            dir: get("P2P_RENDEZVOUS_DIR").map(PathBuf::from),
            timeout,
        })
    }

    /// The socket rank 0 listens on.
    pub fn socket_path(&self) -> PathBuf {
        let dir = self.dir.clone().unwrap_or_else(default_dir);
        let h = Sha256::digest(self.job.as_bytes());
        let hex: String = h[..12].iter().map(|b| format!("{b:02x}")).collect();
        dir.join(format!("rv-{hex}.sock"))
    }

    /// The key both sides prove they hold: the job's identity and, if set, its secret.
    pub(super) fn key(&self) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(b"p2p rendezvous key v1\0");
        h.update(self.job.as_bytes());
        h.update([0u8]);
        if let Some(s) = &self.secret {
            h.update(s.0);
        }
        h.finalize().into()
    }
}

/// Whether a job identity built from torchrun's variables holds a run id shaped like the random
/// UUID `torchrun --standalone` makes (`8-4-4-4-12` hex digits): a value only the job's processes
/// were given, which makes the key unguessable without reading their environment.
pub(super) fn job_holds_random_run_id(job: &str) -> bool {
    let Some(rest) = job.strip_prefix("torch:") else {
        return false;
    };
    let Some(run_id) = rest.split('/').nth(1) else {
        return false;
    };
    let groups: Vec<&str> = run_id.split('-').collect();
    groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups
            .iter()
            .all(|g| g.bytes().all(|b| b.is_ascii_hexdigit()))
}

pub(super) fn default_dir() -> PathBuf {
    let uid = rustix::process::getuid().as_raw();
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|p| p.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    base.join(format!("p2p-{uid}"))
}
