#!/usr/bin/env python3
"""Check the deployment files without a cluster or a container engine. CI runs it.

    python3 deploy/check.py [--infertrace BIN]   # check
    python3 deploy/check.py --fix                # copy deploy/infertrace.yaml into the manifest

Needs pyyaml, kubernetes-validate and helm-python-sdk (Helm's Go library; no helm binary).

- deploy/infertrace.yaml is the one source of the agent's settings: the DaemonSet's ConfigMap
  (deploy/kubernetes/daemonset.yaml) holds it verbatim, and the chart's default `config` says
  the same; with --infertrace BIN, `BIN config check` validates it.
- Every object of the plain manifest, and of the chart rendered with its defaults and with
  every option on, is validated against the Kubernetes API schemas (kubernetes-validate,
  strict: unknown fields are errors); the ServiceMonitor, a CRD without a bundled schema, is
  checked for its shape only.
- The chart lints (strict).
"""
import re
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import yaml
from helm_python import chart as helm_chart

DEPLOY = Path(__file__).resolve().parent
CONFIG = DEPLOY / "infertrace.yaml"
MANIFEST = DEPLOY / "kubernetes/daemonset.yaml"
CHART = DEPLOY / "helm/infertrace"
# The oldest and newest Kubernetes schemas kubernetes-validate bundles.
KUBERNETES_VERSIONS = ["1.25.0", "1.37.0"]
# The ConfigMap's block scalar: from `infertrace.yaml: |` up to the next `---`.
INLINE = re.compile(r"(  infertrace\.yaml: \|\n)(.*?)(\n---\n)", re.S)


def inline(text: str) -> str:
    return "\n".join(("    " + l) if l else "" for l in text.rstrip("\n").split("\n"))


def validate(docs: list, origin: str) -> list:
    """Schema-validate each object; the failures."""
    failures = []
    for doc in docs:
        what = f"{origin}: {doc['kind']}/{doc['metadata']['name']}"
        if doc["kind"] == "ServiceMonitor":
            ok = doc["apiVersion"] == "monitoring.coreos.com/v1" and doc["spec"]["endpoints"]
            print(f"{what}: shape {'ok' if ok else 'WRONG'} (no bundled schema)")
            failures += [] if ok else [what]
            continue
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as e:
                failures.append(f"{what} against {version}: {e.message} at {list(e.path)}")
            except kubernetes_validate.SchemaNotFoundError as e:
                failures.append(f"{what}: no schema for {version}: {e}")
        print(f"{what}: valid against Kubernetes {', '.join(KUBERNETES_VERSIONS)}")
    return failures


def render(values: dict) -> list:
    out = helm_chart.Chart.load(str(CHART)).render(values, name="infertrace", namespace="infertrace")
    text = "\n---\n".join(t for path, t in out.items() if not path.endswith("NOTES.txt"))
    return [d for d in yaml.safe_load_all(text) if d]


def main() -> int:
    args = sys.argv[1:]
    config = CONFIG.read_text()
    failures = []

    manifest = MANIFEST.read_text()
    if "--fix" in args:
        manifest = INLINE.sub(lambda m: m[1] + inline(config) + m[3], manifest, count=1)
        MANIFEST.write_text(manifest)
    docs = [d for d in yaml.safe_load_all(manifest) if d]
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    if cm["data"]["infertrace.yaml"] != config:
        failures.append(f"the ConfigMap in {MANIFEST.name} differs from {CONFIG.name} (run --fix)")
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    if defaults["config"] != yaml.safe_load(config):
        failures.append(f"the chart's default `config` differs from {CONFIG.name}")
    if "--infertrace" in args:
        binary = args[args.index("--infertrace") + 1]
        r = subprocess.run([binary, "config", "check", str(CONFIG)], capture_output=True, text=True)
        print(r.stdout.strip() or r.stderr.strip())
        if r.returncode:
            failures.append(f"infertrace config check {CONFIG.name}: {r.stderr.strip()}")
    failures += validate(docs, MANIFEST.name)

    report = helm_chart.lint(str(CHART), strict=True)
    if report["errors"] or any(m["severity"] >= 2 for m in report["messages"]):
        failures.append(f"helm lint: {report}")
    else:
        print("helm chart: lints (strict)")
    failures += validate(render({}), "chart (defaults)")
    everything = {
        "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
        "privileged": True,
        "extraArgs": ["--ring-mib", "64"],
        "nodeSelector": {"nvidia.com/gpu.present": "true"},
        "priorityClassName": "system-node-critical",
        "podAnnotations": {"example": "yes"},
    }
    rendered = render(everything)
    failures += validate(rendered, "chart (every option)")
    daemonset = next(d for d in rendered if d["kind"] == "DaemonSet")
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    if container["args"][:3] != ["run", "--config", "/etc/infertrace/infertrace.yaml"]:
        failures.append(f"the chart's DaemonSet does not run `infertrace run --config`: {container['args']}")

    for f in failures:
        print("FAIL:", f)
    print("deploy check:", "FAILED" if failures else "ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
