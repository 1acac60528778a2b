//! Fuzzes the SGLang message decoder, both encodings: arbitrary bytes as one ZeroMQ frame (a
//! pickle when it starts with PROTO, else msgpack), typed through the field tables. It must
//! return a message, an error or "not SGLang", and never panic.
#![no_main]

use infertrace::engines::sglang::wire::SglangDecoder;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = SglangDecoder::default().decode(&[data.to_vec()]);
});
