//! Kernel records and recording files are untrusted input to `infertrace replay`: parsing
//! them, and running what parses through the flow table, must never panic.
#![no_main]

use infertrace::{
    capture::{CaptureEvent, recording::Reader, records},
    decode::flows::FlowTable,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut flows = FlowTable::new();
    if let Ok(record) = records::parse(data) {
        let _ = flows.handle(CaptureEvent::Kernel(record));
    }
    if let Ok((mut reader, _)) = Reader::open(data) {
        while let Ok(Some(event)) = reader.next_event() {
            let _ = flows.handle(event);
        }
    }
    let _ = flows.finish(0);
});
