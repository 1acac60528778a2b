//! Human-readable output: one line per finished request (from its spans), a metrics summary
//! at each metrics interval, and with `--messages` one line per decoded HTTP exchange and
//! ZeroMQ message.
//!
//! Each line is written into one pre-sized String: on a busy engine this runs for every
//! message, and per-value `format!` calls made it the agent's most expensive step.
use std::{collections::BTreeMap, fmt::Write as _, io::Write as _, sync::Arc};

use infertrace_common::cuda_fn;

use super::Exporter;
use crate::{
    decode::{cuda::CudaEvent, flows::Decoded, http::HttpExchange, zmtp::ZmtpMessage},
    telemetry::{
        metrics::{MetricDef, Resource, SERVICE_INSTANCE_ID, Sample},
        span::{AttrValue, Span},
    },
};

/// Bytes of each frame shown in hex.
const HEAD_BYTES: usize = 12;
/// Frames listed per ZMTP message before "...".
const MAX_FRAMES_SHOWN: usize = 4;

/// Renders lines with wall-clock times from the kernel's monotonic timestamps.
pub struct Console {
    /// CLOCK_REALTIME - CLOCK_MONOTONIC, ns.
    realtime_offset_ns: i128,
}

impl Console {
    pub fn new(realtime_offset_ns: i128) -> Self {
        Self { realtime_offset_ns }
    }

    /// The line for one decoded item; none for a loop's epoll wait, a mailbox poll or the start
    /// of a serialization (thousands a second, and only an input to the timing of others) nor
    /// a Python stack sample (`infertrace profile` and `--profile-output` show those).
    pub fn line(&self, decoded: &Decoded) -> Option<String> {
        if matches!(
            decoded,
            Decoded::LoopWait(_)
                | Decoded::MailboxPoll(_)
                | Decoded::Serializing(_)
                | Decoded::PySample(_)
                // The agent's log says which servers it traces, and when they exit.
                | Decoded::Traced(_)
                | Decoded::Pod { .. }
                | Decoded::Exited { .. }
        ) {
            return None;
        }
        let mut line = String::with_capacity(160);
        self.time(&mut line, decoded.start_ns());
        match decoded {
            Decoded::Http { tgid, fd, exchange } => {
                let _ = write!(line, " http pid={tgid} fd={fd} ");
                http(&mut line, exchange);
            }
            Decoded::Zmtp {
                tgid,
                fd,
                outgoing,
                message,
            } => {
                let direction = if *outgoing { "send" } else { "recv" };
                let _ = write!(line, " zmtp pid={tgid} fd={fd} {direction} ");
                zmtp(&mut line, message);
            }
            Decoded::Process(p) => {
                let _ = write!(line, " process pid={} {}", p.pid, p.cmdline.join(" "));
            }
            Decoded::Wakeup(w) => {
                let what = if w.write { "signal" } else { "wake" };
                let _ = write!(
                    line,
                    " eventfd pid={} fd={} tid={} {what}",
                    w.tgid, w.fd, w.tid
                );
            }
            Decoded::Handover(h) => {
                let _ = write!(
                    line,
                    " zmq pid={} tid={} handed over {} B on socket {:#x}",
                    h.tgid, h.tid, h.size, h.socket
                );
            }
            Decoded::Log(log) => {
                let _ = write!(line, " log pid={} {}", log.tgid, log.line);
            }
            Decoded::Clock(moved) => {
                let _ = write!(
                    line,
                    " wall clock now {} ns ahead of the monotonic clock",
                    moved.realtime_minus_monotonic_ns
                );
            }
            Decoded::LoopWait(_)
            | Decoded::MailboxPoll(_)
            | Decoded::Serializing(_)
            | Decoded::PySample(_)
            | Decoded::Traced(_)
            | Decoded::Pod { .. }
            | Decoded::Exited { .. } => {}
            Decoded::Cuda(CudaEvent::Step(step)) => {
                let _ = write!(
                    line,
                    " cuda pid={} tid={} step ended by {}: {} launches, {} graph launches, \
                     {} copies",
                    step.tgid,
                    step.tid,
                    cuda_fn::name(step.sync_function),
                    step.launches,
                    step.graph_launches,
                    step.copies
                );
            }
            Decoded::Cuda(CudaEvent::Name(name)) => {
                let _ = write!(line, " cuda {name:?}");
            }
            Decoded::Cuda(CudaEvent::Exited { tgid, .. }) => {
                let _ = write!(line, " cuda pid={tgid} exited");
            }
        }
        Some(line)
    }

    /// HH:MM:SS.micros of the wall clock.
    fn time(&self, line: &mut String, monotonic_ns: u64) {
        time_of_day(line, monotonic_ns as i128 + self.realtime_offset_ns);
    }
}

/// HH:MM:SS.micros (UTC) of a Unix time in ns.
fn time_of_day(line: &mut String, unix_ns: i128) {
    // Narrowed before formatting: formatting an i128 costs thousands of instructions.
    let secs_of_day = (unix_ns / 1_000_000_000).rem_euclid(86_400) as u32;
    let micros = (unix_ns / 1_000).rem_euclid(1_000_000) as u32;
    let _ = write!(
        line,
        "{:02}:{:02}:{:02}.{micros:06}",
        secs_of_day / 3600,
        secs_of_day / 60 % 60,
        secs_of_day % 60
    );
}

/// The live view on stdout: a line per finished request and, per interval, a metrics line per
/// traced server with the figures its engine chose.
pub struct ConsoleExporter {
    /// Each engine kind's figures.
    fields: Vec<&'static [SummaryField]>,
}

/// A figure of the console's metrics line: the total of a metric over an instance's series.
pub struct SummaryField {
    pub label: &'static str,
    pub metric: &'static MetricDef,
    /// A ratio, shown as a percentage.
    pub percent: bool,
}

impl SummaryField {
    pub const fn total(label: &'static str, metric: &'static MetricDef) -> Self {
        Self {
            label,
            metric,
            percent: false,
        }
    }

    pub const fn percent(label: &'static str, metric: &'static MetricDef) -> Self {
        Self {
            label,
            metric,
            percent: true,
        }
    }
}

impl ConsoleExporter {
    /// `fields`: each engine kind's figures. A server's line shows the figures of the kind
    /// whose metrics it has.
    pub fn new(fields: Vec<&'static [SummaryField]>) -> Self {
        Self { fields }
    }
}

impl Exporter for ConsoleExporter {
    fn spans(&mut self, _resource: &Arc<Resource>, spans: &[Span]) {
        let text = request_lines(spans);
        if !text.is_empty() {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
        }
    }

    fn metrics(&mut self, samples: &[Sample], unix_ns: u64) {
        let text = metrics_lines(&self.fields, samples, unix_ns);
        if !text.is_empty() {
            let mut out = std::io::stdout().lock();
            let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
        }
    }
}

fn int_attr(span: &Span, key: &str) -> Option<i64> {
    match span.attribute(key)? {
        AttrValue::Int(v) => Some(*v),
        _ => None,
    }
}

fn str_attr<'a>(span: &'a Span, key: &str) -> Option<&'a str> {
    match span.attribute(key)? {
        AttrValue::Str(v) => Some(v),
        _ => None,
    }
}

/// One line per entry span (with its engine requests) and per `llm_request` without one.
pub fn request_lines(spans: &[Span]) -> String {
    let mut text = String::new();
    for span in spans.iter().filter(|s| {
        s.name != "llm_request"
            && s.parent_span_id
                .is_none_or(|p| !spans.iter().any(|o| o.span_id == p))
    }) {
        if ["wait", "prefill", "decode", "kv_transfer"].contains(&span.name.as_str()) {
            continue;
        }
        time_of_day(&mut text, i128::from(span.start_time_unix_nano));
        let _ = write!(text, " {}", span.name);
        if let Some(id) = str_attr(span, "gen_ai.response.id") {
            let _ = write!(text, " {id}");
        }
        if let Some(error) = &span.error {
            let _ = write!(text, " ERROR ({error})");
        }
        let tokens = [
            ("in", "gen_ai.usage.input_tokens"),
            ("out", "gen_ai.usage.output_tokens"),
        ];
        for (label, key) in tokens {
            if let Some(v) = int_attr(span, key) {
                let _ = write!(text, " {label}={v}");
            }
        }
        let ms = (span
            .end_time_unix_nano
            .saturating_sub(span.start_time_unix_nano)) as f64
            / 1e6;
        let _ = write!(text, " {ms:.1} ms");
        for child in spans
            .iter()
            .filter(|c| c.name == "llm_request" && c.parent_span_id == Some(span.span_id))
        {
            text.push_str(" |");
            llm_request(&mut text, child);
        }
        text.push('\n');
    }
    for span in spans.iter().filter(|s| {
        s.name == "llm_request"
            && s.parent_span_id
                .is_none_or(|p| !spans.iter().any(|o| o.span_id == p))
    }) {
        time_of_day(&mut text, i128::from(span.start_time_unix_nano));
        text.push_str(" (no API call seen) |");
        llm_request(&mut text, span);
        text.push('\n');
    }
    text
}

fn llm_request(text: &mut String, span: &Span) {
    if let Some(id) = str_attr(span, "gen_ai.request.id") {
        let _ = write!(text, " {id}");
    }
    for (label, key) in [
        ("prompt", "gen_ai.usage.prompt_tokens"),
        ("cached", "gen_ai.usage.cache_read.input_tokens"),
        ("completion", "gen_ai.usage.completion_tokens"),
    ] {
        if let Some(v) = int_attr(span, key) {
            let _ = write!(text, " {label}={v}");
        }
    }
    for (label, key) in [
        ("tokenize", "gen_ai.latency.time_in_tokenize"),
        ("queue", "gen_ai.latency.time_in_queue"),
        ("prefill", "gen_ai.latency.time_in_model_prefill"),
        ("decode", "gen_ai.latency.time_in_model_decode"),
        ("ttft", "gen_ai.latency.time_to_first_token"),
        ("e2e", "gen_ai.latency.e2e"),
    ] {
        if let Some(v) = int_attr(span, key) {
            let _ = write!(text, " {label}={:.2}ms", v as f64 / 1e6);
        }
    }
    if let Some(v) = int_attr(span, "gen_ai.request.preemption_count") {
        let _ = write!(text, " preempted={v}");
    }
    if let Some(v) = str_attr(span, "infertrace.finish_reason") {
        let _ = write!(text, " finish={v}");
    }
}

/// One line per traced server (the agent's own series are not shown): its identity, then the
/// figures of the engine kind whose metrics it has most of.
fn metrics_lines(fields: &[&[SummaryField]], samples: &[Sample], unix_ns: u64) -> String {
    let mut instances: BTreeMap<&str, Vec<&Sample>> = BTreeMap::new();
    for sample in samples {
        if let Some(id) = sample.resource.get(SERVICE_INSTANCE_ID) {
            instances.entry(id).or_default().push(sample);
        }
    }
    let mut text = String::new();
    for (id, samples) in instances {
        let total = |name: &str| -> f64 {
            samples
                .iter()
                .filter(|s| s.name == name)
                .map(|s| s.value)
                // Not `sum()`: an empty f64 sum is -0, printed "-0".
                .fold(0.0, |a, b| a + b)
        };
        let shown = |set: &[SummaryField]| {
            set.iter()
                .filter(|f| samples.iter().any(|s| s.name == f.metric.name))
                .count()
        };
        let Some(set) = fields
            .iter()
            .filter(|set| shown(set) > 0)
            .max_by_key(|set| shown(set))
        else {
            continue;
        };
        time_of_day(&mut text, i128::from(unix_ns));
        let _ = write!(text, " metrics instance={id}");
        for field in *set {
            let value = total(field.metric.name);
            if field.percent {
                let _ = write!(text, " {}={:.1}%", field.label, 100.0 * value);
            } else {
                let _ = write!(text, " {}={value}", field.label);
            }
        }
        text.push('\n');
    }
    text
}

fn http(line: &mut String, exchange: &HttpExchange) {
    match &exchange.request {
        Some(req) => {
            let _ = write!(line, "{} {} ({} B)", req.method, req.path, req.body.len());
        }
        None => line.push_str("<request not seen>"),
    }
    match &exchange.response {
        Some(resp) => {
            let _ = write!(
                line,
                " -> {} {} ({} B",
                resp.status,
                resp.reason,
                resp.body.len()
            );
            if !resp.sse_events.is_empty() {
                let _ = write!(line, ", {} SSE events", resp.sse_events.len());
            }
            line.push(')');
            if let Some(req) = &exchange.request {
                let ms = resp.last_ns.saturating_sub(req.first_ns) as f64 / 1e6;
                let _ = write!(line, " {ms:.3} ms");
            }
        }
        None => line.push_str(" -> <no response>"),
    }
    if !exchange.complete {
        line.push_str(" [incomplete]");
    }
}

fn zmtp(line: &mut String, message: &ZmtpMessage) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let total: usize = message.frames.iter().map(Vec::len).sum();
    let _ = write!(line, "{} frame(s), {total} B:", message.frames.len());
    for frame in message.frames.iter().take(MAX_FRAMES_SHOWN) {
        let _ = write!(line, " [{} B ", frame.len());
        for &b in frame.iter().take(HEAD_BYTES) {
            line.push(HEX[usize::from(b >> 4)] as char);
            line.push(HEX[usize::from(b & 0xf)] as char);
        }
        line.push_str(if frame.len() > HEAD_BYTES { "..]" } else { "]" });
    }
    if message.frames.len() > MAX_FRAMES_SHOWN {
        line.push_str(" ...");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zmtp_line() {
        let message = ZmtpMessage {
            first_ns: 1_000_000_000,
            last_ns: 1_000_000_000,
            frames: vec![vec![0x00], (0u8..20).collect()],
        };
        let d = Decoded::Zmtp {
            tgid: 5,
            fd: 9,
            outgoing: true,
            message,
        };
        assert_eq!(
            Console::new(3_600_000_000_000).line(&d).unwrap(),
            "01:00:01.000000 zmtp pid=5 fd=9 send 2 frame(s), 21 B: [1 B 00] \
             [20 B 000102030405060708090a0b..]"
        );
    }

    #[test]
    fn metrics_line_per_server_with_its_engines_figures() {
        use crate::engines::{Engine, kind};
        let sample = |name: &'static str, instance: Option<&str>, value: f64| Sample {
            name,
            kind: crate::telemetry::metrics::Kind::Counter,
            resource: instance
                .map(|id| Arc::new([(SERVICE_INSTANCE_ID.to_owned(), id.to_string())].into()))
                .unwrap_or_default(),
            dimensions: BTreeMap::new(),
            value,
        };
        let samples = [
            sample("gen_ai_vllm_request_success", Some("h:1"), 2.0),
            sample("gen_ai_vllm_request_success", Some("h:1"), 3.0),
            sample("gen_ai_vllm_kv_cache_usage_perc", Some("h:1"), 0.25),
            // Shared by both engines: does not make h:1 an SGLang server.
            sample("gen_ai_server_request_duration", Some("h:1"), 1.0),
            sample("num_requests_total", Some("h:2"), 7.0),
            sample("gen_ai_server_request_duration", Some("h:2"), 1.0),
            // The agent's own series and an instance with none of the figures: no line.
            sample("infertrace_ringbuf_lost_records", None, 9.0),
            sample("gen_ai_server_request_duration", Some("h:3"), 1.0),
        ];
        let fields: Vec<&'static [SummaryField]> = Engine::ALL
            .iter()
            .map(|e| kind(e).console_fields())
            .collect();
        let text = metrics_lines(&fields, &samples, 3_600_000_000_000);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(
            lines[0],
            "01:00:00.000000 metrics instance=h:1 requests=5 prompt_tokens=0 \
             generation_tokens=0 iterations=0 preemptions=0 running=0 waiting=0 kv_cache=25.0%"
        );
        assert_eq!(
            lines[1],
            "01:00:00.000000 metrics instance=h:2 requests=7 prompt_tokens=0 \
             generation_tokens=0 cached_tokens=0 reports=0"
        );
    }
}
