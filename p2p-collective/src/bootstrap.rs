//! The rendezvous of a process-per-GPU communicator: TCP to rank 0, as torchrun sets it up.
//!
//! Rank 0 listens on `MASTER_ADDR:MASTER_PORT`; every other rank connects (retrying until the
//! time limit, since rank 0 may start last) and says who it is. After that the only exchange is
//! [`Bootstrap::all_gather`]: every rank hands rank 0 a blob, rank 0 sends everyone the list.
//! Communicators use it to trade their workspace's CUDA IPC handle, and as a barrier.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};

const MAGIC: &[u8; 4] = b"P2PB";
const VERSION: u32 = 1;
/// The largest blob a rank may send (a workspace handle is about 100 bytes).
const MAX_BLOB: usize = 1 << 20;

/// Where and as whom a process joins a communicator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendezvous {
    /// This process's rank, `0..world`.
    pub rank: usize,
    /// How many processes join.
    pub world: usize,
    /// This process's rank among those on this host: its GPU ordinal by default.
    pub local_rank: usize,
    /// Rank 0's address, `host:port`.
    pub address: String,
    /// How long to wait for the others.
    pub timeout: Duration,
}

impl Rendezvous {
    /// From the variables torchrun and `p2p-bench launch` set: `RANK`, `WORLD_SIZE`,
    /// `LOCAL_RANK` (default: `RANK`), `MASTER_ADDR` (default `127.0.0.1`) and `MASTER_PORT`.
    pub fn from_env() -> Result<Rendezvous> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// As [`from_env`](Self::from_env), reading variables through `get`.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Rendezvous> {
        let bad = |why: String| Error::Bootstrap { rank: 0, why };
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
        let host = get("MASTER_ADDR").unwrap_or_else(|| "127.0.0.1".into());
        let port = num("MASTER_PORT")?.ok_or_else(|| bad("MASTER_PORT is not set".into()))?;
        if world == 0 || rank >= world {
            return Err(bad(format!("RANK={rank} is not below WORLD_SIZE={world}")));
        }
        if port == 0 || port > u16::MAX as usize {
            return Err(bad(format!("MASTER_PORT={port} is not a TCP port")));
        }
        Ok(Rendezvous {
            rank,
            world,
            local_rank,
            address: format!("{host}:{port}"),
            timeout: Duration::from_secs(60),
        })
    }
}

/// The connections of one rank: rank 0 holds one to every other rank, the others one to rank 0.
pub struct Bootstrap {
    rank: usize,
    world: usize,
    links: Vec<TcpStream>,
    timeout: Duration,
}

impl Bootstrap {
    /// Joins the rendezvous; returns once every rank has.
    pub fn connect(rv: &Rendezvous) -> Result<Bootstrap> {
        let rank = rv.rank;
        let fail = |why: String| Error::Bootstrap { rank, why };
        let deadline = Instant::now() + rv.timeout;
        let mut links = Vec::new();
        if rv.rank == 0 {
            let listener = TcpListener::bind(&rv.address).map_err(|e| {
                fail(format!(
                    "listening on {}: {e} (is MASTER_PORT in use?)",
                    rv.address
                ))
            })?;
            listener
                .set_nonblocking(true)
                .map_err(|e| fail(e.to_string()))?;
            let mut by_rank: Vec<Option<TcpStream>> = (0..rv.world).map(|_| None).collect();
            let mut joined = 1;
            while joined < rv.world {
                match listener.accept() {
                    Ok((mut s, from)) => {
                        s.set_nonblocking(false).map_err(|e| fail(e.to_string()))?;
                        s.set_read_timeout(Some(rv.timeout))
                            .map_err(|e| fail(e.to_string()))?;
                        let _ = s.set_nodelay(true);
                        let hello = read_frame(&mut s)
                            .map_err(|e| fail(format!("hello from {from}: {e}")))?;
                        let (r, w) = parse_hello(&hello)
                            .ok_or_else(|| fail(format!("{from} is not a p2p rank (bad hello)")))?;
                        if w != rv.world {
                            return Err(fail(format!(
                                "rank {r} at {from} says WORLD_SIZE={w}, rank 0 has {}",
                                rv.world
                            )));
                        }
                        if r == 0 || r >= rv.world || by_rank[r].is_some() {
                            return Err(fail(format!(
                                "{from} claims rank {r}, which is taken or out of range"
                            )));
                        }
                        by_rank[r] = Some(s);
                        joined += 1;
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        if Instant::now() > deadline {
                            let missing: Vec<usize> =
                                (1..rv.world).filter(|&r| by_rank[r].is_none()).collect();
                            return Err(fail(format!(
                                "ranks {missing:?} did not join within {:?}",
                                rv.timeout
                            )));
                        }
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(e) => return Err(fail(format!("accepting on {}: {e}", rv.address))),
                }
            }
            links = by_rank.into_iter().flatten().collect();
        } else if rv.world > 1 {
            let addr = rv
                .address
                .to_socket_addrs()
                .map_err(|e| fail(format!("resolving MASTER_ADDR {}: {e}", rv.address)))?
                .next()
                .ok_or_else(|| fail(format!("{} resolves to no address", rv.address)))?;
            let mut s = loop {
                match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
                    Ok(s) => break s,
                    Err(e) if Instant::now() > deadline => {
                        return Err(fail(format!(
                            "rank 0 at {addr} did not answer within {:?}: {e}",
                            rv.timeout
                        )))
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            };
            s.set_read_timeout(Some(rv.timeout))
                .map_err(|e| fail(e.to_string()))?;
            let _ = s.set_nodelay(true);
            let mut hello = MAGIC.to_vec();
            hello.extend_from_slice(&VERSION.to_le_bytes());
            hello.extend_from_slice(&(rv.rank as u32).to_le_bytes());
            hello.extend_from_slice(&(rv.world as u32).to_le_bytes());
            write_frame(&mut s, &hello).map_err(|e| fail(format!("hello to rank 0: {e}")))?;
            links.push(s);
        }
        Ok(Bootstrap {
            rank: rv.rank,
            world: rv.world,
            links,
            timeout: rv.timeout,
        })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// How many ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// Every rank's blob, in rank order (this rank's included).
    pub fn all_gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        let rank = self.rank;
        let fail = |why: String| Error::Bootstrap { rank, why };
        if self.world == 1 {
            return Ok(vec![mine.to_vec()]);
        }
        if self.rank == 0 {
            let mut all = vec![mine.to_vec()];
            for (i, s) in self.links.iter_mut().enumerate() {
                all.push(
                    read_frame(s)
                        .map_err(|e| fail(format!("from rank {}: {e} (did it exit?)", i + 1)))?,
                );
            }
            let mut table = Vec::new();
            for b in &all {
                table.extend_from_slice(&(b.len() as u32).to_le_bytes());
                table.extend_from_slice(b);
            }
            for (i, s) in self.links.iter_mut().enumerate() {
                write_frame(s, &table).map_err(|e| fail(format!("to rank {}: {e}", i + 1)))?;
            }
            Ok(all)
        } else {
            let s = &mut self.links[0];
            write_frame(s, mine).map_err(|e| fail(format!("to rank 0: {e}")))?;
            let table =
                read_frame(s).map_err(|e| fail(format!("from rank 0: {e} (did it exit?)")))?;
            let mut all = Vec::new();
            let mut at = 0;
            while at < table.len() {
                let len = table
                    .get(at..at + 4)
                    .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
                    .ok_or_else(|| fail("a truncated table from rank 0".into()))?;
                let blob = table
                    .get(at + 4..at + 4 + len)
                    .ok_or_else(|| fail("a truncated table from rank 0".into()))?;
                all.push(blob.to_vec());
                at += 4 + len;
            }
            if all.len() != self.world {
                return Err(fail(format!(
                    "rank 0 sent {} blobs for {} ranks",
                    all.len(),
                    self.world
                )));
            }
            Ok(all)
        }
    }

    /// Returns once every rank has called it (or fails after the time limit).
    pub fn barrier(&mut self) -> Result<()> {
        self.all_gather(&[]).map(|_| ())
    }

    /// The time limit of every exchange.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

fn parse_hello(b: &[u8]) -> Option<(usize, usize)> {
    if b.len() != 16 || &b[..4] != MAGIC {
        return None;
    }
    let word = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    if word(4) != VERSION {
        return None;
    }
    Some((word(8) as usize, word(12) as usize))
}

fn write_frame(s: &mut TcpStream, data: &[u8]) -> std::io::Result<()> {
    s.write_all(&(data.len() as u32).to_le_bytes())?;
    s.write_all(data)?;
    s.flush()
}

fn read_frame(s: &mut TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_BLOB * 16 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a {len}-byte frame"),
        ));
    }
    let mut data = vec![0u8; len];
    s.read_exact(&mut data)?;
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port")
    }

    #[test]
    fn ranks_in_threads_exchange_blobs_in_rank_order() {
        let port = free_port();
        let world = 4;
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                std::thread::spawn(move || {
                    let rv = Rendezvous {
                        rank,
                        world,
                        local_rank: rank,
                        address: format!("127.0.0.1:{port}"),
                        timeout: Duration::from_secs(20),
                    };
                    let mut b = Bootstrap::connect(&rv).expect("connect");
                    let all = b
                        .all_gather(format!("rank {rank}").as_bytes())
                        .expect("all_gather");
                    b.barrier().expect("barrier");
                    all
                })
            })
            .collect();
        for h in handles {
            let all = h.join().expect("thread");
            let want: Vec<Vec<u8>> = (0..world)
                .map(|r| format!("rank {r}").into_bytes())
                .collect();
            assert_eq!(all, want);
        }
    }

    #[test]
    fn a_missing_rank_is_named_after_the_time_limit() {
        let port = free_port();
        let rv = Rendezvous {
            rank: 0,
            world: 3,
            local_rank: 0,
            address: format!("127.0.0.1:{port}"),
            timeout: Duration::from_millis(300),
        };
        let e = Bootstrap::connect(&rv)
            .err()
            .expect("must time out")
            .to_string();
        assert!(e.contains("ranks [1, 2] did not join"), "{e}");
    }

    #[test]
    fn the_environment_is_read_and_checked() {
        let vars = |v: &'static [(&'static str, &'static str)]| {
            move |k: &str| v.iter().find(|(n, _)| *n == k).map(|(_, x)| x.to_string())
        };
        let rv = Rendezvous::from_vars(vars(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("MASTER_PORT", "29500"),
        ]))
        .expect("valid");
        assert_eq!((rv.rank, rv.world, rv.local_rank), (1, 2, 1));
        assert_eq!(rv.address, "127.0.0.1:29500");
        let e = Rendezvous::from_vars(vars(&[("WORLD_SIZE", "2")])).expect_err("no RANK");
        assert!(e.to_string().contains("RANK is not set"), "{e}");
        let e = Rendezvous::from_vars(vars(&[
            ("RANK", "2"),
            ("WORLD_SIZE", "2"),
            ("MASTER_PORT", "1"),
        ]))
        .expect_err("rank too big");
        assert!(e.to_string().contains("not below WORLD_SIZE"), "{e}");
    }
}
