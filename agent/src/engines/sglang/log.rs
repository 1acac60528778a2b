//! The SGLang scheduler's own log lines: its periodic statistics report, its prefill batches
//! and its retractions.
//!
//! The scheduler computes its gauges (running and queued requests, KV tokens in use, token
//! usage, generation throughput, speculative accept length) in the scheduler process and sends
//! them nowhere but its log: every `--decode-log-interval` decode batches (40 by default) it
//! writes one line (scheduler_components/metrics_reporter.py `report_decode_stats`, 0.5.x):
//!
//! ```text
//! [2026-12-03 10:00:00 TP0] Decode batch, #running-req: 3, #token: 120, token usage: 0.03, cuda graph: False, gen throughput (token/s): 45.12, #queue-req: 0
//! ```
//!
//! and when the KV cache is full (or `SGLANG_TEST_RETRACT` asks) it rolls requests back
//! (scheduler.py `update_running_batch`):
//!
//! ```text
//! [2026-12-03 10:00:00 TP0] KV cache pool is full. Retract requests. #retracted_reqs: 1, #new_tokens_gained: 64, #new_token_ratio: 0.5000 -> 0.6000
//! ```
//!
//! Each prefill batch's result is logged too (`report_prefill_stats`), which marks that batch
//! in the scheduler's loop (`engines::sglang::scheduler_loop`):
//!
//! ```text
//! [2026-12-03 10:00:00 TP0] Prefill batch, #new-seq: 1, #new-token: 10, #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0, ...
//! ```
//!
//! These are the values SGLang itself reported, read from the bytes the scheduler wrote to its
//! stderr (the syscall, whatever the file: a terminal, a pipe, a log file, `/dev/null`): a
//! field that a line does not carry stays absent, nothing is computed in its place.

/// What one log line says, when it is one of the lines read here.
#[derive(Clone, Debug, PartialEq)]
pub enum SchedulerLog {
    /// A decode statistics report.
    DecodeStats(DecodeStats),
    /// Requests rolled back into the waiting queue because the KV cache was full.
    Retract { requests: u32 },
    /// A prefill batch's result was processed; `new_seqs`: the requests it prefilled.
    PrefillBatch { new_seqs: u64 },
}

/// The fields of a `Decode batch` report, as SGLang printed them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DecodeStats {
    pub running_reqs: u64,
    pub queue_reqs: u64,
    /// `#token`: KV cache tokens in use. Absent on hybrid (SWA / SSM) models, which print
    /// per-pool counts instead.
    pub used_tokens: Option<u64>,
    /// `token usage`: the KV cache's used fraction (two decimals, as SGLang rounds it).
    pub token_usage: Option<f64>,
    pub gen_throughput: f64,
    /// `accept len`: speculative decoding only.
    pub accept_length: Option<f64>,
}

/// Where the message starts: after SGLang's `[date time prefix] ` header, if any.
fn message(line: &str) -> &str {
    let line = line.trim_end_matches(['\r', '\n']);
    match line
        .strip_prefix('[')
        .and_then(|rest| rest.split_once("] "))
    {
        Some((_, message)) => message,
        None => line,
    }
}

/// The `name: value` fields of a report, in order (`, ` separated).
fn fields(body: &str) -> impl Iterator<Item = (&str, &str)> {
    body.split(", ")
        .filter_map(|field| field.split_once(": "))
        .map(|(name, value)| (name.trim(), value.trim()))
}

/// Read one line the scheduler wrote; None for every other line (and for a report that lacks
/// a field every version prints, or whose numbers do not parse).
pub fn parse(line: &str) -> Option<SchedulerLog> {
    let message = message(line);
    if let Some(rest) = message.strip_prefix("Decode batch") {
        // An optional ` [iteration]` (SGLANG_LOG_FORWARD_ITERS), then the fields.
        let (_, body) = rest.split_once(", ")?;
        return decode_stats(body).map(SchedulerLog::DecodeStats);
    }
    if let Some(rest) = message.strip_prefix("Prefill batch") {
        let (_, body) = rest.split_once(", ")?;
        let new_seqs = fields(body).find(|(name, _)| *name == "#new-seq")?.1;
        return Some(SchedulerLog::PrefillBatch {
            new_seqs: new_seqs.parse().ok()?,
        });
    }
    // Retractions for a full KV cache, and those SGLANG_TEST_RETRACT makes (real ones too).
    let body = message
        .strip_prefix("KV cache pool is full. Retract requests. ")
        .or_else(|| message.strip_prefix("Testing retraction. "))?;
    let requests = fields(body)
        .find(|(name, _)| *name == "#retracted_reqs")?
        .1
        .parse()
        .ok()?;
    Some(SchedulerLog::Retract { requests })
}

fn decode_stats(body: &str) -> Option<DecodeStats> {
    let mut stats = DecodeStats::default();
    let (mut running, mut queue, mut throughput) = (None, None, None);
    for (name, value) in fields(body) {
        match name {
            "#running-req" => running = Some(value.parse().ok()?),
            "#queue-req" => queue = Some(value.parse().ok()?),
            "#token" => stats.used_tokens = Some(value.parse().ok()?),
            "token usage" => stats.token_usage = Some(value.parse().ok()?),
            "gen throughput (token/s)" => throughput = Some(value.parse().ok()?),
            "accept len" => stats.accept_length = Some(value.parse().ok()?),
            _ => {}
        }
    }
    stats.running_reqs = running?;
    stats.queue_reqs = queue?;
    stats.gen_throughput = throughput?;
    Some(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decode_report_is_read_field_by_field() {
        let line = "[2026-12-03 10:00:00 TP0] Decode batch, #running-req: 3, #token: 120, token \
                    usage: 0.03, cuda graph: False, gen throughput (token/s): 45.12, #queue-req: 2\n";
        assert_eq!(
            parse(line),
            Some(SchedulerLog::DecodeStats(DecodeStats {
                running_reqs: 3,
                queue_reqs: 2,
                used_tokens: Some(120),
                token_usage: Some(0.03),
                gen_throughput: 45.12,
                accept_length: None,
            }))
        );
    }

    #[test]
    fn iteration_numbers_speculative_fields_and_hybrid_pools_are_understood() {
        let line = "[2026-12-03 10:00:00.123] Decode batch [812], #running-req: 1, #full token: 9, \
                    full token usage: 0.10, #swa token: 4, swa token usage: 0.05, accept len: 2.50, \
                    accept rate: 0.75, cuda graph: True, gen throughput (token/s): 7.00, #queue-req: 0";
        let Some(SchedulerLog::DecodeStats(stats)) = parse(line) else {
            panic!("not read: {line}");
        };
        assert_eq!(stats.running_reqs, 1);
        assert_eq!(stats.accept_length, Some(2.5));
        // Per-pool counts are not the spec's single KV figure: absent, not summed.
        assert_eq!((stats.used_tokens, stats.token_usage), (None, None));
    }

    #[test]
    fn a_prefill_batch_line_gives_its_new_requests() {
        let line = "[2026-12-03 10:00:00 TP0] Prefill batch, #new-seq: 3, #new-token: 10, \
                    #cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0, \
                    #pending-token: 0, cpu graph: False, input throughput (token/s): 0.00";
        assert_eq!(
            parse(line),
            Some(SchedulerLog::PrefillBatch { new_seqs: 3 })
        );
        let numbered = "[t] Prefill batch [17], #new-seq: 1, #new-token: 4";
        assert_eq!(
            parse(numbered),
            Some(SchedulerLog::PrefillBatch { new_seqs: 1 })
        );
    }

    #[test]
    fn retractions_are_counted_and_other_lines_ignored() {
        let line = "[2026-12-03 10:00:00 TP0] KV cache pool is full. Retract requests. \
                    #retracted_reqs: 2, #new_tokens_gained: 64, #new_token_ratio: 0.5000 -> 0.6000";
        assert_eq!(parse(line), Some(SchedulerLog::Retract { requests: 2 }));
        let test_mode = "Testing retraction. #retracted_reqs: 1, #new_tokens_gained: 3";
        assert_eq!(
            parse(test_mode),
            Some(SchedulerLog::Retract { requests: 1 })
        );
        for other in [
            "[x] Prefill batch, #new-seq: some, #new-token: 10",
            "[x] Prefill batch #new-seq: 1",
            "INFO:     127.0.0.1:5000 - \"POST /generate HTTP/1.1\" 200 OK",
            "Decode batch",
            "[x] Decode batch, #running-req: many, #queue-req: 0, gen throughput (token/s): 1",
            "[x] Decode batch, #token: 5, gen throughput (token/s): 1.0",
            "KV cache pool is full. Retract requests. #retracted_reqs: -1",
            "",
        ] {
            assert_eq!(parse(other), None, "{other}");
        }
    }
}
