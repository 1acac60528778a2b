//! Fuzzes the restricted pickle decoder: arbitrary bytes as one pickle, with the first byte
//! choosing how many out-of-band buffers (protocol 5) are supplied, and whether only some
//! fields of an instance are built (SGLang's decoder). It must return a value or an error,
//! within its bounds, and never panic.
#![no_main]

use infertrace::decode::pickle::{loads, loads_keeping};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&config, pickle)) = data.split_first() else {
        return;
    };
    let buffers: Vec<Vec<u8>> = (0..config % 4).map(|i| vec![i; usize::from(i)]).collect();
    let decoded = if config & 4 != 0 {
        loads_keeping(pickle, &buffers, &|name| name.len() % 2 == 0)
    } else {
        loads(pickle, &buffers)
    };
    if let Ok(value) = decoded {
        // Reading it back as an instance must not panic either.
        let _ = value.instance();
    }
});
