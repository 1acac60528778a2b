//! OTLP export end to end: `infertrace replay` of a real engine's workload fixture (vLLM's, over
//! gRPC and over HTTP/protobuf; SGLang's over gRPC) sends its spans and metrics to a real OTLP
//! receiver (the opentelemetry-proto Python bindings); what the receiver got must be what the
//! JSONL output holds, each engine instance's spans and metrics under its own resource.
use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader},
    net::TcpListener,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use infertrace_tests::{fixture, infertrace_bin, python};
use serde_json::Value;

struct Receiver {
    child: Child,
    http: u16,
    grpc: u16,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn receiver(out: &Path) -> Receiver {
    let (http, grpc) = (free_port(), free_port());
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../xtask/scripts/engines/vllm/otlp_receiver.py");
    let mut child = Command::new(python())
        .arg(script)
        .arg(out)
        .arg(http.to_string())
        .arg(grpc.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .expect("starting otlp_receiver.py (needs grpcio and opentelemetry-proto)");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("receiver banner");
    assert!(line.starts_with("OTLP receiver"), "receiver said {line:?}");
    Receiver { child, http, grpc }
}

fn json_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect()
}

/// Per span name, the sorted multiset of (attribute keys, duration): what must survive export.
fn span_shapes(
    spans: impl Iterator<Item = (String, Vec<String>, u64)>,
) -> BTreeMap<String, Vec<(Vec<String>, u64)>> {
    let mut shapes: BTreeMap<String, Vec<(Vec<String>, u64)>> = BTreeMap::new();
    for (name, mut keys, duration) in spans {
        keys.sort();
        shapes.entry(name).or_default().push((keys, duration));
    }
    for v in shapes.values_mut() {
        v.sort();
    }
    shapes
}

/// Whether an OTLP resource (attribute -> AnyValue as JSON) holds every attribute of one of
/// our JSONL resources (attribute -> string).
fn same_resource(otlp: &Value, ours: &Value) -> bool {
    ours.as_object().is_some_and(|ours| {
        ours.iter().all(|(key, value)| {
            let theirs = &otlp[key];
            let text = theirs["stringValue"]
                .as_str()
                .map(str::to_owned)
                .or_else(|| theirs["intValue"].as_str().map(str::to_owned));
            text.as_deref() == value.as_str()
        })
    })
}

fn num(v: &Value) -> u64 {
    v.as_u64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        .unwrap_or(0)
}

/// Replays `recording` (a fixture of engine `service`, as its own tracing names itself) with
/// an OTLP export over `protocol`, and compares what arrived with the JSONL output; `with_events`:
/// whether its spans carry events (vLLM's iterations at granularity 2; the SGLang fixtures were
/// recorded before the scheduler's loop, whose `schedule` events they would carry, was
/// followed).
fn export_and_compare(recording: &str, service: &str, protocol: &str, with_events: bool) {
    let dir = std::env::temp_dir().join(
        format!(
            "infertrace-otlp-{service}-{protocol}-{}",
            std::process::id()
        )
        .replace('/', "_"),
    );
    std::fs::create_dir_all(&dir).unwrap();
    let received = dir.join("received.jsonl");
    let ours = dir.join("ours.jsonl");
    let r = receiver(&received);
    let port = if protocol == "grpc" { r.grpc } else { r.http };
    let out = Command::new(infertrace_bin())
        .args(["replay"])
        .arg(fixture(recording))
        .args(["--granularity", "2", "--output"])
        .arg(format!("jsonl:{}", ours.display()))
        .args(["--otlp-protocol", protocol, "--otlp-endpoint"])
        .arg(format!("http://127.0.0.1:{port}"))
        .output()
        .expect("running infertrace replay");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ours = json_lines(&ours);
    let our_spans: Vec<&Value> = ours.iter().filter(|v| v["type"] == "span").collect();
    // The receiver writes as requests arrive; the replay waited for its exports to finish.
    let deadline = Instant::now() + Duration::from_secs(10);
    let got = loop {
        let got = json_lines(&received);
        let spans = got.iter().filter(|v| v.get("_signal").is_none()).count();
        if spans >= our_spans.len() || Instant::now() > deadline {
            break got;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let their_spans: Vec<&Value> = got.iter().filter(|v| v.get("_signal").is_none()).collect();
    assert_eq!(
        their_spans.len(),
        our_spans.len(),
        "spans received over {protocol}"
    );
    assert!(
        their_spans
            .iter()
            .all(|s| s["kind"] == "SPAN_KIND_INTERNAL")
    );
    let instance = our_spans[0]["resource"].clone();
    assert_eq!(
        instance["service.name"], "tiny",
        "the served model names the service"
    );
    assert!(
        their_spans
            .iter()
            .all(|s| same_resource(&s["_resource"], &instance)),
        "every span under its instance's resource: {instance}"
    );
    let theirs = span_shapes(their_spans.iter().map(|s| {
        let keys = s["attributes"]
            .as_object()
            .map(|a| a.keys().cloned().collect())
            .unwrap_or_default();
        let duration = num(&s["endTimeUnixNano"]) - num(&s["startTimeUnixNano"]);
        (
            s["name"].as_str().unwrap_or_default().to_owned(),
            keys,
            duration,
        )
    }));
    let mine = span_shapes(our_spans.iter().map(|s| {
        let keys = s["attributes"]
            .as_object()
            .map(|a| a.keys().cloned().collect())
            .unwrap_or_default();
        let duration = num(&s["end_time_unix_nano"]) - num(&s["start_time_unix_nano"]);
        (
            s["name"].as_str().unwrap_or_default().to_owned(),
            keys,
            duration,
        )
    }));
    assert_eq!(
        theirs, mine,
        "spans over {protocol} differ from the JSONL output"
    );
    let events = |spans: &[&Value], key: &str| -> usize {
        spans
            .iter()
            .map(|s| s[key].as_array().map_or(0, Vec::len))
            .sum()
    };
    assert_eq!(events(&their_spans, "events"), events(&our_spans, "events"));
    assert_eq!(
        events(&our_spans, "events") > 0,
        with_events,
        "span events in {recording}"
    );

    // Metrics: the last value of each series equals the last JSONL snapshot.
    let snapshot = ours
        .iter()
        .rev()
        .find(|v| v["type"] == "metrics")
        .expect("a snapshot");
    let mut last: BTreeMap<String, f64> = BTreeMap::new();
    for m in got.iter().filter(|v| v["_signal"] == "metric") {
        // The instance's points under its resource, the agent's own under the agent's.
        let owner = if same_resource(&m["_resource"], &instance) {
            "instance"
        } else {
            assert_eq!(m["_resource"]["service.name"]["stringValue"], "infertrace");
            "agent"
        };
        let key = format!(
            "{owner} {} {}",
            m["name"].as_str().unwrap(),
            m["attributes"]
        );
        last.insert(key, m["value"].as_f64().unwrap());
    }
    let samples = snapshot["samples"].as_array().unwrap();
    assert!(!samples.is_empty());
    for s in samples {
        // A point's attributes are its series' dimensions; JSONL gives each sample its
        // resource, OTLP each batch of points.
        let attributes = s["dimensions"].as_object().cloned().unwrap_or_default();
        let owner = match s.get("resource") {
            Some(resource) => {
                assert_eq!(resource, &instance);
                "instance"
            }
            None => "agent",
        };
        let key = format!(
            "{owner} {} {}",
            s["name"].as_str().unwrap(),
            Value::Object(attributes)
        );
        assert_eq!(
            last.get(&key),
            s["value"].as_f64().as_ref(),
            "{key} over {protocol}"
        );
    }
    drop(r);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn spans_and_metrics_over_grpc() {
    export_and_compare("vllm-0.32.0-workload.rec", "vllm", "grpc", true);
}

#[test]
fn spans_and_metrics_over_http_protobuf() {
    export_and_compare("vllm-0.32.0-workload.rec", "vllm", "http/protobuf", true);
}

#[test]
fn sglang_spans_and_metrics_over_grpc() {
    export_and_compare("sglang-0.5.23-pickle.rec", "sglang", "grpc", false);
}

#[test]
fn a_dead_collector_is_said_once_and_every_lost_span_counted() {
    let dir = std::env::temp_dir().join(format!("infertrace-otlp-dead-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ours = dir.join("ours.jsonl");
    // Nothing listens there.
    let port = free_port();
    let bin = infertrace_bin();
    let started = Instant::now();
    let out = Command::new(bin)
        .args(["replay"])
        .arg(fixture("vllm-0.32.0-workload.rec"))
        .args(["--output"])
        .arg(format!("jsonl:{}", ours.display()))
        .args(["--otlp-endpoint", &format!("http://127.0.0.1:{port}")])
        .env("INFERTRACE_LOG", "info")
        .output()
        .expect("running infertrace replay");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "a dead collector held the end for {:?}",
        started.elapsed()
    );
    let warnings = stderr
        .lines()
        .filter(|l| l.contains("OTLP:") && l.contains("failed"))
        .collect::<Vec<_>>();
    let spans = json_lines(&ours)
        .iter()
        .filter(|v| v["type"] == "span")
        .count();
    // The first failure at once, then the totals at the end: not a line per batch.
    assert_eq!(warnings.len(), 2, "{stderr}");
    let totals = warnings[1];
    let count = |after: &str| -> usize {
        let before = totals.split(after).next().unwrap_or_default();
        before
            .rsplit(|c: char| !c.is_ascii_digit())
            .find(|w| !w.is_empty())
            .and_then(|n| n.parse().ok())
            .unwrap_or(usize::MAX)
    };
    assert_eq!(count(" spans exported"), 0, "{totals}");
    assert_eq!(
        count(" failed,") + count(" dropped") + count(" unsent"),
        spans,
        "every span is exported, failed, dropped or unsent: {totals}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
