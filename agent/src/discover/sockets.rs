//! Classifying a process's fd from /proc: is it a socket we decode, and which kind?
//!
//! The kernel side reports each new fd of a tracked process once; this module decides whether
//! its payloads are worth copying: TCP sockets (the HTTP listener's connections, ZeroMQ tcp://)
//! and unix stream sockets (ZeroMQ ipc://). The eventfds of an API server are watched too: they
//! are libzmq's mailboxes, and reading one is the moment the event loop takes over a message its
//! I/O thread received (see `engines::common::handoff`). An SGLang scheduler's stdout and stderr are read
//! for its statistics reports (`engines::sglang::log`). Pipes, other eventfds, files and other
//! sockets are ignored in the kernel from then on.
use std::{
    collections::HashMap,
    fs,
    io::{self, BufRead as _},
    net::SocketAddr,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    time::{Duration, Instant},
};

use socket2::{Domain, SockRef, Type};

use serde::{Deserialize, Serialize};

use super::procfs::{pidfd_open, proc_path};

/// What an fd is, as far as the decoders care.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FdKind {
    /// A TCP socket. `server_side`: its local port is one the process listens on, so it is an
    /// accepted connection and the peer is the client.
    Tcp {
        local: SocketAddr,
        peer: SocketAddr,
        server_side: bool,
        listening: bool,
    },
    /// A unix stream socket; `path` is the bound path when the socket has one.
    Unix { path: Option<String> },
    /// An eventfd; `watched`: its 8-byte reads and writes are captured (an API server's).
    Eventfd { watched: bool },
    /// A process's stdout or stderr whose lines are read (an SGLang scheduler's: its statistics
    /// reports), whatever it is (a terminal, a pipe, a file).
    Log { what: String },
    /// Anything else (described for the log).
    Other { what: String },
    /// Closed before it could be looked up in /proc (a connection that lived less than one
    /// drain period). Its protocol is told from its first bytes.
    Vanished,
}

impl FdKind {
    /// Payloads of this fd are copied by the kernel side.
    pub fn capture(&self) -> bool {
        match self {
            FdKind::Tcp { listening, .. } => !listening,
            FdKind::Unix { .. } | FdKind::Log { .. } | FdKind::Vanished => true,
            FdKind::Eventfd { watched } => *watched,
            FdKind::Other { .. } => false,
        }
    }
}

/// How long a process's listening ports are trusted before they are looked up again.
const LISTENING_TTL: Duration = Duration::from_secs(1);

/// Classifies fds of traced processes. A socket is looked at through a duplicate of the
/// process's fd (`pidfd_getfd`, Linux 5.6+, needs CAP_SYS_PTRACE): a few syscalls whatever
/// the host's connection count, where finding its inode in /proc/net/tcp walks the kernel's
/// whole connection table (milliseconds per look-up on a busy host, the agent's main cost
/// before). /proc/net is the fallback when the fd cannot be duplicated.
#[derive(Default)]
pub struct SocketLookup {
    /// Listening ports per process, and when they were read.
    listening: HashMap<u32, (Vec<u16>, Instant)>,
    /// An open pidfd per process whose fds were looked at (at most [`MAX_PIDFDS`]).
    pidfds: HashMap<u32, OwnedFd>,
}

/// Pidfds kept open at once (each is an fd of the agent's).
const MAX_PIDFDS: usize = 256;

impl SocketLookup {
    /// Classify fd `fd` of process `pid`; None when the fd or the process is gone. An eventfd
    /// comes back unwatched: whether its process is an API server is the caller's question.
    pub fn classify(&mut self, pid: u32, fd: u32) -> Option<FdKind> {
        // Most new fds of an engine are its accepted connections: a socket is looked at
        // through its duplicate first, and only what is not one by its /proc link.
        let inspected = self
            .duplicate(pid, fd)
            .and_then(|duplicate| inspect_duplicate(&duplicate));
        match inspected {
            Ok(Inspected::Tcp {
                local,
                peer,
                listening,
            }) => Some(FdKind::Tcp {
                local,
                peer,
                server_side: self.listens_on(pid, local.port()),
                listening,
            }),
            Ok(Inspected::Unix { path }) => Some(FdKind::Unix { path }),
            Ok(Inspected::Other(what)) => Some(FdKind::Other { what }),
            // Closed (or the process gone) since the kernel reported it.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EBADF | libc::ESRCH)) => None,
            Err(e) => {
                let target = fs::read_link(proc_path(pid, &format!("fd/{fd}"))).ok()?;
                let target = target.to_string_lossy();
                if target == EVENTFD_LINK {
                    return Some(FdKind::Eventfd { watched: false });
                }
                match socket_inode(&target) {
                    // A socket that could not be duplicated: the /proc/net way.
                    Some(inode) if e.raw_os_error() != Some(libc::ENOTSOCK) => {
                        Some(classify_from_tables(pid, inode))
                    }
                    _ => Some(FdKind::Other {
                        what: target.into_owned(),
                    }),
                }
            }
        }
    }

    /// A duplicate of process `pid`'s fd `fd`, through the process's pidfd (kept: opening
    /// one per connection was two more syscalls each).
    fn duplicate(&mut self, pid: u32, fd: u32) -> io::Result<OwnedFd> {
        if let Some(pidfd) = self.pidfds.get(&pid) {
            match duplicate_fd(pidfd, fd) {
                // The pid's process exited: its number may now be another's.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {
                    self.pidfds.remove(&pid);
                }
                result => return result,
            }
        }
        if self.pidfds.len() >= MAX_PIDFDS {
            self.pidfds.clear();
        }
        let pidfd = pidfd_open(pid)?;
        let duplicate = duplicate_fd(&pidfd, fd);
        self.pidfds.insert(pid, pidfd);
        duplicate
    }

    /// Whether process `pid` listens on TCP port `port`. Reading a process's listening ports
    /// looks at all its fds, so a port found once is trusted; a port
    /// not found is looked up again, at most once per [`LISTENING_TTL`] (a new listener, or
    /// an outgoing connection's ephemeral port).
    fn listens_on(&mut self, pid: u32, port: u16) -> bool {
        let now = Instant::now();
        // The pidfd the fd was just duplicated through.
        let pidfd = self.pidfds.get(&pid);
        let entry = self
            .listening
            .entry(pid)
            .or_insert_with(|| (listening_ports_through(pid, pidfd), now));
        if !entry.0.contains(&port) && now.duration_since(entry.1) > LISTENING_TTL {
            *entry = (listening_ports_through(pid, pidfd), now);
        }
        entry.0.contains(&port)
    }

    /// The process exited: drop what is known of it.
    pub fn forget(&mut self, pid: u32) {
        self.listening.remove(&pid);
        self.pidfds.remove(&pid);
    }
}

/// A socket as its duplicate shows it.
#[derive(Debug, PartialEq, Eq)]
enum Inspected {
    Tcp {
        local: SocketAddr,
        peer: SocketAddr,
        listening: bool,
    },
    Unix {
        path: Option<String>,
    },
    Other(String),
}

/// Look at a socket through a duplicate of it (ENOTSOCK when it is none). Reading its
/// addresses and options has no effect on the socket.
fn inspect_duplicate(duplicate: &OwnedFd) -> io::Result<Inspected> {
    let socket = SockRef::from(duplicate);
    let domain = socket.domain()?;
    let stream = socket.r#type()? == Type::STREAM;
    if domain == Domain::UNIX && stream {
        // The bound path: an accepted socket carries its listener's; a connecting one has
        // none (its peer's is the listener's).
        let path = socket
            .local_addr()?
            .as_pathname()
            .map(|p| p.to_string_lossy().into_owned());
        return Ok(Inspected::Unix { path });
    }
    if (domain == Domain::IPV4 || domain == Domain::IPV6) && stream {
        let listening = socket.is_listener()?;
        let local = socket.local_addr()?.as_socket();
        // A listening or not yet connected socket has no peer.
        let peer = match socket.peer_addr() {
            Ok(peer) => peer.as_socket(),
            Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
                Some(SocketAddr::from(([0, 0, 0, 0], 0)))
            }
            Err(e) => return Err(e),
        };
        if let (Some(local), Some(peer)) = (local, peer) {
            return Ok(Inspected::Tcp {
                local,
                peer,
                listening,
            });
        }
    }
    Ok(Inspected::Other(format!(
        "{domain:?} {:?} socket",
        socket.r#type()?
    )))
}

/// A duplicate of fd `fd` of the process behind `pidfd`, in this process (`pidfd_getfd`).
fn duplicate_fd(pidfd: &OwnedFd, fd: u32) -> io::Result<OwnedFd> {
    let fd = libc::c_int::try_from(fd).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: pidfd_getfd takes a pidfd, a target fd and flags; it returns a new fd or -1.
    let duplicate = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if duplicate < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(duplicate as libc::c_int) })
}

/// The /proc/net way: find the socket's inode in the process's TCP and unix tables.
fn classify_from_tables(pid: u32, inode: u64) -> FdKind {
    for table in ["net/tcp", "net/tcp6"] {
        if let Some(entry) = read_table(pid, table).iter().find(|e| e.inode == inode) {
            let listen_ports = listening_ports(pid);
            return FdKind::Tcp {
                local: entry.local,
                peer: entry.remote,
                server_side: listen_ports.contains(&entry.local.port()),
                listening: entry.state == TCP_LISTEN,
            };
        }
    }
    let unix = fs::read_to_string(proc_path(pid, "net/unix")).unwrap_or_default();
    if let Some(path) = unix_stream_path(&unix, inode) {
        return FdKind::Unix { path };
    }
    // Not (or no longer) in the TCP and unix tables: most often a connection torn down between
    // the kernel's report and this look-up, or a later connection on the same fd number. Its
    // bytes are decoded by their content rather than dropped.
    FdKind::Vanished
}

/// Ports the process has a listening TCP socket on (its own fds only). Each of its sockets
/// is looked at through a duplicate; /proc/net is read only when they cannot be duplicated:
/// listing a table's listeners makes the kernel walk its whole connection hash (5 ms on this
/// machine kind, whose table has 262,144 buckets), however few connections there are.
pub fn listening_ports(pid: u32) -> Vec<u16> {
    listening_ports_through(pid, pidfd_open(pid).as_ref().ok())
}

/// [`listening_ports`], through the process's pidfd when one is open already.
fn listening_ports_through(pid: u32, pidfd: Option<&OwnedFd>) -> Vec<u16> {
    let by_duplicates = pidfd.map(|pidfd| listening_ports_by_duplicates(pidfd, pid));
    let mut ports = match by_duplicates {
        Some(Ok(ports)) => ports,
        _ => listening_ports_from_tables(pid),
    };
    ports.sort_unstable();
    ports.dedup();
    ports
}

fn listening_ports_by_duplicates(pidfd: &OwnedFd, pid: u32) -> io::Result<Vec<u16>> {
    let mut ports = Vec::new();
    for (fd, _) in socket_fds(pid) {
        let duplicate = match duplicate_fd(pidfd, fd) {
            Ok(duplicate) => duplicate,
            // Closed since its link was read.
            Err(e) if e.raw_os_error() == Some(libc::EBADF) => continue,
            Err(e) => return Err(e),
        };
        let socket = SockRef::from(&duplicate);
        if !socket.is_listener().unwrap_or(false) {
            continue;
        }
        if let Some(local) = socket.local_addr().ok().and_then(|a| a.as_socket()) {
            ports.push(local.port());
        }
    }
    Ok(ports)
}

fn listening_ports_from_tables(pid: u32) -> Vec<u16> {
    let own: Vec<u64> = socket_fds(pid)
        .into_iter()
        .map(|(_, inode)| inode)
        .collect();
    ["net/tcp", "net/tcp6"]
        .iter()
        .flat_map(|t| read_listeners(pid, t))
        .filter(|e| own.contains(&e.inode))
        .map(|e| e.local.port())
        .collect()
}

/// The process's sockets: (fd, inode).
fn socket_fds(pid: u32) -> Vec<(u32, u64)> {
    let Ok(dir) = fs::read_dir(proc_path(pid, "fd")) else {
        return Vec::new();
    };
    dir.filter_map(|e| {
        let e = e.ok()?;
        let fd = e.file_name().to_str()?.parse().ok()?;
        let link = fs::read_link(e.path()).ok()?;
        Some((fd, socket_inode(&link.to_string_lossy())?))
    })
    .collect()
}

fn socket_inode(link: &str) -> Option<u64> {
    link.strip_prefix("socket:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

const TCP_LISTEN: u8 = 0x0A;
/// What /proc/PID/fd/N links to for an eventfd.
const EVENTFD_LINK: &str = "anon_inode:[eventfd]";

struct TcpEntry {
    local: SocketAddr,
    remote: SocketAddr,
    state: u8,
    inode: u64,
}

fn read_table(pid: u32, table: &str) -> Vec<TcpEntry> {
    fs::read_to_string(proc_path(pid, table))
        .map(|text| parse_tcp_table(&text))
        .unwrap_or_default()
}

/// The listening sockets of /proc/PID/net/tcp or tcp6. The kernel lists every listener
/// before any other socket, so reading stops at the first line that is not one: on a busy
/// host the rest is thousands of connections, and the kernel walks them all to print them.
fn read_listeners(pid: u32, table: &str) -> Vec<TcpEntry> {
    let Ok(file) = fs::File::open(proc_path(pid, table)) else {
        return Vec::new();
    };
    listeners(io::BufReader::new(file).lines().map_while(Result::ok))
}

/// The leading listeners of a table's lines (its header line included).
fn listeners(lines: impl Iterator<Item = String>) -> Vec<TcpEntry> {
    lines
        .skip(1)
        .map_while(|line| parse_tcp_line(&line).filter(|e| e.state == TCP_LISTEN))
        .collect()
}

/// Parse /proc/net/tcp or tcp6.
fn parse_tcp_table(text: &str) -> Vec<TcpEntry> {
    text.lines().skip(1).filter_map(parse_tcp_line).collect()
}

fn parse_tcp_line(line: &str) -> Option<TcpEntry> {
    let cols: Vec<&str> = line.split_whitespace().collect();
    Some(TcpEntry {
        local: parse_hex_addr(cols.get(1)?)?,
        remote: parse_hex_addr(cols.get(2)?)?,
        state: u8::from_str_radix(cols.get(3)?, 16).ok()?,
        inode: cols.get(9)?.parse().ok()?,
    })
}

/// "0100007F:1F90" (IPv4) or 32 hex digits (IPv6), each 32-bit word in host byte order.
fn parse_hex_addr(text: &str) -> Option<SocketAddr> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let words: Option<Vec<u32>> = (0..ip.len() / 8)
        .map(|i| u32::from_str_radix(ip.get(i * 8..i * 8 + 8)?, 16).ok())
        .collect();
    let words = words?;
    let ip: std::net::IpAddr = match words.len() {
        1 => std::net::Ipv4Addr::from(words[0].to_le_bytes()).into(),
        4 => {
            let mut bytes = [0u8; 16];
            for (i, w) in words.iter().enumerate() {
                bytes[i * 4..i * 4 + 4].copy_from_slice(&w.to_le_bytes());
            }
            std::net::Ipv6Addr::from(bytes).into()
        }
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// Path of the unix stream socket with this inode in /proc/net/unix: Some(None) for an
/// unbound stream socket (a client end), None when the inode is absent or not a stream.
fn unix_stream_path(table: &str, inode: u64) -> Option<Option<String>> {
    const SOCK_STREAM: u32 = 1;
    table.lines().skip(1).find_map(|line| {
        let cols: Vec<&str> = line.split_whitespace().collect();
        if cols.get(6)?.parse::<u64>().ok()? != inode {
            return None;
        }
        if u32::from_str_radix(cols.get(4)?, 16).ok()? != SOCK_STREAM {
            return None;
        }
        Some(cols.get(7).map(|p| p.to_string()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_tcp_tables() {
        let text = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 12345 1 0000000000000000 100 0 0 10 0\n   1: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000     0        0 12346 1\n";
        let entries = parse_tcp_table(text);
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].local, "127.0.0.1:8080".parse().unwrap());
        assert_eq!(entries[0].state, TCP_LISTEN);
        assert_eq!(entries[1].remote, "127.0.0.1:54321".parse().unwrap());
        assert_eq!(entries[1].inode, 12346);
    }

    #[test]
    fn listeners_are_read_up_to_the_first_other_socket() {
        let line = |port: &str, state: &str, inode: u32| {
            format!(
                "   0: 0100007F:{port} 00000000:0000 {state} 00000000:00000000 00:00000000 00000000     0        0 {inode} 1"
            )
        };
        let lines = [
            "  sl  local_address rem_address   st".to_string(),
            line("1F90", "0A", 1),
            line("1F91", "0A", 2),
            line("1F90", "01", 3),
            line("1F92", "0A", 4),
        ];
        let found = listeners(lines.into_iter());
        let ports: Vec<u16> = found.iter().map(|e| e.local.port()).collect();
        assert_eq!(ports, vec![8080, 8081]);
        assert_eq!(found[1].inode, 2);
    }

    #[test]
    fn a_live_listener_is_found_among_connections() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding");
        let port = listener.local_addr().expect("its address").port();
        let client = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connecting");
        let (_server, _) = listener.accept().expect("accepting");
        let pid = std::process::id();
        assert!(listening_ports(pid).contains(&port));
        // The same from the connection tables, the way without duplicates.
        assert!(listening_ports_from_tables(pid).contains(&port));
        let local = client.local_addr().expect("the client's address").port();
        assert!(!listening_ports(pid).contains(&local));
    }

    #[test]
    fn parses_ipv6_loopback() {
        let addr = parse_hex_addr("00000000000000000000000001000000:0050").unwrap();
        assert_eq!(addr, "[::1]:80".parse().unwrap());
        assert!(parse_hex_addr("zz:0050").is_none());
        assert!(parse_hex_addr("0100007F").is_none());
    }

    #[test]
    fn finds_unix_stream_paths() {
        let table = "Num       RefCount Protocol Flags    Type St Inode Path\n0000000000000000: 00000002 00000000 00010000 0001 01 777 /tmp/sock\n0000000000000000: 00000003 00000000 00000000 0001 03 778\n0000000000000000: 00000003 00000000 00000000 0002 01 779 /dgram\n";
        assert_eq!(unix_stream_path(table, 777), Some(Some("/tmp/sock".into())));
        assert_eq!(unix_stream_path(table, 778), Some(None));
        assert_eq!(unix_stream_path(table, 779), None);
        assert_eq!(unix_stream_path(table, 1), None);
    }

    /// What a fresh duplicate of `pid`'s fd `fd` shows.
    fn inspect(pid: u32, fd: u32) -> io::Result<Inspected> {
        inspect_duplicate(&duplicate_fd(&pidfd_open(pid)?, fd)?)
    }

    #[test]
    fn a_duplicate_shows_tcp_ends_listeners_and_unix_paths() {
        use std::os::{fd::AsRawFd as _, unix::net::UnixListener};
        let pid = std::process::id();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        let fd = |f: &dyn std::os::fd::AsRawFd| f.as_raw_fd() as u32;
        assert!(matches!(
            inspect(pid, fd(&listener)).unwrap(),
            Inspected::Tcp { listening: true, local, .. } if local.port() == port
        ));
        assert_eq!(
            inspect(pid, fd(&accepted)).unwrap(),
            Inspected::Tcp {
                local: accepted.local_addr().unwrap(),
                peer: client.local_addr().unwrap(),
                listening: false,
            }
        );
        let mut lookup = SocketLookup::default();
        assert!(matches!(
            lookup.classify(pid, fd(&accepted)),
            Some(FdKind::Tcp {
                server_side: true,
                listening: false,
                ..
            })
        ));
        assert!(matches!(
            lookup.classify(pid, fd(&client)),
            Some(FdKind::Tcp {
                server_side: false,
                ..
            })
        ));
        let dir = std::env::temp_dir().join(format!("infertrace-sock-{pid}"));
        let _ = fs::remove_file(&dir);
        let unix = UnixListener::bind(&dir).unwrap();
        let connected = std::os::unix::net::UnixStream::connect(&dir).unwrap();
        let (served, _) = unix.accept().unwrap();
        let path = Some(dir.to_string_lossy().into_owned());
        assert_eq!(
            inspect(pid, served.as_raw_fd() as u32).unwrap(),
            Inspected::Unix { path }
        );
        assert_eq!(
            inspect(pid, connected.as_raw_fd() as u32).unwrap(),
            Inspected::Unix { path: None }
        );
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(matches!(
            inspect(pid, fd(&udp)).unwrap(),
            Inspected::Other(_)
        ));
        assert_eq!(
            inspect(pid, 1 << 20).unwrap_err().raw_os_error(),
            Some(libc::EBADF)
        );
        let _ = fs::remove_file(&dir);
    }

    #[test]
    fn what_is_not_a_socket_is_told_by_its_link_and_a_closed_fd_by_none() {
        use std::os::fd::{AsRawFd as _, IntoRawFd as _};
        let pid = std::process::id();
        let mut lookup = SocketLookup::default();
        // SAFETY: eventfd takes an initial value and flags; it returns a new fd or -1.
        let eventfd = unsafe { libc::eventfd(0, 0) };
        assert!(eventfd >= 0);
        // SAFETY: a fresh fd owned by nobody else.
        let eventfd = unsafe { OwnedFd::from_raw_fd(eventfd) };
        assert_eq!(
            lookup.classify(pid, eventfd.as_raw_fd() as u32),
            Some(FdKind::Eventfd { watched: false })
        );
        let file = fs::File::open("/proc/self/stat").unwrap();
        assert!(matches!(
            lookup.classify(pid, file.as_raw_fd() as u32),
            Some(FdKind::Other { what }) if what.starts_with("/proc/")
        ));
        let closed = fs::File::open("/proc/self/stat").unwrap().into_raw_fd();
        // SAFETY: closing an fd this test opened and owns.
        unsafe { libc::close(closed) };
        assert_eq!(lookup.classify(pid, closed as u32), None);
    }

    #[test]
    fn a_kept_pidfd_of_an_exited_process_is_replaced() {
        let pid = std::process::id();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let stale = pidfd_open(child.id()).unwrap();
        child.wait().unwrap();
        // As if this process's number had belonged to the exited one.
        let mut lookup = SocketLookup::default();
        lookup.pidfds.insert(pid, stale);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let _client = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        use std::os::fd::AsRawFd as _;
        assert!(matches!(
            lookup.classify(pid, accepted.as_raw_fd() as u32),
            Some(FdKind::Tcp {
                server_side: true,
                ..
            })
        ));
        lookup.forget(pid);
        assert!(lookup.pidfds.is_empty());
    }

    #[test]
    fn socket_links() {
        assert_eq!(socket_inode("socket:[42]"), Some(42));
        assert_eq!(socket_inode("pipe:[42]"), None);
        assert_eq!(socket_inode("anon_inode:[eventfd]"), None);
    }
}
