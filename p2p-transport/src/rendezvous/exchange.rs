//! Small blobs exchanged between every rank of a job over several hosts (NCCL's unique ids,
//! each rank's host identity): through torchrun's c10d store at `MASTER_ADDR:MASTER_PORT`,
//! sealed with the job's key, or, where no store is named (`p2p-bench launch`, whose ranks all
//! run on one machine), through the job-wide Unix-socket [`Group`]. p2p opens no port of its own.

use std::time::Instant;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

use super::store::StoreClient;
use super::{Group, Rendezvous};

/// How a job over hosts exchanges what its ranks must all know.
pub enum JobExchange {
    /// torchrun's store (`MASTER_ADDR`, `MASTER_PORT`).
    Store {
        /// The connection.
        client: StoreClient,
        /// The whole job (its key seals every value).
        job: Rendezvous,
    },
    /// The job-wide group over this machine's Unix socket: every rank on one machine.
    Group {
        /// The joined group.
        group: Group,
        /// This rank in the whole job.
        rank: usize,
    },
}

impl std::fmt::Debug for JobExchange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JobExchange::Store { client, .. } => write!(f, "JobExchange::Store({})", client.addr()),
            JobExchange::Group { .. } => f.write_str("JobExchange::Group"),
        }
    }
}

impl JobExchange {
    /// Opens the exchange of the whole job `job` (rank and world over every host): the store
    /// where `MASTER_ADDR` and `MASTER_PORT` are set, else the job-wide group. Each choice is
    /// logged with its reason.
    pub fn open(job: &Rendezvous) -> Result<JobExchange> {
        let named = std::env::var("MASTER_ADDR").is_ok() && std::env::var("MASTER_PORT").is_ok();
        if named {
            let deadline = Instant::now() + job.timeout;
            let client = StoreClient::from_env(deadline).map_err(|e| Error::Rendezvous {
                rank: Some(job.rank),
                why: format!("torchrun's store (MASTER_ADDR:MASTER_PORT), which carries NCCL's ids between hosts: {e}"),
            })?;
            tracing::info!(rank = job.rank, store = client.addr(), "a job over hosts meets through torchrun's store (MASTER_ADDR and MASTER_PORT are set)");
            Ok(JobExchange::Store {
                client,
                job: job.clone(),
            })
        } else {
            tracing::info!(rank = job.rank, "a job over hosts meets through this machine's job-wide socket (no MASTER_ADDR/MASTER_PORT: every rank must run on this machine)");
            let group = Group::join(job).map_err(|e| Error::Rendezvous {
                rank: Some(job.rank),
                why: format!("{e} (without MASTER_ADDR and MASTER_PORT the ranks of a job over hosts meet through one machine's socket, so every rank must run on it: start real multi-host jobs with torchrun)"),
            })?;
            Ok(JobExchange::Group {
                group,
                rank: job.rank,
            })
        }
    }

    /// Every rank's `mine`, in rank order. `label` names the exchange: every rank passes the same
    /// labels in the same order, each label once per job.
    pub fn all_gather(&mut self, label: &str, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        match self {
            JobExchange::Group { group, .. } => group.all_gather(mine),
            JobExchange::Store { client, job } => {
                let base = store_prefix(&job.job);
                let key = |r: usize| format!("{base}/{label}/{r}");
                let failed = |what: String| Error::Rendezvous {
                    rank: Some(job.rank),
                    why: format!("the exchange {label:?} through torchrun's store: {what}"),
                };
                let own = key(job.rank);
                client
                    .set(&own, &job.seal_for_store(&own, mine))
                    .map_err(|e| failed(e.to_string()))?;
                let deadline = Instant::now() + job.timeout;
                (0..job.world)
                    .map(|r| {
                        let k = key(r);
                        let sealed = client
                            .get(&k, deadline)
                            .map_err(|e| failed(format!("rank {r}'s part: {e}")))?;
                        job.open_from_store(&k, &sealed).ok_or_else(|| {
                            failed(format!("rank {r}'s part was not sealed with this job's key (another job, or a stranger, wrote it): check P2P_JOB_SECRET is the same on every host"))
                        })
                    })
                    .collect()
            }
        }
    }
}

/// The store keys' prefix of the job `job`: its identity, hashed (the identity itself may hold
/// addresses), under `p2p/`.
fn store_prefix(job: &str) -> String {
    let h = Sha256::digest(job.as_bytes());
    let hex: String = h[..12].iter().map(|b| format!("{b:02x}")).collect();
    format!("p2p/{hex}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_keys_name_the_job_by_hash_only() {
        let a = store_prefix("torch:10.0.0.1:29500/run/0/4");
        assert!(a.starts_with("p2p/") && a.len() == 4 + 24, "{a}");
        assert!(!a.contains("10.0.0.1"));
        assert_ne!(a, store_prefix("torch:10.0.0.1:29500/run/1/4"));
    }
}
