//! Node mode: which servers on this host to trace. A server is an engine's API server
//! (vLLM's API server, SGLang's main process) whose parent is no process of the same engine;
//! the kernel follows the processes it starts. Servers are found by a /proc scan (at start,
//! and now and then in case an exec was missed) and as each starts (its exec); a process is
//! identified in full (version, model) only when its own title or command line says it is an
//! engine's API server that is not traced yet.
use std::collections::HashMap;

use super::{
    engine::{self, EngineProcess, Role, Target},
    procfs,
};
use crate::engines::Engine;

/// The servers found so far, so that each is reported once per process.
#[derive(Debug, Default)]
pub struct Finder {
    /// Traced servers: pid -> start time (a later process with the pid is another server)
    /// and container.
    traced: HashMap<u32, (Option<u64>, Option<String>)>,
}

impl Finder {
    /// The servers running now that are not traced yet. Cheap enough to repeat: each process
    /// costs two small reads unless it says it is a server that is not traced.
    pub fn scan(&self) -> Vec<Target> {
        procfs::all_pids()
            .into_iter()
            .filter_map(|pid| self.consider(pid))
            .collect()
    }

    /// A process that is not traced called execve (or a scan found it): the server it is, if
    /// it is one and is not traced yet.
    pub fn consider(&self, pid: u32) -> Option<Target> {
        // Most processes on a host are not servers: two small reads tell.
        if !engine::says_api_server(pid) {
            return None;
        }
        if self.traces(pid, procfs::start_time(pid)) {
            return None;
        }
        let found = engine::identify(pid)?;
        if !is_server(&found, |ppid| engine::engine_role(ppid).map(|(e, _)| e)) {
            return None;
        }
        Some(Target::of(found))
    }

    /// Whether process `pid`, started at `start_time`, is traced already (a later process with
    /// the number is not).
    fn traces(&self, pid: u32, start_time: Option<u64>) -> bool {
        self.traced
            .get(&pid)
            .is_some_and(|(start, _)| *start == start_time)
    }

    /// The server is traced from now on.
    pub fn admit(&mut self, target: &Target) {
        let container = target.identity.container_id.clone();
        self.traced
            .insert(target.pid, (target.start_time, container));
    }

    /// The traced servers that run in container `container_id`.
    pub fn servers_in(&self, container_id: &str) -> Vec<u32> {
        self.traced
            .iter()
            .filter(|(_, (_, c))| c.as_deref() == Some(container_id))
            .map(|(pid, _)| *pid)
            .collect()
    }

    /// A traced process exited: whether it was a server.
    pub fn exited(&mut self, pid: u32) -> bool {
        self.traced.remove(&pid).is_some()
    }
}

/// An API server whose parent is no process of the same engine (vLLM's API servers under
/// one `vllm serve --api-server-count N` are followed from their launcher).
fn is_server(p: &EngineProcess, engine_of: impl Fn(u32) -> Option<Engine>) -> bool {
    p.role == Role::ApiServer && p.ppid.and_then(engine_of) != Some(p.engine)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(pid: u32, ppid: u32, engine: Engine, role: Role) -> EngineProcess {
        EngineProcess {
            pid,
            ppid: Some(ppid),
            engine,
            role,
            comm: "python3".into(),
            version: None,
            model: None,
            served_model_name: None,
            listening_ports: Vec::new(),
        }
    }

    #[test]
    fn servers_are_api_servers_not_launched_by_their_own_engine() {
        let engines = |pid| match pid {
            10 => Some(Engine::Vllm),
            20 => Some(Engine::Sglang),
            _ => None,
        };
        assert!(is_server(
            &process(11, 1, Engine::Vllm, Role::ApiServer),
            engines
        ));
        // An API server of a vLLM launcher: traced with it.
        assert!(!is_server(
            &process(11, 10, Engine::Vllm, Role::ApiServer),
            engines
        ));
        // Another engine's child is a server of its own.
        assert!(is_server(
            &process(11, 20, Engine::Vllm, Role::ApiServer),
            engines
        ));
        assert!(!is_server(
            &process(11, 1, Engine::Vllm, Role::EngineCore),
            engines
        ));
    }

    #[test]
    fn a_server_is_traced_until_its_process_exits() {
        let mut finder = Finder::default();
        let me = std::process::id();
        let server = Target::of(process(me, 1, Engine::Vllm, Role::ApiServer));
        let traced = |finder: &Finder, t: &Target| finder.traces(t.pid, t.start_time);
        assert!(!traced(&finder, &server));
        finder.admit(&server);
        assert!(traced(&finder, &server));
        // Another process with the number is another server.
        let later = Target {
            start_time: server.start_time.map(|t| t + 1),
            ..server.clone()
        };
        assert!(!traced(&finder, &later));
        assert!(finder.exited(me));
        assert!(!finder.exited(me));
        assert!(!traced(&finder, &server));
    }
}
