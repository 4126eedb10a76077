//! fd passing between two real processes, with a plain file's fd: runs in CI, no GPU needed.

use std::io::Read;
use std::os::fd::{AsFd, AsRawFd};
use std::path::PathBuf;
use std::time::Duration;

use p2p_mem::fdpass::{peer_uid, FdChannel, FdListener, PrivateDir, MAX_MESSAGE};
use p2p_mem::Error;
use p2p_testkit::{child_env, join, random_u8, role, spawn_role};

#[test]
fn a_file_descriptor_crosses_processes_and_bad_messages_are_rejected() {
    if role().as_deref() == Some("fd-sender") {
        return sender();
    }
    let dir = PrivateDir::new("fdtest").expect("private dir");
    let listener = FdListener::bind(&dir.path().join("sock")).expect("bind");
    let content = random_u8(p2p_testkit::fresh_seed(), 10_000);
    let file_path = dir.path().join("data");
    std::fs::write(&file_path, &content).expect("write the file");

    let child = spawn_role(
        "a_file_descriptor_crosses_processes_and_bad_messages_are_rejected",
        "fd-sender",
        listener.path(),
        &[("P2PTEST_FILE", file_path.display().to_string())],
    );
    let chan = listener.accept(Duration::from_secs(30)).expect("accept");
    // SAFETY: getuid has no preconditions.
    assert_eq!(peer_uid(chan.as_fd()).expect("SO_PEERCRED"), unsafe {
        libc::getuid()
    });

    // 1. One fd with a header: read the file through the received fd.
    let (header, fd) = chan.recv_fd().expect("receive the fd");
    assert_eq!(header, format!("file:{}", content.len()).into_bytes());
    // SAFETY: fcntl with integer arguments on an fd we own.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) };
    assert_eq!(
        flags & libc::FD_CLOEXEC,
        libc::FD_CLOEXEC,
        "received fds are close-on-exec"
    );
    let mut read_back = Vec::new();
    std::fs::File::from(fd)
        .read_to_end(&mut read_back)
        .expect("read through the fd");
    assert_eq!(
        read_back, content,
        "the received fd reads the sender's file"
    );

    // 2. Two fds in one message: rejected, and both closed.
    let err = chan.recv_fd().expect_err("two fds");
    assert!(
        matches!(&err, Error::Protocol(m) if m.contains("exactly one fd") && m.contains("got 2")),
        "{err}"
    );

    // 3. A message longer than MAX_MESSAGE: rejected as truncated.
    let err = chan.recv_msg().expect_err("oversized");
    assert!(
        matches!(&err, Error::Protocol(m) if m.contains("truncated")),
        "{err}"
    );

    // 4. The channel still works after the rejections.
    assert_eq!(chan.recv_msg().expect("final message"), b"bye");
    join(child, Duration::from_secs(30));
}

fn sender() {
    let socket = PathBuf::from(child_env("P2PTEST_SOCKET"));
    let file = std::fs::File::open(child_env("P2PTEST_FILE")).expect("open the file");
    let len = file.metadata().expect("stat").len();
    let chan = FdChannel::connect(&socket).expect("connect");
    chan.send_fd(format!("file:{len}").as_bytes(), file.as_fd())
        .expect("send the fd");
    chan.send_with_fds(b"two", &[file.as_fd(), file.as_fd()])
        .expect("send two fds");
    // Bypass the sender-side limit to make the receiver see a truncated message.
    let big = vec![7u8; MAX_MESSAGE + 100];
    // SAFETY: sending from a valid buffer on a connected socket we hold.
    let n = unsafe { libc::send(chan.as_fd().as_raw_fd(), big.as_ptr().cast(), big.len(), 0) };
    assert_eq!(n, big.len() as isize, "raw send");
    chan.send_msg(b"bye").expect("send bye");
}
