//! The configuration file and the environment: everything a flag of `run`, `attach`, `record`
//! or `profile` can say, under the flag's own name.
//!
//! - The file (`--config FILE`, else `INFERTRACE_CONFIG`) is a YAML mapping of flag names
//!   (without `--`) to values: a string or number for a flag that takes one, a list for a
//!   repeatable flag, `true` / `false` for a switch. E.g. `otlp-endpoint: http://c:4317`,
//!   `output: [console, "jsonl:/var/log/infertrace.jsonl"]`, `no-python-sampling: true`.
//! - The environment: `INFERTRACE_<FLAG>` (upper case, `-` as `_`), e.g.
//!   `INFERTRACE_OTLP_ENDPOINT`; a repeatable flag's values comma-separated, a switch `true` /
//!   `false`.
//! - Precedence: defaults < file < environment < flags. The file's and the environment's
//!   settings become flags put before the command line's own, for the flags the command line
//!   does not give: one parser (clap's) checks every value the same way, wherever it came from.
use std::path::{Path, PathBuf};

use thiserror::Error;

/// The environment variable that names the configuration file.
pub const CONFIG_ENV: &str = "INFERTRACE_CONFIG";
/// The prefix of the environment variables that set flags.
pub const ENV_PREFIX: &str = "INFERTRACE_";

/// A flag of a subcommand, as the configuration may set it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Flag {
    /// Its long name, without `--`.
    pub long: String,
    /// Whether it takes a value (else it is a switch).
    pub takes_value: bool,
    /// Whether it may be given several times (each value adds).
    pub repeatable: bool,
}

impl Flag {
    /// `INFERTRACE_OTLP_ENDPOINT` for `otlp-endpoint`.
    pub fn env_var(&self) -> String {
        format!(
            "{ENV_PREFIX}{}",
            self.long.to_ascii_uppercase().replace('-', "_")
        )
    }
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("{path}: {why}")]
    Read { path: PathBuf, why: String },
    #[error("{path}: not valid YAML: {why}")]
    Yaml { path: PathBuf, why: String },
    #[error("{path}: expected a mapping of settings (flag names without `--`) at the top level")]
    NotMapping { path: PathBuf },
    #[error("{path}: `{key}` is not a setting of `infertrace {command}`{hint}")]
    Unknown {
        path: PathBuf,
        key: String,
        command: String,
        hint: String,
    },
    #[error("{origin}: `{key}`: {why}")]
    BadValue {
        origin: String,
        key: String,
        why: String,
    },
}

/// One setting: a flag and the values it is given (none for a switch that is on).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setting {
    pub flag: String,
    pub values: Vec<String>,
    /// A switch set to false: leaves the flag out.
    pub off: bool,
}

/// Read and check a configuration file against `command`'s flags.
pub fn read_file(path: &Path, command: &str, flags: &[Flag]) -> Result<Vec<Setting>, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
        path: path.to_owned(),
        why: e.to_string(),
    })?;
    parse_file(&text, path, command, flags)
}

/// The settings of a configuration file's text.
pub fn parse_file(
    text: &str,
    path: &Path,
    command: &str,
    flags: &[Flag],
) -> Result<Vec<Setting>, ConfigError> {
    let document: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(text).map_err(|e| ConfigError::Yaml {
            path: path.to_owned(),
            why: e.to_string(),
        })?;
    let mapping = match document {
        serde_yaml_ng::Value::Mapping(m) => m,
        // An empty file says nothing.
        serde_yaml_ng::Value::Null => return Ok(Vec::new()),
        _ => {
            return Err(ConfigError::NotMapping {
                path: path.to_owned(),
            });
        }
    };
    let origin = path.display().to_string();
    let mut settings = Vec::new();
    for (key, value) in mapping {
        let key = match key {
            serde_yaml_ng::Value::String(k) => k,
            other => format!("{other:?}"),
        };
        let Some(flag) = flags.iter().find(|f| f.long == key) else {
            return Err(ConfigError::Unknown {
                path: path.to_owned(),
                key: key.clone(),
                command: command.to_owned(),
                hint: hint(&key, flags),
            });
        };
        settings.push(setting_of_yaml(flag, &value, &origin)?);
    }
    Ok(settings)
}

/// " (did you mean `x`?)", or the list of settings.
fn hint(key: &str, flags: &[Flag]) -> String {
    let near = flags.iter().find(|f| {
        f.long.replace('-', "_") == key.replace('-', "_")
            || f.long.contains(key)
            || key.contains(&f.long)
    });
    match near {
        Some(f) => format!(" (did you mean `{}`?)", f.long),
        None => format!(
            "; settings: {}",
            flags
                .iter()
                .map(|f| f.long.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

fn setting_of_yaml(
    flag: &Flag,
    value: &serde_yaml_ng::Value,
    origin: &str,
) -> Result<Setting, ConfigError> {
    use serde_yaml_ng::Value;
    let bad = |why: &str| ConfigError::BadValue {
        origin: origin.to_owned(),
        key: flag.long.clone(),
        why: why.to_owned(),
    };
    let scalar = |v: &Value| match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        _ => Err(bad("expected a string or a number")),
    };
    if !flag.takes_value {
        return match value {
            Value::Bool(on) => Ok(Setting {
                flag: flag.long.clone(),
                values: Vec::new(),
                off: !on,
            }),
            _ => Err(bad("a switch: expected true or false")),
        };
    }
    let values = match value {
        Value::Sequence(items) if flag.repeatable => {
            items.iter().map(scalar).collect::<Result<Vec<_>, _>>()?
        }
        Value::Sequence(_) => return Err(bad("takes one value, not a list")),
        v => vec![scalar(v)?],
    };
    Ok(Setting {
        flag: flag.long.clone(),
        values,
        off: false,
    })
}

/// The setting an environment variable's value makes.
fn setting_of_env(flag: &Flag, text: &str) -> Result<Setting, ConfigError> {
    let bad = |why: &str| ConfigError::BadValue {
        origin: flag.env_var(),
        key: flag.long.clone(),
        why: why.to_owned(),
    };
    if !flag.takes_value {
        let on = match text.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => true,
            "false" | "0" | "no" | "off" | "" => false,
            _ => return Err(bad("a switch: expected true or false")),
        };
        return Ok(Setting {
            flag: flag.long.clone(),
            values: Vec::new(),
            off: !on,
        });
    }
    let values = if flag.repeatable {
        text.split(',')
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_owned)
            .collect()
    } else {
        vec![text.to_owned()]
    };
    Ok(Setting {
        flag: flag.long.clone(),
        values,
        off: false,
    })
}

/// Whether the command line gives `flag` itself (`--flag`, `--flag=value`).
fn given(args: &[String], flag: &str) -> bool {
    let long = format!("--{flag}");
    args.iter()
        .take_while(|a| *a != "--")
        .any(|a| *a == long || a.starts_with(&format!("{long}=")))
}

/// The arguments of a subcommand with the file's and the environment's settings put before
/// `args` (the command line's own, which win): for each flag the command line does not give,
/// the environment's value, else the file's.
pub fn merged_args(
    args: &[String],
    file: &[Setting],
    env: impl Fn(&str) -> Option<String>,
    flags: &[Flag],
) -> Result<Vec<String>, ConfigError> {
    let mut out = Vec::new();
    for flag in flags {
        if given(args, &flag.long) {
            continue;
        }
        let setting = match env(&flag.env_var()) {
            Some(text) => Some(setting_of_env(flag, &text)?),
            None => file.iter().find(|s| s.flag == flag.long).cloned(),
        };
        let Some(setting) = setting else { continue };
        if setting.off {
            continue;
        }
        if setting.values.is_empty() {
            out.push(format!("--{}", flag.long));
        }
        for value in setting.values {
            out.push(format!("--{}={value}", flag.long));
        }
    }
    out.extend(args.iter().cloned());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags() -> Vec<Flag> {
        let flag = |long: &str, takes_value, repeatable| Flag {
            long: long.into(),
            takes_value,
            repeatable,
        };
        vec![
            flag("otlp-endpoint", true, false),
            flag("granularity", true, false),
            flag("output", true, true),
            flag("no-python-sampling", false, false),
            flag("capture-content", false, false),
        ]
    }

    fn parse(text: &str) -> Result<Vec<Setting>, ConfigError> {
        parse_file(text, Path::new("c.yaml"), "run", &flags())
    }

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_file_says_what_flags_say_under_their_names() {
        let file = parse(
            "otlp-endpoint: http://c:4317\ngranularity: 2\noutput: [console, 'jsonl:/x']\n\
             no-python-sampling: true\ncapture-content: false\n",
        )
        .expect("a valid file");
        let merged = merged_args(&[], &file, |_| None, &flags()).unwrap();
        assert_eq!(
            merged,
            args(&[
                "--otlp-endpoint=http://c:4317",
                "--granularity=2",
                "--output=console",
                "--output=jsonl:/x",
                "--no-python-sampling",
            ])
        );
        assert_eq!(parse("").unwrap(), Vec::new());
    }

    #[test]
    fn the_environment_beats_the_file_and_flags_beat_both() {
        let file = parse("granularity: 2\noutput: [console]\nno-python-sampling: true\n").unwrap();
        let env = |var: &str| match var {
            "INFERTRACE_GRANULARITY" => Some("0".to_owned()),
            "INFERTRACE_OUTPUT" => Some("none, jsonl:/y".to_owned()),
            "INFERTRACE_NO_PYTHON_SAMPLING" => Some("false".to_owned()),
            _ => None,
        };
        let command_line = args(&["--output", "jsonl:-", "--duration", "5"]);
        let merged = merged_args(&command_line, &file, env, &flags()).unwrap();
        assert_eq!(
            merged,
            args(&["--granularity=0", "--output", "jsonl:-", "--duration", "5"])
        );
        let wrong = |var: &str| (var == "INFERTRACE_CAPTURE_CONTENT").then(|| "maybe".to_owned());
        let err = merged_args(&[], &[], wrong, &flags()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "INFERTRACE_CAPTURE_CONTENT: `capture-content`: a switch: expected true or false"
        );
    }

    #[test]
    fn mistakes_are_named_with_the_file_and_the_setting() {
        let message = |text: &str| parse(text).unwrap_err().to_string();
        assert_eq!(
            message("otlp_endpoint: x"),
            "c.yaml: `otlp_endpoint` is not a setting of `infertrace run` (did you mean \
             `otlp-endpoint`?)"
        );
        assert!(message("colour: red").contains("settings: otlp-endpoint, granularity"));
        assert_eq!(
            message("granularity: [1, 2]"),
            "c.yaml: `granularity`: takes one value, not a list"
        );
        assert_eq!(
            message("no-python-sampling: yes please"),
            "c.yaml: `no-python-sampling`: a switch: expected true or false"
        );
        assert_eq!(
            message("otlp-endpoint: {url: x}"),
            "c.yaml: `otlp-endpoint`: expected a string or a number"
        );
        assert_eq!(
            message("- a list"),
            "c.yaml: expected a mapping of settings (flag names without `--`) at the top level"
        );
        assert!(message("a: [unclosed").starts_with("c.yaml: not valid YAML"));
    }

    #[test]
    fn only_the_command_lines_own_flags_count_as_given() {
        assert!(given(&args(&["--granularity", "1"]), "granularity"));
        assert!(given(&args(&["--granularity=1"]), "granularity"));
        assert!(!given(&args(&["--granularity-x"]), "granularity"));
        assert!(!given(&args(&["--", "--granularity"]), "granularity"));
    }
}
