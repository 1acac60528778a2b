//! vLLM metrics exactly as the spec lists them ("vLLM metrics": common and V1), with their
//! dimensions. Counters follow vLLM's own accounting (vllm/v1/metrics/loggers.py) so that they
//! equal vLLM's `/metrics`: tokens are counted per engine step as the frontend receives them,
//! requests when the engine reports them finished (a request the frontend aborted is not a
//! finished request for vLLM either).
use super::tracker::{StepReport, VllmTimeline, VllmTrace, engine_side};
use crate::{
    export::console::SummaryField,
    telemetry::{
        Clock,
        api_metrics::{USAGE_TOKENS, api_usage},
        metrics::{Dimensions, MetricDef, Registry},
    },
};

pub const ITER_COUNT: MetricDef = MetricDef::counter(
    "vllm_iter_count",
    "Times",
    "The number of engine scheduling iterations.",
);
pub const REQUEST_SUCCESS: MetricDef = MetricDef::counter(
    "gen_ai_vllm_request_success",
    "Times",
    "The number of successfully completed requests.",
);
pub const FIRST_TOKEN_SECONDS: MetricDef = MetricDef::counter(
    "genai_llm_first_token_seconds",
    "Seconds",
    "The cumulative time to first token.",
);
pub const TIME_PER_OUTPUT_TOKEN: MetricDef = MetricDef::counter(
    "gen_ai_server_time_per_output_token",
    "Seconds",
    "The cumulative time per output token.",
);
pub const REQUEST_DURATION: MetricDef = MetricDef::counter(
    "gen_ai_server_request_duration",
    "Seconds",
    "The cumulative end-to-end duration of requests.",
);
pub const NUM_RUNNING: MetricDef = MetricDef::gauge(
    "gen_ai_vllm_num_requests_running",
    "Count",
    "The number of requests in the running batch.",
);
pub const NUM_WAITING: MetricDef = MetricDef::gauge(
    "gen_ai_vllm_num_requests_waiting",
    "Count",
    "The number of requests waiting to be processed.",
);
pub const KV_CACHE_USAGE: MetricDef = MetricDef::gauge(
    "gen_ai_vllm_kv_cache_usage_perc",
    "Ratio",
    "KV cache usage, in the range of [0,1].",
);
pub const PREFIX_CACHE_QUERIES: MetricDef = MetricDef::counter(
    "gen_ai_vllm_prefix_cache_queries",
    "Count",
    "The number of tokens queried in the prefix cache.",
);
pub const PREFIX_CACHE_HITS: MetricDef = MetricDef::counter(
    "gen_ai_vllm_prefix_cache_hits",
    "Count",
    "The number of tokens that hit the prefix cache.",
);
pub const NUM_PREEMPTIONS: MetricDef = MetricDef::counter(
    "gen_ai_vllm_num_preemptions",
    "Times",
    "The cumulative number of engine preemptions.",
);
pub const PROMPT_TOKENS: MetricDef = MetricDef::counter(
    "gen_ai_vllm_prompt_tokens",
    "Count",
    "The number of tokens processed by Prefill.",
);
pub const GENERATION_TOKENS: MetricDef = MetricDef::counter(
    "gen_ai_vllm_generation_tokens",
    "Count",
    "The number of generated tokens.",
);
pub const PARAMS_N: MetricDef = MetricDef::counter(
    "gen_ai_vllm_request_params_n",
    "Count",
    "The cumulative value of the request n parameter.",
);
pub const PARAMS_MAX_TOKENS: MetricDef = MetricDef::counter(
    "gen_ai_vllm_request_params_max_tokens",
    "Count",
    "The cumulative value of the request max_tokens parameter.",
);
pub const QUEUE_TIME: MetricDef = MetricDef::counter(
    "gen_ai_vllm_request_queue_time_seconds",
    "Seconds",
    "The cumulative duration of requests in the WAITING stage.",
);
pub const PREFILL_TIME: MetricDef = MetricDef::counter(
    "gen_ai_vllm_request_prefill_time_seconds",
    "Seconds",
    "The cumulative Prefill stage duration of requests.",
);
pub const DECODE_TIME: MetricDef = MetricDef::counter(
    "gen_ai_vllm_request_decode_time_seconds",
    "Seconds",
    "The cumulative Decode stage duration of requests.",
);
pub const INFERENCE_TIME: MetricDef = MetricDef::counter(
    "gen_ai_vllm_request_inference_time_seconds",
    "Seconds",
    "The cumulative duration of requests in the RUNNING stage.",
);

/// Every vLLM metric of the spec, for exporters that declare instruments up front.
pub static ALL: [&MetricDef; 20] = [
    &USAGE_TOKENS,
    &ITER_COUNT,
    &REQUEST_SUCCESS,
    &FIRST_TOKEN_SECONDS,
    &TIME_PER_OUTPUT_TOKEN,
    &REQUEST_DURATION,
    &NUM_RUNNING,
    &NUM_WAITING,
    &KV_CACHE_USAGE,
    &PREFIX_CACHE_QUERIES,
    &PREFIX_CACHE_HITS,
    &NUM_PREEMPTIONS,
    &PROMPT_TOKENS,
    &GENERATION_TOKENS,
    &PARAMS_N,
    &PARAMS_MAX_TOKENS,
    &QUEUE_TIME,
    &PREFILL_TIME,
    &DECODE_TIME,
    &INFERENCE_TIME,
];

/// The figures of a vLLM server's line on the console: counters' totals, the latest gauges.
pub static CONSOLE: [SummaryField; 8] = [
    SummaryField::total("requests", &REQUEST_SUCCESS),
    SummaryField::total("prompt_tokens", &PROMPT_TOKENS),
    SummaryField::total("generation_tokens", &GENERATION_TOKENS),
    SummaryField::total("iterations", &ITER_COUNT),
    SummaryField::total("preemptions", &NUM_PREEMPTIONS),
    SummaryField::total("running", &NUM_RUNNING),
    SummaryField::total("waiting", &NUM_WAITING),
    SummaryField::percent("kv_cache", &KV_CACHE_USAGE),
];

/// Records vLLM steps and finished requests into a registry.
#[derive(Debug, Default)]
pub struct VllmMetrics {
    /// `model_name`: the served model name (from discovery, else the first API call's model).
    pub model_name: Option<String>,
}

impl VllmMetrics {
    fn engine_dims(&self, engine_index: u64) -> Dimensions {
        vec![
            ("callType", "gen_ai".into()),
            ("rpcType", "2100".into()),
            ("engine_index", engine_index.to_string()),
            (
                "model_name",
                self.model_name.clone().unwrap_or_else(|| "unknown".into()),
            ),
        ]
    }

    pub fn step(&self, r: &mut Registry, step: &StepReport) {
        let dims = r.dims(self.engine_dims(step.engine_index));
        if step.iteration {
            r.add_at(&ITER_COUNT, dims, 1.0);
        }
        r.add_at(&PROMPT_TOKENS, dims, step.prompt_tokens as f64);
        r.add_at(&GENERATION_TOKENS, dims, step.generation_tokens as f64);
        r.add_at(&NUM_PREEMPTIONS, dims, step.preemptions as f64);
        if let Some(s) = &step.scheduler {
            r.set_at(&NUM_RUNNING, dims, s.num_running_reqs as f64);
            r.set_at(&NUM_WAITING, dims, s.num_waiting_reqs as f64);
            r.set_at(&KV_CACHE_USAGE, dims, s.kv_cache_usage);
            if let Some(p) = &s.prefix_cache {
                r.add_at(&PREFIX_CACHE_QUERIES, dims, p.queries as f64);
                r.add_at(&PREFIX_CACHE_HITS, dims, p.hits as f64);
            }
        }
    }

    pub fn request(&mut self, r: &mut Registry, trace: &VllmTrace, clock: &Clock) {
        if let Some(api) = &trace.api {
            if self.model_name.is_none() {
                self.model_name = api.call.model.clone();
            }
            api_usage(
                r,
                api,
                &engine_side(&trace.engine),
                self.model_name.as_deref(),
            );
        }
        for t in trace.engine.iter().filter(|t| !t.aborted_by_frontend) {
            self.finished(r, t, clock);
        }
    }

    fn finished(&self, r: &mut Registry, t: &VllmTimeline, clock: &Clock) {
        let Some(reason) = t.finish_reason else {
            return;
        };
        let engine_dims = self.engine_dims(t.engine_index.unwrap_or(0));
        let mut with_reason = engine_dims.clone();
        with_reason.push(("finished_reason", reason.as_str().into()));
        r.add(&REQUEST_SUCCESS, with_reason, 1.0);
        let dims = r.dims(engine_dims);
        if let Some(s) = &t.sampling {
            r.add_at(&PARAMS_N, dims, s.n as f64);
            if let Some(max) = s.max_tokens {
                r.add_at(&PARAMS_MAX_TOKENS, dims, max as f64);
            }
        }
        let since_arrival = |mono: u64| clock.ns_since_wall_secs(t.arrival_time, mono) as f64 / 1e9;
        if let Some(first) = t.first_output_ns {
            r.add_at(&FIRST_TOKEN_SECONDS, dims, since_arrival(first));
        }
        if let Some(done) = t.finished_ns {
            r.add_at(&REQUEST_DURATION, dims, since_arrival(done));
        }
        if let (Some(first), Some(last)) = (t.first_token, t.last_token) {
            let decode = last - first;
            if t.completion_tokens > 1 {
                let tpot = decode / (t.completion_tokens - 1) as f64;
                r.add_at(&TIME_PER_OUTPUT_TOKEN, dims, tpot);
            }
            r.add_at(&DECODE_TIME, dims, decode);
            if let Some(scheduled) = t.scheduled {
                r.add_at(&PREFILL_TIME, dims, first - scheduled);
                r.add_at(&INFERENCE_TIME, dims, last - scheduled);
            }
        }
        if let (Some(queued), Some(scheduled)) = (t.queued, t.scheduled) {
            r.add_at(&QUEUE_TIME, dims, scheduled - queued);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::{
        decode::openai::{ApiCall, Operation, Usage},
        engines::common::join::ApiExchange,
        engines::vllm::wire::{FinishReason, PrefixCacheStats, Sampling, SchedulerStats},
        telemetry::metrics::Kind,
        telemetry::metrics::Sample,
    };

    /// CLOCK_REALTIME - CLOCK_MONOTONIC.
    const R: i128 = 1_759_000_000_000_000_000;
    /// Wall clock at arrival: monotonic 1000.5 s.
    const ARRIVAL: f64 = 1_759_001_000.5;

    fn clock() -> Clock {
        Clock::fixed(R)
    }

    /// Monotonic ns of 1000 s + `ms`.
    const fn mono(ms: u64) -> u64 {
        1_000_000_000_000 + ms * 1_000_000
    }

    fn metrics() -> VllmMetrics {
        VllmMetrics {
            model_name: Some("tiny".into()),
        }
    }

    fn timeline(id: &str, reason: FinishReason) -> VllmTimeline {
        VllmTimeline {
            request_id: id.into(),
            external_id: None,
            sampling: Some(Sampling {
                n: 1,
                temperature: 0.0,
                top_p: 1.0,
                top_k: 0,
                max_tokens: Some(4),
                logprobs: None,
            }),
            prompt_tokens: Some(5),
            cached_tokens: Some(0),
            arrival_time: ARRIVAL,
            trace_headers: Vec::new(),
            pd_role: None,
            add_sent_ns: mono(501),
            queued: Some(1000.5),
            scheduled: Some(1000.5625),
            first_token: Some(1000.625),
            last_token: Some(1000.75),
            first_output_ns: Some(mono(630)),
            finished_ns: Some(mono(760)),
            last_output_ns: Some(mono(760)),
            output_ns: vec![mono(630), mono(700), mono(760)],
            completion_tokens: 3,
            preemptions: 0,
            finish_reason: Some(reason),
            aborted_by_frontend: false,
            engine_index: Some(0),
            steps: Vec::new(),
            steps_dropped: 0,
        }
    }

    fn api(status: Option<u16>, usage: Usage) -> ApiExchange {
        ApiExchange {
            call: ApiCall {
                operation: Some(Operation::Chat),
                model: Some("tiny".into()),
                status,
                response_id: status.map(|_| "chatcmpl-X".to_owned()),
                usage,
                ..ApiCall::default()
            },
            request_first_ns: mono(499),
            request_last_ns: mono(500),
            response_first_ns: status.map(|_| mono(765)),
            response_last_ns: status.map(|_| mono(766)),
            complete: status.is_some(),
        }
    }

    fn report(iteration: bool, scheduler: Option<SchedulerStats>) -> StepReport {
        StepReport {
            iteration,
            engine_index: 0,
            frontend: 7,
            timestamp: 1.0,
            scheduler,
            prompt_tokens: 5,
            generation_tokens: 2,
            preemptions: 1,
        }
    }

    fn sched(running: u64, waiting: u64, usage: f64, queries: u64, hits: u64) -> SchedulerStats {
        SchedulerStats {
            num_running_reqs: running,
            num_waiting_reqs: waiting,
            kv_cache_usage: usage,
            prefix_cache: Some(PrefixCacheStats {
                reset: false,
                requests: 1,
                queries,
                hits,
            }),
            step_counter: None,
        }
    }

    fn dims(pairs: &[(&'static str, &str)]) -> BTreeMap<&'static str, String> {
        pairs.iter().map(|&(k, v)| (k, v.to_owned())).collect()
    }

    fn engine_dims(engine: &str) -> BTreeMap<&'static str, String> {
        dims(&[
            ("callType", "gen_ai"),
            ("rpcType", "2100"),
            ("engine_index", engine),
            ("model_name", "tiny"),
        ])
    }

    fn samples(r: &Registry, name: &str) -> Vec<Sample> {
        r.snapshot()
            .into_iter()
            .filter(|s| s.name == name)
            .collect()
    }

    #[test]
    fn the_spec_metrics_with_their_types_and_units() {
        let spec = [
            ("genai_llm_usage_tokens", Kind::Counter, "Count"),
            ("vllm_iter_count", Kind::Counter, "Times"),
            ("gen_ai_vllm_request_success", Kind::Counter, "Times"),
            ("genai_llm_first_token_seconds", Kind::Counter, "Seconds"),
            (
                "gen_ai_server_time_per_output_token",
                Kind::Counter,
                "Seconds",
            ),
            ("gen_ai_server_request_duration", Kind::Counter, "Seconds"),
            ("gen_ai_vllm_num_requests_running", Kind::Gauge, "Count"),
            ("gen_ai_vllm_num_requests_waiting", Kind::Gauge, "Count"),
            ("gen_ai_vllm_kv_cache_usage_perc", Kind::Gauge, "Ratio"),
            ("gen_ai_vllm_prefix_cache_queries", Kind::Counter, "Count"),
            ("gen_ai_vllm_prefix_cache_hits", Kind::Counter, "Count"),
            ("gen_ai_vllm_num_preemptions", Kind::Counter, "Times"),
            ("gen_ai_vllm_prompt_tokens", Kind::Counter, "Count"),
            ("gen_ai_vllm_generation_tokens", Kind::Counter, "Count"),
            ("gen_ai_vllm_request_params_n", Kind::Counter, "Count"),
            (
                "gen_ai_vllm_request_params_max_tokens",
                Kind::Counter,
                "Count",
            ),
            (
                "gen_ai_vllm_request_queue_time_seconds",
                Kind::Counter,
                "Seconds",
            ),
            (
                "gen_ai_vllm_request_prefill_time_seconds",
                Kind::Counter,
                "Seconds",
            ),
            (
                "gen_ai_vllm_request_decode_time_seconds",
                Kind::Counter,
                "Seconds",
            ),
            (
                "gen_ai_vllm_request_inference_time_seconds",
                Kind::Counter,
                "Seconds",
            ),
        ];
        let ours: Vec<_> = ALL.iter().map(|d| (d.name, d.kind, d.unit)).collect();
        assert_eq!(ours, spec);
    }

    #[test]
    fn engine_metrics_carry_the_spec_dimensions() {
        let m = metrics();
        let mut r = Registry::default();
        m.step(&mut r, &report(true, Some(sched(1, 2, 0.5, 16, 8))));
        m.step(
            &mut r,
            &StepReport {
                engine_index: 1,
                ..report(true, Some(sched(4, 0, 0.75, 0, 0)))
            },
        );
        let mut m = m;
        m.request(
            &mut r,
            &VllmTrace {
                api: None,
                engine: vec![timeline("a", FinishReason::Stop)],
            },
            &clock(),
        );
        let snapshot = r.snapshot();
        assert!(!snapshot.is_empty());
        for s in &snapshot {
            assert_ne!(s.name, USAGE_TOKENS.name, "no API call, no API tokens");
            let engine = s.dimensions.get("engine_index").expect("engine_index");
            let mut expected = engine_dims(engine);
            if s.name == REQUEST_SUCCESS.name {
                expected.insert("finished_reason", "stop".into());
            }
            assert_eq!(s.dimensions, expected, "{}", s.name);
            assert!(engine == "0" || engine == "1");
        }
        assert_eq!(
            r.value(
                "gen_ai_vllm_request_success",
                &[
                    ("callType", "gen_ai"),
                    ("rpcType", "2100"),
                    ("engine_index", "0"),
                    ("model_name", "tiny"),
                    ("finished_reason", "stop"),
                ],
            ),
            Some(1.0)
        );
        // One series per engine.
        assert_eq!(samples(&r, ITER_COUNT.name).len(), 2);
        assert_eq!(r.total(ITER_COUNT.name), 2.0);
        assert_eq!(
            r.value(
                "gen_ai_vllm_num_requests_running",
                &[
                    ("callType", "gen_ai"),
                    ("rpcType", "2100"),
                    ("engine_index", "1"),
                    ("model_name", "tiny"),
                ],
            ),
            Some(4.0)
        );
        // Without a known model name: "unknown", never a missing dimension.
        let mut r = Registry::default();
        VllmMetrics::default().step(&mut r, &report(true, None));
        let s = &samples(&r, ITER_COUNT.name)[0];
        assert_eq!(
            s.dimensions.get("model_name").map(String::as_str),
            Some("unknown")
        );
    }

    #[test]
    fn api_tokens_carry_the_spec_dimensions() {
        let mut m = metrics();
        let mut r = Registry::default();
        let usage = Usage {
            input: Some(7),
            output: Some(9),
            total: Some(16),
        };
        m.request(
            &mut r,
            &VllmTrace {
                api: Some(api(Some(200), usage)),
                engine: vec![timeline("a", FinishReason::Length)],
            },
            &clock(),
        );
        let usage_dims = |usage_type: &str| {
            dims(&[
                ("callType", "gen_ai"),
                ("callKind", "custom_entry"),
                ("rpcType", "2100"),
                ("modelName", "tiny"),
                ("spanKind", "LLM"),
                ("usageType", usage_type),
            ])
        };
        let got: Vec<_> = samples(&r, USAGE_TOKENS.name)
            .into_iter()
            .map(|s| (s.dimensions, s.value))
            .collect();
        assert_eq!(
            got,
            [(usage_dims("input"), 7.0), (usage_dims("output"), 9.0)]
        );

        // No usage in the response (a stream without include_usage): the engine's counts.
        m.request(
            &mut r,
            &VllmTrace {
                api: Some(api(Some(200), Usage::default())),
                engine: vec![timeline("b", FinishReason::Stop)],
            },
            &clock(),
        );
        assert_eq!(
            samples(&r, USAGE_TOKENS.name)
                .iter()
                .map(|s| s.value)
                .collect::<Vec<_>>(),
            [7.0 + 5.0, 9.0 + 3.0]
        );
        // Invalid calls and abandoned ones consume nothing.
        let before = r.total(USAGE_TOKENS.name);
        for status in [Some(400), None] {
            m.request(
                &mut r,
                &VllmTrace {
                    api: Some(api(status, Usage::default())),
                    engine: Vec::new(),
                },
                &clock(),
            );
        }
        assert_eq!(r.total(USAGE_TOKENS.name), before);
        // Embeddings.
        let mut embedding = api(Some(200), usage);
        embedding.call.operation = Some(Operation::Embeddings);
        let mut r = Registry::default();
        m.request(
            &mut r,
            &VllmTrace {
                api: Some(embedding),
                engine: Vec::new(),
            },
            &clock(),
        );
        assert!(
            samples(&r, USAGE_TOKENS.name)
                .iter()
                .all(|s| s.dimensions["spanKind"] == "EMBEDDING")
        );
    }

    #[test]
    fn counters_only_grow_and_gauges_take_the_latest_step() {
        let m = metrics();
        let mut r = Registry::default();
        let steps = [
            report(true, Some(sched(3, 2, 0.5, 16, 8))),
            report(true, Some(sched(1, 0, 0.25, 32, 4))),
            // Late-applied outputs: not an iteration, no scheduler state.
            StepReport {
                generation_tokens: 0,
                preemptions: 0,
                ..report(false, None)
            },
            report(true, None),
        ];
        let mut previous: BTreeMap<(String, BTreeMap<&'static str, String>), f64> = BTreeMap::new();
        for step in &steps {
            m.step(&mut r, step);
            for s in r.snapshot() {
                let key = (s.name.to_owned(), s.dimensions.clone());
                if s.kind == Kind::Counter
                    && let Some(&before) = previous.get(&key)
                {
                    assert!(
                        s.value >= before,
                        "{} went from {before} to {}",
                        s.name,
                        s.value
                    );
                }
                previous.insert(key, s.value);
            }
        }
        assert_eq!(r.total(ITER_COUNT.name), 3.0);
        assert_eq!(r.total(PROMPT_TOKENS.name), 20.0);
        assert_eq!(r.total(GENERATION_TOKENS.name), 6.0);
        assert_eq!(r.total(NUM_PREEMPTIONS.name), 3.0);
        // Gauges: the latest step that reported its scheduler state.
        assert_eq!(r.total(NUM_RUNNING.name), 1.0);
        assert_eq!(r.total(NUM_WAITING.name), 0.0);
        assert_eq!(r.total(KV_CACHE_USAGE.name), 0.25);
        assert_eq!(samples(&r, NUM_RUNNING.name).len(), 1);
        // Prefix cache: per-step deltas, summed.
        assert_eq!(r.total(PREFIX_CACHE_QUERIES.name), 48.0);
        assert_eq!(r.total(PREFIX_CACHE_HITS.name), 12.0);

        // A request whose engine times run backwards adds nothing negative.
        let mut odd = timeline("odd", FinishReason::Stop);
        odd.first_token = Some(1000.5);
        odd.scheduled = Some(1000.6);
        odd.queued = Some(1000.7);
        let mut m = m;
        m.request(
            &mut r,
            &VllmTrace {
                api: None,
                engine: vec![odd],
            },
            &clock(),
        );
        for name in [QUEUE_TIME.name, PREFILL_TIME.name] {
            assert_eq!(r.total(name), 0.0, "{name}");
        }
        assert!(r.snapshot().iter().all(|s| s.value >= 0.0));
    }

    #[test]
    fn finished_requests_add_their_durations() {
        let mut m = metrics();
        let mut r = Registry::default();
        let mut t = timeline("a", FinishReason::Length);
        t.sampling.as_mut().expect("sampling").n = 2;
        m.request(
            &mut r,
            &VllmTrace {
                api: None,
                engine: vec![t],
            },
            &clock(),
        );
        let close = |name: &str, expected: f64| {
            let got = r.total(name);
            assert!((got - expected).abs() < 1e-9, "{name}: {got} != {expected}");
        };
        close(REQUEST_SUCCESS.name, 1.0);
        close(PARAMS_N.name, 2.0);
        close(PARAMS_MAX_TOKENS.name, 4.0);
        close(QUEUE_TIME.name, 0.0625);
        close(PREFILL_TIME.name, 0.0625);
        close(DECODE_TIME.name, 0.125);
        close(INFERENCE_TIME.name, 0.1875);
        close(TIME_PER_OUTPUT_TOKEN.name, 0.125 / 2.0);
        close(FIRST_TOKEN_SECONDS.name, 0.130);
        close(REQUEST_DURATION.name, 0.260);
        assert_eq!(
            samples(&r, REQUEST_SUCCESS.name)[0].dimensions["finished_reason"],
            "length"
        );
    }

    #[test]
    fn frontend_aborted_requests_are_not_finished_requests() {
        let mut m = metrics();
        let mut r = Registry::default();
        let mut aborted = timeline("a", FinishReason::Abort);
        aborted.aborted_by_frontend = true;
        m.request(
            &mut r,
            &VllmTrace {
                api: Some(api(None, Usage::default())),
                engine: vec![aborted],
            },
            &clock(),
        );
        assert!(r.snapshot().is_empty(), "{:?}", r.snapshot());
        // The engine's own abort (finish_reason 2 on an output) is one.
        m.request(
            &mut r,
            &VllmTrace {
                api: None,
                engine: vec![timeline("b", FinishReason::Abort)],
            },
            &clock(),
        );
        let success = samples(&r, REQUEST_SUCCESS.name);
        assert_eq!(success.len(), 1);
        assert_eq!(success[0].dimensions["finished_reason"], "abort");
        assert_eq!(success[0].value, 1.0);
        // Unfinished timelines are not counted either.
        let mut unfinished = timeline("c", FinishReason::Stop);
        unfinished.finish_reason = None;
        m.request(
            &mut r,
            &VllmTrace {
                api: None,
                engine: vec![unfinished],
            },
            &clock(),
        );
        assert_eq!(r.total(REQUEST_SUCCESS.name), 1.0);
    }
}
