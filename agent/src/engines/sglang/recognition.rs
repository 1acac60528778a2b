//! How discovery recognises SGLang's processes: titles, launch commands, package and model.
use crate::discover::{
    cmdline::{Program, basename, flag_value},
    engine::Role,
    recognition::Recognition,
};

pub static RECOGNITION: Recognition = Recognition {
    name: "SGLang",
    package: "sglang",
    distributions: &["sglang"],
    version_files: &["sglang/version.py"],
    title_prefix: "sglang",
    titles: &[
        ("scheduler", Role::Scheduler),
        ("detokenizer", Role::Detokenizer),
        ("data_parallel_controller", Role::DataParallelController),
    ],
    launches,
    model,
    served_model_name_flags: &["--served-model-name"],
    default_port: 30000,
};

/// `python -m sglang.launch_server` (or `sglang.cli.main serve`), `sglang serve`, or the
/// launch_server script of a source checkout.
fn launches(program: &Program) -> bool {
    match program {
        Program::Module(m, _) => {
            *m == "sglang.launch_server"
                || (*m == "sglang.cli.main" && program.subcommand_is("serve"))
        }
        Program::Path(path, _) => match basename(path) {
            "sglang" => program.subcommand_is("serve"),
            "launch_server.py" => path.ends_with("sglang/launch_server.py"),
            _ => false,
        },
        Program::Other => false,
    }
}

fn model(_: &Program, args: &[String]) -> Option<String> {
    flag_value(args, &["--model-path", "--model"])
}
