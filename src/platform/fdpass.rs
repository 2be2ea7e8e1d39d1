//! Messages with open file descriptors between processes: a `SOCK_SEQPACKET` socket pair (each send
//! one message, its boundaries kept) and `SCM_RIGHTS`. The fork server of warm trials gets each
//! trial's hand-off with the trial's own stdout and stderr this way, so a forked trial's output is a
//! pipe that ends when its processes close it, as a cold trial's.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::time::Duration;

/// A connected pair of `SOCK_SEQPACKET` Unix sockets, both close-on-exec (a child is given its end
/// as stdin, which `dup2` leaves open across the exec).
pub fn seqpacket_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: socketpair writes two descriptors into the array it is given.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned by nothing else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A pipe, both ends close-on-exec: the read end as a file, the write end to pass on.
pub fn pipe() -> io::Result<(std::fs::File, OwnedFd)> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned by nothing else.
    Ok(unsafe {
        (
            std::fs::File::from_raw_fd(fds[0]),
            OwnedFd::from_raw_fd(fds[1]),
        )
    })
}

/// Sends `data` as one message on `sock` with `fds` attached (the receiver gets its own copies).
pub fn send(sock: BorrowedFd, data: &[u8], fds: &[BorrowedFd]) -> io::Result<()> {
    let raw: Vec<libc::c_int> = fds.iter().map(|f| f.as_raw_fd()).collect();
    let bytes = std::mem::size_of_val(raw.as_slice()) as u32;
    // SAFETY: CMSG_SPACE computes a size.
    let space = unsafe { libc::CMSG_SPACE(bytes) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)]; // aligned as a cmsghdr needs
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: msghdr is plain data; every pointer set below outlives the sendmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !raw.is_empty() {
        msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = space as _;
        // SAFETY: the control buffer holds one cmsghdr with room for `raw` (CMSG_SPACE above).
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(bytes) as _;
            std::ptr::copy_nonoverlapping(
                raw.as_ptr() as *const u8,
                libc::CMSG_DATA(c),
                bytes as usize,
            );
        }
    }
    loop {
        // SAFETY: msg points at live buffers; MSG_NOSIGNAL: a closed peer is an error, no SIGPIPE.
        let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return if n as usize == data.len() {
                Ok(())
            } else {
                Err(io::Error::other("a message was sent in part"))
            };
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// The next message on `sock` (at most 4 KiB), waiting `timeout` at most: `None` when none came, or
/// the peer closed its end.
pub fn recv(sock: BorrowedFd, timeout: Duration) -> io::Result<Option<Vec<u8>>> {
    let mut pfd = libc::pollfd {
        fd: sock.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        // SAFETY: one valid pollfd.
        let r = unsafe { libc::poll(&mut pfd, 1, left.as_millis().min(i32::MAX as u128) as i32) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if r == 0 {
            return Ok(None);
        }
        let mut buf = vec![0u8; 4096];
        // SAFETY: recv into a buffer of its stated length.
        let n = unsafe {
            libc::recv(
                sock.as_raw_fd(),
                buf.as_mut_ptr() as *mut libc::c_void,
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if matches!(
                e.kind(),
                io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
            ) {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Ok(None);
        }
        buf.truncate(n as usize);
        return Ok(Some(buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::os::fd::AsFd;

    /// A message arrives whole with the descriptors attached, which stay usable after the sender
    /// closed its own copies; with nothing sent, the wait ends empty at its timeout.
    #[test]
    fn a_message_carries_open_descriptors() {
        let (a, b) = seqpacket_pair().unwrap();
        let (mut r, w) = pipe().unwrap();
        send(a.as_fd(), b"hello", &[w.as_fd()]).unwrap();
        drop(w);
        let mut buf = [0u8; 64];
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr() as *mut libc::c_void,
            iov_len: buf.len(),
        };
        let mut control = [0u64; 8];
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = std::mem::size_of_val(&control) as _;
        let n = unsafe { libc::recvmsg(b.as_raw_fd(), &mut msg, 0) };
        assert_eq!(&buf[..n as usize], b"hello");
        let got = unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            assert_eq!((*c).cmsg_type, libc::SCM_RIGHTS);
            std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::c_int)
        };
        let mut passed = unsafe { std::fs::File::from_raw_fd(got) };
        passed.write_all(b"through").unwrap();
        drop(passed);
        let mut s = String::new();
        r.read_to_string(&mut s).unwrap();
        assert_eq!(s, "through");
        assert_eq!(recv(b.as_fd(), Duration::from_millis(20)).unwrap(), None);
        send(b.as_fd(), b"12345", &[]).unwrap();
        assert_eq!(
            recv(a.as_fd(), Duration::from_secs(1)).unwrap().as_deref(),
            Some(&b"12345"[..])
        );
    }
}
