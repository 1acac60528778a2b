//! Joins API calls (HTTP exchanges) to the engine requests they caused.
//!
//! The HTTP exchange is decoded when its response is complete, which is after the engine's last
//! output for it reached the frontend; but messages of one drain batch are handed over in the
//! order they *started*, so an exchange can arrive before the final outputs of its engine
//! requests. Both sides therefore wait here for [`GRACE_NS`] of capture time before they are
//! joined (by id) or reported alone.
//!
//! Ids: the API answers with `chatcmpl-X` / `cmpl-X`; the engine request carries that id, or
//! (completions with several prompts) `cmpl-X-<prompt index>`, and n>1 children are
//! `<i>_<id>`. SGLang instead gives every n>1 sample and the call's prefix warm-up an id of its
//! own and answers with the first sample's; those are joined by prompt and send order
//! (`Joiner::claim_relatives`). A call without an id (the client went away before any
//! response) waits [`ABANDONED_GRACE_NS`] and is joined to the first unclaimed engine request
//! the frontend sent after the call's body arrived.
use std::collections::VecDeque;

use crate::decode::{http::HttpExchange, openai::ApiCall};

/// How long (capture time) each side waits for the other.
pub const GRACE_NS: u64 = 1_000_000_000;
/// How long a call the client abandoned (no response) waits for its engine request: the
/// frontend may notice the client gone only seconds later and end the request then (SGLang
/// polls for a disconnected client every `SGLANG_REQUEST_STATE_WAIT_TIMEOUT`, 4 s).
pub const ABANDONED_GRACE_NS: u64 = 6_000_000_000;
/// Calls or requests waiting at once; beyond it the oldest is reported unjoined.
const MAX_WAITING: usize = 65_536;

/// What the joiner needs to know about an engine request.
pub trait EngineRequestInfo {
    /// The id the API layer answers with (engine suffixes allowed, see the module docs).
    fn api_id(&self) -> &str;
    /// Capture time the frontend handed the request to the engine.
    fn sent_ns(&self) -> u64;
    /// Capture time the frontend learnt that it finished.
    fn done_ns(&self) -> u64;
    /// A key of the request's prompt (its token ids), where the engine has prefix warm-ups.
    fn prompt_key(&self) -> Option<u64> {
        None
    }
    /// Whether the frontend sent this request only to warm the prefix cache for the n>1
    /// children of its call (SGLang: the prompt alone, no tokens to generate, an id of its own).
    fn is_prefix_warmup(&self) -> bool {
        false
    }
    /// The samples its call asked for (n), where the engine gives each its own unrelated id
    /// and the API answers with the first one's (SGLang). 1 where ids tell them apart.
    fn unrelated_samples(&self) -> u64 {
        1
    }
}

/// What the engine requests of one API call add to its entry span.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct EngineSide {
    /// The prompt's tokens (counted once for n>1).
    pub input_tokens: Option<u64>,
    /// Tokens generated over all the call's engine requests.
    pub output_tokens: Option<u64>,
    /// When the last engine request ended (capture time), for a call without a response.
    pub finished_ns: Option<u64>,
}

impl EngineSide {
    /// Input and output tokens of the call: its `usage`, else the engine's counts (a streamed
    /// response without `include_usage` carries none).
    pub fn tokens(&self, call: &ApiCall) -> (Option<u64>, Option<u64>) {
        (
            call.usage.input.or(self.input_tokens),
            call.usage.output.or(self.output_tokens),
        )
    }
}

/// An API call with the capture times of its exchange (CLOCK_MONOTONIC ns).
#[derive(Clone, Debug, PartialEq)]
pub struct ApiExchange {
    pub call: ApiCall,
    pub request_first_ns: u64,
    pub request_last_ns: u64,
    pub response_first_ns: Option<u64>,
    pub response_last_ns: Option<u64>,
    /// The response arrived whole.
    pub complete: bool,
}

impl ApiExchange {
    pub fn from_exchange(exchange: &HttpExchange) -> Option<Self> {
        let call = ApiCall::from_exchange(exchange)?;
        let request = exchange.request.as_ref()?;
        Some(Self {
            call,
            request_first_ns: request.first_ns,
            request_last_ns: request.last_ns,
            response_first_ns: exchange.response.as_ref().map(|r| r.first_ns),
            response_last_ns: exchange.response.as_ref().map(|r| r.last_ns),
            complete: exchange.complete,
        })
    }

    fn end_ns(&self) -> u64 {
        self.response_last_ns.unwrap_or(self.request_last_ns)
    }
}

/// An API call and its engine requests (either side may be missing).
#[derive(Clone, Debug, PartialEq)]
pub struct Outcome<T> {
    pub api: Option<ApiExchange>,
    pub engine: Vec<T>,
}

pub struct Joiner<T> {
    /// Calls with the capture time they were handed over (their wait starts then at the
    /// earliest: a call the client abandoned is decoded only when its connection closes).
    apis: VecDeque<(ApiExchange, u64)>,
    engines: VecDeque<T>,
}

impl<T> Default for Joiner<T> {
    fn default() -> Self {
        Self {
            apis: VecDeque::new(),
            engines: VecDeque::new(),
        }
    }
}

/// Whether engine id `engine` belongs to API response id `api`: after an optional `<i>_`
/// child prefix, `engine` is `api`, optionally followed by `-<prompt index>` and then by the
/// engine's own `-<8 hex digits>` suffix.
pub fn ids_match(api: &str, engine: &str) -> bool {
    let engine = match engine.split_once('_') {
        Some((index, rest)) if !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit()) => {
            rest
        }
        _ => engine,
    };
    let Some(mut rest) = engine.strip_prefix(api) else {
        return false;
    };
    let part = |rest: &str, ok: fn(&str) -> bool| -> Option<usize> {
        let tail = rest.strip_prefix('-')?;
        let end = tail.find('-').unwrap_or(tail.len());
        ok(&tail[..end]).then_some(end + 1)
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let suffix = |s: &str| s.len() == 8 && s.bytes().all(|b| b.is_ascii_hexdigit());
    if let Some(n) = part(rest, digits) {
        rest = &rest[n..];
    }
    if let Some(n) = part(rest, suffix) {
        rest = &rest[n..];
    }
    rest.is_empty()
}

impl<T: EngineRequestInfo> Joiner<T> {
    pub fn add_api(&mut self, api: ApiExchange, now_ns: u64) {
        let since = api.end_ns().max(now_ns);
        self.apis.push_back((api, since));
    }

    pub fn add_engine(&mut self, engine: T) {
        self.engines.push_back(engine);
    }

    /// Join and report what has waited long enough at capture time `now_ns`.
    pub fn advance(&mut self, now_ns: u64) -> Vec<Outcome<T>> {
        let mut done = Vec::new();
        // In arrival order, so that calls without a response claim requests in send order.
        let mut i = 0;
        while i < self.apis.len() {
            let (api, since) = &self.apis[i];
            let grace = if api.call.response_id.is_none() && api.call.status.is_none() {
                ABANDONED_GRACE_NS
            } else {
                GRACE_NS
            };
            if since.saturating_add(grace) > now_ns && self.apis.len() <= MAX_WAITING {
                i += 1;
                continue;
            }
            let (api, _) = self.apis.remove(i).expect("index in range");
            let engine = self.claim(&api);
            done.push(Outcome {
                api: Some(api),
                engine,
            });
        }
        let cutoff = now_ns.saturating_sub(2 * GRACE_NS);
        let waiting_api_start = self.apis.iter().map(|(a, _)| a.request_first_ns).min();
        while let Some(oldest) = self.engines.front() {
            // An engine request may still be claimed by a call that is waiting.
            let claimable = waiting_api_start.is_some_and(|start| oldest.sent_ns() >= start);
            if (oldest.done_ns() <= cutoff && !claimable) || self.engines.len() > MAX_WAITING {
                let engine = self.engines.pop_front().expect("checked non-empty");
                done.push(Outcome {
                    api: None,
                    engine: vec![engine],
                });
            } else {
                break;
            }
        }
        done
    }

    /// End of the session: everything waiting is reported.
    pub fn finish(&mut self) -> Vec<Outcome<T>> {
        let mut done = self.advance(u64::MAX);
        done.extend(self.engines.drain(..).map(|engine| Outcome {
            api: None,
            engine: vec![engine],
        }));
        done
    }

    /// Take the engine requests that belong to `api`.
    fn claim(&mut self, api: &ApiExchange) -> Vec<T> {
        if let Some(id) = api.call.response_id.as_deref() {
            let (mine, rest): (VecDeque<T>, VecDeque<T>) = self
                .engines
                .drain(..)
                .partition(|e| ids_match(id, e.api_id()));
            self.engines = rest;
            let mut mine: Vec<T> = mine.into();
            self.claim_relatives(api, &mut mine);
            return mine;
        }
        // No response id: an error answered before the engine was asked, or a client that went
        // away; the latter's request is the first one sent after its body arrived.
        if api.call.status.is_some_and(|s| s >= 400) {
            return Vec::new();
        }
        let at = self
            .engines
            .iter()
            .enumerate()
            .filter(|(_, e)| {
                e.sent_ns() >= api.request_last_ns
                    && e.sent_ns() <= api.request_last_ns.saturating_add(GRACE_NS)
            })
            .min_by_key(|(_, e)| e.sent_ns())
            .map(|(i, _)| i);
        at.and_then(|i| self.engines.remove(i))
            .into_iter()
            .collect()
    }

    /// The requests of a call that its response does not name (SGLang, n>1): for each prompt
    /// of the requests joined by id (`mine`), its other samples, the unclaimed requests of the
    /// same prompt sent after the call's body nearest to the first of `mine` (the frontend
    /// sends them back to back), and its prefix warm-up, the last one of the same prompt sent
    /// between the call's body and the first of `mine`. Appended: the named request stays first.
    fn claim_relatives(&mut self, api: &ApiExchange, mine: &mut Vec<T>) {
        let Some(first_sent) = mine.iter().map(|e| e.sent_ns()).min() else {
            return;
        };
        let mut prompts: Vec<u64> = mine.iter().filter_map(|e| e.prompt_key()).collect();
        prompts.sort_unstable();
        prompts.dedup();
        let after_body = |e: &T| e.sent_ns() >= api.request_last_ns;
        for prompt in prompts {
            let of_prompt = |e: &T| e.prompt_key() == Some(prompt);
            let samples = mine
                .iter()
                .filter(|e| of_prompt(e) && !e.is_prefix_warmup());
            let wanted = samples.clone().map(|e| e.unrelated_samples()).max();
            let missing = wanted.unwrap_or(0).saturating_sub(samples.count() as u64);
            for _ in 0..missing {
                let nearest = self
                    .engines
                    .iter()
                    .enumerate()
                    .filter(|(_, e)| of_prompt(e) && !e.is_prefix_warmup() && after_body(e))
                    .min_by_key(|(_, e)| e.sent_ns().abs_diff(first_sent))
                    .map(|(i, _)| i);
                let Some(i) = nearest else {
                    break;
                };
                mine.extend(self.engines.remove(i));
            }
            let warmup = self
                .engines
                .iter()
                .enumerate()
                .filter(|(_, e)| {
                    e.is_prefix_warmup()
                        && of_prompt(e)
                        && (api.request_last_ns..=first_sent).contains(&e.sent_ns())
                })
                .max_by_key(|(_, e)| e.sent_ns())
                .map(|(i, _)| i);
            mine.extend(warmup.and_then(|i| self.engines.remove(i)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_rules() {
        assert!(ids_match("chatcmpl-ab", "chatcmpl-ab"));
        assert!(ids_match("cmpl-ab", "cmpl-ab-0"));
        assert!(ids_match("cmpl-ab", "1_cmpl-ab-0"));
        assert!(ids_match("chatcmpl-ab", "0_chatcmpl-ab"));
        assert!(!ids_match("cmpl-ab", "cmpl-abc"));
        assert!(!ids_match("cmpl-ab", "cmpl-ab-x1"));
        assert!(!ids_match("cmpl-ab", "x_cmpl-ab"));
        assert!(!ids_match("cmpl-ab", "cmpl-ab-"));
        assert!(ids_match("cmpl-ab", "cmpl-ab-0-8a0c4653"));
        assert!(ids_match("chatcmpl-ab", "1_chatcmpl-ab-bacd08f4"));
        assert!(ids_match("cmpl-ab-0", "cmpl-ab-0-8a0c4653"));
        assert!(!ids_match("cmpl-ab", "cmpl-ab-8a0c465"));
        assert!(!ids_match("cmpl-ab", "cmpl-ab-8a0c4653-0"));
    }

    #[derive(Debug, PartialEq)]
    struct E(&'static str, u64, u64);
    impl EngineRequestInfo for E {
        fn api_id(&self) -> &str {
            self.0
        }
        fn sent_ns(&self) -> u64 {
            self.1
        }
        fn done_ns(&self) -> u64 {
            self.2
        }
    }

    fn api(id: Option<&str>, status: Option<u16>, first: u64, last: u64) -> ApiExchange {
        ApiExchange {
            call: ApiCall {
                response_id: id.map(str::to_owned),
                status,
                ..ApiCall::default()
            },
            request_first_ns: first,
            request_last_ns: first + 1,
            response_first_ns: status.map(|_| last - 1),
            response_last_ns: status.map(|_| last),
            complete: status.is_some(),
        }
    }

    #[test]
    fn joins_by_id_after_the_grace_period() {
        let mut j = Joiner::default();
        j.add_api(api(Some("cmpl-1"), Some(200), 10, 100), 0);
        j.add_engine(E("0_cmpl-1-0", 20, 90));
        j.add_engine(E("1_cmpl-1-0", 21, 95));
        j.add_engine(E("cmpl-2", 30, 99));
        assert!(j.advance(100 + GRACE_NS - 1).is_empty());
        let done = j.advance(100 + GRACE_NS);
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].engine.len(), 2);
        // The unclaimed one is reported alone once it has waited too.
        let done = j.advance(99 + 2 * GRACE_NS);
        assert_eq!(done[0].api, None);
        assert_eq!(done[0].engine, vec![E("cmpl-2", 30, 99)]);
    }

    #[test]
    fn a_call_without_response_takes_the_next_request_sent() {
        let mut j = Joiner::default();
        j.add_engine(E("cmpl-early", 5, 50));
        j.add_engine(E("cmpl-late", 15, 60));
        j.add_api(api(None, None, 10, 0), 70);
        j.add_api(api(None, Some(400), 12, 14), 70);
        let done = j.finish();
        assert_eq!(done[0].engine, vec![E("cmpl-late", 15, 60)]);
        assert!(done[1].engine.is_empty());
        assert_eq!(done[2].engine, vec![E("cmpl-early", 5, 50)]);
    }

    #[test]
    fn an_abandoned_call_waits_for_the_frontend_to_notice() {
        const S: u64 = 1_000_000_000;
        let mut j = Joiner::default();
        // The client leaves at 2 s; the frontend aborts the request at its 4 s poll, at 6 s.
        j.add_api(api(None, None, S, 0), 2 * S);
        j.add_api(api(Some("cmpl-2"), Some(200), S + 1, 3 * S), 3 * S);
        j.add_engine(E("cmpl-2", S + 2, 3 * S));
        let done = j.advance(4 * S);
        assert_eq!(done.len(), 1, "the answered call goes first");
        assert_eq!(done[0].engine, vec![E("cmpl-2", S + 2, 3 * S)]);
        j.add_engine(E("cmpl-abandoned", S + 5, 6 * S));
        assert!(j.advance(7 * S).is_empty());
        let done = j.advance(8 * S);
        assert_eq!(done[0].engine, vec![E("cmpl-abandoned", S + 5, 6 * S)]);
    }

    /// An SGLang-like request: fresh ids per sample, a prompt, the call's n, a warm-up flag.
    #[derive(Debug, PartialEq)]
    struct Sample {
        id: &'static str,
        sent: u64,
        prompt: u64,
        n: u64,
        warmup: bool,
    }
    impl EngineRequestInfo for Sample {
        fn api_id(&self) -> &str {
            self.id
        }
        fn sent_ns(&self) -> u64 {
            self.sent
        }
        fn done_ns(&self) -> u64 {
            self.sent + 100
        }
        fn prompt_key(&self) -> Option<u64> {
            Some(self.prompt)
        }
        fn is_prefix_warmup(&self) -> bool {
            self.warmup
        }
        fn unrelated_samples(&self) -> u64 {
            self.n
        }
    }

    #[test]
    fn an_n_call_takes_its_other_samples_and_its_prefix_warmup() {
        let request = |id, sent, prompt, warmup| Sample {
            id,
            sent,
            prompt,
            n: 2,
            warmup,
        };
        let mut j = Joiner::default();
        // A warm-up of the same prompt from before this call's body belongs to another call.
        j.add_engine(request("old-warmup", 5, 1, true));
        j.add_engine(request("warmup-a", 20, 1, true));
        j.add_engine(request("warmup-b", 21, 2, true));
        j.add_engine(request("a1", 40, 1, false));
        j.add_engine(request("a2", 41, 1, false));
        j.add_engine(request("b1", 42, 2, false));
        j.add_engine(request("b2", 43, 2, false));
        j.add_api(api(Some("a1"), Some(200), 10, 200), 0);
        let done = j.advance(200 + GRACE_NS);
        let ids: Vec<&str> = done[0].engine.iter().map(|e| e.id).collect();
        assert_eq!(ids, ["a1", "a2", "warmup-a"]);
        let left: Vec<&str> = j.finish().iter().map(|o| o.engine[0].id).collect();
        assert_eq!(left, ["old-warmup", "warmup-b", "b1", "b2"]);
    }
}
