//! SGLang metrics as the spec lists them, for what the wire carries. SGLang's own accounting
//! (tokenizer_manager.py `collect_metrics`) is followed so that the counters equal its
//! `/metrics`: a request is counted when it finishes, client aborts and n>1's prefix warm-ups
//! included, health checks and requests the scheduler dropped from its queue excluded; time to
//! first token is counted for a request whose first output was not its abort; time per output
//! token only for `length` and `stop` finishes.
//!
//! The scheduler's snapshot counters (`sglang_num_running_reqs`, `sglang_num_queue_reqs`,
//! `sglang_num_used_tokens`, `sglang_token_usage`, `sglang_gen_throughput`,
//! `sglang_spec_accept_length`) add up the values of each statistics report the scheduler
//! wrote to its log (`engines::sglang::log`: its decode report, every `--decode-log-interval`
//! decode batches), and `sglang_log_count` counts those reports, so that a snapshot's average
//! over a period is its increase divided by `sglang_log_count`'s. A field a report does not
//! carry is not added (`#token` and `token usage` of hybrid-pool models, `accept len` without
//! speculative decoding), and `gen_ai_sglang_cache_hit_rate` is not produced: SGLang prints no
//! hit rate, and computing one from the prefill lines would not be the scheduler's figure.
use super::{
    log::DecodeStats,
    spans::{engine_side, instants},
    tracker::{SglangTimeline, SglangTrace},
};
use crate::{
    export::console::SummaryField,
    telemetry::{
        Clock,
        api_metrics::{USAGE_TOKENS, api_usage},
        metrics::{Dimensions, MetricDef, Registry},
    },
};

pub const PROMPT_TOKENS: MetricDef = MetricDef::counter(
    "prompt_tokens_total",
    "Count",
    "The cumulative number of input tokens.",
);
pub const GENERATION_TOKENS: MetricDef = MetricDef::counter(
    "generation_tokens_total",
    "Count",
    "The cumulative number of output tokens.",
);
pub const CACHED_TOKENS: MetricDef = MetricDef::counter(
    "gen_ai_sglang_cached_tokens_total",
    "Count",
    "The cumulative number of input tokens served from the cache.",
);
pub const NUM_REQUESTS: MetricDef = MetricDef::counter(
    "num_requests_total",
    "Times",
    "The cumulative number of requests.",
);
pub const TIME_TO_FIRST_TOKEN: MetricDef = MetricDef::counter(
    "gen_ai_server_time_to_first_token",
    "Seconds",
    "The cumulative time to first token.",
);
pub const TIME_PER_OUTPUT_TOKEN: MetricDef = MetricDef::counter(
    "gen_ai_server_time_per_output_token",
    "Seconds",
    "The cumulative time per output token.",
);
pub const INTER_TOKEN_LATENCY: MetricDef = MetricDef::counter(
    "sglang_inter_token_latency_seconds",
    "Seconds",
    "The cumulative inter-token latency.",
);
pub const REQUEST_DURATION: MetricDef = MetricDef::counter(
    "gen_ai_server_request_duration",
    "Seconds",
    "The cumulative end-to-end duration of requests.",
);

pub const NUM_RUNNING_REQS: MetricDef = MetricDef::counter(
    "sglang_num_running_reqs",
    "Count",
    "A snapshot of the number of running requests.",
);
pub const NUM_QUEUE_REQS: MetricDef = MetricDef::counter(
    "sglang_num_queue_reqs",
    "Count",
    "A snapshot of the number of requests in the queue.",
);
pub const NUM_USED_TOKENS: MetricDef = MetricDef::counter(
    "sglang_num_used_tokens",
    "Count",
    "A snapshot of the number of tokens currently in use.",
);
pub const TOKEN_USAGE: MetricDef = MetricDef::counter(
    "sglang_token_usage",
    "Ratio",
    "A snapshot of the KV cache token usage.",
);
pub const GEN_THROUGHPUT: MetricDef = MetricDef::counter(
    "sglang_gen_throughput",
    "Tokens/s",
    "A snapshot of the generation throughput.",
);
pub const SPEC_ACCEPT_LENGTH: MetricDef = MetricDef::counter(
    "sglang_spec_accept_length",
    "Count",
    "The accept length of speculative decoding.",
);
pub const LOG_COUNT: MetricDef = MetricDef::counter(
    "sglang_log_count",
    "Times",
    "The number of statistical reports, which is used to calculate the average of the preceding snapshot metrics.",
);

/// Every SGLang metric (with the API layer's), for exporters that declare instruments up front.
pub static ALL: [&MetricDef; 16] = [
    &USAGE_TOKENS,
    &PROMPT_TOKENS,
    &GENERATION_TOKENS,
    &CACHED_TOKENS,
    &NUM_REQUESTS,
    &TIME_TO_FIRST_TOKEN,
    &TIME_PER_OUTPUT_TOKEN,
    &INTER_TOKEN_LATENCY,
    &REQUEST_DURATION,
    &NUM_RUNNING_REQS,
    &NUM_QUEUE_REQS,
    &NUM_USED_TOKENS,
    &TOKEN_USAGE,
    &GEN_THROUGHPUT,
    &SPEC_ACCEPT_LENGTH,
    &LOG_COUNT,
];

/// The figures of an SGLang server's line on the console (counters' totals; the snapshots are
/// sums over reports, meaningful only divided by `reports`).
pub static CONSOLE: [SummaryField; 5] = [
    SummaryField::total("requests", &NUM_REQUESTS),
    SummaryField::total("prompt_tokens", &PROMPT_TOKENS),
    SummaryField::total("generation_tokens", &GENERATION_TOKENS),
    SummaryField::total("cached_tokens", &CACHED_TOKENS),
    SummaryField::total("reports", &LOG_COUNT),
];

/// One statistics report of a scheduler: each snapshot it carries is added, and counted.
pub fn report(r: &mut Registry, stats: &DecodeStats) {
    let dims = r.dims(self::dims());
    r.add_at(&LOG_COUNT, dims, 1.0);
    r.add_at(&NUM_RUNNING_REQS, dims, stats.running_reqs as f64);
    r.add_at(&NUM_QUEUE_REQS, dims, stats.queue_reqs as f64);
    r.add_at(&GEN_THROUGHPUT, dims, stats.gen_throughput);
    let optional = [
        (&NUM_USED_TOKENS, stats.used_tokens.map(|n| n as f64)),
        (&TOKEN_USAGE, stats.token_usage),
        (&SPEC_ACCEPT_LENGTH, stats.accept_length),
    ];
    for (def, value) in optional {
        if let Some(value) = value {
            r.add_at(def, dims, value);
        }
    }
}

/// Records finished SGLang requests into a registry.
#[derive(Debug, Default)]
pub struct SglangMetrics {
    /// The served model name (from discovery, else the first API call's model).
    pub model_name: Option<String>,
}

fn dims() -> Dimensions {
    vec![
        ("callType", "gen_ai".into()),
        ("callKind", "custom_entry".into()),
        ("rpcType", "2100".into()),
    ]
}

fn seconds(from: u64, to: u64) -> f64 {
    to.saturating_sub(from) as f64 / 1e9
}

impl SglangMetrics {
    pub fn request(&mut self, r: &mut Registry, trace: &SglangTrace, clock: &Clock) {
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
        for t in &trace.engine {
            self.finished(r, t, trace, clock);
        }
    }

    fn finished(&self, r: &mut Registry, t: &SglangTimeline, trace: &SglangTrace, clock: &Clock) {
        let Some(finish) = &t.finish else {
            return;
        };
        if t.dropped_while_queued {
            return;
        }
        // One numbered set for the request's updates (not three strings per update).
        let dims = r.dims(self::dims());
        r.add_at(&NUM_REQUESTS, dims, 1.0);
        let tokens = [
            (&PROMPT_TOKENS, t.prompt_tokens),
            (&GENERATION_TOKENS, t.completion_tokens),
            (&CACHED_TOKENS, t.cached_tokens),
        ];
        for (def, count) in tokens {
            r.add_at(def, dims, count.unwrap_or(0) as f64);
        }
        let at = instants(t, trace.api.as_ref(), clock);
        let first_output_aborted = t.output_ns.len() == 1 && finish.kind == "abort";
        if let Some(first) = at.first_token.filter(|_| !first_output_aborted) {
            r.add_at(&TIME_TO_FIRST_TOKEN, dims, seconds(at.created, first));
        }
        if let (Some(first), Some(last)) = (t.first_output_ns, t.last_output_ns) {
            let (first, last) = (clock.unix_ns(first), clock.unix_ns(last));
            if t.output_ns.len() > 1 {
                r.add_at(&INTER_TOKEN_LATENCY, dims, seconds(first, last));
            }
        }
        if let Some(done) = at.finished {
            r.add_at(&REQUEST_DURATION, dims, seconds(at.created, done));
            let completion = t.completion_tokens.unwrap_or(0);
            if let Some(first) = at.first_token
                && completion > 1
                && matches!(finish.kind.as_str(), "length" | "stop")
            {
                let tpot = seconds(first, done) / (completion - 1) as f64;
                r.add_at(&TIME_PER_OUTPUT_TOKEN, dims, tpot);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{engines::common::join::Outcome, engines::sglang::wire::SglangFinish};

    const MS: u64 = 1_000_000;
    /// Monotonic ns of 1000 s + `ms`.
    const fn mono(ms: u64) -> u64 {
        1_000_000_000_000 + ms * MS
    }

    fn finished(kind: &str, outputs: &[u64], completion: u64) -> SglangTimeline {
        SglangTimeline {
            rid: "r".into(),
            prompt_tokens: Some(10),
            completion_tokens: Some(completion),
            cached_tokens: Some(4),
            stream: true,
            sent_ns: mono(0),
            first_output_ns: outputs.first().copied(),
            last_output_ns: outputs.last().copied(),
            finished_ns: outputs.last().copied(),
            output_ns: outputs.to_vec(),
            finish: Some(SglangFinish {
                kind: kind.into(),
                message: None,
                status_code: None,
            }),
            ..SglangTimeline::default()
        }
    }

    fn record(timelines: Vec<SglangTimeline>) -> Registry {
        let clock = Clock::fixed(0);
        let mut r = Registry::default();
        let trace = Outcome {
            api: None,
            engine: timelines,
        };
        SglangMetrics::default().request(&mut r, &trace, &clock);
        r
    }

    #[test]
    fn counters_follow_sglangs_accounting() {
        let length = finished("length", &[mono(100), mono(150), mono(300)], 5);
        let r = record(vec![length]);
        assert_eq!(r.total(NUM_REQUESTS.name), 1.0);
        assert_eq!(r.total(PROMPT_TOKENS.name), 10.0);
        assert_eq!(r.total(GENERATION_TOKENS.name), 5.0);
        assert_eq!(r.total(CACHED_TOKENS.name), 4.0);
        // Created at the send (no HTTP call, no SGLang trace context here).
        assert!((r.total(TIME_TO_FIRST_TOKEN.name) - 0.1).abs() < 1e-9);
        assert!((r.total(REQUEST_DURATION.name) - 0.3).abs() < 1e-9);
        assert!((r.total(INTER_TOKEN_LATENCY.name) - 0.2).abs() < 1e-9);
        assert!((r.total(TIME_PER_OUTPUT_TOKEN.name) - 0.05).abs() < 1e-9);

        // A client abort counts as a request, without time per output token; one whose only
        // output is its abort has no time to first token either.
        let r = record(vec![finished("abort", &[mono(100), mono(200)], 3)]);
        assert_eq!(r.total(NUM_REQUESTS.name), 1.0);
        assert!(r.total(TIME_TO_FIRST_TOKEN.name) > 0.0);
        assert_eq!(r.total(TIME_PER_OUTPUT_TOKEN.name), 0.0);
        let r = record(vec![finished("abort", &[mono(100)], 0)]);
        assert_eq!(r.total(TIME_TO_FIRST_TOKEN.name), 0.0);

        // Dropped from the scheduler's queue: not counted at all.
        let mut dropped = finished("abort", &[], 0);
        dropped.dropped_while_queued = true;
        let r = record(vec![dropped]);
        assert_eq!(r.total(NUM_REQUESTS.name), 0.0);
        assert_eq!(r.total(PROMPT_TOKENS.name), 0.0);
    }

    #[test]
    fn snapshot_counters_add_each_report_and_count_the_reports() {
        let mut r = Registry::default();
        let reports = [
            DecodeStats {
                running_reqs: 3,
                queue_reqs: 1,
                used_tokens: Some(100),
                token_usage: Some(0.25),
                gen_throughput: 40.5,
                accept_length: None,
            },
            DecodeStats {
                running_reqs: 1,
                queue_reqs: 0,
                used_tokens: None,
                token_usage: None,
                gen_throughput: 10.0,
                accept_length: None,
            },
        ];
        for stats in &reports {
            report(&mut r, stats);
        }
        assert_eq!(r.total(LOG_COUNT.name), 2.0);
        assert_eq!(r.total(NUM_RUNNING_REQS.name), 4.0);
        assert_eq!(r.total(NUM_QUEUE_REQS.name), 1.0);
        assert_eq!(r.total(GEN_THROUGHPUT.name), 50.5);
        // Added where a report carried it; never reported without speculative decoding.
        assert_eq!(r.total(NUM_USED_TOKENS.name), 100.0);
        assert_eq!(r.total(TOKEN_USAGE.name), 0.25);
        assert!(
            !r.snapshot()
                .iter()
                .any(|sample| sample.name == SPEC_ACCEPT_LENGTH.name)
        );
    }
}
