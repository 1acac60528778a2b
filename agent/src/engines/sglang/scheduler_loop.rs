//! An SGLang scheduler's loop, iteration by iteration, as its mailbox polls show it, and what
//! that tells of one request: the decode steps no output marks (a request not streamed), the
//! wait between its prefill and its first decode batch, and the batches it was scheduled into.
//!
//! The loop (scheduler.py `event_loop_overlap` / `event_loop_normal`, 0.5.x), per iteration:
//! 1. receive: a non-blocking receive on the input socket, then on the RPC socket, until each
//!    finds nothing. libzmq checks a socket's mailbox with `poll(fd, 1, 0)` whenever a receive
//!    finds no message, so every iteration leaves a poll of the input socket's mailbox and then
//!    one of the RPC socket's (nothing else arrives there). That second poll is the iteration's
//!    marker: the loop schedules its next batch right after it (SGLang's `schedule` event).
//! 2. run the batch;
//! 3. process one batch's result — the previous iteration's batch in the overlap loop (the
//!    default), this iteration's with `--disable-overlap-schedule`: each request's step ends
//!    (SGLang's `decode_loop` end, prefill end), then the outputs are sent, then a
//!    `Prefill batch` line is logged for a prefill batch, a `Decode batch` report every
//!    `--decode-log-interval` decode batches.
//!
//! So an iteration's result was processed just before its output send, its statistics line,
//! or the next iteration's first poll, whichever came first (its "end"). A request decodes one
//! token per decode batch it is in, and while it runs every batch holds it but the prefill
//! batches of newer requests, whose results the `Prefill batch` lines mark. Its decode steps
//! are therefore the iterations between its prefill's end (the scheduler's own time stats) and
//! its final output that processed no prefill; when their number is not its completion tokens
//! less one (a statistics line the capture missed, logging above `info`, a retraction), none is
//! placed and the request is counted as such.
use std::collections::{HashMap, VecDeque};

use crate::decode::flows::MailboxPoll;
use crate::engines::common::votes::elected;

/// Iterations kept per scheduler, the oldest going first (minutes at hundreds a second): a
/// request older than that has its steps counted as not placed.
const MAX_ITERATIONS: usize = 65_536;
/// Output sends and statistics lines kept per scheduler.
const MAX_MARKS: usize = 65_536;
/// Consecutive polls of the pair of mailboxes needed before it is taken for the loop's
/// receive phase.
const VOTES_NEEDED: u32 = 8;
/// Two polls further apart than this are not one receive phase.
const RECEIVE_GAP_NS: u64 = 1_000_000;
/// Receive checks held back while the pair is not known (a few iterations' worth).
const MAX_HELD_BACK: usize = 256;

/// libzmq's check of one mailbox (no wait), as a non-blocking receive makes it.
fn is_receive_check(poll: &MailboxPoll) -> bool {
    poll.nfds == 1 && poll.timeout_ms == 0
}

/// One loop iteration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Iteration {
    /// Its first poll (the receive phase's start): the previous iteration's work ended before.
    start_ns: u64,
    /// The RPC mailbox's poll that ended its receive phase: the batch is scheduled after it.
    marker_ns: u64,
}

/// What a scheduler wrote in one of its statistics lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatsLine {
    /// `Prefill batch, #new-seq: N`: a prefill batch's result, and how many requests it had.
    Prefill { requests: u64 },
    /// `Decode batch, #running-req: N`: a decode batch's result, and its size.
    Decode { requests: u64 },
}

/// One scheduler's polls and marks.
#[derive(Debug, Default)]
struct SchedulerLoop {
    /// Votes for (input mailbox, RPC mailbox): a poll of one found nothing and the next poll
    /// of the main thread, soon after, was of the other.
    votes: HashMap<(u32, u32), u32>,
    pair: Option<(u32, u32)>,
    /// The main thread's previous poll: fd, return value, return time.
    previous: Option<(u32, i64, u64)>,
    /// The first input-mailbox poll since the latest marker.
    receiving_since: Option<u64>,
    /// Receive checks before the pair was learnt, marked once it is.
    held_back: VecDeque<MailboxPoll>,
    iterations: VecDeque<Iteration>,
    /// Capture times of the scheduler's output sends (first byte), in order.
    outputs: VecDeque<u64>,
    /// When the loop's thread handed a message to libzmq (the `zmq_msg_send` probe) and on
    /// which socket: its sends' own instants, known from the first send on (the capture's
    /// matching of them to the socket writes needs a few sends to learn).
    hand_overs: VecDeque<(u64, u64)>,
    /// Hand-overs per socket: the outputs' socket is the one the loop sends on most (the
    /// others carry the rare replies to the main process).
    sends_per_socket: HashMap<u64, u64>,
    lines: VecDeque<(u64, StatsLine)>,
    /// Hand-overs of a PD decode server's prebuilt outputs (the prefill node's tokens, put
    /// out before the iteration runs its batch): they mark no result.
    prebuilt: VecDeque<u64>,
}

/// Add `value` in its place by `key` (records of one process mostly arrive in order, but a
/// record of another kind can come a drain late), the oldest going first beyond `max`.
fn insert_bounded<T>(list: &mut VecDeque<T>, value: T, max: usize, key: impl Fn(&T) -> u64) {
    if list.len() >= max {
        list.pop_front();
    }
    let at = list.partition_point(|v| key(v) <= key(&value));
    list.insert(at, value);
}

impl SchedulerLoop {
    /// One poll of the main thread; how many iterations it marked (more than one when it
    /// taught the pair: the receive phases held back until then are marked too).
    fn poll(&mut self, poll: &MailboxPoll) -> u64 {
        let knew = self.pair.is_some();
        self.learn(poll);
        if self.pair.is_none() {
            if is_receive_check(poll) {
                if self.held_back.len() >= MAX_HELD_BACK {
                    self.held_back.pop_front();
                }
                self.held_back.push_back(*poll);
            }
            return 0;
        }
        let mut marked = 0;
        if !knew {
            for held in std::mem::take(&mut self.held_back) {
                marked += u64::from(self.mark(&held));
            }
        }
        marked + u64::from(self.mark(poll))
    }

    /// Votes for the pair of mailboxes.
    fn learn(&mut self, poll: &MailboxPoll) {
        if !is_receive_check(poll) {
            // The idle sleep (`--sleep-on-idle`) waits on both mailboxes at once, input
            // first: once the pair was seen in a receive phase too, that is certain, without
            // waiting for more votes.
            if let Some(second) = poll.second_fd
                && poll.nfds == 2
                && poll.timeout_ms > 0
                && self.pair.is_none()
                && self.votes.contains_key(&(poll.fd, second))
            {
                self.pair = Some((poll.fd, second));
            }
            self.previous = None;
            return;
        }
        if let Some((fd, ret, ns)) = self.previous
            && ret == 0
            && fd != poll.fd
            && poll.enter_ns.saturating_sub(ns) < RECEIVE_GAP_NS
            && elected(&mut self.votes, self.pair, (fd, poll.fd), VOTES_NEEDED)
        {
            self.pair = Some((fd, poll.fd));
        }
        self.previous = Some((poll.fd, poll.ret, poll.ns));
    }

    /// Mark the iteration a receive check of the learnt pair begins or ends; true when it
    /// ended one's receive phase.
    fn mark(&mut self, poll: &MailboxPoll) -> bool {
        let Some((input, rpc)) = self.pair.filter(|_| is_receive_check(poll)) else {
            return false;
        };
        if poll.fd == input {
            self.receiving_since.get_or_insert(poll.enter_ns);
        } else if poll.fd == rpc {
            let iteration = Iteration {
                start_ns: self.receiving_since.take().unwrap_or(poll.enter_ns),
                marker_ns: poll.ns,
            };
            insert_bounded(&mut self.iterations, iteration, MAX_ITERATIONS, |i| {
                i.marker_ns
            });
            return true;
        }
        false
    }

    /// The index of the iteration whose span (from its marker to the next one's) holds `ns`.
    fn iteration_of(&self, ns: u64) -> Option<usize> {
        let after = self.iterations.partition_point(|i| i.marker_ns <= ns);
        after.checked_sub(1)
    }

    /// The bounds of iteration `j`'s work after its marker: up to the next iteration's first
    /// poll, or open while that has not come.
    fn bounds(&self, j: usize) -> Option<(u64, Option<u64>)> {
        let from = self.iterations.get(j)?.marker_ns;
        Some((from, self.iterations.get(j + 1).map(|i| i.start_ns)))
    }

    /// When iteration `j` processed its result (see the module notes), with `handed_over`
    /// turning an output's capture time into the scheduler's hand-over instant (never later);
    /// None while the next iteration has not begun and nothing marked it.
    fn end_of(&self, j: usize, handed_over: &dyn Fn(u64) -> u64) -> Option<u64> {
        let (from, next) = self.bounds(j)?;
        let within = |ns: u64| ns > from && next.is_none_or(|n| ns < n);
        let first = self.outputs.partition_point(|&ns| ns <= from);
        let first_output = self
            .outputs
            .range(first..)
            .map(|&ns| handed_over(ns))
            .take_while(|&ns| next.is_none_or(|n| ns < n))
            .find(|&ns| within(ns));
        let output_socket = self.output_socket();
        let first = self.hand_overs.partition_point(|&(ns, _)| ns <= from);
        let first_hand_over = self
            .hand_overs
            .range(first..)
            .take_while(|&&(ns, _)| within(ns))
            .filter(|&&(ns, _)| self.prebuilt.binary_search(&ns).is_err())
            .find(|&&(_, socket)| Some(socket) == output_socket)
            .map(|&(ns, _)| ns);
        [
            first_output,
            first_hand_over,
            self.line_at(from, next).map(|(ns, _)| ns),
            next,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The socket the loop sends its outputs on.
    fn output_socket(&self) -> Option<u64> {
        self.sends_per_socket
            .iter()
            .max_by_key(|&(_, n)| *n)
            .map(|(&socket, _)| socket)
    }

    /// The loop thread's latest hand-over of an output at or before `ns`.
    fn hand_over_before(&self, ns: u64) -> Option<u64> {
        let output_socket = self.output_socket()?;
        let after = self.hand_overs.partition_point(|&(h, _)| h <= ns);
        self.hand_overs
            .range(..after)
            .rev()
            .find(|&&(_, socket)| socket == output_socket)
            .map(|&(h, _)| h)
    }

    /// The latest prebuilt output handed over in iteration `j`.
    fn prebuilt_within(&self, j: usize) -> Option<u64> {
        let (from, next) = self.bounds(j)?;
        let end = next.map_or(self.prebuilt.len(), |n| {
            self.prebuilt.partition_point(|&ns| ns < n)
        });
        self.prebuilt
            .range(..end)
            .next_back()
            .filter(|&&ns| ns > from)
            .copied()
    }

    /// The first statistics line written in (`from`, `next`).
    fn line_at(&self, from: u64, next: Option<u64>) -> Option<(u64, StatsLine)> {
        let first = self.lines.partition_point(|(ns, _)| *ns <= from);
        self.lines
            .get(first)
            .filter(|(ns, _)| next.is_none_or(|n| *ns < n))
            .copied()
    }

    /// The statistics line iteration `j` wrote, if any.
    fn line_of(&self, j: usize) -> Option<StatsLine> {
        let (from, next) = self.bounds(j)?;
        self.line_at(from, next).map(|(_, line)| line)
    }
}

/// A batch a request was scheduled into.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scheduled {
    /// Capture time (CLOCK_MONOTONIC ns): the prefill batch's forward entry (SGLang's own
    /// stamp), a decode batch's loop marker.
    pub ns: u64,
    /// infertrace's identifier of the batch: the same for every request in it.
    pub bid: String,
    pub forward_mode: &'static str,
    /// The batch's size, where the scheduler's statistics line for that batch printed it.
    pub batch_size: Option<u64>,
}

/// What the loop shows of one request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LoopView {
    /// Capture times each prefill chunk but the last was done (SGLang's `chunked_prefill`
    /// ends; the last one ends with the prefill); empty when the prompt took one batch.
    pub chunk_ends: Vec<u64>,
    /// Capture times each decode step's result was processed (SGLang's `decode_loop` ends),
    /// the last being the final output.
    pub decode_ends: Vec<u64>,
    /// Where its first decode step began, as SGLang reckons it (see `request_view`).
    pub first_loop_start: Option<u64>,
    /// When its first decode batch was scheduled, if that was after its prefill ended (SGLang's
    /// `decode_waiting` end, where its `decode_forward` begins).
    pub decode_waiting_end: Option<u64>,
    pub scheduled: Vec<Scheduled>,
}

/// One request as the loop needs it: capture times (CLOCK_MONOTONIC ns).
#[derive(Clone, Copy, Debug)]
pub struct RequestSteps {
    pub scheduler: u32,
    pub forward_entry_ns: u64,
    /// Its prefill's end; on a PD decode server (`pd_decode`), its forward entry.
    pub prefill_end_ns: u64,
    /// The scheduler's hand-over of the request's final output.
    pub final_output_ns: u64,
    pub completion_tokens: u64,
    /// It ended at its token limit (the loop knew the step before).
    pub finishes_by_length: bool,
    /// The scheduler runs the overlap loop (its default).
    pub overlap: bool,
    /// A PD decode server's request: the prefill node computed its first token, which the
    /// decode server's loop puts out as a prebuilt batch in the iteration that stamped its
    /// forward entry (`get_next_disagg_decode_batch_to_run`), then merges it into the decode
    /// batch it schedules in that same iteration.
    pub pd_decode: bool,
}

/// Every scheduler's loop.
#[derive(Debug, Default)]
pub struct SchedulerLoops {
    loops: HashMap<u32, SchedulerLoop>,
}

/// infertrace's batch identifier: 8 hex digits of the scheduler and the iteration's marker.
fn batch_id(scheduler: u32, marker_ns: u64) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in scheduler
        .to_le_bytes()
        .into_iter()
        .chain(marker_ns.to_le_bytes())
    {
        h = (h ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{:08x}", (h ^ (h >> 32)) as u32)
}

impl SchedulerLoops {
    /// A poll by scheduler `poll.tgid` (only its main thread runs the loop); how many
    /// iterations it marked.
    pub fn poll(&mut self, poll: &MailboxPoll) -> u64 {
        if poll.tid != poll.tgid {
            return 0;
        }
        self.loops.entry(poll.tgid).or_default().poll(poll)
    }

    /// Scheduler `scheduler` sent an output (its first byte captured at `ns`).
    pub fn output_sent(&mut self, scheduler: u32, ns: u64) {
        let outputs = &mut self.loops.entry(scheduler).or_default().outputs;
        insert_bounded(outputs, ns, MAX_MARKS, |&ns| ns);
    }

    /// The main thread of scheduler `scheduler` handed a message to libzmq `socket` at `ns`.
    pub fn handed_over(&mut self, scheduler: u32, socket: u64, ns: u64) {
        let l = self.loops.entry(scheduler).or_default();
        *l.sends_per_socket.entry(socket).or_default() += 1;
        insert_bounded(&mut l.hand_overs, (ns, socket), MAX_MARKS, |&(ns, _)| ns);
    }

    /// When the loop's thread handed over the output whose first byte its I/O thread wrote
    /// at `written_ns`: its latest hand-over before that write.
    pub fn output_handed_over(&self, scheduler: u32, written_ns: u64) -> Option<u64> {
        self.loops.get(&scheduler)?.hand_over_before(written_ns)
    }

    /// A PD decode server's prebuilt output, handed over at `handed_over_ns` (see
    /// `RequestSteps::pd_decode`): not the end of the iteration's result, as other outputs.
    pub fn prebuilt_output(&mut self, scheduler: u32, handed_over_ns: u64) {
        let prebuilt = &mut self.loops.entry(scheduler).or_default().prebuilt;
        insert_bounded(prebuilt, handed_over_ns, MAX_MARKS, |&ns| ns);
    }

    /// Whether instants `a` and `b` (capture times) lie in one iteration of scheduler
    /// `scheduler`'s loop.
    pub fn same_iteration(&self, scheduler: u32, a: u64, b: u64) -> bool {
        self.loops.get(&scheduler).is_some_and(|l| {
            let (a, b) = (l.iteration_of(a), l.iteration_of(b));
            a.is_some() && a == b
        })
    }

    /// Scheduler `scheduler` wrote a statistics line at `ns`.
    pub fn logged(&mut self, scheduler: u32, ns: u64, line: StatsLine) {
        let lines = &mut self.loops.entry(scheduler).or_default().lines;
        insert_bounded(lines, (ns, line), MAX_MARKS, |(ns, _)| *ns);
    }

    /// What the loop of `r.scheduler` shows of one finished request; None when its steps
    /// cannot all be placed.
    pub fn view(&self, r: &RequestSteps, handed_over: &dyn Fn(u64) -> u64) -> Option<LoopView> {
        let l = self.loops.get(&r.scheduler)?;
        request_view(l, r, handed_over)
    }
}

fn request_view(
    l: &SchedulerLoop,
    r: &RequestSteps,
    handed_over: &dyn Fn(u64) -> u64,
) -> Option<LoopView> {
    let (Some(prefill_iteration), Some(final_iteration)) = (
        l.iteration_of(r.prefill_end_ns),
        l.iteration_of(r.final_output_ns),
    ) else {
        tracing::debug!(
            "scheduler {}: prefill end or final output before its loop was learnt",
            r.scheduler
        );
        return None;
    };
    // The iteration that scheduled the batch whose result iteration `j` processed.
    let batch_of = |j: usize| if r.overlap { j.checked_sub(1) } else { Some(j) };
    // Its first decode result: the iteration after its prefill's result, or on a decode
    // server the one that processed the decode batch its prebuilt iteration scheduled.
    let first_step = if r.pd_decode && !r.overlap {
        prefill_iteration
    } else {
        prefill_iteration + 1
    };
    let decode: Vec<usize> = (first_step..=final_iteration)
        .filter(|&j| !matches!(l.line_of(j), Some(StatsLine::Prefill { .. })))
        .collect();
    if decode.len() as u64 + 1 != r.completion_tokens.max(1) {
        tracing::debug!(
            "scheduler {}: {} decode iterations for {} tokens",
            r.scheduler,
            decode.len(),
            r.completion_tokens
        );
        // The window's first and last iterations.
        let (first, last) = (prefill_iteration.saturating_sub(3), final_iteration + 1);
        let shown = (first..=last).filter(|&j| j < first + 20 || j + 20 > last);
        for j in shown {
            tracing::debug!(
                "  iteration {j}: {:?} line {:?} end {:?} (prefill end {}, final output {})",
                l.iterations.get(j),
                l.line_of(j),
                l.end_of(j, handed_over),
                r.prefill_end_ns,
                r.final_output_ns
            );
        }
        return None;
    }
    let Some(decode_ends) = decode
        .iter()
        .map(|&j| l.end_of(j, handed_over))
        .collect::<Option<Vec<u64>>>()
    else {
        tracing::debug!(
            "scheduler {}: a decode step's end not seen yet",
            r.scheduler
        );
        return None;
    };
    let marker = |j: usize| l.iterations.get(j).map(|i| i.marker_ns);
    // A prompt prefilled in chunks: each chunk is a prefill batch of its own, whose result
    // an iteration before the last one's processed (SGLang's `chunked_prefill` ends).
    let forward_iteration = l.iteration_of(r.forward_entry_ns)?;
    let first_result = if r.overlap {
        forward_iteration + 1
    } else {
        forward_iteration
    };
    // A decode server runs no prefill batch: no chunk, no prefill `schedule` event.
    let (prefill_results, chunk_iterations) = if r.pd_decode {
        (0..0, 0..0)
    } else {
        (
            first_result..prefill_iteration + 1,
            first_result..prefill_iteration,
        )
    };
    if chunk_iterations
        .clone()
        .any(|j| !matches!(l.line_of(j), Some(StatsLine::Prefill { .. })))
    {
        tracing::debug!(
            "scheduler {}: a prefill chunk's result not marked",
            r.scheduler
        );
        return None;
    }
    let chunk_ends = chunk_iterations
        .map(|j| l.end_of(j, handed_over))
        .collect::<Option<Vec<u64>>>()?;
    let size_in = |j: usize, prefill: bool| match (l.line_of(j), prefill) {
        (Some(StatsLine::Prefill { requests }), true)
        | (Some(StatsLine::Decode { requests }), false) => Some(requests),
        _ => None,
    };
    // The decode batches that held the request: (scheduling iteration, result iteration).
    let mut batches: Vec<(usize, usize)> = decode
        .iter()
        .filter_map(|&j| Some((batch_of(j)?, j)))
        .collect();
    // The overlap loop schedules the next batch before it learns the request finished, and
    // that batch still holds it unless the loop knew its next token was its last
    // (`_reqs_finishing_inflight`: a length limit; the unified loop only, a decode server's
    // loop leaves it off) or it was a prefill batch (the next iteration's line says, once
    // that iteration is over).
    let known_last = r.finishes_by_length && !r.pd_decode;
    if r.overlap && !known_last && l.end_of(final_iteration + 1, handed_over).is_some() {
        let next = final_iteration + 1;
        if !matches!(l.line_of(next), Some(StatsLine::Prefill { .. })) {
            batches.push((final_iteration, next));
        }
    }
    let first_batch = batches.first().and_then(|&(b, _)| marker(b));
    // A decode server's wait is its queue's (SGLang's own stamps, on the wire).
    let decode_waiting_end = first_batch.filter(|&ns| ns > r.prefill_end_ns && !r.pd_decode);
    // SGLang starts the first decode step at the latest of the prefill's end and the latest
    // decode batch holding the request scheduled before that step ended (req_time_stats.py
    // `set_last_decode_finish_time`), or where its decode wait ended; on a decode server, at
    // the end of its prebuilt batch, a moment after the forward entry that batch stamped.
    let first_loop_start = match (decode_waiting_end, decode_ends.first()) {
        _ if r.pd_decode => Some(r.forward_entry_ns),
        (Some(waited), _) => Some(waited),
        (None, Some(&first_end)) => batches
            .iter()
            .filter_map(|&(b, _)| marker(b))
            .filter(|&ns| ns < first_end)
            .max()
            .map(|ns| ns.max(r.prefill_end_ns)),
        (None, None) => None,
    };

    // One prefill batch per chunk: the first at the request's forward entry (SGLang's own
    // stamp), the others at the markers of the iterations that scheduled them.
    let mut scheduled = Vec::with_capacity(batches.len() + chunk_ends.len() + 1);
    for j in prefill_results {
        let batch = if r.overlap { j - 1 } else { j };
        let bid = batch_id(r.scheduler, marker(batch)?);
        let ns = if batch == forward_iteration {
            r.forward_entry_ns
        } else {
            marker(batch)?
        };
        scheduled.push(Scheduled {
            ns,
            bid,
            forward_mode: "prefill",
            batch_size: size_in(j, true),
        });
    }
    for (batch, result) in batches {
        let at_marker = marker(batch)?;
        // A decode server schedules the batch that first holds the request after it put out
        // its prebuilt batch, which stamped the forward entry (and sent the outputs of its
        // streamed requests).
        let ns = if r.pd_decode && batch == prefill_iteration {
            l.prebuilt_within(batch)
                .map_or(r.forward_entry_ns, |ns| ns.max(r.forward_entry_ns))
        } else {
            at_marker
        };
        scheduled.push(Scheduled {
            ns,
            bid: batch_id(r.scheduler, at_marker),
            forward_mode: "decode",
            batch_size: size_in(result, false),
        });
    }
    Some(LoopView {
        chunk_ends,
        decode_ends,
        first_loop_start,
        decode_waiting_end,
        scheduled,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCHEDULER: u32 = 50;
    const INPUT: u32 = 68;
    const RPC: u32 = 69;
    const MS: u64 = 1_000_000;
    const US: u64 = 1_000;

    fn poll(fd: u32, ns: u64) -> MailboxPoll {
        MailboxPoll {
            tgid: SCHEDULER,
            tid: SCHEDULER,
            fd,
            nfds: 1,
            second_fd: None,
            timeout_ms: 0,
            enter_ns: ns - US,
            ns,
            ret: 0,
        }
    }

    /// Iterations every 4 ms: the input mailbox polled at +0, the RPC one at +50 µs.
    fn loops_with(iterations: u64) -> SchedulerLoops {
        let mut loops = SchedulerLoops::default();
        for k in 0..iterations {
            let t = 100 * MS + k * 4 * MS;
            loops.poll(&poll(INPUT, t));
            loops.poll(&poll(RPC, t + 50 * US));
        }
        loops
    }

    /// The iteration `k`'s marker.
    fn marker(k: u64) -> u64 {
        100 * MS + k * 4 * MS + 50 * US
    }

    fn same(ns: u64) -> u64 {
        ns
    }

    /// A request scheduled for prefill in iteration 10 (0.2 ms after its marker) whose prefill
    /// result iteration 11 processed (overlap), with its final output and tokens.
    fn request(final_output_ns: u64, completion_tokens: u64) -> RequestSteps {
        RequestSteps {
            scheduler: SCHEDULER,
            forward_entry_ns: marker(10) + 200 * US,
            prefill_end_ns: marker(11) + 3 * MS,
            final_output_ns,
            completion_tokens,
            finishes_by_length: false,
            overlap: true,
            pd_decode: false,
        }
    }

    #[test]
    fn the_pair_of_mailboxes_is_learnt_and_each_iteration_marked() {
        let loops = loops_with(20);
        let l = &loops.loops[&SCHEDULER];
        assert_eq!(l.pair, Some((INPUT, RPC)));
        // Learnt at its 8th vote, in the 8th iteration; the iterations before are marked too.
        assert_eq!(l.iterations.len(), 20);
        assert_eq!(l.iterations[0].marker_ns, marker(0));
        assert_eq!(l.iterations[0].start_ns, 100 * MS - US);
        assert_eq!(l.iterations[1].start_ns, 100 * MS + 4 * MS - US);
    }

    #[test]
    fn a_request_not_streamed_gets_one_step_per_iteration_after_its_prefill() {
        let mut loops = loops_with(30);
        // Prefilled in iteration 10 (scheduled at its marker + 0.2 ms), its result processed
        // in iteration 11 (overlap), 5 tokens: 4 decode steps in iterations 12..=15, the last
        // one's output sent at 3 ms into iteration 15.
        let final_output = marker(15) + 3 * MS;
        loops.output_sent(SCHEDULER, final_output);
        let r = request(final_output, 5);
        let view = loops.view(&r, &same).expect("placed");
        // Ends: the next iteration's first poll, the last one its output.
        let next_start = |k: u64| 100 * MS + k * 4 * MS - US;
        assert_eq!(
            view.decode_ends,
            vec![next_start(13), next_start(14), next_start(15), final_output]
        );
        // Its first decode batch was scheduled in iteration 11, before its prefill ended; as
        // SGLang reckons it, its first step began with the next batch holding it (iteration 12).
        assert_eq!(view.decode_waiting_end, None);
        assert_eq!(view.first_loop_start, Some(marker(12)));
        let modes: Vec<(&str, u64)> = view
            .scheduled
            .iter()
            .map(|s| (s.forward_mode, s.ns))
            .collect();
        assert_eq!(
            modes,
            vec![
                ("prefill", r.forward_entry_ns),
                ("decode", marker(11)),
                ("decode", marker(12)),
                ("decode", marker(13)),
                ("decode", marker(14)),
                // The batch scheduled before the loop learnt it had finished.
                ("decode", marker(15)),
            ]
        );
        // A request that ends at its token limit is left out of that batch.
        let by_length = RequestSteps {
            finishes_by_length: true,
            ..r
        };
        let view = loops.view(&by_length, &same).expect("placed");
        assert_eq!(view.scheduled.last().map(|s| s.ns), Some(marker(14)));
    }

    #[test]
    fn a_newer_prefill_in_between_delays_the_first_decode_batch() {
        let mut loops = loops_with(30);
        // Iteration 12 processed another request's prefill (its line), so this request's
        // first decode batch was iteration 12's, scheduled after its prefill ended in 11.
        loops.logged(
            SCHEDULER,
            marker(12) + 3 * MS,
            StatsLine::Prefill { requests: 2 },
        );
        loops.logged(
            SCHEDULER,
            marker(11) + 3 * MS + 10 * US,
            StatsLine::Prefill { requests: 1 },
        );
        loops.logged(
            SCHEDULER,
            marker(14) + 3 * MS,
            StatsLine::Decode { requests: 3 },
        );
        let final_output = marker(14) + 2 * MS;
        loops.output_sent(SCHEDULER, final_output);
        let r = request(final_output, 3);
        let view = loops.view(&r, &same).expect("placed");
        assert_eq!(view.decode_waiting_end, Some(marker(12)));
        assert_eq!(view.decode_ends.len(), 2);
        assert_eq!(view.scheduled[0].batch_size, Some(1));
        // The decode batch of iteration 13, whose result iteration 14 reported.
        let sizes: Vec<Option<u64>> = view.scheduled.iter().map(|s| s.batch_size).collect();
        assert_eq!(sizes, vec![Some(1), None, Some(3), None]);
        // A request with one token more than the loop shows steps for is not placed.
        let longer = RequestSteps {
            completion_tokens: 4,
            ..r
        };
        assert_eq!(loops.view(&longer, &same), None);
    }

    #[test]
    fn an_output_written_after_the_next_iteration_began_belongs_to_its_hand_over() {
        let mut loops = loops_with(30);
        const OUTPUTS: u64 = 0x7f00;
        const TO_MAIN: u64 = 0x7f80;
        // The final output was handed over 3 ms into iteration 14 and written by the I/O
        // thread only after iteration 15 began; a reply to the main process went in between.
        let handed_over = marker(14) + 3 * MS;
        for k in 0..5 {
            loops.handed_over(SCHEDULER, OUTPUTS, marker(k) + MS);
        }
        loops.handed_over(SCHEDULER, OUTPUTS, handed_over);
        loops.handed_over(SCHEDULER, TO_MAIN, marker(15) + 10 * US);
        let written = marker(15) + 100 * US;
        loops.output_sent(SCHEDULER, written);
        assert_eq!(
            loops.output_handed_over(SCHEDULER, written),
            Some(handed_over)
        );
        let r = RequestSteps {
            finishes_by_length: true,
            ..request(handed_over, 4)
        };
        let view = loops.view(&r, &same).expect("placed");
        assert_eq!(view.decode_ends.last(), Some(&handed_over));
    }

    #[test]
    fn a_prompt_prefilled_in_chunks_has_each_chunk_end() {
        let mut loops = loops_with(30);
        // Three chunks, scheduled in iterations 10, 11, 12; their results in 11, 12, 13.
        for k in 11..=13 {
            let requests = if k == 13 { 2 } else { 1 };
            loops.logged(
                SCHEDULER,
                marker(k) + 3 * MS,
                StatsLine::Prefill { requests },
            );
        }
        let final_output = marker(15) + 2 * MS;
        loops.output_sent(SCHEDULER, final_output);
        let r = RequestSteps {
            scheduler: SCHEDULER,
            forward_entry_ns: marker(10) + 200 * US,
            prefill_end_ns: marker(13) + 2 * MS,
            final_output_ns: final_output,
            completion_tokens: 3,
            finishes_by_length: true,
            overlap: true,
            pd_decode: false,
        };
        let view = loops.view(&r, &same).expect("placed");
        assert_eq!(
            view.chunk_ends,
            vec![marker(11) + 3 * MS, marker(12) + 3 * MS]
        );
        let prefills: Vec<(u64, Option<u64>)> = view
            .scheduled
            .iter()
            .filter(|s| s.forward_mode == "prefill")
            .map(|s| (s.ns, s.batch_size))
            .collect();
        assert_eq!(
            prefills,
            vec![
                (r.forward_entry_ns, Some(1)),
                (marker(11), Some(1)),
                (marker(12), Some(2))
            ]
        );
        // A chunk whose result no line marks: not placed.
        let earlier = RequestSteps {
            forward_entry_ns: marker(8),
            ..r
        };
        assert_eq!(loops.view(&earlier, &same), None);
    }

    #[test]
    fn a_decode_servers_request_steps_from_the_batch_its_prebuilt_iteration_scheduled() {
        let mut loops = loops_with(30);
        // The prefill node's token put out in iteration 10 (forward entry 0.2 ms after its
        // marker), the decode batch that iteration scheduled processed in 11 (overlap); 4
        // tokens: decode steps in 11, 12 and 13.
        let final_output = marker(13) + 3 * MS;
        loops.output_sent(SCHEDULER, final_output);
        let forward_entry = marker(10) + 200 * US;
        let r = RequestSteps {
            prefill_end_ns: forward_entry,
            pd_decode: true,
            ..request(final_output, 4)
        };
        let view = loops.view(&r, &same).expect("placed");
        let next_start = |k: u64| 100 * MS + k * 4 * MS - US;
        assert_eq!(
            view.decode_ends,
            vec![next_start(12), next_start(13), final_output]
        );
        assert_eq!(view.first_loop_start, Some(forward_entry));
        assert_eq!(view.decode_waiting_end, None);
        assert!(view.chunk_ends.is_empty());
        let modes: Vec<(&str, u64)> = view
            .scheduled
            .iter()
            .map(|s| (s.forward_mode, s.ns))
            .collect();
        // The first batch scheduled after the prebuilt batch that stamped the forward entry;
        // the last one before the loop learnt the request had finished, even at its length
        // limit (a decode server's loop does not skip it).
        let decode_at = |k: u64| ("decode", marker(k));
        assert_eq!(
            modes,
            vec![
                ("decode", forward_entry),
                decode_at(11),
                decode_at(12),
                decode_at(13)
            ]
        );
        let by_length = RequestSteps {
            finishes_by_length: true,
            ..r
        };
        assert_eq!(loops.view(&by_length, &same), Some(view.clone()));
        // Without the overlap, iteration 10 runs and processes that batch itself: the same
        // tokens end an iteration earlier, and no batch is scheduled after the last.
        let earlier_output = marker(12) + 3 * MS;
        loops.output_sent(SCHEDULER, earlier_output);
        let not_overlapped = RequestSteps {
            overlap: false,
            final_output_ns: earlier_output,
            ..r
        };
        let view = loops.view(&not_overlapped, &same).expect("placed");
        assert_eq!(
            view.decode_ends,
            vec![next_start(11), next_start(12), earlier_output]
        );
        assert_eq!(view.scheduled.len(), 3);
        // One token more than the loop shows steps for: not placed.
        let longer = RequestSteps {
            completion_tokens: 5,
            ..r
        };
        assert_eq!(loops.view(&longer, &same), None);
        // Another request's prebuilt output, put out in iteration 11 before it ran its batch,
        // does not end that iteration's result; an output of a result does.
        const OUTPUTS: u64 = 0x7f00;
        for k in 0..5 {
            loops.handed_over(SCHEDULER, OUTPUTS, marker(k) + MS);
        }
        assert!(loops.same_iteration(SCHEDULER, marker(11) + 10 * US, marker(11) + 90 * US));
        assert!(!loops.same_iteration(SCHEDULER, marker(11), marker(12)));
        loops.handed_over(SCHEDULER, OUTPUTS, marker(11) + 100 * US);
        loops.prebuilt_output(SCHEDULER, marker(11) + 100 * US);
        let view = loops.view(&r, &same).expect("placed");
        assert_eq!(view.decode_ends[0], next_start(12));
        loops.handed_over(SCHEDULER, OUTPUTS, marker(11) + 2 * MS);
        let view = loops.view(&r, &same).expect("placed");
        assert_eq!(view.decode_ends[0], marker(11) + 2 * MS);
        // Its own prebuilt output, after its forward entry: its first batch was scheduled
        // after that.
        loops.prebuilt_output(SCHEDULER, forward_entry + 100 * US);
        let view = loops.view(&r, &same).expect("placed");
        assert_eq!(view.scheduled[0].ns, forward_entry + 100 * US);
    }

    #[test]
    fn the_idle_sleep_and_other_threads_mark_nothing() {
        let mut loops = loops_with(20);
        let mut sleep = poll(INPUT, 200 * MS);
        sleep.nfds = 2;
        sleep.second_fd = Some(RPC);
        sleep.timeout_ms = 1000;
        loops.poll(&sleep);
        let mut other_thread = poll(RPC, 201 * MS);
        other_thread.tid = SCHEDULER + 1;
        loops.poll(&other_thread);
        assert_eq!(loops.loops[&SCHEDULER].iterations.len(), 20);
    }

    #[test]
    fn an_idle_sleep_on_both_mailboxes_names_the_pair_at_once() {
        let mut loops = SchedulerLoops::default();
        loops.poll(&poll(INPUT, 100 * MS));
        loops.poll(&poll(RPC, 100 * MS + 50 * US));
        let mut sleep = poll(INPUT, 100 * MS + 100 * US);
        sleep.nfds = 2;
        sleep.second_fd = Some(RPC);
        sleep.timeout_ms = 1000;
        loops.poll(&sleep);
        assert_eq!(loops.loops[&SCHEDULER].pair, Some((INPUT, RPC)));
        assert_eq!(loops.poll(&poll(RPC, 1100 * MS)), 1);
    }

    #[test]
    fn batch_ids_are_eight_hex_digits_shared_by_one_batch() {
        assert_eq!(batch_id(1, 2), batch_id(1, 2));
        assert_ne!(batch_id(1, 2), batch_id(1, 3));
        assert_eq!(batch_id(7, 123_456).len(), 8);
    }
}
