//! How discovery recognises one engine's processes. Each engine kind gives one of these
//! (`engines/<engine>/recognition.rs`); discovery (`engine.rs`) tries every registered kind,
//! so it names no engine itself.
use super::{cmdline::Program, engine::Role};

pub struct Recognition {
    /// As shown to users ("vLLM").
    pub name: &'static str,
    /// The importable package: its files in a process's maps locate the installation.
    pub package: &'static str,
    /// Distribution names (as in `<name>-<version>.dist-info`), preferred first.
    pub distributions: &'static [&'static str],
    /// Module files that hold `__version__`, relative to the import root.
    pub version_files: &'static [&'static str],
    /// What its process titles (setproctitle) begin with, before `::`: `VLLM` in
    /// `VLLM::EngineCore`.
    pub title_prefix: &'static str,
    /// The title names it knows and the roles they are. A title may add rank suffixes to a
    /// name (`Worker_TP0`, `scheduler_DP0_TP1`); an unknown name is `Role::Other`.
    pub titles: &'static [(&'static str, Role)],
    /// Whether a command line launches its server (the API server or main process).
    pub launches: fn(&Program) -> bool,
    /// The model a launch command line names.
    pub model: fn(&Program, &[String]) -> Option<String>,
    /// The flags that name the served model name.
    pub served_model_name_flags: &'static [&'static str],
    /// The port its server listens on when its launch command says none (`--port`).
    pub default_port: u16,
}
