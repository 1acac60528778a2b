//! Root test: trace a real Python HTTP/1.1 server with the real eBPF programs and check that
//! every exchange on a keep-alive connection (Content-Length, chunked, SSE) is decoded
//! byte-exact on the server's side.
use std::{
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    time::Duration,
};

use infertrace::decode::{flows::Decoded, http::HttpExchange};
use infertrace_tests::{Script, Tracer, fixture};

/// Read one HTTP/1.1 response from the client side, returning its raw bytes (enough framing
/// logic for the fixture's responses: Content-Length or chunked).
fn read_response(reader: &mut BufReader<TcpStream>) -> Vec<u8> {
    let mut raw = Vec::new();
    let mut length = None;
    let mut chunked = false;
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        raw.extend_from_slice(line.as_bytes());
        let lower = line.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            length = Some(v.trim().parse::<usize>().unwrap());
        }
        if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
            chunked = true;
        }
        if line == "\r\n" {
            break;
        }
    }
    if chunked {
        loop {
            let mut size = String::new();
            reader.read_line(&mut size).unwrap();
            raw.extend_from_slice(size.as_bytes());
            let n = usize::from_str_radix(size.trim(), 16).unwrap();
            let mut body = vec![0; n + 2];
            reader.read_exact(&mut body).unwrap();
            raw.extend_from_slice(&body);
            if n == 0 {
                break;
            }
        }
    } else if let Some(n) = length {
        let mut body = vec![0; n];
        reader.read_exact(&mut body).unwrap();
        raw.extend_from_slice(&body);
    }
    raw
}

fn exchanges(decoded: &[Decoded], pid: u32) -> Vec<&HttpExchange> {
    decoded
        .iter()
        .filter_map(|d| match d {
            Decoded::Http { tgid, exchange, .. } if *tgid == pid => Some(exchange.as_ref()),
            _ => None,
        })
        .collect()
}

/// The fixture server (tests/fixtures/http_server.py) and its port.
fn start_server() -> (Script, u16) {
    let mut server = Script::start(&[fixture("http_server.py").to_str().unwrap()]);
    let ready = server.read_line();
    let port = ready.strip_prefix("ready ").unwrap().parse().unwrap();
    (server, port)
}

#[test]
fn keep_alive_chunked_and_sse_exchanges_are_decoded_byte_exact() {
    let (server, port) = start_server();
    let mut tracer = Tracer::attach(&[server.pid()]);

    let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut writer = stream.try_clone().unwrap();
    let mut reader = BufReader::new(stream);
    // 200 KiB body: several syscalls on both sides, larger than one 16 KiB record.
    let big: Vec<u8> = (0..200 * 1024).map(|i| (i * 7 % 256) as u8).collect();
    let mut sent = Vec::new();
    for (path, body) in [
        ("/echo", b"hello".to_vec()),
        ("/chunked", vec![]),
        ("/sse", vec![]),
        ("/echo", big.clone()),
    ] {
        let method = if body.is_empty() { "GET" } else { "POST" };
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: test\r\n").into_bytes();
        if !body.is_empty() {
            req.extend_from_slice(format!("Content-Length: {}\r\n", body.len()).as_bytes());
        }
        req.extend_from_slice(b"\r\n");
        req.extend_from_slice(&body);
        writer.write_all(&req).unwrap();
        let response = read_response(&mut reader);
        sent.push((method, path, body, response));
    }
    let pid = server.pid();
    let done = tracer.pump_until(Duration::from_secs(10), |d| exchanges(d, pid).len() >= 4);
    assert!(done, "{}", tracer.describe());
    let (decoded, stats) = tracer.finish();
    let seen = exchanges(&decoded, server.pid());
    assert_eq!(
        seen.len(),
        4,
        "exactly the 4 exchanges, nothing invented: {seen:#?}"
    );
    for (exchange, (method, path, body, _)) in seen.iter().zip(&sent) {
        assert!(exchange.complete, "{exchange:?}");
        let req = exchange.request.as_ref().unwrap();
        assert_eq!((req.method.as_str(), req.path.as_str()), (*method, *path));
        assert_eq!(&req.body, body, "request body of {path}");
        let resp = exchange.response.as_ref().unwrap();
        assert_eq!(resp.status, 200);
        assert!(resp.first_ns >= req.first_ns && resp.last_ns >= resp.first_ns);
    }
    assert_eq!(seen[0].response.as_ref().unwrap().body, b"hello");
    assert_eq!(seen[1].response.as_ref().unwrap().body, b"alpha-beta-gamma");
    let sse = seen[2].response.as_ref().unwrap();
    let data: Vec<&str> = sse.sse_events.iter().map(|e| e.data.as_str()).collect();
    assert_eq!(
        data,
        [
            "{\"i\": 0}",
            "{\"i\": 1}",
            "{\"i\": 2}",
            "{\"i\": 3}",
            "{\"i\": 4}",
            "[DONE]"
        ]
    );
    assert!(sse.sse_events.windows(2).all(|w| w[0].ts_ns <= w[1].ts_ns));
    assert_eq!(seen[3].response.as_ref().unwrap().body, big);
    assert_eq!(stats.gaps, 0, "{stats:?}");
}

/// A streamed chat completion as vLLM writes it: once the agent has read one content write
/// whole, the kernel reports the server's later content writes by time and size only (but
/// each response's first, which names it), and each exchange still has every event, in order,
/// with the content events told apart.
#[test]
fn streamed_content_writes_are_reported_by_time_and_size_in_order() {
    use infertrace::decode::openai::ApiCall;

    let (server, port) = start_server();
    let mut tracer = Tracer::attach(&[server.pid()]);
    let responses = tracer.pump_during(|| {
        let stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
        let mut writer = stream.try_clone().unwrap();
        let mut reader = BufReader::new(stream);
        let request =
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: test\r\nContent-Length: 2\r\n\r\n{}";
        (0..2)
            .map(|_| {
                writer.write_all(request).unwrap();
                read_response(&mut reader)
            })
            .collect::<Vec<_>>()
    });
    assert!(responses.iter().all(|r| r.ends_with(b"0\r\n\r\n")));
    let pid = server.pid();
    let done = tracer.pump_until(Duration::from_secs(10), |d| exchanges(d, pid).len() >= 2);
    assert!(done, "{}", tracer.describe());
    let elided_by_kernel = tracer.kernel_counters_now().sse_elided;
    let (decoded, stats) = tracer.finish();
    let seen = exchanges(&decoded, pid);
    assert_eq!(seen.len(), 2, "{seen:#?}");
    for (n, exchange) in seen.iter().enumerate() {
        assert!(exchange.complete, "{exchange:?}");
        let events = &exchange.response.as_ref().unwrap().sse_events;
        // Role, 42 content writes (one without text), finish, [DONE].
        assert_eq!(events.len(), 45, "{events:#?}");
        assert!(events.windows(2).all(|w| w[0].ts_ns <= w[1].ts_ns));
        let elided: Vec<usize> = (0..events.len())
            .filter(|&i| events[i].elided.is_some())
            .collect();
        // Only content writes are elided: the first response's from the second after the
        // pause, the second's from its second.
        let first = if n == 0 { 4 } else { 2 };
        assert_eq!(elided, (first..=42).collect::<Vec<_>>(), "response {n}");
        assert_eq!(events[41].elided, Some(0), "the write without text");
        assert_eq!(events[42].elided, Some(r#"say \"hi\""#.len() as u32));
        assert_eq!(events[44].data, "[DONE]");
        let call = ApiCall::from_exchange(exchange).unwrap();
        assert_eq!(call.content_event_ns.len(), 41);
        assert_eq!(call.finish_reasons, ["length"]);
    }
    assert_eq!(stats.elided_syscalls, 39 + 41);
    assert_eq!(elided_by_kernel, stats.elided_syscalls);
    assert_eq!(stats.gaps, 0, "{stats:?}");
}
