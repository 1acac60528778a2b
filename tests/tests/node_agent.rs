//! The node agent: `infertrace run` started before any engine, then a real vLLM and a real
//! SGLang, each run as a pod's container runs (xtask/scripts/engines/in-pod.sh: its own PID and
//! mount namespaces, in a cgroup named as kubelet names a container's). The agent's real
//! Kubernetes client talks to a stand-in API server on loopback
//! (tests/fixtures/fake_kube_apiserver.py: the list and watch of Pods, with those containers'
//! ids; no Kubernetes runs here). Each server is traced from its start, under its own resource
//! (its container from its cgroup, its pid, its pod from the watch). Then the API server goes
//! down, vLLM restarts in a new container whose pod the API server does not know yet, and
//! requests go on; the API server comes back with the new pod. Every request an engine
//! finished is traced once, none twice, through all of it, and each server's spans end up
//! carrying its pod.
//!
//! Needs root (eBPF, cgroups, namespaces) and both engines (installed on first use).
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    time::Duration,
};

use infertrace_tests::{
    Script, fixture,
    live::{
        self, Agent, Cleanup, EngineKind, free_port, get, post, run_agent, script, stop, temp_dir,
        wait_until_idle,
    },
    python,
    vllm_truth::prom,
    wait_for,
};
use serde_json::{Value, json};

const VLLM_PORT: u16 = 18481;
const SGLANG_PORT: u16 = 18483;
const REQUESTS: usize = 6;
const NODE: &str = "gpu-node-7";

/// A pod's container as kubelet places it (containerd, systemd cgroup driver).
struct Container {
    id: String,
    cgroup: PathBuf,
    pod_uid: String,
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
        Self {
            id,
            cgroup,
            pod_uid: pod_uid.to_owned(),
        }
    }

    /// Its Pod object as the API server has it, named `name` in namespace `llm` with container
    /// `container`, owned by `owner` (kind, name).
    fn pod(&self, name: &str, container: &str, owner: (&str, &str), labels: Value) -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {
                "name": name, "namespace": "llm", "uid": self.pod_uid,
                "resourceVersion": "1", "labels": labels,
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": owner.0, "name": owner.1,
                                     "uid": "owner-uid", "controller": true}]
            },
            "spec": {"nodeName": NODE, "containers": [{"name": container, "image": "engine"}]},
            "status": {
                "phase": "Running",
                "containerStatuses": [{"name": container, "ready": true,
                                       "containerID": format!("containerd://{}", self.id)}]
            }
        })
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

/// The stand-in API server on `port`, serving the pods written to `pods`.
fn api_server(port: u16, pods: &Path, requests: &Path) -> Script {
    let mut command = std::process::Command::new(python());
    command
        .arg(fixture("fake_kube_apiserver.py"))
        .arg(port.to_string())
        .arg(pods)
        .arg(requests);
    let mut server = Script::spawn(command);
    assert_eq!(server.read_line().trim(), "listening");
    server
}

/// A kubeconfig for the API server on `port` (plain HTTP, no credentials).
fn kubeconfig(dir: &Path, port: u16) -> PathBuf {
    let path = dir.join("kubeconfig");
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: \
         http://127.0.0.1:{port}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    \
         user: fake\ncurrent-context: fake\nusers:\n- name: fake\n  user: {{}}\n"
    );
    std::fs::write(&path, text).expect("writing the kubeconfig");
    path
}

/// Wait (at most a minute) until the agent's log says `text`.
fn wait_for_log(agent: &Agent, text: &str) {
    assert!(
        wait_for(Duration::from_secs(60), || agent.log().contains(text)),
        "the agent never said {text:?}:\n{}",
        agent.log()
    );
}

/// Per engine instance (`service.instance.id`), its last span's resource and how many spans
/// whose name begins with `name` it has in the JSONL `ours`.
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
        let entry = by.entry(id).or_insert_with(|| (Value::Null, 0));
        entry.0 = v["resource"].clone();
        entry.1 += 1;
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
fn run_traces_each_server_from_its_start_under_its_pod_through_restarts() {
    let dir = temp_dir("node-agent");
    let ours = dir.join("ours.jsonl");
    let mut cleanup = Cleanup::default();
    let vllm_first = Container::new("5b1c7a2e-9d3f-4e8a-b6c1-0f2e3d4c5b6a", 'a');
    let vllm_second = Container::new("6c2d8b3f-0e4a-4f9b-87d2-1a3f4e5d6c7b", 'b');
    let sglang = Container::new("0d9e8f7a-6b5c-4d3e-8f1a-2b3c4d5e6f70", 'c');
    let deployment = |hash: &str| {
        (
            ("ReplicaSet", format!("vllm-{hash}")),
            json!({"app": "vllm", "pod-template-hash": hash}),
        )
    };
    let ((kind, rs), labels) = deployment("6d5f7c8b9");
    let vllm_first_pod = vllm_first.pod("vllm-6d5f7c8b9-x2x4z", "vllm", (kind, &rs), labels);
    let ((kind, rs), labels) = deployment("7e6a8d9c0");
    let mut vllm_second_pod = vllm_second.pod("vllm-7e6a8d9c0-q8w7e", "vllm", (kind, &rs), labels);
    // Created after the others: a later version, as the API server numbers changes.
    vllm_second_pod["metadata"]["resourceVersion"] = json!("2");
    let sglang_pod = sglang.pod("sglang-0", "sglang", ("StatefulSet", "sglang"), json!({}));
    let pods = dir.join("pods.json");
    let requests = dir.join("api-requests.log");
    let write_pods = |list: &[&Value]| {
        std::fs::write(&pods, serde_json::to_string(list).unwrap()).expect("writing the pods")
    };
    write_pods(&[&vllm_first_pod, &sglang_pod]);
    let api_port = free_port();
    let mut api = api_server(api_port, &pods, &requests);
    let config = kubeconfig(&dir, api_port);
    // Nothing of either engine runs yet: the agent finds them as they start.
    for (kind, port) in [
        (EngineKind::Vllm, VLLM_PORT),
        (EngineKind::Sglang, SGLANG_PORT),
    ] {
        cleanup.stop_engine(kind, port);
    }
    let agent = run_agent(
        &ours,
        free_port(),
        &["--no-python-sampling", "--kubernetes-node", NODE],
        &[("KUBECONFIG", config.to_str().unwrap())],
    );
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
        wait_for_log(&agent, &format!("server pid {pid}"));
    }
    wait_for_log(&agent, "pod llm/vllm-6d5f7c8b9-x2x4z");
    wait_for_log(&agent, "pod llm/sglang-0");
    send_requests(VLLM_PORT);
    send_requests(SGLANG_PORT);
    wait_until_idle(VLLM_PORT, &live::VLLM_BUSY);
    let vllm_first_finished = finished(VLLM_PORT, "vllm:request_success_total");
    assert_eq!(vllm_first_finished, REQUESTS);

    // The API server goes down; vLLM restarts in a new pod, which it does not know yet.
    drop(api);
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
    wait_for_log(&agent, &format!("server pid {vllm_pid} exited"));
    wait_for_log(&agent, &format!("server pid {vllm_second_pid}"));
    send_requests(VLLM_PORT);
    send_requests(SGLANG_PORT);

    // It comes back, with the new pod; the new server's identity follows.
    write_pods(&[&vllm_second_pod, &sglang_pod]);
    api = api_server(api_port, &pods, &requests);
    wait_for_log(
        &agent,
        &format!("server pid {vllm_second_pid} is container vllm of pod llm/vllm-7e6a8d9c0-q8w7e"),
    );
    send_requests(VLLM_PORT);
    send_requests(SGLANG_PORT);
    wait_until_idle(VLLM_PORT, &live::VLLM_BUSY);
    wait_until_idle(SGLANG_PORT, &live::SGLANG_BUSY);
    let vllm_second_finished = finished(VLLM_PORT, "vllm:request_success_total");
    let sglang_finished = finished(SGLANG_PORT, "sglang:num_requests_total");
    assert_eq!(
        (vllm_second_finished, sglang_finished),
        (2 * REQUESTS, 3 * REQUESTS)
    );
    // Every finished request has been reported once the agent's count stops moving.
    live::wait_until_settled(&agent);
    let stderr = stop(agent);
    drop(api);
    drop(cleanup);
    for container in [&vllm_first, &vllm_second, &sglang] {
        container.remove();
    }

    // The agent asked for this node's pods only.
    let asked = std::fs::read_to_string(&requests).expect("the API server's log");
    assert!(!asked.is_empty());
    for line in asked.lines() {
        assert!(
            line.starts_with("/api/v1/pods?")
                && line.contains(&format!("fieldSelector=spec.nodeName%3D{NODE}")),
            "{line}"
        );
    }
    let vllm = spans_by_instance(&ours, "llm_request");
    // SGLang's request spans are named ` Req <rid>`, as SGLang names them.
    let sglang_spans = spans_by_instance(&ours, " Req ");
    let servers = [
        (
            &vllm,
            &vllm_pid,
            &vllm_first,
            vllm_first_finished,
            "vllm-6d5f7c8b9-x2x4z",
        ),
        (
            &vllm,
            &vllm_second_pid,
            &vllm_second,
            vllm_second_finished,
            "vllm-7e6a8d9c0-q8w7e",
        ),
        (
            &sglang_spans,
            &sglang_pid,
            &sglang,
            sglang_finished,
            "sglang-0",
        ),
    ];
    for (spans, pid, container, finished, pod) in servers {
        let (resource, traced) = instance(spans, pid);
        assert_eq!(
            traced, finished,
            "pid {pid}: requests traced vs finished\n{stderr}"
        );
        let expected = [
            ("container.id", container.id.as_str()),
            ("process.pid", pid.as_str()),
            ("service.name", "tiny"),
            ("k8s.pod.name", pod),
            ("k8s.pod.uid", container.pod_uid.as_str()),
            ("k8s.namespace.name", "llm"),
            ("k8s.node.name", NODE),
        ];
        for (key, value) in expected {
            assert_eq!(resource[key], value, "{key} of pid {pid}: {resource}");
        }
    }
    assert_eq!(instance(&vllm, &vllm_pid).0["k8s.deployment.name"], "vllm");
    assert_eq!(instance(&vllm, &vllm_pid).0["k8s.container.name"], "vllm");
    assert_eq!(
        instance(&sglang_spans, &sglang_pid).0["k8s.deployment.name"],
        Value::Null,
        "a StatefulSet's pod has no Deployment"
    );
    assert_eq!(
        vllm.len(),
        2,
        "two vLLM servers, each its own instance: {vllm:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
