//! Fuzzes the restricted pickle decoder: arbitrary bytes as one pickle, with the first byte
//! choosing how many out-of-band buffers (protocol 5) are supplied, and whether it is expanded
//! into values or read in place (SGLang's decoder). It must return a value or an error, within
//! its bounds, and never panic; reading the result as an instance must not panic either.
#![no_main]

use infertrace::decode::{
    pickle::{loads, parse},
    pyread::PyRead,
};
use libfuzzer_sys::fuzz_target;

/// Reads `v` as SGLang's decoder does: an instance, its fields, their ints.
fn read<'v>(v: impl PyRead<'v>) {
    if let Some((_, _, fields)) = v.instance() {
        for key in ["rids", "input_ids", "output_ids", "time_stats"] {
            if let Some(field) = fields.get(key) {
                let _ = (field.int_array(), field.items());
                let _ = field.item(0).and_then(PyRead::instance);
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&config, pickle)) = data.split_first() else {
        return;
    };
    let buffers: Vec<Vec<u8>> = (0..config % 4).map(|i| vec![i; usize::from(i)]).collect();
    if config & 4 != 0 {
        if let Ok(pickle) = parse(pickle, &buffers) {
            read(pickle.root());
        }
    } else if let Ok(value) = loads(pickle, &buffers) {
        read(&value);
    }
});
