//! Passing file descriptors between processes of one host over a Unix domain socket.
//!
//! cuMem allocations are shared as POSIX fds, and an fd only crosses a process boundary
//! through `SCM_RIGHTS`. This module does that with the care it needs:
//!
//! - the socket lives in a [`PrivateDir`]: a fresh directory of mode 0700, owner checked,
//!   removed on `Drop`;
//! - both ends check the other's uid with `SO_PEERCRED` and refuse a different user;
//! - sockets are `SOCK_SEQPACKET`, so each message arrives whole or is rejected: a truncated
//!   payload or truncated control data is an error, never a silent partial read;
//! - [`FdChannel::recv_fd`] demands exactly one fd per message and closes any extra it was
//!   sent; [`FdChannel::recv_msg`] demands none;
//! - received fds are close-on-exec (`MSG_CMSG_CLOEXEC`), and every wait has a time limit.
//!
//! ```no_run
//! use p2p_mem::fdpass::{FdChannel, FdListener, PrivateDir};
//! use std::time::Duration;
//! let dir = PrivateDir::new("example")?;
//! let listener = FdListener::bind(&dir.path().join("sock"))?;
//! // ... start the other process, which calls FdChannel::connect(path) ...
//! let chan = listener.accept(Duration::from_secs(30))?;
//! let (header, fd) = chan.recv_fd()?;
//! # Ok::<(), p2p_mem::Error>(())
//! ```

use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::net::{
    self, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

use crate::error::{os, Error, Result};

/// The largest message payload this module sends or accepts.
pub const MAX_MESSAGE: usize = 64 * 1024;
/// The time limit of a blocking send or receive unless changed with [`FdChannel::set_timeout`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// A directory only this user can enter (mode 0700), deleted with its contents on `Drop`.
#[derive(Debug)]
pub struct PrivateDir {
    path: PathBuf,
}

impl PrivateDir {
    /// Creates `p2p-<tag>-<pid>-<n>` under `$XDG_RUNTIME_DIR`, or the temp dir where unset.
    pub fn new(tag: &str) -> Result<PrivateDir> {
        let base = std::env::var_os("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .filter(|p| p.is_dir())
            .unwrap_or_else(std::env::temp_dir);
        Self::new_in(&base, tag)
    }

    /// Creates the directory under `base`.
    pub fn new_in(base: &Path, tag: &str) -> Result<PrivateDir> {
        use std::os::unix::fs::DirBuilderExt;
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let path = base.join(format!("p2p-{tag}-{}-{n}-{nanos:08x}", std::process::id()));
        // `create` (not `create_all`) fails if the name exists: nobody can pre-plant it.
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|source| Error::Io {
                op: format!("creating {}", path.display()),
                source,
            })?;
        let dir = PrivateDir { path };
        check_private(&dir.path)?;
        Ok(dir)
    }

    /// The directory's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Makes `path` a directory only this user can enter, or checks that it already is one.
///
/// Unlike [`PrivateDir`] the directory is shared by this user's processes and outlives them
/// (a job's rendezvous socket lives in it, at a name every rank can compute). It is created with
/// mode 0700 if missing; an existing one must be a real directory (not a symlink) owned by this
/// user with no access for anyone else, or it is refused: nobody can pre-plant it.
pub fn user_private_dir(path: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(source) => {
            return Err(Error::Io {
                op: format!("creating {}", path.display()),
                source,
            })
        }
    }
    check_private(path)
}

/// A real directory (not a symlink) owned by this user that nobody else may enter.
fn check_private(path: &Path) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path).map_err(|source| Error::Io {
        op: format!("checking {}", path.display()),
        source,
    })?;
    let uid = rustix::process::getuid().as_raw();
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o077 != 0 {
        return Err(Error::Protocol(format!(
            "{} is not a private directory of uid {uid} (owner {}, mode {:o}): remove it or choose another",
            path.display(),
            meta.uid(),
            meta.mode() & 0o777
        )));
    }
    Ok(())
}

/// The socket address of `path`, refused if it does not fit `sun_path` (108 bytes with the NUL).
fn sockaddr(path: &Path) -> Result<SocketAddrUnix> {
    use std::os::unix::ffi::OsStrExt;
    const SUN_PATH: usize = 108;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= SUN_PATH || bytes.contains(&0) {
        return Err(Error::InvalidArgument(format!(
            "socket path {} must be under {SUN_PATH} bytes with no NUL",
            path.display()
        )));
    }
    SocketAddrUnix::new(path).map_err(os(format!("socket path {}", path.display())))
}

/// A new close-on-exec SEQPACKET socket.
fn seqpacket_socket() -> Result<OwnedFd> {
    net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(os("creating a Unix socket"))
}

/// A new SEQPACKET socket connected to `path` within `limit`.
///
/// A Unix socket's `connect` blocks while the listener's queue is full, which a process that
/// listens at the path and never accepts keeps it for good. So the connect is non-blocking and
/// retried until `limit`; past it, the error is `TimedOut` and says why. The socket is blocking
/// again afterwards (every later send and receive has a time limit of its own).
fn connect_to(path: &Path, what: &str, limit: Duration) -> Result<OwnedFd> {
    let addr = sockaddr(path)?;
    let fd = seqpacket_socket()?;
    let context = || format!("{what} {}", path.display());
    rustix::io::ioctl_fionbio(&fd, true).map_err(os(context()))?;
    let deadline = std::time::Instant::now().checked_add(limit);
    let mut pause = Duration::from_micros(100);
    loop {
        match net::connect(&fd, &addr) {
            Ok(()) => break,
            Err(Errno::INTR) => continue,
            // The listener's queue is full: it accepts slowly, or never.
            Err(Errno::AGAIN) => {
                if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                    return Err(Error::Io {
                        op: format!(
                            "{}: the process listening there accepted no connection within {limit:?} (its queue stays full)",
                            context()
                        ),
                        source: std::io::ErrorKind::TimedOut.into(),
                    });
                }
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(10));
            }
            Err(e) => return Err(os(context())(e)),
        }
    }
    rustix::io::ioctl_fionbio(&fd, false).map_err(os(context()))?;
    Ok(fd)
}

/// How long the stale-socket probe of [`FdListener::bind_replacing_stale`] waits for the
/// process at the path to take its connection.
const PROBE_LIMIT: Duration = Duration::from_secs(1);

/// The uid of the process at the other end of a connected Unix socket.
pub fn peer_uid(fd: BorrowedFd<'_>) -> Result<u32> {
    peer_cred(fd).map(|(_, uid)| uid)
}

/// The process id and uid of the process at the other end of a connected Unix socket, as the
/// kernel recorded them at `connect` (`SO_PEERCRED`): they cannot be forged by the peer.
///
/// The pid is 0 when the peer lives in another PID namespace (the kernel cannot name it there);
/// callers that match pids then refuse it, and the uid check still applies. (Read with
/// `getsockopt` directly: rustix 1.1's `socket_peercred` keeps the pid in a non-zero type and
/// cannot represent that 0.)
pub fn peer_cred(fd: BorrowedFd<'_>) -> Result<(u32, u32)> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: u32::MAX,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for getsockopt to write, `len` is their size, and
    // `fd` is a live socket for the duration of the call.
    let r = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(Error::Io {
            op: "reading SO_PEERCRED".into(),
            source: std::io::Error::last_os_error(),
        });
    }
    if len as usize != std::mem::size_of::<libc::ucred>() {
        return Err(Error::Protocol(format!("SO_PEERCRED gave {len} bytes")));
    }
    Ok((cred.pid.max(0) as u32, cred.uid))
}

/// Accepts a peer only if it runs as the same user as this process.
pub fn check_peer_uid(expected: u32, got: u32) -> Result<()> {
    if expected == got {
        Ok(())
    } else {
        Err(Error::PeerCredentials { expected, got })
    }
}

/// Whether `fd` became readable (or hung up) by `deadline` (`None`: past any clock). A signal
/// does not restart the wait: what is left of it goes on.
fn poll_until(
    fd: BorrowedFd<'_>,
    deadline: Option<std::time::Instant>,
    what: &str,
) -> Result<bool> {
    loop {
        let limit = match deadline {
            Some(d) => Timespec::try_from(d.saturating_duration_since(std::time::Instant::now())),
            None => Timespec::try_from(Duration::MAX),
        }
        .unwrap_or(Timespec {
            tv_sec: i64::MAX,
            tv_nsec: 0,
        });
        let mut fds = [PollFd::new(&fd, PollFlags::IN)];
        match poll(&mut fds, Some(&limit)) {
            Ok(n) => return Ok(n > 0),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(os(what)(e)),
        }
    }
}

/// A message that must carry no fd: its payload, or an error (the fds close as they drop).
fn no_fds(payload: Vec<u8>, fds: Vec<OwnedFd>) -> Result<Vec<u8>> {
    if !fds.is_empty() {
        return Err(Error::Protocol(format!(
            "expected no fd with the message, got {} (closed)",
            fds.len()
        )));
    }
    Ok(payload)
}

/// A timed-out wait's error.
fn timed_out(what: &str, timeout: Duration) -> Error {
    Error::Io {
        op: format!("{what}: nothing arrived within {timeout:?}"),
        source: std::io::ErrorKind::TimedOut.into(),
    }
}

/// A listening socket that accepts [`FdChannel`]s from processes of the same user.
#[derive(Debug)]
pub struct FdListener {
    fd: OwnedFd,
    path: PathBuf,
}

impl FdListener {
    /// Listens at `path`, which should be inside a [`PrivateDir`].
    pub fn bind(path: &Path) -> Result<FdListener> {
        let addr = sockaddr(path)?;
        let fd = seqpacket_socket()?;
        net::bind(&fd, &addr).map_err(os(format!("binding {}", path.display())))?;
        net::listen(&fd, 128).map_err(os(format!("listening on {}", path.display())))?;
        // Accepts never block: where two threads accept on one listener and one connection
        // comes, the one that finds it taken waits again, within its time limit.
        rustix::io::ioctl_fionbio(&fd, true)
            .map_err(os(format!("making {} non-blocking", path.display())))?;
        Ok(FdListener {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// Listens at a well-known `path` (inside a [`user_private_dir`]) that a crashed earlier
    /// process may have left behind: a socket there that nobody answers is removed and bound
    /// again; one that a live process answers is an error (`AddrInUse`).
    pub fn bind_replacing_stale(path: &Path) -> Result<FdListener> {
        match Self::bind(path) {
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::AddrInUse => {
                match connect_to(path, "probing", PROBE_LIMIT) {
                    Ok(_) => Err(Error::Io {
                        op: format!("binding {}: a live process listens there", path.display()),
                        source: std::io::ErrorKind::AddrInUse.into(),
                    }),
                    // Alive, but it takes no connection: as much in the way as one that does.
                    Err(Error::Io { source, .. })
                        if source.kind() == std::io::ErrorKind::TimedOut =>
                    {
                        Err(Error::Io {
                            op: format!(
                                "binding {}: a live process listens there and accepts no connection",
                                path.display()
                            ),
                            source: std::io::ErrorKind::AddrInUse.into(),
                        })
                    }
                    Err(_) => {
                        tracing::debug!("removing the stale socket {}", path.display());
                        let _ = std::fs::remove_file(path);
                        Self::bind(path)
                    }
                }
            }
            other => other,
        }
    }

    /// The socket's path, for the other process to connect to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Waits up to `timeout` for a connection: `None` if none came. A connection from another
    /// user is an [`Error::PeerCredentials`] (and closed), so a caller serving strangers can log
    /// it and go on.
    pub fn accept_within(&self, timeout: Duration) -> Result<Option<FdChannel>> {
        let what = format!("accepting on {}", self.path.display());
        let deadline = std::time::Instant::now().checked_add(timeout);
        loop {
            if !poll_until(self.fd.as_fd(), deadline, &what)? {
                return Ok(None);
            }
            match net::accept_with(&self.fd, SocketFlags::CLOEXEC) {
                Ok(fd) => return FdChannel::checked(fd).map(Some),
                // Taken by another thread, or gone before it was accepted: wait again.
                Err(Errno::AGAIN | Errno::INTR | Errno::CONNABORTED) => continue,
                Err(e) => return Err(os(what)(e)),
            }
        }
    }

    /// Waits up to `timeout` for a connection, and checks the peer's uid.
    pub fn accept(&self, timeout: Duration) -> Result<FdChannel> {
        self.accept_within(timeout)?
            .ok_or_else(|| timed_out(&format!("accepting on {}", self.path.display()), timeout))
    }
}

impl Drop for FdListener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// One connected end of the fd-passing socket.
#[derive(Debug)]
pub struct FdChannel {
    fd: OwnedFd,
    timeout: Duration,
}

impl AsFd for FdChannel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl FdChannel {
    /// Connects to a listener at `path` and checks the peer's uid. Waits at most
    /// [`DEFAULT_TIMEOUT`] for the listener to take the connection ([`connect_within`] for
    /// another limit).
    ///
    /// [`connect_within`]: Self::connect_within
    pub fn connect(path: &Path) -> Result<FdChannel> {
        Self::connect_within(path, DEFAULT_TIMEOUT)
    }

    /// As [`connect`](Self::connect), waiting at most `limit` for the listener to take the
    /// connection (a process that listens at `path` and never accepts is an error after it,
    /// `TimedOut`, not a hang).
    pub fn connect_within(path: &Path, limit: Duration) -> Result<FdChannel> {
        let fd = connect_to(path, "connecting to", limit)?;
        Self::checked(fd)
    }

    fn checked(fd: OwnedFd) -> Result<FdChannel> {
        check_peer_uid(rustix::process::getuid().as_raw(), peer_uid(fd.as_fd())?)?;
        let mut chan = FdChannel {
            fd,
            timeout: DEFAULT_TIMEOUT,
        };
        chan.set_timeout(DEFAULT_TIMEOUT);
        Ok(chan)
    }

    /// Changes the time limit of every later send and receive. A send to a peer that stopped
    /// reading fails after it (`SO_SNDTIMEO`) rather than blocking for ever.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
        // No value would mean "no limit", so a zero timeout is raised to 1 µs.
        let limit = timeout.max(Duration::from_micros(1));
        if let Err(e) =
            net::sockopt::set_socket_timeout(&self.fd, net::sockopt::Timeout::Send, Some(limit))
        {
            tracing::warn!("setting SO_SNDTIMEO on an fd socket: {e}");
        }
    }

    /// The process id and uid of the peer, as the kernel recorded them at connect.
    pub fn peer_cred(&self) -> Result<(u32, u32)> {
        peer_cred(self.fd.as_fd())
    }

    /// Receives one message that must carry no fd, waiting at most `timeout`: `None` if none
    /// arrived in time; [`Error::Closed`] once the peer has hung up.
    pub fn recv_msg_within(&self, timeout: Duration) -> Result<Option<Vec<u8>>> {
        match self.recv_raw_within(timeout)? {
            Some((payload, fds)) => no_fds(payload, fds).map(Some),
            None => Ok(None),
        }
    }

    /// Sends `payload` with exactly one fd.
    pub fn send_fd(&self, payload: &[u8], fd: BorrowedFd<'_>) -> Result<()> {
        self.send_with_fds(payload, &[fd])
    }

    /// Sends `payload` with no fd.
    pub fn send_msg(&self, payload: &[u8]) -> Result<()> {
        self.send_with_fds(payload, &[])
    }

    /// Sends `payload` with any number of fds (up to 4). The receiving calls of this module
    /// accept exactly one ([`recv_fd`](Self::recv_fd)) or none ([`recv_msg`](Self::recv_msg));
    /// this is the low-level call underneath, public for protocols of your own.
    pub fn send_with_fds(&self, payload: &[u8], fds: &[BorrowedFd<'_>]) -> Result<()> {
        if payload.is_empty() || payload.len() > MAX_MESSAGE {
            return Err(Error::InvalidArgument(format!(
                "a message is 1 to {MAX_MESSAGE} bytes, not {}",
                payload.len()
            )));
        }
        if fds.len() > 4 {
            return Err(Error::InvalidArgument("at most 4 fds per message".into()));
        }
        self.send_unchecked(payload, fds)
    }

    /// `sendmsg` with no limits checked (the tests use it to break the protocol on purpose).
    fn send_unchecked(&self, payload: &[u8], fds: &[BorrowedFd<'_>]) -> Result<()> {
        let mut space =
            vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(fds.len().max(1)))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
            return Err(Error::InvalidArgument(format!(
                "{} fds do not fit one message's control data",
                fds.len()
            )));
        }
        let iov = [IoSlice::new(payload)];
        loop {
            match net::sendmsg(&self.fd, &iov, &mut control, SendFlags::NOSIGNAL) {
                Ok(n) if n == payload.len() => return Ok(()),
                Ok(n) => {
                    return Err(Error::Protocol(format!(
                        "sent {n} of {} bytes",
                        payload.len()
                    )))
                }
                Err(Errno::INTR) => continue,
                Err(Errno::AGAIN) => {
                    return Err(Error::Io {
                        op: format!(
                            "sending on the fd socket: the peer read nothing for {:?}",
                            self.timeout
                        ),
                        source: std::io::ErrorKind::TimedOut.into(),
                    })
                }
                Err(Errno::PIPE | Errno::CONNRESET) => return Err(Error::Closed("sending".into())),
                Err(e) => return Err(os("sending on the fd socket")(e)),
            }
        }
    }

    /// Receives one message that must carry exactly one fd.
    pub fn recv_fd(&self) -> Result<(Vec<u8>, OwnedFd)> {
        let (payload, mut fds) = self.recv_raw()?;
        match fds.len() {
            1 => Ok((payload, fds.remove(0))),
            n => Err(Error::Protocol(format!(
                "expected exactly one fd with the message, got {n} (closed)"
            ))),
        }
    }

    /// Receives one message that must carry no fd.
    pub fn recv_msg(&self) -> Result<Vec<u8>> {
        let (payload, fds) = self.recv_raw()?;
        no_fds(payload, fds)
    }

    /// Receives one message and whatever fds came with it (all owned, so dropped on error),
    /// within the channel's time limit.
    fn recv_raw(&self) -> Result<(Vec<u8>, Vec<OwnedFd>)> {
        self.recv_raw_within(self.timeout)?
            .ok_or_else(|| timed_out("receiving on the fd socket", self.timeout))
    }

    /// As `recv_raw`, within `timeout`: `None` if nothing came (or another thread took what
    /// came) in that time.
    fn recv_raw_within(&self, timeout: Duration) -> Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
        let what = "receiving on the fd socket";
        let deadline = std::time::Instant::now().checked_add(timeout);
        let mut buf = vec![0u8; MAX_MESSAGE];
        // Room for more fds than any valid message carries, so extras are seen and closed
        // rather than silently dropped by the kernel.
        let mut space = vec![MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(8))];
        let mut control = RecvAncillaryBuffer::new(&mut space);
        let msg = loop {
            if !poll_until(self.fd.as_fd(), deadline, what)? {
                return Ok(None);
            }
            let mut iov = [IoSliceMut::new(&mut buf)];
            // Never blocks: where two threads receive on one channel and one message comes, the
            // one that finds it taken waits again, within its time limit.
            let flags = RecvFlags::CMSG_CLOEXEC | RecvFlags::DONTWAIT;
            match net::recvmsg(&self.fd, &mut iov, &mut control, flags) {
                Ok(m) => break m,
                Err(Errno::INTR | Errno::AGAIN) => continue,
                Err(Errno::CONNRESET) => return Err(Error::Closed("receiving".into())),
                Err(e) => return Err(os("receiving on the fd socket")(e)),
            }
        };
        let mut fds = Vec::new();
        for m in control.drain() {
            if let RecvAncillaryMessage::ScmRights(received) = m {
                fds.extend(received);
            }
        }
        if msg.bytes == 0 {
            return Err(Error::Closed("receiving".into()));
        }
        if msg.flags.contains(ReturnFlags::TRUNC) {
            return Err(Error::Protocol(format!(
                "message longer than {MAX_MESSAGE} bytes was truncated (rejected)"
            )));
        }
        if msg.flags.contains(ReturnFlags::CTRUNC) {
            return Err(Error::Protocol(
                "control data was truncated: too many fds (rejected)".into(),
            ));
        }
        buf.truncate(msg.bytes);
        Ok(Some((buf, fds)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_dirs_are_0700_and_removed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = PrivateDir::new("unit").expect("create");
        let mode = std::fs::metadata(dir.path())
            .expect("stat")
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        let path = dir.path().to_path_buf();
        drop(dir);
        assert!(!path.exists());
    }

    #[test]
    fn other_users_are_refused() {
        assert!(check_peer_uid(1000, 1000).is_ok());
        let e = check_peer_uid(1000, 0).expect_err("different uid");
        assert!(matches!(
            e,
            Error::PeerCredentials {
                expected: 1000,
                got: 0
            }
        ));
    }

    /// A process that listens at a path and never accepts (backlog 0, one connection already
    /// queued): a connect there fails at its limit instead of blocking, and the stale-socket
    /// probe calls the path taken instead of hanging. Run in a thread, so that a regression
    /// fails the test rather than hanging it.
    #[test]
    fn a_listener_that_never_accepts_costs_a_connect_its_limit_not_a_hang() {
        let dir = PrivateDir::new("unit").expect("dir");
        let path = dir.path().join("squatted");
        let squatter = seqpacket_socket().expect("socket");
        net::bind(&squatter, &sockaddr(&path).expect("addr")).expect("bind");
        net::listen(&squatter, 0).expect("listen");
        // The one connection a backlog of 0 queues; the listener never takes it.
        let _queued = connect_to(&path, "filling", Duration::from_secs(1)).expect("first");
        let (tx, rx) = std::sync::mpsc::channel();
        let p = path.clone();
        std::thread::spawn(move || {
            let t = std::time::Instant::now();
            let connect = FdChannel::connect_within(&p, Duration::from_millis(300)).map(|_| ());
            let probe = FdListener::bind_replacing_stale(&p).map(|_| ());
            let _ = tx.send((t.elapsed(), connect, probe));
        });
        let (took, connect, probe) = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("connect and probe return (they hung before)");
        let e = connect.expect_err("the queue is full");
        assert!(
            matches!(&e, Error::Io { source, .. } if source.kind() == std::io::ErrorKind::TimedOut),
            "{e}"
        );
        assert!(
            e.to_string()
                .contains("accepted no connection within 300ms"),
            "{e}"
        );
        let e = probe.expect_err("a live process holds the path");
        assert!(
            e.to_string()
                .contains("a live process listens there and accepts no connection"),
            "{e}"
        );
        // 300 ms for the connect, PROBE_LIMIT for the probe, and slack.
        assert!(took < Duration::from_secs(3), "took {took:?}");
        assert!(
            path.exists(),
            "the probe must not remove a live process's socket"
        );
    }

    #[test]
    fn long_socket_paths_are_rejected() {
        let long = PathBuf::from(format!("/tmp/{}", "x".repeat(200)));
        assert!(matches!(sockaddr(&long), Err(Error::InvalidArgument(_))));
    }

    #[test]
    fn in_process_round_trip_with_extras_rejected() {
        let dir = PrivateDir::new("unit").expect("dir");
        let listener = FdListener::bind(&dir.path().join("s")).expect("bind");
        let client = FdChannel::connect(listener.path()).expect("connect");
        let server = listener.accept(Duration::from_secs(5)).expect("accept");

        let file = std::fs::File::open("/proc/self/exe").expect("open");
        client.send_fd(b"hello", file.as_fd()).expect("send");
        let (payload, fd) = server.recv_fd().expect("recv");
        assert_eq!(payload, b"hello");
        let flags = rustix::io::fcntl_getfd(&fd).expect("F_GETFD");
        assert!(
            flags.contains(rustix::io::FdFlags::CLOEXEC),
            "received fds must be close-on-exec"
        );

        client
            .send_with_fds(b"two", &[file.as_fd(), file.as_fd()])
            .expect("send");
        assert!(matches!(server.recv_fd(), Err(Error::Protocol(m)) if m.contains("got 2")));
        client.send_msg(b"none").expect("send");
        assert!(matches!(server.recv_fd(), Err(Error::Protocol(m)) if m.contains("got 0")));
        client.send_fd(b"one", file.as_fd()).expect("send");
        assert!(matches!(server.recv_msg(), Err(Error::Protocol(m)) if m.contains("got 1")));
        client.send_msg(b"plain").expect("send");
        assert_eq!(server.recv_msg().expect("recv"), b"plain");
        // More fds than the receiver has control space for: the kernel truncates the control
        // data (MSG_CTRUNC) and the message is rejected, with the fds that did arrive closed.
        let many: Vec<BorrowedFd<'_>> = (0..12).map(|_| file.as_fd()).collect();
        client.send_unchecked(b"many", &many).expect("send");
        let e = server.recv_fd().expect_err("control data truncated");
        assert!(
            matches!(&e, Error::Protocol(m) if m.contains("control data was truncated")),
            "{e}"
        );
        assert!(matches!(
            client.send_with_fds(b"x", &many),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            client.send_msg(&[]),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn silence_times_out_instead_of_hanging() {
        let dir = PrivateDir::new("unit").expect("dir");
        let listener = FdListener::bind(&dir.path().join("s")).expect("bind");
        let e = listener
            .accept(Duration::from_millis(50))
            .expect_err("nobody connects");
        assert!(e.to_string().contains("nothing arrived"), "{e}");
        let mut client = FdChannel::connect(listener.path()).expect("connect");
        client.set_timeout(Duration::from_millis(50));
        assert!(matches!(client.recv_msg(), Err(Error::Io { .. })));
    }

    #[test]
    fn two_threads_waiting_on_one_socket_for_one_arrival_never_hang() {
        use std::sync::{mpsc, Arc};
        let dir = PrivateDir::new("unit").expect("dir");
        let listener = Arc::new(FdListener::bind(&dir.path().join("s")).expect("bind"));
        let limit = Duration::from_millis(300);
        // Results come back by channel with a time limit, so a thread that hangs fails the
        // test instead of hanging it.
        fn collect<T>(rx: mpsc::Receiver<T>) -> Vec<T> {
            (0..2)
                .map(|_| {
                    rx.recv_timeout(Duration::from_secs(10))
                        .expect("a waiter hung")
                })
                .collect()
        }
        // Two accepts, one connection: one accepts it, the other's wait ends at its limit.
        let (tx, rx) = mpsc::channel();
        for _ in 0..2 {
            let (l, tx) = (listener.clone(), tx.clone());
            std::thread::spawn(move || tx.send(l.accept_within(limit)));
        }
        std::thread::sleep(Duration::from_millis(50));
        let client = FdChannel::connect(listener.path()).expect("connect");
        let got: Vec<_> = collect(rx)
            .into_iter()
            .map(|r| r.expect("no error"))
            .collect();
        assert_eq!(got.iter().filter(|c| c.is_some()).count(), 1);
        let mut server = got.into_iter().flatten().next().expect("accepted");
        server.set_timeout(limit);
        let server = Arc::new(server);
        // Two receivers, one message: one gets it, the other's wait ends at its limit; the same
        // with the caller's own limit (recv_msg_within).
        for within in [false, true] {
            let (tx, rx) = mpsc::channel();
            for _ in 0..2 {
                let (c, tx) = (server.clone(), tx.clone());
                std::thread::spawn(move || {
                    tx.send(if within {
                        c.recv_msg_within(limit)
                            .and_then(|m| m.ok_or_else(|| timed_out("within", limit)))
                    } else {
                        c.recv_msg()
                    })
                });
            }
            std::thread::sleep(Duration::from_millis(50));
            client.send_msg(b"once").expect("send");
            let results = collect(rx);
            let ok: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
            assert_eq!(ok, [&b"once".to_vec()], "within: {within}");
            assert!(results
                .iter()
                .any(|r| matches!(r, Err(e) if e.to_string().contains("nothing arrived"))));
        }
    }
}
