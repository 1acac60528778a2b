//! Many short connections in a row (one request each, `Connection: close`): the server reuses
//! the same fd numbers faster than infertrace classifies them from /proc. Every exchange must
//! still be decoded: a classification made for one connection must not silence the next one on
//! the same fd number (the kernel matches decisions to fd incarnations), and a connection torn
//! down before it is looked up is decoded by its content.
use std::{
    io::{Read, Write},
    net::TcpStream,
    process::{Command, Stdio},
    time::Duration,
};

use infertrace_tests::{Script, fixture, infertrace_bin, wait_for};

const CONNECTIONS: usize = 300;

#[test]
fn back_to_back_one_request_connections_are_all_decoded() {
    let mut server = Script::start(&[fixture("http_server.py").to_str().unwrap()]);
    let ready = server.read_line();
    let port: u16 = ready
        .trim()
        .strip_prefix("ready ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("server said {ready:?}"));
    // stderr to a file, read while it runs: it says when the agent is attached.
    let log_path =
        std::env::temp_dir().join(format!("short-connections-{}.log", std::process::id()));
    let log = std::fs::File::create(&log_path).expect("the agent's log file");
    let agent = Command::new(infertrace_bin())
        .args(["attach", "--pid", &server.pid().to_string()])
        .args(["--messages", "--output", "none", "--duration", "15"])
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("starting infertrace");
    let agent_log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    let attached = wait_for(Duration::from_secs(10), || {
        agent_log().contains("attached:")
    });
    assert!(attached, "never attached:\n{}", agent_log());
    for i in 0..CONNECTIONS {
        let body = format!("{i:010}");
        let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        write!(
            s,
            "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\nConnection: close\r\n\r\n{body}"
        )
        .unwrap();
        let mut response = String::new();
        s.read_to_string(&mut response).unwrap();
        assert!(response.ends_with(&body), "{response}");
    }
    let out = agent.wait_with_output().expect("infertrace output");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = agent_log();
    let _ = std::fs::remove_file(&log_path);
    let exchanges = stdout
        .lines()
        .filter(|l| l.contains("POST /echo") && l.contains("-> 200"))
        .count();
    assert_eq!(exchanges, CONNECTIONS, "{stderr}");
}
