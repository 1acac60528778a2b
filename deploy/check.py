#!/usr/bin/env python3
"""Check the deployment files (no cluster, no container engine needed).

    python3 deploy/check.py          # check
    python3 deploy/check.py --fix    # rewrite the two copies of the attach script, then check

- deploy/kubernetes/attach-engines.sh is the one source of the DaemonSet's attach loop; its
  copies (inlined in deploy/kubernetes/daemonset.yaml's ConfigMap, and
  deploy/helm/infertrace/files/attach-engines.sh) must be identical to it.
- The plain YAML files must parse (needs PyYAML).
- Optional, when installed: shellcheck on the script; `helm lint` + `helm template` on the
  chart, or the same through the helm-python-sdk package (bundles Helm's Go library) when no
  `helm` binary is on PATH.
"""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

DEPLOY = Path(__file__).resolve().parent
SCRIPT = DEPLOY / "kubernetes/attach-engines.sh"
MANIFEST = DEPLOY / "kubernetes/daemonset.yaml"
CHART = DEPLOY / "helm/infertrace"
CHART_SCRIPT = CHART / "files/attach-engines.sh"
# The ConfigMap's block scalar: from `attach-engines.sh: |` up to the next `---`.
INLINE = re.compile(r"(  attach-engines\.sh: \|\n)(.*?)(\n---\n)", re.S)


def inline(script: str) -> str:
    return "\n".join(("    " + l) if l else "" for l in script.rstrip("\n").split("\n"))


def main() -> int:
    fix = "--fix" in sys.argv[1:]
    script = SCRIPT.read_text()
    failures = []

    manifest = MANIFEST.read_text()
    if fix:
        manifest = INLINE.sub(lambda m: m[1] + inline(script) + m[3], manifest, count=1)
        MANIFEST.write_text(manifest)
        CHART_SCRIPT.write_text(script)

    docs = [d for d in yaml.safe_load_all(manifest) if d]
    kinds = [d["kind"] for d in docs]
    print(f"{MANIFEST.relative_to(DEPLOY)}: parses: {kinds}")
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    if cm["data"]["attach-engines.sh"] != script:
        failures.append(f"the ConfigMap in {MANIFEST.name} differs from {SCRIPT.name} (run --fix)")
    if CHART_SCRIPT.read_text() != script:
        failures.append(f"{CHART_SCRIPT.relative_to(DEPLOY)} differs from {SCRIPT.name} (run --fix)")
    for f in (CHART / "Chart.yaml", CHART / "values.yaml"):
        yaml.safe_load(f.read_text())
        print(f"{f.relative_to(DEPLOY)}: parses")

    if shutil.which("shellcheck"):
        r = subprocess.run(["shellcheck", "-s", "sh", str(SCRIPT)])
        print(f"shellcheck: {'ok' if r.returncode == 0 else 'FAILED'}")
        if r.returncode:
            failures.append("shellcheck")
    else:
        print("shellcheck: not installed, skipped")

    failures += check_chart(script)
    for f in failures:
        print("FAIL:", f)
    print("deploy check:", "FAILED" if failures else "ok")
    return 1 if failures else 0


def check_chart(script: str) -> list:
    """Lint and render the chart; compare its ConfigMap with the script."""
    if shutil.which("helm"):
        lint = subprocess.run(["helm", "lint", "--strict", str(CHART)])
        out = subprocess.run(["helm", "template", "infertrace", str(CHART)],
                             capture_output=True, text=True)
        if lint.returncode or out.returncode:
            return [f"helm lint/template: {out.stderr.strip()}"]
        rendered = out.stdout
    else:
        try:
            from helm_python import chart as hc
        except ImportError:
            print("helm chart: neither helm nor helm-python-sdk installed, render skipped")
            return []
        report = hc.lint(str(CHART), strict=True)
        if report["errors"] or any(m["severity"] >= 2 for m in report["messages"]):
            return [f"helm lint: {report}"]
        out = hc.Chart.load(str(CHART)).render(name="infertrace", namespace="infertrace")
        rendered = "\n---\n".join(t for p, t in out.items() if not p.endswith("NOTES.txt"))
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    print(f"helm chart: lints and renders: {sorted(d['kind'] for d in docs)}")
    cm = next(d for d in docs if d["kind"] == "ConfigMap")
    if cm["data"]["attach-engines.sh"] != script:
        return ["the chart's rendered ConfigMap differs from the attach script"]
    return []


if __name__ == "__main__":
    sys.exit(main())
