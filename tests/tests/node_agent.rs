//! The node agent: `infertrace run` started before any engine, then a real vLLM and a real
//! SGLang, each run as a pod's container runs (xtask/scripts/engines/in-pod.sh: its own PID and
//! mount namespaces, in a cgroup named as kubelet names a container's). Each server is traced
//! from its start, under its own resource (its container from its cgroup, its pid); vLLM is
//! then restarted in a new container, and the new server's requests are traced while SGLang's
//! are untouched: every request an engine finished is traced once, none twice.
//!
//! Needs root (eBPF, cgroups, namespaces) and both engines (installed on first use).
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use infertrace_tests::{
    live::{
        self, Cleanup, EngineKind, free_port, get, post, run_agent, script, stop, temp_dir,
        wait_until_idle,
    },
    vllm_truth::prom,
    wait_for,
};
use serde_json::Value;

const VLLM_PORT: u16 = 18481;
const SGLANG_PORT: u16 = 18483;
const REQUESTS: usize = 6;

/// A pod's container as kubelet places it (containerd, systemd cgroup driver).
struct Container {
    id: String,
    cgroup: PathBuf,
}

impl Container {
    fn new(pod_uid: &str, id_digit: char) -> Self {
        let id: String = std::iter::repeat_n(id_digit, 64).collect();
        // cgroup v2: the unified tree beside v1 controllers on this machine kind, else the root.
        let unified = Path::new("/sys/fs/cgroup/unified");
        let root = if unified.join("cgroup.procs").exists() {
            unified
        } else {
            Path::new("/sys/fs/cgroup")
        };
        let pod = pod_uid.replace('-', "_");
        let cgroup = root
            .join("kubepods.slice/kubepods-besteffort.slice")
            .join(format!("kubepods-besteffort-pod{pod}.slice"))
            .join(format!("cri-containerd-{id}.scope"));
        Self { id, cgroup }
    }

    /// The engine scripts' WRAPPER that starts a server in this container.
    fn wrapper(&self) -> String {
        format!(
            "{} {}",
            script(".", "in-pod.sh").display(),
            self.cgroup.display()
        )
    }

    /// Its cgroup, once its processes are gone (best effort: a test that failed may leave
    /// some).
    fn remove(&self) {
        let mut dir = self.cgroup.as_path();
        for _ in 0..4 {
            if std::fs::remove_dir(dir).is_err() {
                break;
            }
            let Some(parent) = dir.parent() else { break };
            dir = parent;
        }
    }
}

/// Requests to a server: plain and streamed completions and chats.
fn send_requests(port: u16) {
    for i in 0..REQUESTS {
        let stream = i % 2 == 1;
        let body = if i % 3 == 0 {
            format!(
                r#"{{"model":"tiny","prompt":"node agent {i}","max_tokens":8,"stream":{stream}}}"#
            )
        } else {
            format!(
                r#"{{"model":"tiny","messages":[{{"role":"user","content":"node agent {i}"}}],"max_tokens":8,"stream":{stream}}}"#
            )
        };
        let path = if i % 3 == 0 {
            "/v1/completions"
        } else {
            "/v1/chat/completions"
        };
        let answer = post(port, path, &body);
        assert!(answer.contains("choices"), "port {port}: {answer}");
    }
}

/// Per engine instance (`service.instance.id`), its resource and how many spans whose name
/// begins with `name` it has in the JSONL `ours`.
fn spans_by_instance(ours: &Path, name: &str) -> BTreeMap<String, (Value, usize)> {
    let mut by: BTreeMap<String, (Value, usize)> = BTreeMap::new();
    for line in std::fs::read_to_string(ours).unwrap_or_default().lines() {
        let Ok(v) = serde_json::from_str::<Value>(line) else {
            continue;
        };
        if v["type"] != "span" || !v["name"].as_str().is_some_and(|n| n.starts_with(name)) {
            continue;
        }
        let id = v["resource"]["service.instance.id"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        by.entry(id).or_insert_with(|| (v["resource"].clone(), 0)).1 += 1;
    }
    by
}

/// The instance of server `pid`: its resource and span count.
fn instance(by: &BTreeMap<String, (Value, usize)>, pid: &str) -> (Value, usize) {
    by.iter()
        .find(|(id, _)| id.ends_with(&format!(":{pid}")))
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("no spans of pid {pid}: {by:?}"))
}

/// What a server's engine says it finished (its /metrics counter).
fn finished(port: u16, counter: &str) -> usize {
    prom(&get(port, "/metrics"), counter, &[]) as usize
}

#[test]
fn run_traces_each_server_from_its_start_under_its_container_through_a_restart() {
    let dir = temp_dir("node-agent");
    let ours = dir.join("ours.jsonl");
    let mut cleanup = Cleanup::default();
    let vllm_first = Container::new("5b1c7a2e-9d3f-4e8a-b6c1-0f2e3d4c5b6a", 'a');
    let vllm_second = Container::new("5b1c7a2e-9d3f-4e8a-b6c1-0f2e3d4c5b6a", 'b');
    let sglang = Container::new("0d9e8f7a-6b5c-4d3e-8f1a-2b3c4d5e6f70", 'c');
    // Nothing of either engine runs yet: the agent finds them as they start.
    for (kind, port) in [
        (EngineKind::Vllm, VLLM_PORT),
        (EngineKind::Sglang, SGLANG_PORT),
    ] {
        cleanup.stop_engine(kind, port);
    }
    let agent = run_agent(&ours, free_port(), &["--no-python-sampling"]);
    let vllm_pid = cleanup.fresh_engine(
        EngineKind::Vllm,
        VLLM_PORT,
        &[],
        &[("WRAPPER", &vllm_first.wrapper())],
    );
    let sglang_pid = cleanup.fresh_engine(
        EngineKind::Sglang,
        SGLANG_PORT,
        &["--enable-metrics"],
        &[("WRAPPER", &sglang.wrapper())],
    );
    for pid in [&vllm_pid, &sglang_pid] {
        assert!(
            agent.log().contains(&format!("server pid {pid}")),
            "the agent found pid {pid} as it started:\n{}",
            agent.log()
        );
    }
    send_requests(VLLM_PORT);
    send_requests(SGLANG_PORT);
    wait_until_idle(VLLM_PORT, &live::VLLM_BUSY);
    let vllm_first_finished = finished(VLLM_PORT, "vllm:request_success_total");
    assert_eq!(vllm_first_finished, REQUESTS);

    // vLLM restarts in a new container; SGLang runs on.
    cleanup.fresh_engine(
        EngineKind::Vllm,
        VLLM_PORT,
        &[],
        &[("WRAPPER", &vllm_second.wrapper())],
    );
    let vllm_second_pid = std::fs::read_to_string(
        EngineKind::Vllm
            .home()
            .join(format!("logs/vllm-{VLLM_PORT}.pid")),
    )
    .expect("the new server's pid")
    .trim()
    .to_owned();
    assert_ne!(vllm_second_pid, vllm_pid);
    assert!(
        wait_for(Duration::from_secs(30), || agent
            .log()
            .contains(&format!("server pid {vllm_pid} exited"))),
        "{}",
        agent.log()
    );
    send_requests(VLLM_PORT);
    send_requests(SGLANG_PORT);
    wait_until_idle(VLLM_PORT, &live::VLLM_BUSY);
    wait_until_idle(SGLANG_PORT, &live::SGLANG_BUSY);
    let vllm_second_finished = finished(VLLM_PORT, "vllm:request_success_total");
    let sglang_finished = finished(SGLANG_PORT, "sglang:num_requests_total");
    assert_eq!(
        (vllm_second_finished, sglang_finished),
        (REQUESTS, 2 * REQUESTS)
    );
    // Every finished request has been reported once the agent's count stops moving.
    live::wait_until_settled(&agent);
    let stderr = stop(agent);
    drop(cleanup);
    for container in [&vllm_first, &vllm_second, &sglang] {
        container.remove();
    }

    let vllm = spans_by_instance(&ours, "llm_request");
    // SGLang's request spans are named ` Req <rid>`, as SGLang names them.
    let sglang_spans = spans_by_instance(&ours, " Req ");
    let servers = [
        (&vllm, &vllm_pid, &vllm_first, vllm_first_finished, "vllm"),
        (
            &vllm,
            &vllm_second_pid,
            &vllm_second,
            vllm_second_finished,
            "vllm",
        ),
        (
            &sglang_spans,
            &sglang_pid,
            &sglang,
            sglang_finished,
            "sglang",
        ),
    ];
    for (spans, pid, container, finished, engine) in servers {
        let (resource, traced) = instance(spans, pid);
        assert_eq!(
            traced, finished,
            "{engine} pid {pid}: requests traced vs finished\n{stderr}"
        );
        assert_eq!(
            resource["container.id"],
            container.id.as_str(),
            "{resource}"
        );
        assert_eq!(resource["process.pid"], pid.as_str(), "{resource}");
        assert_eq!(resource["service.name"], "tiny", "{resource}");
    }
    assert_eq!(
        vllm.len(),
        2,
        "two vLLM servers, each its own instance: {vllm:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
