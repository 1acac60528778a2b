//! Reading a process's command line: what program it runs and the values of its flags. Pure;
//! each engine's recognition rules (`engines/<engine>/recognition.rs`) are written with these.

/// What a command line runs.
#[derive(Debug, PartialEq, Eq)]
pub enum Program<'a> {
    /// `python -m <module> args...`
    Module(&'a str, &'a [String]),
    /// `python <script> args...` or `<executable> args...`
    Path(&'a str, &'a [String]),
    /// `python -c ...`, a bare interpreter, or nothing.
    Other,
}

impl Program<'_> {
    /// The arguments after the module, script or executable.
    pub fn rest(&self) -> &[String] {
        match self {
            Program::Module(_, rest) | Program::Path(_, rest) => rest,
            Program::Other => &[],
        }
    }

    /// Whether the first argument after the program is `word` (a subcommand: `vllm serve`).
    pub fn subcommand_is(&self, word: &str) -> bool {
        self.rest().first().is_some_and(|a| a == word)
    }
}

/// The arguments, split again when a title squashed them into one string.
pub fn tokens(cmdline: &[String]) -> Vec<String> {
    match cmdline {
        [one] if one.trim().contains(' ') => one.split_whitespace().map(String::from).collect(),
        _ => cmdline.iter().map(|a| a.trim().to_string()).collect(),
    }
}

pub fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

pub fn is_python(path: &str) -> bool {
    basename(path).starts_with("python")
}

pub fn program(args: &[String]) -> Program<'_> {
    let Some(first) = args.first() else {
        return Program::Other;
    };
    if !is_python(first) {
        return Program::Path(first, &args[1..]);
    }
    let mut i = 1;
    while let Some(arg) = args.get(i) {
        match arg.as_str() {
            "-m" => {
                return args
                    .get(i + 1)
                    .map_or(Program::Other, |m| Program::Module(m, &args[i + 2..]));
            }
            "-c" | "-" => return Program::Other,
            "-X" | "-W" | "--check-hash-based-pycs" => i += 2,
            _ if arg.starts_with("-m") => return Program::Module(&arg[2..], &args[i + 1..]),
            _ if arg.starts_with('-') => i += 1,
            _ => return Program::Path(arg, &args[i + 1..]),
        }
    }
    Program::Other
}

/// The (first) value of a `--flag value` / `--flag=value` option; `_` and `-` are the same in
/// flag names (vLLM accepts both).
pub fn flag_value(args: &[String], names: &[&str]) -> Option<String> {
    let is = |flag: &str| names.iter().any(|n| flag.replace('_', "-") == *n);
    args.iter().enumerate().find_map(|(i, arg)| {
        if !arg.starts_with("--") {
            return None;
        }
        match arg.split_once('=') {
            Some((flag, value)) if is(flag) => Some(value.to_string()),
            None if is(arg) => args.get(i + 1).filter(|v| !v.starts_with("--")).cloned(),
            _ => None,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split(' ').map(String::from).collect()
    }

    #[test]
    fn programs() {
        let a = args("python3 -u -X dev -m pkg.mod serve m");
        assert_eq!(program(&a), Program::Module("pkg.mod", &a[6..]));
        assert!(program(&a).subcommand_is("serve"));
        let a = args("/usr/bin/python3 -mpkg x");
        assert_eq!(program(&a), Program::Module("pkg", &a[2..]));
        let a = args("/venv/bin/python /venv/bin/tool serve");
        assert_eq!(program(&a), Program::Path("/venv/bin/tool", &a[2..]));
        let a = args("tool --x");
        assert_eq!(program(&a), Program::Path("tool", &a[1..]));
        assert_eq!(program(&args("python3 -c import x")), Program::Other);
        assert_eq!(program(&args("python3 -u")), Program::Other);
        assert_eq!(program(&[]), Program::Other);
        assert!(Program::Other.rest().is_empty());
    }

    #[test]
    fn flags_and_tokens() {
        let a = args("x --served_model_name=n --model m --flag --other");
        assert_eq!(
            flag_value(&a, &["--served-model-name"]).as_deref(),
            Some("n")
        );
        assert_eq!(flag_value(&a, &["--model"]).as_deref(), Some("m"));
        assert_eq!(flag_value(&a, &["--flag"]), None);
        assert_eq!(flag_value(&a, &["--absent"]), None);
        assert_eq!(tokens(&["VLLM::Worker   ".into()]), ["VLLM::Worker"]);
        assert_eq!(tokens(&["a b  c".into()]), ["a", "b", "c"]);
    }
}
