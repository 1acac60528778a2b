//! Which servers node mode traces: `--include RULE` and `--exclude RULE` (repeatable; in the
//! configuration file, lists). Default: every vLLM and SGLang server found.
//!
//! A rule is conditions joined by `,`, all of which must hold:
//! - `engine=vllm` / `engine=sglang`;
//! - `port=N`: the port the server listens on (its launch command's `--port`, else its
//!   engine's default);
//! - `container=ID`: its container's id, or a prefix of it (12 digits, as runtimes show it);
//! - `namespace=NS`, `pod=NAME`, `label.KEY=VALUE`: its Kubernetes pod (node mode with
//!   `--kubernetes-node`);
//! - `cmdline=REGEX`: a regular expression found in its command line (its arguments joined by
//!   spaces). It takes the rest of the rule, commas included, so it comes last.
//!
//! A server is traced when no exclude rule matches it and, if there are include rules, one of
//! them does. A rule about the pod of a server whose pod is not known yet is undecided: node
//! mode waits for the pod (briefly; a container's status names it a second or so after it
//! starts) before it decides.
use std::collections::BTreeMap;

use regex::Regex;
use thiserror::Error;

use crate::engines::Engine;

#[derive(Debug, Error, PartialEq, Eq)]
pub enum SelectionError {
    #[error(
        "rule {rule:?}: {condition:?} is not a condition (engine=, port=, container=, \
         namespace=, pod=, label.KEY=, cmdline=)"
    )]
    Unknown { rule: String, condition: String },
    #[error("rule {rule:?}: {why}")]
    Bad { rule: String, why: String },
}

#[derive(Clone, Debug)]
enum Condition {
    Engine(Engine),
    Port(u16),
    Container(String),
    Namespace(String),
    Pod(String),
    Label(String, String),
    Cmdline(Regex),
}

/// One `--include` / `--exclude` rule.
#[derive(Clone, Debug)]
pub struct Rule {
    text: String,
    conditions: Vec<Condition>,
}

/// The pod facts a rule may ask about.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodFacts {
    pub namespace: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
}

/// What a rule may ask about a server.
#[derive(Clone, Debug)]
pub struct Facts<'a> {
    pub engine: Engine,
    pub cmdline: &'a str,
    pub port: u16,
    pub container: Option<&'a str>,
    /// None: not known (yet, or not in Kubernetes).
    pub pod: Option<&'a PodFacts>,
}

impl Rule {
    pub fn parse(text: &str) -> Result<Self, SelectionError> {
        let bad = |why: String| SelectionError::Bad {
            rule: text.to_owned(),
            why,
        };
        let mut conditions = Vec::new();
        let mut rest = text.trim();
        while !rest.is_empty() {
            if let Some(pattern) = rest.strip_prefix("cmdline=") {
                let regex = Regex::new(pattern).map_err(|e| bad(format!("cmdline: {e}")))?;
                conditions.push(Condition::Cmdline(regex));
                break;
            }
            let (condition, after) = rest.split_once(',').unwrap_or((rest, ""));
            rest = after.trim_start();
            let (key, value) =
                condition
                    .split_once('=')
                    .ok_or_else(|| SelectionError::Unknown {
                        rule: text.to_owned(),
                        condition: condition.to_owned(),
                    })?;
            let value = value.trim().to_owned();
            conditions.push(match key.trim() {
                "engine" => Condition::Engine(
                    Engine::ALL
                        .into_iter()
                        .find(|e| e.recognition().package == value)
                        .ok_or_else(|| bad(format!("engine {value:?}: vllm or sglang")))?,
                ),
                "port" => Condition::Port(
                    value
                        .parse()
                        .map_err(|_| bad(format!("port {value:?}: a number")))?,
                ),
                "container" if !value.is_empty() => Condition::Container(value.to_lowercase()),
                "namespace" => Condition::Namespace(value),
                "pod" => Condition::Pod(value),
                key => match key.strip_prefix("label.") {
                    Some(label) if !label.is_empty() => Condition::Label(label.to_owned(), value),
                    _ => {
                        return Err(SelectionError::Unknown {
                            rule: text.to_owned(),
                            condition: condition.to_owned(),
                        });
                    }
                },
            });
        }
        if conditions.is_empty() {
            return Err(bad("no condition".into()));
        }
        Ok(Self {
            text: text.to_owned(),
            conditions,
        })
    }

    /// Whether the rule matches (None: it asks about a pod that is not known).
    fn matches(&self, facts: &Facts) -> Option<bool> {
        let mut undecided = false;
        for condition in &self.conditions {
            let holds = match condition {
                Condition::Engine(e) => Some(*e == facts.engine),
                Condition::Port(p) => Some(*p == facts.port),
                Condition::Container(id) => {
                    Some(facts.container.is_some_and(|c| c.starts_with(id)))
                }
                Condition::Cmdline(regex) => Some(regex.is_match(facts.cmdline)),
                Condition::Namespace(ns) => facts.pod.map(|p| p.namespace == *ns),
                Condition::Pod(name) => facts.pod.map(|p| p.name == *name),
                Condition::Label(k, v) => facts.pod.map(|p| p.labels.get(k) == Some(v)),
            };
            match holds {
                Some(false) => return Some(false),
                Some(true) => {}
                None => undecided = true,
            }
        }
        (!undecided).then_some(true)
    }

    fn asks_about_pods(&self) -> bool {
        self.conditions.iter().any(|c| {
            matches!(
                c,
                Condition::Namespace(_) | Condition::Pod(_) | Condition::Label(..)
            )
        })
    }
}

/// What the selection says of one server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Trace(String),
    Skip(String),
    /// A rule asks about its pod, which is not known yet.
    NeedsPod,
}

#[derive(Clone, Debug, Default)]
pub struct Selection {
    include: Vec<Rule>,
    exclude: Vec<Rule>,
}

impl Selection {
    pub fn parse(include: &[String], exclude: &[String]) -> Result<Self, SelectionError> {
        let parse = |rules: &[String]| {
            rules
                .iter()
                .map(|r| Rule::parse(r))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(Self {
            include: parse(include)?,
            exclude: parse(exclude)?,
        })
    }

    /// Whether any rule asks about pods.
    pub fn asks_about_pods(&self) -> bool {
        self.include
            .iter()
            .chain(&self.exclude)
            .any(Rule::asks_about_pods)
    }

    pub fn judge(&self, facts: &Facts) -> Verdict {
        let mut undecided = false;
        for rule in &self.exclude {
            match rule.matches(facts) {
                Some(true) => return Verdict::Skip(format!("excluded by {:?}", rule.text)),
                None => undecided = true,
                Some(false) => {}
            }
        }
        if self.include.is_empty() {
            return if undecided {
                Verdict::NeedsPod
            } else {
                Verdict::Trace("no --include rule: every server is traced".into())
            };
        }
        for rule in &self.include {
            match rule.matches(facts) {
                Some(true) if !undecided => {
                    return Verdict::Trace(format!("included by {:?}", rule.text));
                }
                Some(true) | None => undecided = true,
                Some(false) => {}
            }
        }
        if undecided {
            Verdict::NeedsPod
        } else {
            Verdict::Skip("no --include rule matches".into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts<'a>(pod: Option<&'a PodFacts>) -> Facts<'a> {
        Facts {
            engine: Engine::Vllm,
            cmdline: "/venv/bin/python /venv/bin/vllm serve Qwen/Qwen3-8B --port 8001",
            port: 8001,
            container: Some("3f1c6b0e8d2a4c5b9e7f"),
            pod,
        }
    }

    fn judge(include: &[&str], exclude: &[&str], pod: Option<&PodFacts>) -> Verdict {
        let owned = |rules: &[&str]| rules.iter().map(|r| r.to_string()).collect::<Vec<_>>();
        Selection::parse(&owned(include), &owned(exclude))
            .expect("valid rules")
            .judge(&facts(pod))
    }

    #[test]
    fn everything_is_traced_unless_rules_say_otherwise() {
        assert!(matches!(judge(&[], &[], None), Verdict::Trace(_)));
        assert_eq!(
            judge(
                &["engine=sglang", "port=8001,cmdline=Qwen3-\\d+B"],
                &[],
                None
            ),
            Verdict::Trace("included by \"port=8001,cmdline=Qwen3-\\\\d+B\"".into())
        );
        assert_eq!(
            judge(&["engine=sglang"], &[], None),
            Verdict::Skip("no --include rule matches".into())
        );
        assert_eq!(
            judge(&[], &["container=3f1c6b0e8d2a"], None),
            Verdict::Skip("excluded by \"container=3f1c6b0e8d2a\"".into())
        );
        // A regex with a comma in it: cmdline takes the rest of the rule.
        assert!(matches!(
            judge(&["engine=vllm, cmdline=--port 80{2,}"], &[], None),
            Verdict::Trace(_)
        ));
    }

    #[test]
    fn rules_about_pods_wait_for_the_pod() {
        let pod = PodFacts {
            namespace: "llm".into(),
            name: "chat-0".into(),
            labels: [("team".to_owned(), "search".to_owned())].into(),
        };
        assert_eq!(judge(&["namespace=llm"], &[], None), Verdict::NeedsPod);
        assert!(matches!(
            judge(&["namespace=llm"], &[], Some(&pod)),
            Verdict::Trace(_)
        ));
        assert_eq!(judge(&[], &["label.team=search"], None), Verdict::NeedsPod);
        assert!(matches!(
            judge(&[], &["label.team=search"], Some(&pod)),
            Verdict::Skip(_)
        ));
        // A rule already false for what is known needs no pod.
        assert!(matches!(
            judge(&["engine=sglang,namespace=llm"], &[], None),
            Verdict::Skip(_)
        ));
        assert!(
            Selection::parse(&["pod=chat-0".into()], &[])
                .unwrap()
                .asks_about_pods()
        );
    }

    #[test]
    fn bad_rules_are_named() {
        let error = |rule: &str| Rule::parse(rule).unwrap_err().to_string();
        assert!(error("colour=red").contains("\"colour=red\" is not a condition"));
        assert!(error("port=http").contains("port \"http\": a number"));
        assert!(error("engine=trt").contains("vllm or sglang"));
        assert!(error("cmdline=(").contains("cmdline:"));
        assert!(error("").contains("no condition"));
        assert!(error("namespace").contains("is not a condition"));
    }
}
