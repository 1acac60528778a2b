//! An engine instance's OpenTelemetry resource: who the spans and metrics of one traced server
//! are from, in the semantic conventions' keys.
use super::metrics::{Resource, SERVICE_INSTANCE_ID};
use crate::discover::engine::Target;

/// The resource of the server `target` on `host`:
/// - `service.name`: the server's own `OTEL_SERVICE_NAME`, else the `service.name` of its
///   `OTEL_RESOURCE_ATTRIBUTES` (as the engine's own tracing would name itself), else its
///   served model, else its engine's package (`vllm`, `sglang`);
/// - `service.instance.id` (`host:pid`, unique while the server runs), `service.version` (the
///   engine's), `host.name`, `process.pid`, `container.id`;
/// - in Kubernetes, its pod's: `k8s.namespace.name`, `k8s.pod.name`, `k8s.pod.uid`,
///   `k8s.container.name`, `k8s.node.name`, `k8s.deployment.name`;
/// - every other attribute of its `OTEL_RESOURCE_ATTRIBUTES`, unless one of ours has the key.
pub fn of_server(host: &str, target: &Target) -> Resource {
    let identity = &target.identity;
    let own = |key: &str| {
        identity
            .resource_attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    };
    let service_name = identity
        .service_name
        .clone()
        .or_else(|| own("service.name"))
        .or_else(|| target.served_model.clone())
        .or_else(|| target.engine.map(|e| e.recognition().package.to_owned()))
        .unwrap_or_else(|| "openai-compatible-server".to_owned());
    let mut resource: Resource = identity.resource_attributes.iter().cloned().collect();
    let ours = [
        ("service.name", Some(service_name)),
        (SERVICE_INSTANCE_ID, Some(format!("{host}:{}", target.pid))),
        ("service.version", target.version.clone()),
        ("host.name", Some(host.to_owned())),
        ("process.pid", Some(target.pid.to_string())),
        ("container.id", identity.container_id.clone()),
    ];
    for (key, value) in ours {
        match value {
            Some(v) => resource.insert(key.to_owned(), v),
            None => resource.remove(key),
        };
    }
    for (key, value) in target.pod.iter().flat_map(|pod| pod.attributes()) {
        resource.insert(key.to_owned(), value);
    }
    resource
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        discover::{identity::Identity, kubernetes::PodIdentity},
        engines::Engine,
    };

    fn target(identity: Identity) -> Target {
        Target {
            pid: 42,
            engine: Some(Engine::Vllm),
            version: Some("0.32.0".into()),
            served_model: Some("tiny".into()),
            start_time: Some(7),
            identity,
            pod: None,
        }
    }

    #[test]
    fn the_service_is_named_as_the_engine_names_itself_else_by_its_model() {
        let named = |identity| of_server("node-1", &target(identity))["service.name"].clone();
        assert_eq!(named(Identity::default()), "tiny");
        let from_attributes = Identity {
            resource_attributes: vec![("service.name".into(), "chat".into())],
            ..Identity::default()
        };
        assert_eq!(named(from_attributes.clone()), "chat");
        assert_eq!(
            named(Identity {
                service_name: Some("chat-prod".into()),
                ..from_attributes
            }),
            "chat-prod"
        );
        let unnamed = Target {
            served_model: None,
            ..target(Identity::default())
        };
        assert_eq!(of_server("h", &unnamed)["service.name"], "vllm");
    }

    #[test]
    fn the_resource_says_where_the_server_runs_and_keeps_its_own_attributes() {
        let resource = of_server(
            "node-1",
            &target(Identity {
                resource_attributes: vec![
                    ("deployment.environment".into(), "prod".into()),
                    ("host.name".into(), "spoofed".into()),
                ],
                container_id: Some("ab".repeat(32)),
                ..Identity::default()
            }),
        );
        let expected: Resource = [
            ("container.id", "ab".repeat(32)),
            ("deployment.environment", "prod".into()),
            ("host.name", "node-1".into()),
            ("process.pid", "42".into()),
            ("service.instance.id", "node-1:42".into()),
            ("service.name", "tiny".into()),
            ("service.version", "0.32.0".into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        assert_eq!(resource, expected);
        let in_a_pod = Target {
            pod: Some(PodIdentity {
                namespace: "llm".into(),
                pod_name: "chat-0".into(),
                ..PodIdentity::default()
            }),
            ..target(Identity::default())
        };
        let resource = of_server("node-1", &in_a_pod);
        assert_eq!(resource["k8s.pod.name"], "chat-0");
        assert_eq!(resource["k8s.namespace.name"], "llm");
    }
}
