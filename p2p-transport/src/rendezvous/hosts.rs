//! A job over several hosts: where a rank sits (its host, its place there), the per-host job its
//! communicator joins, and the identity that says which ranks share a host.
//!
//! torchrun numbers ranks host by host: rank `r` is local rank `r % L` of host `r / L`, for `L`
//! ranks on every host (`LOCAL_WORLD_SIZE`; `GROUP_RANK` is the host's index). p2p's
//! communicators inside a host are joined per host (their Unix-socket rendezvous reaches only
//! that host); what crosses hosts goes through NCCL.

use crate::error::{Error, Result};

use super::Rendezvous;

/// Where this rank sits in a job over several hosts, every host running the same number of
/// ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostLayout {
    /// Ranks in the whole job (`WORLD_SIZE`).
    pub world: usize,
    /// This rank in the whole job (`RANK`).
    pub rank: usize,
    /// How many hosts (`WORLD_SIZE / LOCAL_WORLD_SIZE`).
    pub hosts: usize,
    /// This rank's host, `0..hosts` (`GROUP_RANK`).
    pub host: usize,
    /// Ranks on each host (`LOCAL_WORLD_SIZE`).
    pub local_world: usize,
    /// This rank on its host, `0..local_world` (`LOCAL_RANK`).
    pub local_rank: usize,
}

impl HostLayout {
    /// The layout from torchrun's variables (see [`from_vars`](Self::from_vars)).
    pub fn from_env() -> Result<Option<HostLayout>> {
        Self::from_vars(|n| std::env::var(n).ok())
    }

    /// The layout from `RANK`, `WORLD_SIZE`, `LOCAL_WORLD_SIZE`, `LOCAL_RANK` and `GROUP_RANK`
    /// read through `get`: `None` where the job spans one host (`LOCAL_WORLD_SIZE` unset or equal
    /// to `WORLD_SIZE`). Refused, with the reason, where hosts would run different numbers of
    /// ranks or the variables disagree with torchrun's numbering.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Option<HostLayout>> {
        let bad = |why: String| Error::Rendezvous { rank: None, why };
        let num = |name: &str| -> Result<Option<usize>> {
            get(name)
                .map(|v| {
                    v.trim()
                        .parse::<usize>()
                        .map_err(|_| bad(format!("{name}={v:?} is not a whole number")))
                })
                .transpose()
        };
        let (Some(world), Some(rank)) = (num("WORLD_SIZE")?, num("RANK")?) else {
            return Err(bad(
                "RANK and WORLD_SIZE must be set: start the processes with torchrun or `p2p-bench launch`".into(),
            ));
        };
        let Some(local_world) = num("LOCAL_WORLD_SIZE")? else {
            return Ok(None);
        };
        if local_world == world {
            return Ok(None);
        }
        if local_world == 0 || local_world > world || world % local_world != 0 {
            return Err(bad(format!(
                "LOCAL_WORLD_SIZE={local_world} does not divide WORLD_SIZE={world}: every host must run the same number of ranks"
            )));
        }
        if rank >= world {
            return Err(bad(format!("RANK={rank} is not below WORLD_SIZE={world}")));
        }
        let local_rank = num("LOCAL_RANK")?.unwrap_or(rank % local_world);
        let host = num("GROUP_RANK")?.unwrap_or(rank / local_world);
        if host * local_world + local_rank != rank || local_rank >= local_world {
            return Err(bad(format!(
                "RANK={rank} is not GROUP_RANK={host} x LOCAL_WORLD_SIZE={local_world} + LOCAL_RANK={local_rank}: ranks must be numbered host by host, as torchrun numbers them"
            )));
        }
        Ok(Some(HostLayout {
            world,
            rank,
            hosts: world / local_world,
            host,
            local_world,
            local_rank,
        }))
    }

    /// The rank of local rank `local` on host `host`.
    pub fn rank_of(&self, host: usize, local: usize) -> usize {
        host * self.local_world + local
    }

    /// Which host and local rank `rank` is.
    pub fn place_of(&self, rank: usize) -> (usize, usize) {
        (rank / self.local_world, rank % self.local_world)
    }
}

impl Rendezvous {
    /// The whole job's identity over every host, as [`from_vars`](Self::from_vars) reads it but
    /// without its one-host check (`rank` and `world` over the whole job), with its layout.
    pub fn for_hosts_from_vars(
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<(Rendezvous, HostLayout)> {
        let layout = HostLayout::from_vars(&get)?.ok_or_else(|| Error::Rendezvous {
            rank: None,
            why: "LOCAL_WORLD_SIZE is unset or equals WORLD_SIZE: this job spans one host (use Communicator)".into(),
        })?;
        Ok((Self::job_from_vars(&get)?, layout))
    }

    /// The job of this rank's host inside the whole job `self`: its own rendezvous (ranks
    /// `0..local_world`, the job's identity with the host's index), as a split child's is derived.
    pub fn for_host(&self, layout: &HostLayout) -> Rendezvous {
        Rendezvous {
            rank: layout.local_rank,
            world: layout.local_world,
            local_rank: layout.local_rank,
            job: format!("{}/host-{}", self.job, layout.host),
            secret: self.secret.clone(),
            allow_no_secret: self.allow_no_secret,
            dir: self.dir.clone(),
            timeout: self.timeout,
        }
    }
}

/// This host's identity for p2p: `P2P_HOST_ID` where set (to make one machine act as several
/// hosts in tests, beside NCCL's `NCCL_HOSTID`), else the host name.
pub fn host_id() -> String {
    match std::env::var("P2P_HOST_ID") {
        Ok(id) if !id.trim().is_empty() => id.trim().to_string(),
        _ => crate::hostname(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn vars(s: &str) -> impl Fn(&str) -> Option<String> + '_ {
        move |n| {
            s.split_whitespace()
                .find_map(|kv| kv.strip_prefix(n)?.strip_prefix('=').map(str::to_string))
        }
    }

    #[test]
    fn torchrun_two_hosts_of_two() {
        let l = HostLayout::from_vars(vars(
            "RANK=3 WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 LOCAL_RANK=1 GROUP_RANK=1",
        ))
        .unwrap()
        .unwrap();
        assert_eq!((l.hosts, l.host, l.local_rank), (2, 1, 1));
        assert_eq!(l.rank_of(1, 0), 2);
        assert_eq!(l.place_of(1), (0, 1));
        // Without LOCAL_RANK and GROUP_RANK, torchrun's numbering gives them.
        let l = HostLayout::from_vars(vars("RANK=2 WORLD_SIZE=6 LOCAL_WORLD_SIZE=3")).unwrap();
        assert_eq!(l.map(|l| (l.hosts, l.host, l.local_rank)), Some((2, 0, 2)));
    }

    #[test]
    fn one_host_is_none_and_odd_layouts_are_refused_with_the_reason() {
        assert_eq!(
            HostLayout::from_vars(vars("RANK=0 WORLD_SIZE=4")).unwrap(),
            None
        );
        assert_eq!(
            HostLayout::from_vars(vars("RANK=0 WORLD_SIZE=4 LOCAL_WORLD_SIZE=4")).unwrap(),
            None
        );
        for (env, words) in [
            (
                "RANK=0 WORLD_SIZE=4 LOCAL_WORLD_SIZE=3",
                "same number of ranks",
            ),
            (
                "RANK=1 WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 LOCAL_RANK=1 GROUP_RANK=1",
                "host by host",
            ),
            ("RANK=5 WORLD_SIZE=4 LOCAL_WORLD_SIZE=2", "not below"),
            ("WORLD_SIZE=4 LOCAL_WORLD_SIZE=2", "RANK and WORLD_SIZE"),
        ] {
            let e = HostLayout::from_vars(vars(env)).unwrap_err().to_string();
            assert!(e.contains(words), "{env}: {e}");
        }
    }

    #[test]
    fn each_host_joins_a_job_of_its_own_inside_the_whole_job() {
        let env = "RANK=3 WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 P2P_JOB_ID=j";
        let (job, layout) = Rendezvous::for_hosts_from_vars(vars(env)).unwrap();
        assert_eq!((job.rank, job.world), (3, 4));
        let host = job.for_host(&layout);
        assert_eq!((host.rank, host.world), (1, 2));
        assert_ne!(host.socket_path(), job.socket_path());
        let other = Rendezvous::for_hosts_from_vars(vars(
            "RANK=1 WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 P2P_JOB_ID=j",
        ))
        .unwrap();
        assert_ne!(other.0.for_host(&other.1).socket_path(), host.socket_path());
        assert!(Rendezvous::for_hosts_from_vars(vars("RANK=0 WORLD_SIZE=2 P2P_JOB_ID=j")).is_err());
    }
}
