//! Fuzzes the HTTP/1.x exchange decoder: any sequence of syscall feeds, gaps and closes on
//! either direction must neither panic nor break the decoder's output invariants; each
//! exchange is also read as an OpenAI API call.
//!
//! Input format, repeated until the input ends: a control byte, then for feeds a length byte
//! and that many bytes (fewer if the input ends). Control byte: bit 7 = direction (1 = client
//! to server); low 4 bits 0 = gap, 1 = close, 2 = a write the kernel elided (its length
//! byte is the write's size, half of it content), anything else = feed. Bits 4..6 advance
//! the timestamp, so equal and increasing timestamps both occur.
#![no_main]

use infertrace::decode::{
    http::{HttpConnection, HttpExchange, MAX_BODY},
    openai::{ApiCall, RequestInput},
};
use infertrace_common::ElidedWrite;
use libfuzzer_sys::fuzz_target;

fn check(out: &[HttpExchange]) {
    for x in out {
        assert!(
            x.request.is_some() || x.response.is_some(),
            "empty exchange"
        );
        if let Some(r) = &x.request {
            assert!(r.body.len() <= MAX_BODY);
            assert!(r.first_ns <= r.last_ns);
        }
        if let Some(r) = &x.response {
            assert!(r.body.len() <= MAX_BODY);
            assert!(r.first_ns <= r.last_ns);
        }
        // What is read of the API call (request JSON, response JSON or SSE chunks) never
        // panics either.
        if let Some(call) = ApiCall::from_exchange(x) {
            let _ = call.input.as_ref().and_then(RequestInput::messages);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut conn = HttpConnection::new();
    let mut ts: u64 = 0;
    let mut rest = data;
    while let Some((&ctrl, tail)) = rest.split_first() {
        rest = tail;
        let from_client = ctrl & 0x80 != 0;
        ts += u64::from((ctrl >> 4) & 0x07);
        match ctrl & 0x0f {
            0 => conn.gap(from_client),
            1 => check(&conn.close(ts)),
            2 => {
                let Some((&len, tail)) = rest.split_first() else {
                    break;
                };
                rest = tail;
                let write = ElidedWrite {
                    seq: 0,
                    ts_ns: ts,
                    len: u32::from(len),
                    content: u32::from(len / 2),
                };
                check(&conn.elided_event(from_client, &write));
            }
            _ => {
                let Some((&len, tail)) = rest.split_first() else {
                    break;
                };
                let n = usize::from(len).min(tail.len());
                let (bytes, tail) = tail.split_at(n);
                rest = tail;
                check(&conn.feed(from_client, ts, bytes));
            }
        }
    }
    check(&conn.close(ts));
});
