//! Fuzzes the streamed-content templates (decode/sse_template.rs) and the matcher the kernel
//! runs on each candidate write (`SseTemplate::matches`): any bytes must neither panic nor be
//! taken as a template that does not match the very write it came from; and a template of a
//! real content write must match arbitrary bytes without panicking.
#![no_main]

use std::sync::LazyLock;

use infertrace::decode::sse_template::{content_template, kernel_match};
use infertrace_common::{SSE_WRITE_MAX, SseTemplate};
use libfuzzer_sys::fuzz_target;

/// A template of a vLLM content write.
static TEMPLATE: LazyLock<SseTemplate> = LazyLock::new(|| {
    let data = "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1765000000,\"model\":\"tiny\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"logprobs\":null,\"finish_reason\":null}]}\n\n";
    let write = format!("{:x}\r\n{data}\r\n", data.len());
    content_template(write.as_bytes()).expect("a content write")
});

fuzz_target!(|data: &[u8]| {
    if let Some(content) = kernel_match(&TEMPLATE, data) {
        assert!(content < data.len());
    }
    if let Some(template) = content_template(data)
        && data.len() <= SSE_WRITE_MAX
    {
        assert!(kernel_match(&template, data).is_some(), "its own write");
    }
});
