//! Kubernetes' view of the containers on this node (node mode): a watch of the pods scheduled
//! here (`spec.nodeName`), kept as an index from container id to the pod identity that goes
//! on a server's resource (`k8s.namespace.name`, `k8s.pod.name`, ...).
//!
//! The watch runs on its own thread, with the well-kept client (`kube`), and never holds up
//! tracing: a server whose pod is not known yet is traced at once, and its identity is filled
//! in when the pod arrives. Pods are read trimmed to the fields used ([`PodLite`]); RBAC needs
//! pods get/list/watch only. An unreachable API server is retried with backoff, said once when
//! it goes and once when it comes back.
use std::{
    collections::{BTreeMap, HashMap},
    sync::{Arc, Mutex, mpsc},
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::{WatchStreamExt as _, watcher};
use serde::{Deserialize, Serialize};

/// What a server's resource says of its pod and container.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodIdentity {
    pub namespace: String,
    pub pod_name: String,
    pub pod_uid: String,
    pub container_name: String,
    pub node_name: String,
    /// The Deployment that owns the pod's ReplicaSet, when one does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment_name: Option<String>,
    /// The pod's labels (for selection rules; not resource attributes).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

impl PodIdentity {
    /// As OpenTelemetry resource attributes (semantic conventions' keys).
    pub fn attributes(&self) -> Vec<(&'static str, String)> {
        let mut attributes = vec![
            ("k8s.namespace.name", self.namespace.clone()),
            ("k8s.pod.name", self.pod_name.clone()),
            ("k8s.pod.uid", self.pod_uid.clone()),
            ("k8s.container.name", self.container_name.clone()),
            ("k8s.node.name", self.node_name.clone()),
        ];
        if let Some(deployment) = &self.deployment_name {
            attributes.push(("k8s.deployment.name", deployment.clone()));
        }
        attributes
    }
}

/// A Pod, trimmed to what the index uses (the rest of the object is never kept).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct PodLite {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<PodSpecLite>,
    #[serde(default)]
    pub status: Option<PodStatusLite>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpecLite {
    #[serde(default)]
    pub node_name: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStatusLite {
    #[serde(default)]
    pub container_statuses: Vec<ContainerStatusLite>,
    #[serde(default)]
    pub init_container_statuses: Vec<ContainerStatusLite>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStatusLite {
    pub name: String,
    /// `<runtime>://<id>`, e.g. `containerd://3f1c...`; absent until the container started.
    #[serde(default, rename = "containerID")]
    pub container_id: Option<String>,
}

impl k8s_openapi::Resource for PodLite {
    const API_VERSION: &'static str = "v1";
    const GROUP: &'static str = "";
    const KIND: &'static str = "Pod";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "pods";
    type Scope = k8s_openapi::NamespaceResourceScope;
}

impl k8s_openapi::Metadata for PodLite {
    type Ty = ObjectMeta;
    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Each running container of a pod: its id (without the runtime's scheme) and identity.
pub fn containers_of(pod: &PodLite) -> Vec<(String, PodIdentity)> {
    let meta = &pod.metadata;
    let deployment_name = meta
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.kind == "ReplicaSet")
        .map(|o| deployment_of(&o.name, meta.labels.as_ref()));
    let identity = |container_name: &str| PodIdentity {
        namespace: meta.namespace.clone().unwrap_or_default(),
        pod_name: meta.name.clone().unwrap_or_default(),
        pod_uid: meta.uid.clone().unwrap_or_default(),
        container_name: container_name.to_owned(),
        node_name: pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default(),
        deployment_name: deployment_name.clone(),
        labels: meta.labels.clone().unwrap_or_default(),
    };
    let Some(status) = &pod.status else {
        return Vec::new();
    };
    status
        .container_statuses
        .iter()
        .chain(&status.init_container_statuses)
        .filter_map(|c| {
            let id = c.container_id.as_deref()?;
            let id = id.split_once("://").map_or(id, |(_, id)| id);
            (!id.is_empty()).then(|| (id.to_ascii_lowercase(), identity(&c.name)))
        })
        .collect()
}

/// A ReplicaSet's Deployment: the ReplicaSet is named `<deployment>-<pod-template-hash>`
/// (the hash is the pod's `pod-template-hash` label; without it, the last dash-part).
fn deployment_of(replica_set: &str, labels: Option<&BTreeMap<String, String>>) -> String {
    let hash = labels.and_then(|l| l.get("pod-template-hash"));
    let stripped = match hash {
        Some(hash) => replica_set.strip_suffix(&format!("-{hash}")),
        None => replica_set.rsplit_once('-').map(|(name, _)| name),
    };
    stripped.unwrap_or(replica_set).to_owned()
}

/// Container id -> pod identity, for the pods on this node.
#[derive(Debug, Default)]
pub struct PodIndex {
    by_container: HashMap<String, PodIdentity>,
    /// Each pod's containers, to forget them with the pod.
    by_pod: HashMap<String, Vec<String>>,
}

impl PodIndex {
    pub fn get(&self, container_id: &str) -> Option<&PodIdentity> {
        self.by_container.get(container_id)
    }

    /// A pod was added or changed: the container ids whose identity is new.
    fn apply(&mut self, pod: &PodLite) -> Vec<String> {
        let key = pod.metadata.uid.clone().unwrap_or_default();
        let containers = containers_of(pod);
        let mut changed = Vec::new();
        for (id, identity) in &containers {
            if self.by_container.get(id) != Some(identity) {
                self.by_container.insert(id.clone(), identity.clone());
                changed.push(id.clone());
            }
        }
        let ids: Vec<String> = containers.into_iter().map(|(id, _)| id).collect();
        if let Some(old) = self.by_pod.insert(key, ids.clone()) {
            for id in old.iter().filter(|id| !ids.contains(id)) {
                self.by_container.remove(id);
            }
        }
        changed
    }

    fn delete(&mut self, pod: &PodLite) {
        let key = pod.metadata.uid.clone().unwrap_or_default();
        for id in self.by_pod.remove(&key).unwrap_or_default() {
            self.by_container.remove(&id);
        }
    }

    /// A fresh list replaces everything (pods deleted while the watch was down go).
    fn replace(&mut self, pods: &[PodLite]) -> Vec<String> {
        *self = Self::default();
        pods.iter().flat_map(|p| self.apply(p)).collect()
    }
}

/// The watch of this node's pods, running on its own thread.
pub struct PodWatch {
    index: Arc<Mutex<PodIndex>>,
    /// Container ids whose pod became known or changed, as the watch sees them.
    changed: mpsc::Receiver<Vec<String>>,
}

impl PodWatch {
    /// Watch the pods of node `node` with the client configuration found the usual way
    /// (in-cluster service account, else `KUBECONFIG` / `~/.kube/config`). Fails only on a
    /// configuration that cannot be read; an API server that does not answer is retried.
    pub fn start(node: &str) -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let config = runtime
            .block_on(kube::Config::infer())
            .map_err(|e| anyhow::anyhow!("Kubernetes client configuration: {e}"))?;
        let server = config.cluster_url.to_string();
        let client = {
            let _guard = runtime.enter();
            kube::Client::try_from(config)
                .map_err(|e| anyhow::anyhow!("Kubernetes client for {server}: {e}"))?
        };
        let index = Arc::new(Mutex::new(PodIndex::default()));
        let (tx, changed) = mpsc::channel();
        let selector = format!("spec.nodeName={node}");
        tracing::info!("watching the pods of node {node} at {server}");
        let kept = index.clone();
        std::thread::Builder::new()
            .name("k8s-pods".into())
            .spawn(move || runtime.block_on(watch(client, selector, kept, tx)))?;
        Ok(Self { index, changed })
    }

    /// The pod of a container, when known.
    pub fn pod_of(&self, container_id: &str) -> Option<PodIdentity> {
        self.index
            .lock()
            .expect("pod index lock")
            .get(container_id)
            .cloned()
    }

    /// The container ids whose pod became known or changed since the last call.
    pub fn take_changed(&self) -> Vec<String> {
        self.changed.try_iter().flatten().collect()
    }
}

async fn watch(
    client: kube::Client,
    selector: String,
    index: Arc<Mutex<PodIndex>>,
    changed: mpsc::Sender<Vec<String>>,
) {
    use futures::StreamExt as _;
    let api: kube::Api<PodLite> = kube::Api::all(client);
    let mut events = watcher(api, watcher::Config::default().fields(&selector))
        .default_backoff()
        .boxed();
    let mut listing: Vec<PodLite> = Vec::new();
    let mut down = false;
    while let Some(event) = events.next().await {
        let ids = match event {
            Err(e) => {
                if !down {
                    tracing::warn!(
                        "Kubernetes API: {e}; retrying (servers are traced meanwhile, their pod \
                         identity added when it answers)"
                    );
                }
                down = true;
                continue;
            }
            Ok(event) => {
                if down {
                    tracing::info!("Kubernetes API answers again");
                    down = false;
                }
                let mut index = index.lock().expect("pod index lock");
                match event {
                    watcher::Event::Init => {
                        listing.clear();
                        Vec::new()
                    }
                    watcher::Event::InitApply(pod) => {
                        listing.push(pod);
                        Vec::new()
                    }
                    watcher::Event::InitDone => index.replace(&std::mem::take(&mut listing)),
                    watcher::Event::Apply(pod) => index.apply(&pod),
                    watcher::Event::Delete(pod) => {
                        index.delete(&pod);
                        Vec::new()
                    }
                }
            }
        };
        if !ids.is_empty() && changed.send(ids).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f1c6b0e8d2a4c5b9e7f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f";

    fn pod(json: serde_json::Value) -> PodLite {
        serde_json::from_value(json).expect("a pod")
    }

    fn chat_pod() -> PodLite {
        pod(serde_json::json!({
            "metadata": {
                "name": "chat-7d9f8b6c5-x2x4z", "namespace": "llm", "uid": "u-1",
                "labels": {"pod-template-hash": "7d9f8b6c5"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                                     "name": "chat-7d9f8b6c5", "uid": "rs-1"}],
                "managedFields": [{"manager": "kubelet"}]
            },
            "spec": {"nodeName": "gpu-3", "containers": [{"name": "vllm", "image": "x"}]},
            "status": {
                "phase": "Running",
                "containerStatuses": [
                    {"name": "vllm", "containerID": format!("containerd://{ID}"), "ready": true},
                    {"name": "sidecar", "ready": false}
                ]
            }
        }))
    }

    #[test]
    fn a_pods_containers_carry_its_identity_and_its_deployment() {
        let containers = containers_of(&chat_pod());
        assert_eq!(containers.len(), 1, "a container not started has no id yet");
        let (id, identity) = &containers[0];
        assert_eq!(id, ID);
        assert_eq!(
            identity.attributes(),
            vec![
                ("k8s.namespace.name", "llm".to_owned()),
                ("k8s.pod.name", "chat-7d9f8b6c5-x2x4z".to_owned()),
                ("k8s.pod.uid", "u-1".to_owned()),
                ("k8s.container.name", "vllm".to_owned()),
                ("k8s.node.name", "gpu-3".to_owned()),
                ("k8s.deployment.name", "chat".to_owned()),
            ]
        );
    }

    #[test]
    fn deployments_are_named_from_their_replica_sets() {
        let labels: BTreeMap<String, String> =
            [("pod-template-hash".to_owned(), "5f6b7c".to_owned())].into();
        assert_eq!(deployment_of("my-app-5f6b7c", Some(&labels)), "my-app");
        assert_eq!(deployment_of("my-app-5f6b7c", None), "my-app");
        // A hash label that does not end the name: the name is kept whole.
        assert_eq!(deployment_of("other", Some(&labels)), "other");
    }

    #[test]
    fn the_index_follows_pods_as_they_come_change_and_go() {
        let mut index = PodIndex::default();
        assert_eq!(index.apply(&chat_pod()), vec![ID.to_owned()]);
        assert!(index.apply(&chat_pod()).is_empty(), "nothing new");
        assert_eq!(
            index.get(ID).map(|p| p.pod_name.as_str()),
            Some("chat-7d9f8b6c5-x2x4z")
        );
        index.delete(&chat_pod());
        assert_eq!(index.get(ID), None);
        assert_eq!(index.replace(&[chat_pod()]), vec![ID.to_owned()]);
        assert_eq!(index.replace(&[]), Vec::<String>::new());
        assert_eq!(
            index.get(ID),
            None,
            "a pod missing from a fresh list is gone"
        );
        // A pod without a status, or garbage, is nothing.
        assert!(containers_of(&pod(serde_json::json!({"metadata": {}}))).is_empty());
    }
}
