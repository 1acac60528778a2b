//! Node mode: which servers on this host to trace (those found, as the selection rules say),
//! and who they are (their pods, as the Kubernetes watch tells).
use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use super::{
    cmdline::{flag_value, tokens},
    engine::Target,
    kubernetes::{PodIdentity, PodWatch},
    procfs,
    selection::{Facts, PodFacts, Selection, Verdict},
    servers::Finder,
};

/// How long a server waits for its pod when a selection rule asks about it (a container's
/// status names it a second or so after it starts); then the rule is judged without it.
const POD_WAIT: Duration = Duration::from_secs(10);

pub struct Node {
    finder: Finder,
    selection: Selection,
    pods: Option<PodWatch>,
    /// Servers waiting for their pod before the selection decides, since when.
    pending: HashMap<u32, (Target, Instant)>,
    /// Servers left out, so that each is said once: pid -> start time.
    skipped: HashMap<u32, Option<u64>>,
}

impl Node {
    pub fn new(selection: Selection, pods: Option<PodWatch>) -> Self {
        if selection.asks_about_pods() && pods.is_none() {
            tracing::warn!(
                "selection rules ask about pods (namespace, pod, label.*) but no Kubernetes node \
                 is set (--kubernetes-node): those rules never match"
            );
        }
        Self {
            finder: Finder::default(),
            selection,
            pods,
            pending: HashMap::new(),
            skipped: HashMap::new(),
        }
    }

    /// The servers running now that are not traced yet and that the selection takes.
    pub fn scan(&mut self) -> Vec<Target> {
        let mut found = self.finder.scan();
        found.retain(|t| !self.pending.contains_key(&t.pid));
        found
            .into_iter()
            .filter_map(|t| self.judge(t, false))
            .collect()
    }

    /// An untraced process called execve: the server it starts, when it is one to trace.
    pub fn consider(&mut self, pid: u32) -> Option<Target> {
        let target = self.finder.consider(pid)?;
        self.judge(target, false)
    }

    /// Servers that waited for their pod and are decided now (their pod is known, or they
    /// waited long enough), those to trace.
    pub fn due(&mut self) -> Vec<Target> {
        let decided: Vec<u32> = self
            .pending
            .iter()
            .filter(|(_, (target, since))| {
                since.elapsed() >= POD_WAIT || self.pod_of(target).is_some()
            })
            .map(|(pid, _)| *pid)
            .collect();
        let mut due = Vec::new();
        for pid in decided {
            if let Some((target, since)) = self.pending.remove(&pid) {
                due.extend(self.judge(target, since.elapsed() >= POD_WAIT));
            }
        }
        due
    }

    /// A traced process exited: whether it was a server.
    pub fn exited(&mut self, pid: u32) -> bool {
        self.pending.remove(&pid);
        self.skipped.remove(&pid);
        self.finder.exited(pid)
    }

    /// The pod of a server's container, when Kubernetes has told it.
    pub fn pod_of(&self, target: &Target) -> Option<PodIdentity> {
        let container = target.identity.container_id.as_deref()?;
        self.pods.as_ref()?.pod_of(container)
    }

    /// The pods Kubernetes told since the last call, of the traced servers they hold.
    pub fn pods_known(&self) -> Vec<(u32, PodIdentity)> {
        let Some(pods) = &self.pods else {
            return Vec::new();
        };
        let mut known = Vec::new();
        for container in pods.take_changed() {
            let Some(pod) = pods.pod_of(&container) else {
                continue;
            };
            for pid in self.finder.servers_in(&container) {
                known.push((pid, pod.clone()));
            }
        }
        known
    }

    /// Trace, leave out (said once), or wait for the pod (unless it `waited` long enough).
    fn judge(&mut self, target: Target, waited: bool) -> Option<Target> {
        let pod = self.pod_of(&target);
        match self
            .selection
            .judge(&facts(&target, pod.as_ref()).as_facts())
        {
            Verdict::Trace(_) => {
                self.finder.admit(&target);
                Some(target)
            }
            Verdict::NeedsPod if self.pods.is_some() && !waited => {
                self.pending
                    .entry(target.pid)
                    .or_insert_with(|| (target, Instant::now()));
                None
            }
            verdict => {
                let why = match verdict {
                    Verdict::Skip(why) => why,
                    _ => "its pod is not known, and a rule asks about it".to_owned(),
                };
                if self.skipped.insert(target.pid, target.start_time) != Some(target.start_time) {
                    tracing::info!("not tracing {}: {why}", crate::session::describe(&target));
                }
                None
            }
        }
    }
}

/// What the selection may ask about a server (its command line read now).
pub struct ServerFacts {
    target_engine: crate::engines::Engine,
    cmdline: String,
    port: u16,
    container: Option<String>,
    pod: Option<PodFacts>,
}

impl ServerFacts {
    pub fn as_facts(&self) -> Facts<'_> {
        Facts {
            engine: self.target_engine,
            cmdline: &self.cmdline,
            port: self.port,
            container: self.container.as_deref(),
            pod: self.pod.as_ref(),
        }
    }
}

/// The facts of a server (of a known engine: node mode traces no other).
pub fn facts(target: &Target, pod: Option<&PodIdentity>) -> ServerFacts {
    let engine = target.engine.unwrap_or(crate::engines::Engine::Vllm);
    let args = procfs::cmdline(target.pid).unwrap_or_default();
    let port = flag_value(&tokens(&args), &["--port"])
        .and_then(|p| p.parse().ok())
        .unwrap_or(engine.recognition().default_port);
    ServerFacts {
        target_engine: engine,
        cmdline: args.join(" "),
        port,
        container: target.identity.container_id.clone(),
        pod: pod.map(|p| PodFacts {
            namespace: p.namespace.clone(),
            name: p.pod_name.clone(),
            labels: p.labels.clone(),
        }),
    }
}
