//! A Prometheus scrape endpoint (`--prometheus ADDR`): `GET /metrics` returns every metric
//! series of the registry in the text exposition format (0.0.4), names and labels exactly as
//! the spec writes them.
//!
//! Served from its own thread with blocking sockets: a scrape is one small request every few
//! seconds, and this keeps it apart from the capture loop.
use std::{
    fmt::Write as _,
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    sync::{Arc, Mutex},
    time::Duration,
};

use crate::telemetry::metrics::{Kind, Registry};

/// Largest request head read; scrapers send a few hundred bytes.
const MAX_REQUEST: usize = 16 << 10;

/// The text exposition of every series.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    let mut current = "";
    for sample in registry.snapshot() {
        if sample.name != current {
            current = sample.name;
            if let Some(def) = registry.def(sample.name) {
                let _ = writeln!(out, "# HELP {} {}", def.name, escape_help(def.description));
                let kind = match def.kind {
                    Kind::Counter => "counter",
                    Kind::Gauge => "gauge",
                };
                let _ = writeln!(out, "# TYPE {} {kind}", def.name);
            }
        }
        out.push_str(sample.name);
        // The engine instance's identity first (`service.instance.id` as
        // `service_instance_id`, as OpenTelemetry's Prometheus exporters name resource labels).
        let resource = sample
            .resource
            .iter()
            .map(|(k, v)| (k.replace('.', "_"), v));
        let dimensions = sample.dimensions.iter().map(|(k, v)| (k.to_string(), v));
        let labels: Vec<(String, &String)> = resource.chain(dimensions).collect();
        if !labels.is_empty() {
            out.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                let _ = write!(out, "{k}=\"{}\"", escape_label(v));
            }
            out.push('}');
        }
        let _ = writeln!(out, " {}", sample.value);
    }
    out
}

fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Bind `addr` and serve scrapes until the process exits. Returns the bound address.
pub fn serve(addr: &str, registry: Arc<Mutex<Registry>>) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)
        .map_err(|e| anyhow::anyhow!("--prometheus {addr}: cannot listen: {e}"))?;
    let bound = listener.local_addr()?;
    std::thread::Builder::new()
        .name("prometheus".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                if let Err(e) = answer(stream, &registry) {
                    tracing::debug!("prometheus scrape: {e}");
                }
            }
        })?;
    Ok(bound)
}

fn answer(mut stream: TcpStream, registry: &Mutex<Registry>) -> std::io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    let path = loop {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut request = httparse::Request::new(&mut headers);
        match request.parse(&buf) {
            Ok(httparse::Status::Complete(_)) => {
                break (request.method == Some("GET"))
                    .then(|| request.path.unwrap_or("").to_owned());
            }
            Ok(httparse::Status::Partial) if buf.len() < MAX_REQUEST => {}
            _ => break None,
        }
    };
    let (status, body) = match path.as_deref().map(|p| p.split('?').next().unwrap_or(p)) {
        Some("/metrics") => ("200 OK", render(&registry.lock().expect("registry lock"))),
        Some(_) => ("404 Not Found", "try /metrics\n".to_owned()),
        None => ("400 Bad Request", String::new()),
    };
    write!(
        stream,
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::metrics::MetricDef;

    const C: MetricDef = MetricDef {
        name: "gen_ai_vllm_request_success",
        kind: Kind::Counter,
        unit: "Times",
        description: "The number of successfully completed requests.",
    };

    #[test]
    fn exposition_format_and_scrape() {
        let mut r = Registry::default();
        r.add(
            &C,
            vec![
                ("finished_reason", "stop".into()),
                ("model_name", "a\"b".into()),
            ],
            2.0,
        );
        assert_eq!(
            render(&r),
            "# HELP gen_ai_vllm_request_success The number of successfully completed requests.\n\
             # TYPE gen_ai_vllm_request_success counter\n\
             gen_ai_vllm_request_success{finished_reason=\"stop\",model_name=\"a\\\"b\"} 2\n"
        );
        let addr = serve("127.0.0.1:0", Arc::new(Mutex::new(r))).unwrap();
        let get = |path: &str| {
            let mut s = TcpStream::connect(addr).unwrap();
            write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
            let mut text = String::new();
            s.read_to_string(&mut text).unwrap();
            text
        };
        let ok = get("/metrics");
        assert!(ok.starts_with("HTTP/1.1 200 OK"), "{ok}");
        assert!(ok.ends_with("model_name=\"a\\\"b\"} 2\n"), "{ok}");
        assert!(get("/other").starts_with("HTTP/1.1 404"));
    }
}
