//! A Prometheus scrape endpoint (`--prometheus ADDR`): `GET /metrics` returns every metric
//! series of the registry in the text exposition format (0.0.4), names and labels exactly as
//! the spec writes them. An engine instance's series carry its `service_instance_id`; the rest
//! of its resource (service name, container, pod, ...) is on its `target_info` series, as
//! OpenTelemetry's Prometheus exporters do, so that series do not grow a label per attribute.
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

use super::health::Health;
use crate::telemetry::metrics::{Kind, Registry, SERVICE_INSTANCE_ID};

/// Largest request head read; scrapers send a few hundred bytes.
const MAX_REQUEST: usize = 16 << 10;

/// The text exposition of every series.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    let scopes = registry.scopes();
    if !scopes.is_empty() {
        out.push_str("# HELP target_info Target metadata\n# TYPE target_info gauge\n");
        for (_, resource) in &scopes {
            out.push_str("target_info");
            labels(
                &mut out,
                resource.iter().map(|(k, v)| (k.replace('.', "_"), v)),
            );
            out.push_str(" 1\n");
        }
    }
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
        let instance = sample
            .resource
            .get_key_value(SERVICE_INSTANCE_ID)
            .map(|(k, v)| (k.replace('.', "_"), v));
        let dimensions = sample.dimensions.iter().map(|(k, v)| (k.to_string(), v));
        labels(&mut out, instance.into_iter().chain(dimensions));
        let _ = writeln!(out, " {}", sample.value);
    }
    out
}

/// `{k="v",...}`, nothing when there are none.
fn labels<'a>(out: &mut String, pairs: impl Iterator<Item = (String, &'a String)>) {
    let mut first = true;
    for (k, v) in pairs {
        out.push(if first { '{' } else { ',' });
        first = false;
        let _ = write!(out, "{k}=\"{}\"", escape_label(v));
    }
    if !first {
        out.push('}');
    }
}

fn escape_label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Bind `addr` and serve scrapes (and the health probes) until the process exits. Returns the
/// bound address.
pub fn serve(
    addr: &str,
    registry: Arc<Mutex<Registry>>,
    health: Arc<Health>,
) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)
        .map_err(|e| anyhow::anyhow!("--prometheus {addr}: cannot listen: {e}"))?;
    let bound = listener.local_addr()?;
    std::thread::Builder::new()
        .name("prometheus".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                if let Err(e) = answer(stream, &registry, &health) {
                    tracing::debug!("prometheus scrape: {e}");
                }
            }
        })?;
    Ok(bound)
}

fn answer(
    mut stream: TcpStream,
    registry: &Mutex<Registry>,
    health: &Health,
) -> std::io::Result<()> {
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
        Some("/readyz") if health.ready() => ("200 OK", "ready\n".to_owned()),
        Some("/readyz") => (
            "503 Service Unavailable",
            "loading the eBPF programs\n".to_owned(),
        ),
        Some("/healthz") if health.healthy() => ("200 OK", "ok\n".to_owned()),
        Some("/healthz") => (
            "503 Service Unavailable",
            "the capture loop is stalled\n".to_owned(),
        ),
        Some(_) => (
            "404 Not Found",
            "try /metrics, /healthz or /readyz\n".to_owned(),
        ),
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
        let health = Arc::new(Health::default());
        let addr = serve("127.0.0.1:0", Arc::new(Mutex::new(r)), health.clone()).unwrap();
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
        assert!(get("/readyz").starts_with("HTTP/1.1 503"));
        assert!(get("/healthz").starts_with("HTTP/1.1 503"));
        health.round();
        assert!(get("/readyz").starts_with("HTTP/1.1 200"));
        assert!(get("/healthz").starts_with("HTTP/1.1 200"));
    }

    #[test]
    fn an_instances_series_carry_its_id_and_its_target_info_the_rest() {
        let mut r = Registry::default();
        let resource: crate::telemetry::metrics::Resource = [
            ("service.instance.id", "node:42"),
            ("k8s.pod.name", "chat-0"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let scope = r.add_scope(resource);
        r.in_scope(scope, |r| {
            r.add(&C, vec![("model_name", "tiny".into())], 1.0)
        });
        let text = render(&r);
        assert!(
            text.contains(
                "target_info{k8s_pod_name=\"chat-0\",service_instance_id=\"node:42\"} 1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "gen_ai_vllm_request_success{service_instance_id=\"node:42\",model_name=\"tiny\"} 1\n"
            ),
            "{text}"
        );
    }
}
