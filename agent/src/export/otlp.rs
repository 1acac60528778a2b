//! OTLP export of spans and metrics, over gRPC or HTTP/protobuf, with the OpenTelemetry SDK's
//! exporters.
//!
//! Exporting is network I/O that may stall; it runs on its own thread so that capture never
//! waits for a collector. Spans go to that thread through a bounded queue (full: the trace is
//! dropped and counted) and are sent in batches; metrics are read from the shared registry
//! through observable instruments at each metrics interval (cumulative temporality).
//!
//! Configuration follows the OpenTelemetry conventions: `--otlp-endpoint` / `--otlp-protocol`,
//! else `OTEL_EXPORTER_OTLP_ENDPOINT` (and the per-signal `..._TRACES_ENDPOINT`,
//! `..._METRICS_ENDPOINT`), `OTEL_EXPORTER_OTLP_PROTOCOL`, `OTEL_EXPORTER_OTLP_HEADERS`,
//! `OTEL_EXPORTER_OTLP_TIMEOUT`, `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`.
use std::{
    borrow::Cow,
    sync::{
        Arc, Mutex,
        atomic::{AtomicU64, Ordering},
        mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError},
    },
    thread::JoinHandle,
    time::{Duration, Instant, SystemTime},
};

use opentelemetry::{
    InstrumentationScope, KeyValue, Value,
    metrics::MeterProvider as _,
    trace::{Event, Link, SpanContext, SpanId, SpanKind, Status, TraceFlags, TraceId, TraceState},
};
use opentelemetry_otlp::{MetricExporter, Protocol, SpanExporter, WithExportConfig as _};
use opentelemetry_sdk::{
    Resource,
    metrics::{
        ManualReader, Pipeline, SdkMeterProvider, Temporality, data::ResourceMetrics,
        exporter::PushMetricExporter as _, reader::MetricReader,
    },
    trace::{SpanData, SpanEvents, SpanExporter as _, SpanLinks},
};

use super::Exporter;
use crate::telemetry::{
    metrics::{self as registry, Kind, MetricDef, Registry, Sample},
    span::{AttrValue, Attributes, Span},
};

/// Traces waiting for the export thread; beyond it new ones are dropped (and counted).
const QUEUE_TRACES: usize = 4096;
/// Spans sent per export call, and the longest a span waits for its batch.
const BATCH_SPANS: usize = 512;
const BATCH_DELAY: Duration = Duration::from_secs(1);
/// How long the end of a session waits for the last exports.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(15);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OtlpProtocol {
    Grpc,
    HttpProtobuf,
}

impl OtlpProtocol {
    /// `grpc` or `http/protobuf` (the `OTEL_EXPORTER_OTLP_PROTOCOL` values).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "grpc" => Some(Self::Grpc),
            "http/protobuf" | "http" => Some(Self::HttpProtobuf),
            _ => None,
        }
    }
}

#[derive(Clone, Debug)]
pub struct OtlpOptions {
    /// None: from the environment (`OTEL_EXPORTER_OTLP_ENDPOINT`, ...).
    pub endpoint: Option<String>,
    pub protocol: OtlpProtocol,
    /// Resource attributes describing the traced engine (service.name unless OTEL_SERVICE_NAME).
    pub service_name: String,
    pub resource: Vec<(String, String)>,
}

enum Message {
    Spans(Vec<Span>),
    Metrics,
    Shutdown,
}

/// The exporter handle the pipeline holds; the work happens on the export thread.
pub struct Otlp {
    queue: SyncSender<Message>,
    thread: Option<JoinHandle<()>>,
    /// Traces dropped because the queue was full.
    pub dropped: Arc<AtomicU64>,
    done: Option<Receiver<()>>,
}

/// Runs the exporters' futures: gRPC (tonic) needs a Tokio runtime; the HTTP exporter uses a
/// blocking client, which must not run inside one.
enum Runner {
    Tokio(tokio::runtime::Runtime),
    Plain,
}

impl Runner {
    fn run<F: std::future::Future>(&self, future: F) -> F::Output {
        match self {
            Runner::Tokio(rt) => rt.block_on(future),
            Runner::Plain => futures_executor::block_on(future),
        }
    }
}

/// Lets the export thread collect from the reader that the meter provider also holds.
#[derive(Debug, Clone)]
struct SharedReader(Arc<ManualReader>);

impl MetricReader for SharedReader {
    fn register_pipeline(&self, pipeline: std::sync::Weak<Pipeline>) {
        self.0.register_pipeline(pipeline)
    }
    fn collect(&self, rm: &mut ResourceMetrics) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.collect(rm)
    }
    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.force_flush()
    }
    fn shutdown_with_timeout(&self, timeout: Duration) -> opentelemetry_sdk::error::OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }
    fn temporality(&self, kind: opentelemetry_sdk::metrics::InstrumentKind) -> Temporality {
        self.0.temporality(kind)
    }
}

/// The full URL of an OTLP/HTTP signal path under a base endpoint given on the command line.
fn http_url(base: &str, path: &str) -> String {
    if base.trim_end_matches('/').ends_with(path) {
        base.to_owned()
    } else {
        format!("{}{path}", base.trim_end_matches('/'))
    }
}

impl Otlp {
    /// Build the exporters (fails on a bad endpoint) and start the export thread.
    pub fn start(
        options: &OtlpOptions,
        registry: Arc<Mutex<Registry>>,
        metrics: &[&'static MetricDef],
    ) -> anyhow::Result<Self> {
        let runner = match options.protocol {
            OtlpProtocol::Grpc => Runner::Tokio(
                tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?,
            ),
            OtlpProtocol::HttpProtobuf => Runner::Plain,
        };
        let (mut spans, metric_exporter) = {
            let _guard = match &runner {
                Runner::Tokio(rt) => Some(rt.enter()),
                Runner::Plain => None,
            };
            build_exporters(options)?
        };
        let mut resource = Resource::builder();
        if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
            resource = resource.with_service_name(options.service_name.clone());
        }
        let resource = resource
            .with_attributes(
                options
                    .resource
                    .iter()
                    .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
            )
            .build();
        spans.set_resource(&resource);
        let reader = SharedReader(Arc::new(
            ManualReader::builder()
                .with_temporality(Temporality::Cumulative)
                .build(),
        ));
        let provider = SdkMeterProvider::builder()
            .with_resource(resource)
            .with_reader(reader.clone())
            .build();
        register_instruments(&provider, registry, metrics);
        let (queue, rx) = mpsc::sync_channel(QUEUE_TRACES);
        let (done_tx, done) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || {
                export_loop(&runner, &spans, &metric_exporter, &reader, &rx);
                let _ = runner.run(async { spans.shutdown() });
                let _ = provider.shutdown();
                let _ = done_tx.send(());
            })?;
        Ok(Self {
            queue,
            thread: Some(thread),
            dropped: Arc::new(AtomicU64::new(0)),
            done: Some(done),
        })
    }
}

fn build_exporters(options: &OtlpOptions) -> anyhow::Result<(SpanExporter, MetricExporter)> {
    let metric = MetricExporter::builder().with_temporality(Temporality::Cumulative);
    Ok(match options.protocol {
        OtlpProtocol::Grpc => {
            let (mut s, mut m) = (SpanExporter::builder().with_tonic(), metric.with_tonic());
            if let Some(e) = &options.endpoint {
                s = s.with_endpoint(e.clone());
                m = m.with_endpoint(e.clone());
            }
            (s.build()?, m.build()?)
        }
        OtlpProtocol::HttpProtobuf => {
            let s = SpanExporter::builder()
                .with_http()
                .with_protocol(Protocol::HttpBinary);
            let m = metric.with_http().with_protocol(Protocol::HttpBinary);
            match &options.endpoint {
                Some(e) => (
                    s.with_endpoint(http_url(e, "/v1/traces")).build()?,
                    m.with_endpoint(http_url(e, "/v1/metrics")).build()?,
                ),
                None => (s.build()?, m.build()?),
            }
        }
    })
}

/// One observable instrument per metric; its callback reads the registry at collection.
fn register_instruments(
    provider: &SdkMeterProvider,
    registry: Arc<Mutex<Registry>>,
    metrics: &[&'static MetricDef],
) {
    let meter = provider.meter("infertrace");
    for def in metrics {
        let registry = registry.clone();
        let name = def.name;
        let observe = move || -> Vec<(f64, Vec<KeyValue>)> {
            let registry = registry.lock().expect("registry lock");
            registry
                .snapshot()
                .into_iter()
                .filter(|s| s.name == name)
                .map(|s| {
                    // The engine instance's identity rides on each point until each instance
                    // exports under its own resource.
                    let attrs = s
                        .dimensions
                        .into_iter()
                        .chain(s.resource)
                        .map(|(k, v)| KeyValue::new(k, v))
                        .collect();
                    (s.value, attrs)
                })
                .collect()
        };
        let unit = otel_unit(def.unit);
        match def.kind {
            Kind::Counter => {
                meter
                    .f64_observable_counter(def.name)
                    .with_description(def.description)
                    .with_unit(unit)
                    .with_callback(move |o| {
                        for (v, attrs) in observe() {
                            o.observe(v, &attrs);
                        }
                    })
                    .build();
            }
            Kind::Gauge => {
                meter
                    .f64_observable_gauge(def.name)
                    .with_description(def.description)
                    .with_unit(unit)
                    .with_callback(move |o| {
                        for (v, attrs) in observe() {
                            o.observe(v, &attrs);
                        }
                    })
                    .build();
            }
        }
    }
}

/// UCUM units for the spec's unit column (names stay exactly the spec's; collectors that
/// append unit suffixes understand these).
fn otel_unit(spec_unit: &str) -> &'static str {
    match spec_unit {
        "Seconds" => "s",
        "Ratio" => "1",
        _ => "",
    }
}

fn export_loop(
    runner: &Runner,
    spans: &SpanExporter,
    metrics: &MetricExporter,
    reader: &SharedReader,
    rx: &Receiver<Message>,
) {
    let mut batch: Vec<SpanData> = Vec::new();
    let mut oldest: Option<Instant> = None;
    let send_spans = |batch: &mut Vec<SpanData>| {
        if batch.is_empty() {
            return;
        }
        let n = batch.len();
        if let Err(e) = runner.run(spans.export(std::mem::take(batch))) {
            tracing::warn!("OTLP: exporting {n} spans failed: {e}");
        }
    };
    let send_metrics = || {
        let mut rm = ResourceMetrics::default();
        if let Err(e) = reader.collect(&mut rm) {
            tracing::warn!("OTLP: collecting metrics failed: {e}");
            return;
        }
        if let Err(e) = runner.run(metrics.export(&rm)) {
            tracing::warn!("OTLP: exporting metrics failed: {e}");
        }
    };
    loop {
        let wait = oldest.map_or(BATCH_DELAY, |t| BATCH_DELAY.saturating_sub(t.elapsed()));
        match rx.recv_timeout(wait) {
            Ok(Message::Spans(spans)) => {
                oldest.get_or_insert_with(Instant::now);
                batch.extend(spans.iter().map(span_data));
                if batch.len() >= BATCH_SPANS {
                    send_spans(&mut batch);
                    oldest = None;
                }
            }
            Ok(Message::Metrics) => send_metrics(),
            Err(RecvTimeoutError::Timeout) => {
                send_spans(&mut batch);
                oldest = None;
            }
            Ok(Message::Shutdown) | Err(RecvTimeoutError::Disconnected) => {
                send_spans(&mut batch);
                send_metrics();
                return;
            }
        }
    }
}

fn otel_value(v: &AttrValue) -> Value {
    match v {
        AttrValue::Str(s) => Value::from(s.clone()),
        AttrValue::Int(i) => Value::I64(*i),
        AttrValue::Float(f) => Value::F64(*f),
        AttrValue::Bool(b) => Value::Bool(*b),
        AttrValue::StrArray(a) => Value::Array(
            a.iter()
                .map(|s| s.clone().into())
                .collect::<Vec<opentelemetry::StringValue>>()
                .into(),
        ),
        AttrValue::IntArray(a) => Value::Array(a.clone().into()),
        AttrValue::FloatArray(a) => Value::Array(a.clone().into()),
    }
}

fn key_values(attrs: &Attributes) -> Vec<KeyValue> {
    attrs
        .iter()
        .map(|(k, v)| KeyValue::new(*k, otel_value(v)))
        .collect()
}

fn system_time(unix_ns: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_nanos(unix_ns)
}

/// The context of a sampled span of ours (ids are never the reserved all-zero ones).
fn sampled_context(trace_id: [u8; 16], span_id: [u8; 8]) -> SpanContext {
    SpanContext::new(
        TraceId::from_bytes(trace_id),
        SpanId::from_bytes(span_id),
        TraceFlags::SAMPLED,
        false,
        TraceState::default(),
    )
}

/// Our span as the SDK's exportable span.
pub fn span_data(span: &Span) -> SpanData {
    SpanData {
        span_context: sampled_context(span.trace_id, span.span_id),
        parent_span_id: span
            .parent_span_id
            .map_or(SpanId::INVALID, SpanId::from_bytes),
        parent_span_is_remote: false,
        span_kind: SpanKind::Internal,
        name: Cow::Owned(span.name.clone()),
        start_time: system_time(span.start_time_unix_nano),
        end_time: system_time(span.end_time_unix_nano),
        attributes: key_values(&span.attributes),
        dropped_attributes_count: 0,
        events: {
            let mut events = SpanEvents::default();
            events.events = span
                .events
                .iter()
                .map(|e| {
                    Event::new(
                        e.name,
                        system_time(e.time_unix_nano),
                        key_values(&e.attributes),
                        0,
                    )
                })
                .collect();
            events
        },
        links: {
            let mut links = SpanLinks::default();
            links.links = span
                .links
                .iter()
                .map(|id| Link::new(sampled_context(span.trace_id, *id), Vec::new(), 0))
                .collect();
            links
        },
        status: match &span.error {
            Some(message) => Status::error(message.clone()),
            None => Status::Unset,
        },
        instrumentation_scope: InstrumentationScope::builder("infertrace")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build(),
    }
}

impl Exporter for Otlp {
    fn spans(&mut self, _resource: &registry::Resource, spans: &[Span]) {
        match self.queue.try_send(Message::Spans(spans.to_vec())) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                if self.dropped.fetch_add(1, Ordering::Relaxed) == 0 {
                    tracing::warn!(
                        "OTLP: the collector does not keep up; dropping traces (counted)"
                    );
                }
            }
        }
    }

    fn metrics(&mut self, _samples: &[Sample], _unix_ns: u64) {
        // The export thread reads the registry itself; a full queue skips one snapshot.
        let _ = self.queue.try_send(Message::Metrics);
    }

    fn shutdown(&mut self) {
        let _ = self.queue.send(Message::Shutdown);
        if let Some(done) = self.done.take()
            && done.recv_timeout(SHUTDOWN_WAIT).is_err()
        {
            tracing::warn!("OTLP: the last export did not finish in {SHUTDOWN_WAIT:?}");
            return;
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let dropped = self.dropped.load(Ordering::Relaxed);
        if dropped > 0 {
            tracing::warn!("OTLP: {dropped} traces were dropped (export queue full)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_and_units() {
        assert_eq!(
            http_url("http://c:4318", "/v1/traces"),
            "http://c:4318/v1/traces"
        );
        assert_eq!(
            http_url("http://c:4318/", "/v1/metrics"),
            "http://c:4318/v1/metrics"
        );
        assert_eq!(
            http_url("http://c:4318/v1/traces", "/v1/traces"),
            "http://c:4318/v1/traces"
        );
        assert_eq!(otel_unit("Seconds"), "s");
        assert_eq!(
            OtlpProtocol::parse("http/protobuf"),
            Some(OtlpProtocol::HttpProtobuf)
        );
        assert_eq!(OtlpProtocol::parse("http/json"), None);
    }

    #[test]
    fn span_conversion_keeps_ids_times_attributes_and_status() {
        let span = Span {
            trace_id: [7; 16],
            span_id: [8; 8],
            parent_span_id: Some([9; 8]),
            name: "llm_request".into(),
            start_time_unix_nano: 1_000,
            end_time_unix_nano: 3_000,
            attributes: vec![
                ("gen_ai.latency.e2e", AttrValue::Int(2_000)),
                ("gen_ai.token.ids", AttrValue::IntArray(vec![1, 2])),
            ],
            events: vec![],
            links: vec![[6; 8]],
            error: Some("boom".into()),
        };
        let d = span_data(&span);
        assert_eq!(d.span_context.trace_id(), TraceId::from_bytes([7; 16]));
        assert_eq!(d.parent_span_id, SpanId::from_bytes([9; 8]));
        assert_eq!(
            d.end_time.duration_since(d.start_time).unwrap().as_nanos(),
            2_000
        );
        assert_eq!(
            d.attributes[0],
            KeyValue::new("gen_ai.latency.e2e", 2_000i64)
        );
        assert_eq!(d.status, Status::error("boom"));
        assert_eq!(d.links.len(), 1);
        let link = &d.links[0].span_context;
        assert_eq!(
            (link.trace_id(), link.span_id()),
            (TraceId::from_bytes([7; 16]), SpanId::from_bytes([6; 8]))
        );
        assert_eq!(d.span_kind, SpanKind::Internal);
    }
}
