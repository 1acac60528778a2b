//! Fuzzes the restricted pickle decoder: arbitrary bytes as one pickle, with the first byte
//! choosing how many out-of-band buffers (protocol 5) are supplied. It must return a value or
//! an error, within its bounds, and never panic.
#![no_main]

use infertrace::decode::pickle::loads;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&config, pickle)) = data.split_first() else {
        return;
    };
    let buffers: Vec<Vec<u8>> = (0..config % 4).map(|i| vec![i; usize::from(i)]).collect();
    if let Ok(value) = loads(pickle, &buffers) {
        // Reading it back as an instance must not panic either.
        let _ = value.instance();
    }
});
