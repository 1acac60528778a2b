//! Last stage: where decoded data goes. For now, one console line per message.
pub mod console;
