//! Compares infertrace's vLLM output (its JSONL: spans and metrics snapshots) with the ground
//! truth of the same run: vLLM's own `llm_request` spans (`--otlp-traces-endpoint`, collected
//! by `otlp_receiver.py`), the client's record of what it sent and got (`workload.py`), and
//! vLLM's `/metrics` before and after.
use std::{collections::HashMap, fmt::Write as _, path::Path};

use infertrace::engines::common::join::ids_match;
use serde_json::Value;

/// Engine-clock latencies must agree to this (seconds): both sides subtract the same engine
/// timestamps; only float formatting separates them.
pub const ENGINE_TOLERANCE_S: f64 = 0.05e-3;
/// Frontend-clock latencies (TTFT, e2e) must agree to this at p50 and at p99 (seconds): vLLM
/// stamps `time.time()` when `output_handler` handles an output, infertrace the return of the
/// API server loop's first epoll wait after it read the output socket's mailbox, which is when
/// that handler's iteration begins (docs/accuracy.md).
pub const FRONTEND_P50_S: f64 = 1e-3;
pub const FRONTEND_P99_S: f64 = 5e-3;

/// Every JSON line of a file (infertrace's JSONL output, the OTLP receiver's output).
pub fn json_lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l}: {e}")))
        .collect()
}

/// Number of an OTLP-JSON attribute (ints arrive as strings) or of ours.
fn num(v: &Value) -> Option<f64> {
    v.as_f64().or_else(|| v.as_str()?.parse().ok())
}

fn attr<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    span.get("attributes")?.get(key)
}

fn attr_num(span: &Value, key: &str) -> Option<f64> {
    attr(span, key).and_then(num)
}

fn attr_str<'a>(span: &'a Value, key: &str) -> Option<&'a str> {
    attr(span, key)?.as_str()
}

/// Percentile (nearest rank) of absolute values.
pub fn percentile(values: &[f64], p: f64) -> f64 {
    let mut v: Vec<f64> = values.iter().map(|x| x.abs()).collect();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// infertrace's last metrics snapshot in its JSONL output.
pub fn last_metrics(ours: &[Value]) -> &Value {
    ours.iter()
        .rev()
        .find(|v| v["type"] == "metrics")
        .expect("a metrics snapshot")
}

/// Sum of a metric's samples in a snapshot, optionally of one dimension's value only.
pub fn metric_total(metrics: &Value, name: &str, label: Option<(&str, &str)>) -> f64 {
    metrics["samples"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["name"] == name)
        .filter(|s| label.is_none_or(|(k, v)| s["dimensions"][k] == v))
        .filter_map(|s| s["value"].as_f64())
        .fold(0.0, |a, b| a + b)
}

/// Sum of a Prometheus series' values whose line starts with `prefix` (name plus `{` or space)
/// and contains every label in `labels`.
pub fn prom(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter(|l| labels.iter().all(|lab| l.contains(lab)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The comparison's findings: `failures` empty means every assertion held.
#[derive(Default, Debug)]
pub struct Report {
    pub text: String,
    pub failures: Vec<String>,
}

impl Report {
    pub fn fail(&mut self, what: String) {
        self.failures.push(what);
    }

    /// Append another report's text and failures.
    pub fn add(&mut self, other: Report) {
        self.text.push_str(&other.text);
        self.failures.extend(other.failures);
    }

    /// Print the report under `title` with the agent's summary (the last line of its
    /// `stderr`), then fail the test when an assertion did not hold. The failures come first
    /// and again in the panic message: a CI log cut in the middle keeps its head and tail.
    pub fn print_and_check(&self, title: &str, stderr: &str) {
        if !self.failures.is_empty() {
            println!("{title}FAILED: {:#?}", self.failures);
        }
        println!(
            "{title}{}\n{}",
            self.text,
            stderr.lines().last().unwrap_or_default()
        );
        assert!(
            self.failures.is_empty(),
            "{title}{:#?}\nthe agent's stderr:\n{stderr}\n{title}failed: {:#?}",
            self.failures,
            self.failures
        );
    }
}

/// Compare infertrace's JSONL output with the ground truth files of the same run.
pub fn compare(
    ours_jsonl: &Path,
    vllm_otlp_jsonl: &Path,
    client_json: &Path,
    metrics_before: &str,
    metrics_after: &str,
) -> Report {
    let ours = json_lines(ours_jsonl);
    let spans: Vec<&Value> = ours.iter().filter(|v| v["type"] == "span").collect();
    let truth: Vec<Value> = json_lines(vllm_otlp_jsonl)
        .into_iter()
        .filter(|s| s["name"] == "llm_request")
        .collect();
    let client: Value = serde_json::from_str(
        &std::fs::read_to_string(client_json).expect("reading the client record"),
    )
    .expect("client JSON");
    let requests = client["requests"].as_array().expect("client requests");
    let mut r = Report::default();

    let llm: Vec<&Value> = spans
        .iter()
        .copied()
        .filter(|s| s["name"] == "llm_request")
        .collect();
    let entries: Vec<&Value> = spans
        .iter()
        .copied()
        .filter(|s| attr(s, "gen_ai.operation.name").is_some())
        .collect();
    let _ = writeln!(
        r.text,
        "vLLM: {} llm_request spans; infertrace: {} llm_request, {} entry spans, {} spans in all",
        truth.len(),
        llm.len(),
        entries.len(),
        spans.len()
    );

    // 1. Every vLLM span has its counterpart, with the same token counts and latencies.
    let mut used = vec![false; llm.len()];
    let mut engine_diffs: HashMap<&str, Vec<f64>> = HashMap::new();
    let mut frontend_diffs: HashMap<&str, Vec<f64>> = HashMap::new();
    // Per attribute, the request that differed most (signed difference, id): the report names it.
    let mut worst: HashMap<&str, (f64, String)> = HashMap::new();
    for t in &truth {
        let id = attr_str(t, "gen_ai.request.id").unwrap_or_default();
        let Some(i) = (0..llm.len()).find(|&i| {
            !used[i] && attr_str(llm[i], "gen_ai.request.id").is_some_and(|o| ids_match(id, o))
        }) else {
            r.fail(format!(
                "vLLM's llm_request {id} has no infertrace llm_request"
            ));
            continue;
        };
        used[i] = true;
        let o = llm[i];
        for key in [
            "gen_ai.usage.prompt_tokens",
            "gen_ai.usage.completion_tokens",
        ] {
            if attr_num(t, key) != attr_num(o, key) {
                r.fail(format!(
                    "{id}: {key} vLLM {:?} infertrace {:?}",
                    attr_num(t, key),
                    attr_num(o, key)
                ));
            }
        }
        for (key, engine_clock) in [
            ("gen_ai.latency.time_in_queue", true),
            ("gen_ai.latency.time_in_model_prefill", true),
            ("gen_ai.latency.time_in_model_decode", true),
            ("gen_ai.latency.time_in_model_inference", true),
            ("gen_ai.latency.time_to_first_token", false),
            ("gen_ai.latency.e2e", false),
        ] {
            let (Some(theirs), Some(ours_ns)) = (attr_num(t, key), attr_num(o, key)) else {
                r.fail(format!("{id}: {key} missing on one side"));
                continue;
            };
            let diff = ours_ns / 1e9 - theirs;
            let into = if engine_clock {
                &mut engine_diffs
            } else {
                &mut frontend_diffs
            };
            into.entry(key).or_default().push(diff);
            let w = worst.entry(key).or_insert((0.0, String::new()));
            if diff.abs() > w.0.abs() {
                *w = (diff, id.to_string());
            }
        }
        // The caller's trace context is honoured on both sides.
        if t.get("parentSpanId").is_some() {
            let their_trace = t["traceId"].as_str().unwrap_or_default();
            let our_trace = o["trace_id"].as_str().unwrap_or_default();
            if base64_to_hex(their_trace) != our_trace {
                r.fail(format!(
                    "{id}: trace id vLLM {their_trace} infertrace {our_trace}"
                ));
            }
        }
    }
    // Engine-clock values must all agree (bound on the max); frontend-clock ones at p50 and p99.
    for (diffs, what, every) in [
        (&engine_diffs, "engine clock", true),
        (&frontend_diffs, "frontend clock", false),
    ] {
        let mut keys: Vec<_> = diffs.keys().collect();
        keys.sort();
        for key in keys {
            let d = &diffs[key];
            let mean = d.iter().sum::<f64>() / d.len() as f64;
            let (p50, p95, p99, max) = (
                percentile(d, 50.0),
                percentile(d, 95.0),
                percentile(d, 99.0),
                percentile(d, 100.0),
            );
            let (bound_p50, tail) = if every {
                (ENGINE_TOLERANCE_S, (max, ENGINE_TOLERANCE_S))
            } else {
                (FRONTEND_P50_S, (p99, FRONTEND_P99_S))
            };
            let _ = writeln!(
                r.text,
                "{key} ({what}, {} requests): |infertrace - vLLM| p50 {:.4} ms, p95 {:.4} ms, \
                 p99 {:.4} ms, max {:.4} ms (mean signed {:+.4} ms; largest {:+.4} ms, {})",
                d.len(),
                p50 * 1e3,
                p95 * 1e3,
                p99 * 1e3,
                max * 1e3,
                mean * 1e3,
                worst[key].0 * 1e3,
                worst[key].1
            );
            if p50 > bound_p50 {
                r.fail(format!("{key}: p50 {p50:.6} s beyond {bound_p50} s"));
            }
            let (value, bound) = tail;
            if value > bound {
                r.fail(format!("{key}: tail {value:.6} s beyond {bound} s"));
            }
        }
    }

    // 2. Every request that existed has its spans; nothing is invented.
    for req in requests {
        let status = req["status"].as_u64();
        let ids: Vec<&str> = req["ids"]
            .as_array()
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let aborted = req["aborted_by_client"].as_bool().unwrap_or(false);
        let what = format!(
            "client request {} ({} {})",
            req["idx"], req["phase"], req["endpoint"]
        );
        let entry = entries.iter().find(|e| {
            ids.iter()
                .any(|id| attr_str(e, "gen_ai.response.id") == Some(id))
        });
        match status {
            Some(200) if !ids.is_empty() => {
                let Some(entry) = entry else {
                    r.fail(format!("{what}: no entry span for {ids:?}"));
                    continue;
                };
                let children = llm
                    .iter()
                    .filter(|s| s["parent_span_id"] == entry["span_id"])
                    .count() as u64;
                let n = req["n"].as_u64().unwrap_or(1);
                if children != n {
                    r.fail(format!(
                        "{what}: {children} llm_request under the entry span, n={n}"
                    ));
                }
                if let Some(tp) = req["traceparent"].as_str()
                    && entry["trace_id"].as_str() != tp.split('-').nth(1)
                {
                    r.fail(format!("{what}: entry span not in the caller's trace {tp}"));
                }
                if !aborted {
                    let usage = &req["usage"];
                    for (key, theirs) in [
                        ("gen_ai.usage.input_tokens", &usage["prompt_tokens"]),
                        ("gen_ai.usage.output_tokens", &usage["completion_tokens"]),
                    ] {
                        if !theirs.is_null() && attr_num(entry, key) != num(theirs) {
                            r.fail(format!(
                                "{what}: {key} {:?}, the client got {theirs}",
                                attr_num(entry, key)
                            ));
                        }
                    }
                }
            }
            Some(s) if s >= 400 => {
                let errors = entries
                    .iter()
                    .filter(|e| {
                        !e["error"].is_null() && e["attributes"]["gen_ai.response.id"].is_null()
                    })
                    .count();
                if errors == 0 {
                    r.fail(format!("{what}: HTTP {s} but no entry span with an error"));
                }
            }
            _ => {}
        }
    }
    let client_ids: Vec<&str> = requests
        .iter()
        .flat_map(|q| q["ids"].as_array().into_iter().flatten())
        .filter_map(Value::as_str)
        .collect();
    let client_errors = requests
        .iter()
        .filter(|q| q["status"].as_u64().is_some_and(|s| s >= 400))
        .count();
    let our_errors = entries
        .iter()
        .filter(|e| e["attributes"]["gen_ai.response.id"].is_null())
        .count();
    let no_response = requests.iter().filter(|q| q["status"].is_null()).count();
    if our_errors != client_errors + no_response {
        // Say which, so that a failure in CI can be diagnosed from its log alone.
        let ours: Vec<String> = entries
            .iter()
            .filter(|e| e["attributes"]["gen_ai.response.id"].is_null())
            .map(|e| {
                format!(
                    "{} at {} ({})",
                    e["name"], e["start_time_unix_nano"], e["error"]
                )
            })
            .collect();
        let theirs: Vec<String> = requests
            .iter()
            .filter(|q| q["status"].as_u64().is_none_or(|s| s >= 400))
            .map(|q| {
                format!(
                    "{} {} {} at {}",
                    q["idx"], q["endpoint"], q["status"], q["t_start"]
                )
            })
            .collect();
        r.fail(format!(
            "{our_errors} entry spans without a response id; the client had {client_errors} \
             errors and {no_response} requests without a response\n  ours: {ours:#?}\n  \
             client: {theirs:#?}"
        ));
    }
    for s in &llm {
        let id = attr_str(s, "gen_ai.request.id").unwrap_or_default();
        let known = client_ids.iter().any(|c| ids_match(c, id));
        let unanswered = requests.iter().any(|q| q["status"].is_null());
        if !known && !unanswered {
            r.fail(format!("infertrace invented llm_request {id}"));
        }
    }

    // 3. Counters equal vLLM's /metrics over the same run.
    let metrics = last_metrics(&ours);
    let ours_total =
        |name: &str, label: Option<(&str, &str)>| -> f64 { metric_total(metrics, name, label) };
    let delta = |name: &str, labels: &[&str]| {
        prom(metrics_after, name, labels) - prom(metrics_before, name, labels)
    };
    // Outputs of a request the client abandoned race with vLLM's abort: the frontend may
    // receive an output (infertrace counts it) that its event loop then drops because it
    // handled the abort first (vLLM does not). Only these tokens may differ.
    let aborted = |key: &str| -> f64 {
        llm.iter()
            .filter(|s| attr_str(s, "infertrace.finish_reason") == Some("abort"))
            .filter_map(|s| attr_num(s, key))
            .sum()
    };
    let (aborted_prompt, aborted_generated) = (
        aborted("gen_ai.usage.prompt_tokens"),
        aborted("gen_ai.usage.completion_tokens"),
    );
    for (ours_name, label, theirs_name, theirs_labels, race) in [
        (
            "gen_ai_vllm_prompt_tokens",
            None,
            "vllm:prompt_tokens_total",
            &[][..],
            aborted_prompt,
        ),
        (
            "gen_ai_vllm_generation_tokens",
            None,
            "vllm:generation_tokens_total",
            &[],
            aborted_generated,
        ),
        (
            "gen_ai_vllm_num_preemptions",
            None,
            "vllm:num_preemptions_total",
            &[],
            0.0,
        ),
        (
            "gen_ai_vllm_request_success",
            Some(("finished_reason", "length")),
            "vllm:request_success_total",
            &["finished_reason=\"length\""],
            0.0,
        ),
        (
            "gen_ai_vllm_request_success",
            Some(("finished_reason", "stop")),
            "vllm:request_success_total",
            &["finished_reason=\"stop\""],
            0.0,
        ),
        (
            "gen_ai_vllm_request_success",
            Some(("finished_reason", "abort")),
            "vllm:request_success_total",
            &["finished_reason=\"abort\""],
            0.0,
        ),
        (
            "gen_ai_vllm_request_params_n",
            None,
            "vllm:request_params_n_sum",
            &[],
            0.0,
        ),
        (
            "gen_ai_vllm_request_params_max_tokens",
            None,
            "vllm:request_params_max_tokens_sum",
            &[],
            0.0,
        ),
        (
            "gen_ai_vllm_prefix_cache_queries",
            None,
            "vllm:prefix_cache_queries_total",
            &[],
            0.0,
        ),
        (
            "gen_ai_vllm_prefix_cache_hits",
            None,
            "vllm:prefix_cache_hits_total",
            &[],
            0.0,
        ),
        (
            "vllm_iter_count",
            None,
            "vllm:iteration_tokens_total_count",
            &[],
            0.0,
        ),
    ] {
        let (o, t) = (
            ours_total(ours_name, label),
            delta(theirs_name, theirs_labels),
        );
        let _ = writeln!(
            r.text,
            "{ours_name}{}: infertrace {o}, vLLM {theirs_name} {t}",
            label
                .map(|(k, v)| format!("{{{k}={v}}}"))
                .unwrap_or_default()
        );
        if !(o - t >= -1e-9 && o - t <= race + 1e-9) {
            r.fail(format!(
                "{ours_name}{label:?} = {o}, vLLM's {theirs_name} grew by {t} (allowed: up to \
                 {race} more, from client-aborted requests)"
            ));
        }
    }
    r
}

/// OTLP JSON ids are base64 (protobuf bytes); ours are hex.
fn base64_to_hex(b64: &str) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits = 0u32;
    let mut nbits = 0;
    let mut out = String::new();
    for c in b64.bytes().filter(|&c| c != b'=') {
        let Some(v) = ALPHABET.iter().position(|&a| a == c) else {
            return String::new();
        };
        bits = (bits << 6) | v as u32;
        nbits += 6;
        if nbits >= 8 {
            nbits -= 8;
            let _ = write!(out, "{:02x}", (bits >> nbits) & 0xff);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers() {
        assert_eq!(
            base64_to_hex("YHvGlptUXqp9yeZ/j8v4Ow=="),
            "607bc6969b545eaa7dc9e67f8fcbf83b"
        );
        assert_eq!(percentile(&[3.0, -1.0, 2.0, 4.0], 50.0), 2.0);
        assert_eq!(percentile(&[3.0, -1.0, 2.0, 4.0], 100.0), 4.0);
        let text =
            "# HELP x\nx_total{a=\"1\",b=\"2\"} 3.0\nx_total{a=\"2\"} 4.0\nx_total_created 9\n";
        assert_eq!(prom(text, "x_total", &[]), 7.0);
        assert_eq!(prom(text, "x_total", &["a=\"1\""]), 3.0);
    }
}
