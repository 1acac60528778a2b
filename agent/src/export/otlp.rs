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
    collections::BTreeMap,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
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
    agent_metrics::ExportTotals,
    metrics::{self as registry, Kind, MetricDef, Registry, Sample, Scope},
    span::{AttrValue, Attributes, Span},
};

/// Traces waiting for the export thread; beyond it new ones are dropped (and counted).
const QUEUE_TRACES: usize = 4096;
/// Spans sent per export call, and the longest a span waits for its batch.
const BATCH_SPANS: usize = 512;
const BATCH_DELAY: Duration = Duration::from_secs(1);
/// How long the end of a session waits for the last exports (SIGTERM must end the agent
/// within 10 s).
const SHUTDOWN_WAIT: Duration = Duration::from_secs(5);
/// At most one warning per this long about failing exports; the others are counted in it.
const WARN_EVERY: Duration = Duration::from_secs(60);

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
    /// The host the agent runs on (its own resource's `host.name`).
    pub host: String,
}

enum Message {
    /// One trace, of the engine instance the resource names.
    Spans(Arc<registry::Resource>, Vec<Span>),
    Metrics,
    Shutdown,
}

/// What the export did so far, shared with its thread.
#[derive(Debug, Default)]
struct Counters {
    /// Set when the session ends: the thread sends what it holds and stops, whatever is
    /// still queued.
    stopping: AtomicBool,
    queued_spans: AtomicU64,
    exported_spans: AtomicU64,
    failed_spans: AtomicU64,
    dropped_spans: AtomicU64,
    exported_points: AtomicU64,
    failed_points: AtomicU64,
}

impl Counters {
    fn totals(&self) -> ExportTotals {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ExportTotals {
            queued_spans: get(&self.queued_spans),
            exported_spans: get(&self.exported_spans),
            failed_spans: get(&self.failed_spans),
            dropped_spans: get(&self.dropped_spans),
            exported_points: get(&self.exported_points),
            failed_points: get(&self.failed_points),
        }
    }
}

/// Warnings about failing exports, at most one per [`WARN_EVERY`] (a dead collector must not
/// flood the log): the first failure at once, then a line a minute with what failed since.
#[derive(Debug, Default)]
struct FailureLog {
    last_warning: Option<Instant>,
    /// Since the last warning: failed exports, spans and points, and the last error.
    exports: u64,
    spans: u64,
    points: u64,
    last_error: String,
    failing: bool,
}

impl FailureLog {
    fn failed(&mut self, spans: u64, points: u64, error: &str) {
        self.exports += 1;
        self.spans += spans;
        self.points += points;
        self.last_error = error.to_owned();
        self.failing = true;
        if self.last_warning.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
            self.warn();
        }
    }

    fn warn(&mut self) {
        let first = self.last_warning.is_none();
        tracing::warn!(
            "OTLP: {} export{} failed{} ({} spans, {} metric points): {}{}",
            self.exports,
            if self.exports == 1 { "" } else { "s" },
            if first { "" } else { " in the last minute" },
            self.spans,
            self.points,
            self.last_error,
            if first {
                " (retried with the next batches; said again at most once a minute)"
            } else {
                ""
            }
        );
        self.last_warning = Some(Instant::now());
        (self.exports, self.spans, self.points) = (0, 0, 0);
    }

    fn succeeded(&mut self) {
        if self.failing {
            if self.exports > 0 {
                self.warn();
            }
            tracing::info!("OTLP: exports succeed again");
            self.failing = false;
        }
    }
}

/// The exporter handle the pipeline holds; the work happens on the export thread.
pub struct Otlp {
    queue: SyncSender<Message>,
    thread: Option<JoinHandle<()>>,
    counters: Arc<Counters>,
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
    /// Build the exporters (fails on a bad endpoint) and start the export thread. Each engine
    /// instance's spans and metrics go under its own resource; the agent's own series (capture,
    /// GPU, Python samples) under the agent's.
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
        let (spans, metric_exporter) = {
            let _guard = match &runner {
                Runner::Tokio(rt) => Some(rt.enter()),
                Runner::Plain => None,
            };
            build_exporters(options)?
        };
        let counters = Arc::new(Counters::default());
        let mut exporter = Exporting {
            spans,
            metrics: metric_exporter,
            counters: counters.clone(),
            failures: FailureLog::default(),
            meters: BTreeMap::new(),
            registry,
            defs: metrics.to_vec(),
            agent: agent_resource(&options.host),
            shared: shared_attributes(),
        };
        let (queue, rx) = mpsc::sync_channel(QUEUE_TRACES);
        let (done_tx, done) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("otlp-export".into())
            .spawn(move || {
                exporter.run(&runner, &rx);
                exporter.shutdown(&runner);
                let _ = done_tx.send(());
            })?;
        Ok(Self {
            queue,
            thread: Some(thread),
            counters,
            done: Some(done),
        })
    }
}

/// The attributes every resource of ours carries: what made the telemetry, and the agent's
/// own `OTEL_RESOURCE_ATTRIBUTES` (e.g. a cluster name set on the DaemonSet).
fn shared_attributes() -> Vec<KeyValue> {
    let mut attributes = vec![
        KeyValue::new("telemetry.auto.name", "infertrace"),
        KeyValue::new("telemetry.auto.version", env!("CARGO_PKG_VERSION")),
    ];
    if let Ok(text) = std::env::var("OTEL_RESOURCE_ATTRIBUTES") {
        attributes.extend(
            crate::discover::identity::resource_attributes(&text)
                .into_iter()
                .map(|(k, v)| KeyValue::new(k, v)),
        );
    }
    attributes
}

/// The agent's own resource: `service.name` infertrace (or the agent's `OTEL_SERVICE_NAME`).
fn agent_resource(host: &str) -> Resource {
    Resource::builder()
        .with_service_name(
            std::env::var("OTEL_SERVICE_NAME")
                .ok()
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "infertrace".to_owned()),
        )
        .with_attributes([
            KeyValue::new("host.name", host.to_owned()),
            KeyValue::new("process.pid", i64::from(std::process::id())),
        ])
        .build()
}

/// An engine instance's resource for the SDK: ours, after the shared attributes (ours win).
fn instance_resource(shared: &[KeyValue], resource: &registry::Resource) -> Resource {
    Resource::builder_empty()
        .with_attributes(shared.iter().cloned())
        .with_attributes(resource.iter().map(|(k, v)| match k.as_str() {
            // An integer in the semantic conventions.
            "process.pid" => v.parse::<i64>().map_or_else(
                |_| KeyValue::new(k.clone(), v.clone()),
                |pid| KeyValue::new(k.clone(), pid),
            ),
            _ => KeyValue::new(k.clone(), v.clone()),
        }))
        .build()
}

/// One resource's metrics: a meter provider whose instruments read that scope's series.
struct Meters {
    /// The registry's resource it was made for (a new one means the instance's identity
    /// changed: the provider is made again).
    made_for: Option<Arc<registry::Resource>>,
    reader: SharedReader,
    provider: SdkMeterProvider,
}

/// The export thread's state.
struct Exporting {
    spans: SpanExporter,
    metrics: MetricExporter,
    counters: Arc<Counters>,
    failures: FailureLog,
    /// By registry scope ([`registry::AGENT`]: the agent's own series).
    meters: BTreeMap<Scope, Meters>,
    registry: Arc<Mutex<Registry>>,
    defs: Vec<&'static MetricDef>,
    agent: Resource,
    shared: Vec<KeyValue>,
}

impl Exporting {
    fn run(&mut self, runner: &Runner, rx: &Receiver<Message>) {
        let mut batch: Vec<(Arc<registry::Resource>, SpanData)> = Vec::new();
        let mut oldest: Option<Instant> = None;
        loop {
            let wait = oldest.map_or(BATCH_DELAY, |t| BATCH_DELAY.saturating_sub(t.elapsed()));
            let message = rx.recv_timeout(wait);
            let last = match message {
                Ok(message) => self.take(runner, message, &mut batch, &mut oldest),
                Err(RecvTimeoutError::Timeout) => {
                    self.send_spans(runner, &mut batch);
                    oldest = None;
                    false
                }
                Err(RecvTimeoutError::Disconnected) => true,
            };
            // The session ends (the Shutdown message itself may not have fit in the queue):
            // what is queued goes out now, as far as the time the session waits allows.
            if last || self.counters.stopping.load(Ordering::Relaxed) {
                while let Ok(message) = rx.try_recv() {
                    self.take(runner, message, &mut batch, &mut oldest);
                }
                self.send_spans(runner, &mut batch);
                self.send_metrics(runner);
                return;
            }
        }
    }

    /// Handle one message; true when it is the last (Shutdown).
    fn take(
        &mut self,
        runner: &Runner,
        message: Message,
        batch: &mut Vec<(Arc<registry::Resource>, SpanData)>,
        oldest: &mut Option<Instant>,
    ) -> bool {
        match message {
            Message::Spans(resource, spans) => {
                oldest.get_or_insert_with(Instant::now);
                batch.extend(spans.iter().map(|s| (resource.clone(), span_data(s))));
                if batch.len() >= BATCH_SPANS {
                    self.send_spans(runner, batch);
                    *oldest = None;
                }
                false
            }
            Message::Metrics => {
                self.send_metrics(runner);
                false
            }
            Message::Shutdown => true,
        }
    }

    /// One export per resource in the batch.
    fn send_spans(
        &mut self,
        runner: &Runner,
        batch: &mut Vec<(Arc<registry::Resource>, SpanData)>,
    ) {
        let mut by_resource: BTreeMap<
            *const registry::Resource,
            (Arc<registry::Resource>, Vec<SpanData>),
        > = BTreeMap::new();
        for (resource, span) in batch.drain(..) {
            by_resource
                .entry(Arc::as_ptr(&resource))
                .or_insert_with(|| (resource.clone(), Vec::new()))
                .1
                .push(span);
        }
        for (resource, spans) in by_resource.into_values() {
            self.spans
                .set_resource(&instance_resource(&self.shared, &resource));
            let n = spans.len() as u64;
            let result = runner.run(self.spans.export(spans));
            // Waiting until now: queued, then batched, then being exported.
            self.counters.queued_spans.fetch_sub(n, Ordering::Relaxed);
            match result {
                Ok(()) => {
                    self.counters.exported_spans.fetch_add(n, Ordering::Relaxed);
                    self.failures.succeeded();
                }
                Err(e) => {
                    self.counters.failed_spans.fetch_add(n, Ordering::Relaxed);
                    self.failures.failed(n, 0, &e.to_string());
                }
            }
        }
    }

    fn send_metrics(&mut self, runner: &Runner) {
        self.sync_meters();
        for (scope, meters) in &self.meters {
            let mut rm = ResourceMetrics::default();
            if let Err(e) = meters.reader.collect(&mut rm) {
                tracing::warn!("OTLP: collecting metrics failed: {e}");
                continue;
            }
            if rm.scope_metrics().all(|s| s.metrics().next().is_none()) {
                continue;
            }
            // One point per series of the scope.
            let points = self
                .registry
                .lock()
                .expect("registry lock")
                .series_in(*scope) as u64;
            match runner.run(self.metrics.export(&rm)) {
                Ok(()) => {
                    self.counters
                        .exported_points
                        .fetch_add(points, Ordering::Relaxed);
                    self.failures.succeeded();
                }
                Err(e) => {
                    self.counters
                        .failed_points
                        .fetch_add(points, Ordering::Relaxed);
                    self.failures.failed(0, points, &e.to_string());
                }
            }
        }
    }

    /// A meter provider per scope the registry has now (and the agent's), each under its
    /// instance's current resource; those of ended instances go.
    fn sync_meters(&mut self) {
        let scopes = self.registry.lock().expect("registry lock").scopes();
        self.meters
            .retain(|scope, _| *scope == registry::AGENT || scopes.iter().any(|(s, _)| s == scope));
        if !self.meters.contains_key(&registry::AGENT) {
            let meters = self.meters_for(registry::AGENT, self.agent.clone(), None);
            self.meters.insert(registry::AGENT, meters);
        }
        for (scope, resource) in scopes {
            let current = self
                .meters
                .get(&scope)
                .and_then(|m| m.made_for.as_ref())
                .is_some_and(|made_for| Arc::ptr_eq(made_for, &resource));
            if !current {
                let sdk = instance_resource(&self.shared, &resource);
                let meters = self.meters_for(scope, sdk, Some(resource));
                if let Some(old) = self.meters.insert(scope, meters) {
                    let _ = old.provider.shutdown();
                }
            }
        }
    }

    fn meters_for(
        &self,
        scope: Scope,
        resource: Resource,
        made_for: Option<Arc<registry::Resource>>,
    ) -> Meters {
        let reader = SharedReader(Arc::new(
            ManualReader::builder()
                .with_temporality(Temporality::Cumulative)
                .build(),
        ));
        let provider = SdkMeterProvider::builder()
            .with_resource(resource)
            .with_reader(reader.clone())
            .build();
        register_instruments(&provider, &self.registry, scope, &self.defs);
        Meters {
            made_for,
            reader,
            provider,
        }
    }

    fn shutdown(&mut self, runner: &Runner) {
        let _ = runner.run(async { self.spans.shutdown() });
        for meters in self.meters.values() {
            let _ = meters.provider.shutdown();
        }
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

/// One observable instrument per metric; its callback reads the scope's series of it from
/// the registry at collection.
fn register_instruments(
    provider: &SdkMeterProvider,
    registry: &Arc<Mutex<Registry>>,
    scope: Scope,
    metrics: &[&'static MetricDef],
) {
    let meter = provider.meter("infertrace");
    for def in metrics {
        let registry = registry.clone();
        let name = def.name;
        let observe = move || -> Vec<(f64, Vec<KeyValue>)> {
            let registry = registry.lock().expect("registry lock");
            registry
                .series(name, scope)
                .map(|(dimensions, value)| {
                    let attrs = dimensions
                        .iter()
                        .map(|(k, v)| KeyValue::new(*k, v.clone()))
                        .collect();
                    (value, attrs)
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
    fn spans(&mut self, resource: &Arc<registry::Resource>, spans: &[Span]) {
        // Counted before the send: the thread may take it off the queue at once.
        let n = spans.len() as u64;
        self.counters.queued_spans.fetch_add(n, Ordering::Relaxed);
        match self
            .queue
            .try_send(Message::Spans(resource.clone(), spans.to_vec()))
        {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.counters.queued_spans.fetch_sub(n, Ordering::Relaxed);
                if self.counters.dropped_spans.fetch_add(n, Ordering::Relaxed) == 0 {
                    tracing::warn!(
                        "OTLP: the collector does not keep up; dropping traces (counted in \
                         infertrace_export_dropped_spans_total)"
                    );
                }
            }
        }
    }

    fn totals(&self) -> Option<ExportTotals> {
        Some(self.counters.totals())
    }

    fn metrics(&mut self, _samples: &[Sample], _unix_ns: u64) {
        // The export thread reads the registry itself; a full queue skips one snapshot.
        let _ = self.queue.try_send(Message::Metrics);
    }

    /// Send what can be sent in [`SHUTDOWN_WAIT`] (never blocks on a full queue), then say
    /// what was lost.
    fn shutdown(&mut self) {
        self.counters.stopping.store(true, Ordering::Relaxed);
        let _ = self.queue.try_send(Message::Shutdown);
        let finished = self
            .done
            .take()
            .is_some_and(|done| done.recv_timeout(SHUTDOWN_WAIT).is_ok());
        if finished && let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let t = self.counters.totals();
        if !finished || t.dropped_spans + t.failed_spans + t.failed_points > 0 {
            tracing::warn!(
                "OTLP: {} spans exported, {} failed, {} dropped (export queue full), {} unsent at \
                 exit; {} metric points exported, {} failed",
                t.exported_spans,
                t.failed_spans,
                t.dropped_spans,
                t.queued_spans,
                t.exported_points,
                t.failed_points
            );
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
