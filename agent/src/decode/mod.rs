//! Pure byte-to-message decoders. No I/O here: each decoder takes the bytes of one syscall at a
//! time (`feed`), is told when bytes were lost (`gap`), and returns the messages it completed.
//!
//! Attaching to an engine that has run for hours is the normal case, so every decoder finds
//! message boundaries on its own (no handshake is ever required) and resynchronises after a gap.
pub mod cuda;
pub mod flows;
pub mod http;
pub mod lines;
pub mod msgpack;
pub mod openai;
pub mod pickle;
pub mod pickle_head;
pub mod pyread;
pub mod python;
pub mod sse;
pub mod sse_template;
pub mod zmtp;
