//! What every engine's tracker uses: joining API calls to engine requests, in-flight tables,
//! the frontend's mailbox hand-over timing, send probes and their election rule, the work of
//! each engine iteration (CUDA steps, Python samples) and the well-known Python code.
pub mod gpu;
pub mod handoff;
pub mod in_flight;
pub mod instance;
pub mod iteration_work;
pub mod join;
pub mod pd_role;
pub mod send_probe;
pub mod votes;
pub mod well_known;
