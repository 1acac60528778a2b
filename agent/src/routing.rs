//! Which engine instance a traced process belongs to: the instance whose target (the pid given
//! to attach) is the process itself or its nearest traced ancestor. Processes are announced
//! before anything else of theirs (at attach, and as they fork or exec), parents before their
//! children, so each is placed by its parent's owner when it is announced.
use crate::FastMap;

use crate::capture::ProcessInfo;

/// Owners of traced processes, by tgid.
#[derive(Debug, Default)]
pub struct Owners {
    /// Each target's pid, and its instance.
    roots: FastMap<u32, usize>,
    owner: FastMap<u32, usize>,
}

impl Owners {
    /// `pid` is the target of instance `instance`.
    pub fn add_root(&mut self, pid: u32, instance: usize) {
        self.roots.insert(pid, instance);
        self.owner.insert(pid, instance);
    }

    /// A process was announced: it belongs to its root's instance, else to its parent's.
    pub fn announce(&mut self, process: &ProcessInfo) {
        let owner = self
            .roots
            .get(&process.pid)
            .or_else(|| process.ppid.and_then(|ppid| self.owner.get(&ppid)))
            .copied();
        match owner {
            Some(instance) => {
                self.owner.insert(process.pid, instance);
            }
            // Not (or no longer) a descendant of a target: a pid reused by another process.
            None => {
                self.owner.remove(&process.pid);
            }
        }
    }

    /// A process exited: it belongs to nobody now (its number may be reused).
    pub fn forget(&mut self, tgid: u32) {
        self.roots.remove(&tgid);
        self.owner.remove(&tgid);
    }

    /// Instance `instance` ended: none of its processes belongs to it any longer.
    pub fn remove_instance(&mut self, instance: usize) {
        self.roots.retain(|_, i| *i != instance);
        self.owner.retain(|_, i| *i != instance);
    }

    /// Whether `pid` is the target of an instance, and which.
    pub fn root(&self, pid: u32) -> Option<usize> {
        self.roots.get(&pid).copied()
    }

    /// The instance process `tgid` belongs to.
    pub fn of(&self, tgid: u32) -> Option<usize> {
        self.owner.get(&tgid).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn process(pid: u32, ppid: u32) -> ProcessInfo {
        ProcessInfo {
            pid,
            ppid: Some(ppid),
            comm: "python".into(),
            cmdline: Vec::new(),
        }
    }

    #[test]
    fn each_process_belongs_to_the_target_it_descends_from() {
        let mut owners = Owners::default();
        owners.add_root(100, 0);
        owners.add_root(200, 1);
        owners.announce(&process(100, 1));
        owners.announce(&process(101, 100));
        owners.announce(&process(102, 101));
        owners.announce(&process(200, 1));
        owners.announce(&process(201, 200));
        assert_eq!(owners.of(102), Some(0));
        assert_eq!(owners.of(201), Some(1));
        assert_eq!(owners.of(300), None);
    }

    #[test]
    fn exited_processes_and_ended_instances_are_forgotten() {
        let mut owners = Owners::default();
        owners.add_root(100, 0);
        owners.add_root(200, 1);
        owners.announce(&process(101, 100));
        owners.announce(&process(201, 200));
        owners.forget(101);
        assert_eq!(owners.of(101), None);
        owners.remove_instance(1);
        assert_eq!(
            (owners.of(200), owners.of(201), owners.root(200)),
            (None, None, None)
        );
        assert_eq!((owners.of(100), owners.root(100)), (Some(0), Some(0)));
    }

    #[test]
    fn a_reused_pid_of_an_unrelated_process_belongs_to_nobody() {
        let mut owners = Owners::default();
        owners.add_root(100, 0);
        owners.announce(&process(101, 100));
        owners.announce(&process(101, 7));
        assert_eq!(owners.of(101), None);
    }
}
