//! Fuzzes the SGLang message decoder, both encodings: arbitrary bytes as one ZeroMQ frame (a
//! pickle when it starts with PROTO, else msgpack), typed through the field tables, and read
//! for an output batch's leading fields or a request's id without decoding it (`output_head`,
//! `request_rid`, which walk a pickle's first opcodes). Each must return a message, an error or nothing, and never panic.
#![no_main]

use infertrace::engines::sglang::wire::SglangDecoder;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let decoder = SglangDecoder::default();
    let frames = [data.to_vec()];
    let _ = decoder.decode(&frames);
    if let Some((_, leading)) = decoder.output_head(&frames) {
        assert!(
            leading.len() < data.len(),
            "the leading fields lie inside the message"
        );
    }
    if let Some(rid) = decoder.request_rid(&frames) {
        assert!(rid.len() < data.len(), "the id lies inside the message");
    }
});
