//! vLLM metrics exactly as the spec lists them ("vLLM metrics": common and V1), with their
//! dimensions. Counters follow vLLM's own accounting (vllm/v1/metrics/loggers.py) so that they
//! equal vLLM's `/metrics`: tokens are counted per engine step as the frontend receives them,
//! requests when the engine reports them finished (a request the frontend aborted is not a
//! finished request for vLLM either).
use super::{
    Clock,
    metrics::{Dimensions, Kind, MetricDef, Registry},
};
use crate::engines::{
    join::ApiExchange,
    vllm::{EngineTimeline, RequestTrace, StepReport},
};

const fn counter(name: &'static str, unit: &'static str, description: &'static str) -> MetricDef {
    MetricDef {
        name,
        kind: Kind::Counter,
        unit,
        description,
    }
}

const fn gauge(name: &'static str, unit: &'static str, description: &'static str) -> MetricDef {
    MetricDef {
        name,
        kind: Kind::Gauge,
        unit,
        description,
    }
}

pub const USAGE_TOKENS: MetricDef = counter(
    "genai_llm_usage_tokens",
    "Count",
    "Input and output token consumption, distinguished by usageType.",
);
pub const ITER_COUNT: MetricDef = counter(
    "vllm_iter_count",
    "Times",
    "The number of engine scheduling iterations.",
);
pub const REQUEST_SUCCESS: MetricDef = counter(
    "gen_ai_vllm_request_success",
    "Times",
    "The number of successfully completed requests.",
);
pub const FIRST_TOKEN_SECONDS: MetricDef = counter(
    "genai_llm_first_token_seconds",
    "Seconds",
    "The cumulative time to first token.",
);
pub const TIME_PER_OUTPUT_TOKEN: MetricDef = counter(
    "gen_ai_server_time_per_output_token",
    "Seconds",
    "The cumulative time per output token.",
);
pub const REQUEST_DURATION: MetricDef = counter(
    "gen_ai_server_request_duration",
    "Seconds",
    "The cumulative end-to-end duration of requests.",
);
pub const NUM_RUNNING: MetricDef = gauge(
    "gen_ai_vllm_num_requests_running",
    "Count",
    "The number of requests in the running batch.",
);
pub const NUM_WAITING: MetricDef = gauge(
    "gen_ai_vllm_num_requests_waiting",
    "Count",
    "The number of requests waiting to be processed.",
);
pub const KV_CACHE_USAGE: MetricDef = gauge(
    "gen_ai_vllm_kv_cache_usage_perc",
    "Ratio",
    "KV cache usage, in the range of [0,1].",
);
pub const PREFIX_CACHE_QUERIES: MetricDef = counter(
    "gen_ai_vllm_prefix_cache_queries",
    "Count",
    "The number of tokens queried in the prefix cache.",
);
pub const PREFIX_CACHE_HITS: MetricDef = counter(
    "gen_ai_vllm_prefix_cache_hits",
    "Count",
    "The number of tokens that hit the prefix cache.",
);
pub const NUM_PREEMPTIONS: MetricDef = counter(
    "gen_ai_vllm_num_preemptions",
    "Times",
    "The cumulative number of engine preemptions.",
);
pub const PROMPT_TOKENS: MetricDef = counter(
    "gen_ai_vllm_prompt_tokens",
    "Count",
    "The number of tokens processed by Prefill.",
);
pub const GENERATION_TOKENS: MetricDef = counter(
    "gen_ai_vllm_generation_tokens",
    "Count",
    "The number of generated tokens.",
);
pub const PARAMS_N: MetricDef = counter(
    "gen_ai_vllm_request_params_n",
    "Count",
    "The cumulative value of the request n parameter.",
);
pub const PARAMS_MAX_TOKENS: MetricDef = counter(
    "gen_ai_vllm_request_params_max_tokens",
    "Count",
    "The cumulative value of the request max_tokens parameter.",
);
pub const QUEUE_TIME: MetricDef = counter(
    "gen_ai_vllm_request_queue_time_seconds",
    "Seconds",
    "The cumulative duration of requests in the WAITING stage.",
);
pub const PREFILL_TIME: MetricDef = counter(
    "gen_ai_vllm_request_prefill_time_seconds",
    "Seconds",
    "The cumulative Prefill stage duration of requests.",
);
pub const DECODE_TIME: MetricDef = counter(
    "gen_ai_vllm_request_decode_time_seconds",
    "Seconds",
    "The cumulative Decode stage duration of requests.",
);
pub const INFERENCE_TIME: MetricDef = counter(
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
        let dims = self.engine_dims(step.engine_index);
        if step.iteration {
            r.add(&ITER_COUNT, dims.clone(), 1.0);
        }
        r.add(&PROMPT_TOKENS, dims.clone(), step.prompt_tokens as f64);
        r.add(
            &GENERATION_TOKENS,
            dims.clone(),
            step.generation_tokens as f64,
        );
        r.add(&NUM_PREEMPTIONS, dims.clone(), step.preemptions as f64);
        if let Some(s) = &step.scheduler {
            r.set(&NUM_RUNNING, dims.clone(), s.num_running_reqs as f64);
            r.set(&NUM_WAITING, dims.clone(), s.num_waiting_reqs as f64);
            r.set(&KV_CACHE_USAGE, dims.clone(), s.kv_cache_usage);
            if let Some(p) = &s.prefix_cache {
                r.add(&PREFIX_CACHE_QUERIES, dims.clone(), p.queries as f64);
                r.add(&PREFIX_CACHE_HITS, dims, p.hits as f64);
            }
        }
    }

    pub fn request(&mut self, r: &mut Registry, trace: &RequestTrace, clock: &Clock) {
        if let Some(api) = &trace.api {
            if self.model_name.is_none() {
                self.model_name = api.call.model.clone();
            }
            self.api_usage(r, api, &trace.engine);
        }
        for t in trace.engine.iter().filter(|t| !t.aborted_by_frontend) {
            self.finished(r, t, clock);
        }
    }

    /// `genai_llm_usage_tokens`, from the API's usage (or the engine's counts without it).
    fn api_usage(&self, r: &mut Registry, api: &ApiExchange, engine: &[EngineTimeline]) {
        let Some(op) = api.call.operation else {
            return;
        };
        if api.call.status.is_none_or(|s| s >= 400) {
            return;
        }
        let model = api
            .call
            .model
            .clone()
            .or_else(|| self.model_name.clone())
            .unwrap_or_else(|| "unknown".into());
        let input = api
            .call
            .usage
            .input
            .or_else(|| engine.iter().find_map(|e| e.prompt_tokens));
        let output = api.call.usage.output.or_else(|| {
            (!engine.is_empty()).then(|| engine.iter().map(|e| e.completion_tokens).sum())
        });
        for (usage_type, count) in [("input", input), ("output", output)] {
            let Some(count) = count else { continue };
            let dims = vec![
                ("callType", "gen_ai".into()),
                ("callKind", "custom_entry".into()),
                ("rpcType", "2100".into()),
                ("modelName", model.clone()),
                ("spanKind", op.span_kind().into()),
                ("usageType", usage_type.into()),
            ];
            r.add(&USAGE_TOKENS, dims, count as f64);
        }
    }

    fn finished(&self, r: &mut Registry, t: &EngineTimeline, clock: &Clock) {
        let Some(reason) = t.finish_reason else {
            return;
        };
        let dims = self.engine_dims(t.engine_index.unwrap_or(0));
        let mut with_reason = dims.clone();
        with_reason.push(("finished_reason", reason.as_str().into()));
        r.add(&REQUEST_SUCCESS, with_reason, 1.0);
        if let Some(s) = &t.sampling {
            r.add(&PARAMS_N, dims.clone(), s.n as f64);
            if let Some(max) = s.max_tokens {
                r.add(&PARAMS_MAX_TOKENS, dims.clone(), max as f64);
            }
        }
        let arrival = clock.unix_ns_of_wall_secs(t.arrival_time);
        let since_arrival = |mono: u64| clock.unix_ns(mono).saturating_sub(arrival) as f64 / 1e9;
        if let Some(first) = t.first_output_ns {
            r.add(&FIRST_TOKEN_SECONDS, dims.clone(), since_arrival(first));
        }
        if let Some(done) = t.finished_ns {
            r.add(&REQUEST_DURATION, dims.clone(), since_arrival(done));
        }
        if let (Some(first), Some(last)) = (t.first_token, t.last_token) {
            let decode = last - first;
            if t.completion_tokens > 1 {
                let tpot = decode / (t.completion_tokens - 1) as f64;
                r.add(&TIME_PER_OUTPUT_TOKEN, dims.clone(), tpot);
            }
            r.add(&DECODE_TIME, dims.clone(), decode);
            if let Some(scheduled) = t.scheduled {
                r.add(&PREFILL_TIME, dims.clone(), first - scheduled);
                r.add(&INFERENCE_TIME, dims.clone(), last - scheduled);
            }
        }
        if let (Some(queued), Some(scheduled)) = (t.queued, t.scheduled) {
            r.add(&QUEUE_TIME, dims, scheduled - queued);
        }
    }
}
