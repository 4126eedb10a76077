//! Splitting a communicator into smaller ones, as NCCL's `ncclCommSplit`: every rank gives a
//! color (or none) and a key; the ranks of one color form a new communicator, ordered by key
//! (then by their rank in the parent). A child is a communicator of its own, made as one made
//! for those GPUs alone: its own workspaces, its own rendezvous group (liveness), the same
//! options as its parent. The parent stays usable, and either may be dropped first.

use std::sync::atomic::Ordering;

use p2p_mem::Device;

use crate::error::{Error, Result};
use crate::exchange::SplitRequest;

use super::Communicator;
use p2p_transport::rendezvous::Rendezvous;

/// Where one rank lands in a split: its rank and the world of its child, or nowhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Placement {
    /// The child's color.
    pub color: u32,
    /// This rank's rank in the child.
    pub rank: usize,
    /// The child's ranks.
    pub world: usize,
}

/// The parent ranks that gave `color`, in the child's rank order: by key, then by parent rank.
fn members(requests: &[(Option<u32>, i32)], color: u32) -> Vec<usize> {
    let mut m: Vec<(i32, usize)> = requests
        .iter()
        .enumerate()
        .filter(|(_, (c, _))| *c == Some(color))
        .map(|(r, (_, key))| (*key, r))
        .collect();
    m.sort_unstable();
    m.into_iter().map(|(_, r)| r).collect()
}

/// Where parent rank `me` lands, given every rank's `(color, key)` in parent-rank order (see
/// [`members`]). `None` when `me` gives no color.
pub(super) fn placement(requests: &[(Option<u32>, i32)], me: usize) -> Option<Placement> {
    let color = requests.get(me)?.0?;
    let members = members(requests, color);
    let rank = members.iter().position(|&r| r == me)?;
    Some(Placement {
        color,
        rank,
        world: members.len(),
    })
}

/// The parent ranks of each color, in the child's rank order (see [`members`]), colors in
/// increasing order.
pub(super) fn children(requests: &[(Option<u32>, i32)]) -> Vec<(u32, Vec<usize>)> {
    let mut colors: Vec<u32> = requests.iter().filter_map(|(c, _)| *c).collect();
    colors.sort_unstable();
    colors.dedup();
    colors
        .into_iter()
        .map(|color| (color, members(requests, color)))
        .collect()
}

/// The job identity of split `seq`'s child of color `color` of the job `parent` (the run id of
/// a torchrun job stays where the rendezvous looks for it).
pub(super) fn child_job(parent: &str, seq: u64, color: u32) -> String {
    format!("{parent}/split-{seq}-color-{color}")
}

impl Communicator {
    /// Splits this process-per-GPU communicator, as NCCL's `ncclCommSplit`: every rank calls it
    /// (in the same order as its other calls that involve every rank, such as `register`), and
    /// the ranks that give the same `color` form a new communicator, ordered by `key` (then by
    /// their rank here). A rank that gives no color (`None`, NCCL's `NCCL_SPLIT_NOCOLOR`) gets
    /// `Ok(None)` at once and takes part in no child.
    ///
    /// A child is a communicator of its own, made as one made for its GPUs alone (its own
    /// workspaces, rendezvous group and liveness; the parent's options): its collectives run as
    /// on such a communicator. This communicator stays usable, and the two may be dropped in
    /// either order, once the calls queued on the one dropped are synchronized: a `Drop` waits
    /// for its GPU's work (the other's calls included) up to its limit, so a rank that drops one
    /// while its peers still wait in calls of the other would wait for them that long. Returns
    /// when every rank of the child has joined it, or fails as [`init`](Self::init) fails (a
    /// rank that died is named by its rank in this communicator).
    ///
    /// For communicators of one process ([`init_all`](Self::init_all)), use
    /// [`split_all`](Self::split_all).
    ///
    /// ```no_run
    /// use p2p_collective::{Collectives, Communicator, DataType, RedOp};
    /// use p2p_mem::{DeviceBuffer, Stream};
    ///
    /// // Every rank of a 4-rank job (torchrun or `p2p-bench launch`): two tensor-parallel
    /// // pairs, {0, 1} and {2, 3}.
    /// let world = Communicator::from_env()?;
    /// let pair = world
    ///     .split(Some((world.rank() / 2) as u32), world.rank() as i32)?
    ///     .expect("every rank gives a color");
    /// let stream = Stream::new(pair.device())?;
    /// let mut buf = DeviceBuffer::from_host(pair.device(), &[1.0f32; 256])?;
    /// pair.all_reduce_in_place(&mut buf, 256, DataType::F32, RedOp::Sum, &stream)?;
    /// pair.synchronize(&stream)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn split(&self, color: Option<u32>, key: i32) -> Result<Option<Communicator>> {
        let Some(super::Job {
            group,
            rendezvous: rv,
            splits,
        }) = &self.job
        else {
            return Err(Error::InvalidArgument {
                op: "split",
                rank: self.rank,
                what: "this communicator's ranks live in one process (init_all): split them all at once with Communicator::split_all".into(),
            });
        };
        self.health.usable("split", self.rank)?;
        let seq = splits.fetch_add(1, Ordering::SeqCst);
        let mine = SplitRequest { seq, color, key };
        let all = group
            .all_gather(&mine.encode())
            .map_err(|e| Error::from(e).peer_failure_in("split"))?;
        let fail = |why: String| Error::Bootstrap {
            rank: self.rank,
            why,
        };
        let mut requests = Vec::with_capacity(all.len());
        for (r, b) in all.iter().enumerate() {
            let theirs = SplitRequest::decode(b).ok_or_else(|| {
                fail(format!(
                    "rank {r} sent no split request at this point: every rank calls split together (in the same order as register and the other calls every rank makes)"
                ))
            })?;
            if theirs.seq != seq {
                return Err(fail(format!(
                    "rank {r} made its split number {}, this rank its number {seq}: every rank must call split the same number of times, in the same order",
                    theirs.seq
                )));
            }
            requests.push((theirs.color, theirs.key));
        }
        let Some(at) = placement(&requests, self.rank) else {
            tracing::info!(
                rank = self.rank,
                seq,
                "split {seq}: this rank gave no color and joins no child"
            );
            return Ok(None);
        };
        let child = Rendezvous {
            rank: at.rank,
            world: at.world,
            local_rank: rv.local_rank,
            job: child_job(&rv.job, seq, at.color),
            secret: rv.secret.clone(),
            allow_no_secret: rv.allow_no_secret,
            dir: rv.dir.clone(),
            timeout: rv.timeout,
        };
        tracing::info!(
            rank = self.rank,
            seq,
            color = at.color,
            child_rank = at.rank,
            child_world = at.world,
            "split {seq}: joining the child of color {} as its rank {} of {}",
            at.color,
            at.rank,
            at.world
        );
        // A death found while the child is made names ranks of the child: said in this
        // communicator's ranks, as the caller knows them.
        let parent_ranks = members(&requests, at.color);
        Communicator::init(&self.device, &child, self.options.clone())
            .map(Some)
            .map_err(|e| match e.peer_failure_in("split") {
                Error::PeerFailed { failure, .. } => Error::PeerFailed {
                    op: "split".into(),
                    failure: p2p_transport::PeerFailure {
                        rank: self.rank,
                        peer: parent_ranks
                            .get(failure.peer)
                            .copied()
                            .unwrap_or(failure.peer),
                        why: failure.why,
                    },
                },
                e => e,
            })
    }

    /// Splits communicators of one process ([`init_all`](Self::init_all)) at once: `how[r]` is
    /// rank r's `(color, key)`, as every rank gives them to [`split`](Self::split). Returns, for
    /// each rank of `comms`, its child (`None` for a rank without a color), each child made as
    /// [`init_all_with`](Self::init_all_with) makes one over its GPUs (in key order) with the
    /// parent's options. `comms` are left as they are.
    ///
    /// ```no_run
    /// use p2p_collective::Communicator;
    /// use p2p_mem::Device;
    ///
    /// let gpus = Device::all()?;
    /// let comms = Communicator::init_all(&gpus)?;
    /// // Even and odd GPUs: {0, 2} and {1, 3} on four.
    /// let how: Vec<_> = (0..comms.len()).map(|r| (Some((r % 2) as u32), r as i32)).collect();
    /// let children = Communicator::split_all(&comms, &how)?;
    /// assert!(children.iter().all(Option::is_some));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn split_all(
        comms: &[Communicator],
        how: &[(Option<u32>, i32)],
    ) -> Result<Vec<Option<Communicator>>> {
        let bad = |what: String| Error::InvalidArgument {
            op: "split_all",
            rank: 0,
            what,
        };
        let Some(first) = comms.first() else {
            return Err(bad("no communicators to split".into()));
        };
        if how.len() != comms.len() {
            return Err(bad(format!(
                "{} communicators but {} (color, key) pairs: give one per rank",
                comms.len(),
                how.len()
            )));
        }
        let world = first.world;
        for (i, c) in comms.iter().enumerate() {
            if c.job.is_some() {
                return Err(bad(format!(
                    "rank {} is one of a process-per-GPU communicator: every rank calls Communicator::split",
                    c.rank
                )));
            }
            if c.world != world || c.rank != i || comms.len() != world {
                return Err(bad(format!(
                    "give every rank of one communicator, in rank order (init_all's result): position {i} holds rank {} of {}",
                    c.rank, c.world
                )));
            }
            c.health.usable("split_all", c.rank)?;
        }
        let mut out: Vec<Option<Communicator>> = (0..world).map(|_| None).collect();
        for (color, members) in children(how) {
            let devices: Vec<Device> = members.iter().map(|&r| comms[r].device.clone()).collect();
            tracing::info!(
                color,
                ranks = ?members,
                "split_all: a child of color {color} over parent ranks {members:?}"
            );
            let made = Communicator::init_all_with(&devices, first.options.clone())?;
            for (r, child) in members.into_iter().zip(made) {
                out[r] = Some(child);
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_land_by_color_then_key_then_parent_rank() {
        // 4 ranks into {0, 2} and {1, 3}.
        let even_odd = [(Some(0), 0), (Some(1), 0), (Some(0), 0), (Some(1), 0)];
        let at: Vec<_> = (0..4).map(|r| placement(&even_odd, r)).collect();
        assert_eq!(
            at,
            [
                Some(Placement {
                    color: 0,
                    rank: 0,
                    world: 2
                }),
                Some(Placement {
                    color: 1,
                    rank: 0,
                    world: 2
                }),
                Some(Placement {
                    color: 0,
                    rank: 1,
                    world: 2
                }),
                Some(Placement {
                    color: 1,
                    rank: 1,
                    world: 2
                }),
            ]
        );
        assert_eq!(children(&even_odd), [(0, vec![0, 2]), (1, vec![1, 3])]);
        // Keys reorder: rank 3 first, then 0, then 1 (keys 5, 5 tie by parent rank); rank 2 out.
        let three = [(Some(4), 5), (Some(4), 5), (None, 0), (Some(4), -1)];
        assert_eq!(children(&three), [(4, vec![3, 0, 1])]);
        assert_eq!(placement(&three, 2), None);
        assert_eq!(
            placement(&three, 0),
            Some(Placement {
                color: 4,
                rank: 1,
                world: 3
            })
        );
        assert_eq!(placement(&three, 3).map(|p| p.rank), Some(0));
        // 2 x 2, and every rank alone.
        let pairs = [(Some(0), 0), (Some(0), 1), (Some(1), 0), (Some(1), 1)];
        assert_eq!(children(&pairs), [(0, vec![0, 1]), (1, vec![2, 3])]);
        let alone: Vec<_> = (0..4).map(|r| (Some(r as u32), 0)).collect();
        assert!(children(&alone).iter().all(|(_, m)| m.len() == 1));
        // Nobody with a color: no child; a rank past the end lands nowhere.
        assert!(children(&[(None, 0), (None, 1)]).is_empty());
        assert_eq!(placement(&pairs, 9), None);
    }

    #[test]
    fn a_childs_job_keeps_the_torchrun_run_id_where_it_was() {
        let job = child_job(
            "torch:127.0.0.1:29500/0123abcd-0000-1111-2222-333344445555/4",
            2,
            1,
        );
        assert_eq!(
            job,
            "torch:127.0.0.1:29500/0123abcd-0000-1111-2222-333344445555/4/split-2-color-1"
        );
        assert_eq!(
            job.split('/').nth(1),
            Some("0123abcd-0000-1111-2222-333344445555")
        );
        assert_ne!(child_job("j", 0, 1), child_job("j", 1, 0));
        assert_ne!(child_job("j", 0, 1), child_job("j", 0, 2));
    }
}
