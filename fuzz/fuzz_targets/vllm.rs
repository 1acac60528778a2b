//! Fuzzes the vLLM msgpack decoder: any frames, as an input (frontend -> engine) message and as
//! an output (engine -> frontend) message, with each schema table to start from and with one
//! decoder that keeps switching tables, must neither panic nor break its invariants. Each
//! frame is also read by the agent's msgpack reader, by rmpv's and in place (`Lazy`, what the
//! decoder uses): the same value or all an error.
//!
//! Input layout: a mode byte, then frames as `[length byte][bytes]` (length 0xFF: the rest of
//! the input is the last frame). Mode bit 0 set: a request type frame `[(mode >> 1) % 8]` goes
//! before the frames for `input` (types 6 and 7 are not vLLM's).
#![no_main]

use infertrace::{
    decode::msgpack,
    engines::vllm::wire::{InputMessage, SCHEMAS, VllmDecoder},
};
use libfuzzer_sys::fuzz_target;

fn split(mut rest: &[u8]) -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    while let Some((&len, tail)) = rest.split_first() {
        let len = if len == 0xFF {
            tail.len()
        } else {
            usize::from(len).min(tail.len())
        };
        let (frame, tail) = tail.split_at(len);
        frames.push(frame.to_vec());
        rest = tail;
    }
    frames
}

fn check(decoder: &mut VllmDecoder, input: &[Vec<u8>], output: &[Vec<u8>]) {
    if let Some(Ok(InputMessage::Add(request))) = decoder.input(input) {
        // A request's prompt is a list in the body frame: at most one token per byte.
        let body = input.get(1).map_or(0, Vec::len) as u64;
        assert!(
            request.prompt_tokens.unwrap_or(0) <= body,
            "more tokens than bytes"
        );
    }
    if let Some(Ok(outputs)) = decoder.outputs(output) {
        for o in &outputs.outputs {
            if let Some(logprobs) = &o.logprobs {
                // One value per row of a matrix that came from an inline ext or a frame.
                let available: usize = output.iter().map(Vec::len).sum();
                assert!(logprobs.len() * 4 <= available, "more logprobs than bytes");
            }
        }
    }
    assert!(
        SCHEMAS.contains(&decoder.schema()),
        "schema not in the tables"
    );
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let frames = split(rest);
    for frame in &frames {
        let (mut ours, mut theirs) = (&frame[..], &frame[..]);
        let ours = msgpack::read_value(&mut ours, 64)
            .ok()
            .map(|v| (format!("{v:?}"), ours.len()));
        let theirs = rmpv::decode::read_value_with_max_depth(&mut theirs, 64)
            .ok()
            .map(|v| (format!("{v:?}"), theirs.len()));
        assert_eq!(ours, theirs, "the msgpack readers disagree");
        let mut rest = &frame[..];
        let lazy = msgpack::Lazy::read(&mut rest, 64).ok();
        let in_place = lazy.map(|v| (format!("{:?}", v.to_value()), rest.len()));
        assert_eq!(
            in_place, ours,
            "reading in place disagrees with the value tree"
        );
    }
    let mut input = frames.clone();
    if mode & 1 == 1 {
        input.insert(0, vec![(mode >> 1) % 8]);
    }
    for schema in SCHEMAS {
        let mut decoder = VllmDecoder::new(schema);
        check(&mut decoder, &input, &frames);
        assert!(decoder.layout_switches <= 2, "more switches than messages");
    }
    // One decoder across many messages: each frame on its own as well.
    let mut decoder = VllmDecoder::new(SCHEMAS[SCHEMAS.len() - 1]);
    let mut calls = 2;
    check(&mut decoder, &input, &frames);
    for frame in &frames {
        check(
            &mut decoder,
            &[vec![0x00], frame.clone()],
            std::slice::from_ref(frame),
        );
        calls += 2;
    }
    assert!(
        decoder.layout_switches <= calls,
        "more switches than messages"
    );
});
