//! Which processes are engines, what their fds are, and what this host can trace.
pub mod btf;
pub mod cmdline;
pub mod cuda;
pub mod engine;
pub mod gpu;
pub mod identity;
pub mod kubernetes;
pub mod pickle;
pub mod procfs;
pub mod python;
pub mod recognition;
pub mod servers;
pub mod sockets;
pub mod system;
pub mod uprobe_sites;
pub mod zmq;
