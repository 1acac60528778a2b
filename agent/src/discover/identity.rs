//! Who a traced server is, beyond its engine: what its own environment names it
//! (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, as the engine's own tracing would be
//! named) and the container it runs in (from its cgroup). Read once, when tracing begins;
//! Kubernetes' view of the same container is added in node mode.
use serde::{Deserialize, Serialize};

use super::procfs;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    /// The server's `OTEL_SERVICE_NAME`, when its environment sets one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_name: Option<String>,
    /// The server's `OTEL_RESOURCE_ATTRIBUTES`, decoded, in their order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resource_attributes: Vec<(String, String)>,
    /// The container runtime's id of the container the server runs in (64 hex digits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
    /// The Kubernetes pod the container belongs to, as its cgroup names it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
}

impl Identity {
    /// What /proc says of process `pid` (nothing, for a process that is gone or that we may
    /// not read).
    pub fn of_process(pid: u32) -> Self {
        let environ = std::fs::read(procfs::proc_path(pid, "environ")).unwrap_or_default();
        let cgroup = std::fs::read_to_string(procfs::proc_path(pid, "cgroup")).unwrap_or_default();
        let placement = container_of(&cgroup);
        Self {
            service_name: env_var(&environ, "OTEL_SERVICE_NAME").filter(|s| !s.is_empty()),
            resource_attributes: env_var(&environ, "OTEL_RESOURCE_ATTRIBUTES")
                .map(|s| resource_attributes(&s))
                .unwrap_or_default(),
            container_id: placement.container_id,
            pod_uid: placement.pod_uid,
        }
    }
}

/// A variable of a process's environment (`/proc/PID/environ`: NUL-separated `NAME=value`).
pub fn env_var(environ: &[u8], name: &str) -> Option<String> {
    environ.split(|&b| b == 0).find_map(|entry| {
        let value = entry.strip_prefix(name.as_bytes())?.strip_prefix(b"=")?;
        Some(String::from_utf8_lossy(value).into_owned())
    })
}

/// `OTEL_RESOURCE_ATTRIBUTES`: `key1=value1,key2=value2`, values percent-encoded (the
/// OpenTelemetry SDK environment specification). A pair without `=` or with an empty key is
/// left out, as the SDKs do.
pub fn resource_attributes(text: &str) -> Vec<(String, String)> {
    text.split(',')
        .filter_map(|pair| {
            let (key, value) = pair.split_once('=')?;
            let key = key.trim();
            (!key.is_empty()).then(|| (key.to_owned(), percent_decoded(value.trim())))
        })
        .collect()
}

/// `%XX` escapes decoded (an escape that is not two hex digits is kept as it is).
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                out.push((hex(h).unwrap_or(0) * 16 + hex(l).unwrap_or(0)) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Where a process's cgroup places it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    pub container_id: Option<String>,
    pub pod_uid: Option<String>,
}

/// The container and pod in `/proc/PID/cgroup` (`hierarchy:controllers:path` lines; cgroup v2
/// has the single line `0::path`, v1 one line per hierarchy; any line that names them will
/// do). Path formats, by the runtime and cgroup driver that made them:
/// - containerd, systemd driver: `.../kubepods-besteffort-pod<uid_with_underscores>.slice/cri-containerd-<id>.scope`
/// - CRI-O: `.../crio-<id>.scope` (its `crio-conmon-<id>.scope` is the monitor, not the
///   container)
/// - cgroupfs driver: `/kubepods/burstable/pod<uid>/<id>`
/// - Docker: `/docker/<id>`, `/system.slice/docker-<id>.scope`; Podman: `libpod-<id>.scope`
pub fn container_of(cgroup: &str) -> Placement {
    let mut placement = Placement::default();
    for line in cgroup.lines() {
        let Some(path) = line.splitn(3, ':').nth(2) else {
            continue;
        };
        for part in path.split('/').rev() {
            if placement.container_id.is_none() {
                placement.container_id = container_id(part);
            }
            if placement.pod_uid.is_none() {
                placement.pod_uid = pod_uid(part);
            }
        }
        if placement.container_id.is_some() {
            break;
        }
    }
    placement
}

/// A container id in one path component, after the runtime's prefix and `.scope`.
fn container_id(part: &str) -> Option<String> {
    let name = part.strip_suffix(".scope").unwrap_or(part);
    if name.starts_with("crio-conmon-") {
        return None;
    }
    let id = [
        "cri-containerd-",
        "crio-",
        "docker-",
        "libpod-",
        "containerd-",
    ]
    .iter()
    .find_map(|prefix| name.strip_prefix(prefix))
    .unwrap_or(name);
    (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_ascii_lowercase())
}

/// A pod's uid in one path component: `pod<uid>` (cgroupfs) or
/// `kubepods-<qos>-pod<uid with _ for ->.slice` (systemd).
fn pod_uid(part: &str) -> Option<String> {
    let name = part.strip_suffix(".slice").unwrap_or(part);
    let uid = &name[name.rfind("pod")? + 3..];
    let uid = uid.replace('_', "-");
    let shape = uid.len() == 36
        && uid.char_indices().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        });
    shape.then_some(uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f1c6b0e8d2a4c5b9e7f1a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d5e6f";
    const UID: &str = "5b1c7a2e-9d3f-4e8a-b6c1-0f2e3d4c5b6a";

    fn placed(cgroup: &str) -> (Option<String>, Option<String>) {
        let p = container_of(cgroup);
        (p.container_id, p.pod_uid)
    }

    #[test]
    fn containers_and_pods_are_found_in_every_runtime_and_driver_format() {
        let under = UID.replace('-', "_");
        let cases = [
            // cgroup v2, containerd, systemd driver.
            format!(
                "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{under}.slice/cri-containerd-{ID}.scope\n"
            ),
            // cgroup v1 beside v2 (this machine kind), CRI-O.
            format!("12:memory:/kubepods.slice/kubepods-pod{under}.slice/crio-{ID}.scope\n0::/\n"),
            // cgroupfs driver.
            format!("4:cpu,cpuacct:/kubepods/burstable/pod{UID}/{ID}\n"),
        ];
        for cgroup in &cases {
            assert_eq!(
                placed(cgroup),
                (Some(ID.to_owned()), Some(UID.to_owned())),
                "{cgroup}"
            );
        }
        assert_eq!(
            placed(&format!("0::/system.slice/docker-{ID}.scope\n")),
            (Some(ID.to_owned()), None)
        );
        assert_eq!(
            placed(&format!("1:name=systemd:/docker/{ID}\n"))
                .0
                .as_deref(),
            Some(ID)
        );
        assert_eq!(
            placed(&format!("0::/machine.slice/libpod-{ID}.scope"))
                .0
                .as_deref(),
            Some(ID)
        );
    }

    #[test]
    fn hosts_processes_monitors_and_garbage_have_no_container() {
        for cgroup in [
            "0::/user.slice/user-0.slice/session-3.scope\n",
            "0::/\n",
            "",
            "garbage without colons",
            &format!("0::/kubepods.slice/crio-conmon-{ID}.scope"),
            // One hex digit short.
            &format!("0::/docker/{}", &ID[1..]),
        ] {
            assert_eq!(placed(cgroup).0, None, "{cgroup}");
        }
    }

    #[test]
    fn the_environment_names_the_service_as_the_engines_own_tracing_would() {
        let environ = b"PATH=/bin\0OTEL_SERVICE_NAME=chat-llm\0OTEL_RESOURCE_ATTRIBUTES=deployment.environment=prod,team=a%2Cb, =x,novalue\0";
        assert_eq!(
            env_var(environ, "OTEL_SERVICE_NAME").as_deref(),
            Some("chat-llm")
        );
        assert_eq!(env_var(environ, "OTEL_SERVICE"), None);
        let attrs =
            resource_attributes(&env_var(environ, "OTEL_RESOURCE_ATTRIBUTES").expect("attributes"));
        assert_eq!(
            attrs,
            vec![
                ("deployment.environment".to_owned(), "prod".to_owned()),
                ("team".to_owned(), "a,b".to_owned()),
            ]
        );
        assert_eq!(percent_decoded("100%"), "100%");
        assert_eq!(percent_decoded("%zz%41"), "%zzA");
    }
}
