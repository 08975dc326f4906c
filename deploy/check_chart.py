#!/usr/bin/env python3
"""Checks the Helm chart deploy/helm/lifecycle-agent against the kustomize base deploy/.

    target/pyenv/bin/python deploy/check_chart.py --helm /path/to/helm

- `helm lint --strict` passes with the default values and with every toggle on;
- `helm template` with the default values (release lifecycle-agent, namespace lifecycle-system)
  renders the objects of deploy/kustomization.yaml's resources, field for field, except: the
  Namespace (Helm's: `--create-namespace`), and the labels Helm adds to every object
  (app.kubernetes.io/instance, managed-by, version, helm.sh/chart);
- with the toggles on, the PodMonitor and PrometheusRule equal deploy/podmonitor.yaml and
  deploy/prometheusrule.yaml the same way, and each dashboards/*.json is a ConfigMap with the
  Grafana sidecar's label holding that file byte for byte; values.yaml's
  prometheusRule.runbookBaseUrl is extract_rules.RUNBOOK_BASE, and another base moves every
  runbook_url under it (same sections) and changes nothing else;
- each CRI socket preset passes its socket with --cri-socket and mounts its directory read-only;
  `privileged: true` renders a privileged container; wrong values fail to render;
- every rendered object validates as check_manifests.py validates deploy/ (kubernetes-validate
  strict against two Kubernetes versions; custom resources by their fields);
- the chart's appVersion is the workspace's version (Cargo.toml), which the image is tagged with.

One line per check (PASS/FAIL), then "N passed, M failed"; exit status 1 on any failure.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CHART = HERE / "helm" / "lifecycle-agent"
sys.path.insert(0, str(HERE))
import check_manifests  # noqa: E402  (sibling module)
import extract_rules  # noqa: E402  (sibling module)

RELEASE = "lifecycle-agent"
NAMESPACE = "lifecycle-system"
# Labels Helm's convention puts on every object; the kustomize base has no release to name.
HELM_LABELS = {"app.kubernetes.io/instance", "app.kubernetes.io/managed-by", "app.kubernetes.io/version", "helm.sh/chart"}
TOGGLES = ["podMonitor.enabled=true", "serviceMonitor.enabled=true", "prometheusRule.enabled=true",
           "dashboards.enabled=true", "resourceQuota.enabled=true"]
CRI_PRESETS = {
    "containerd": "/run/containerd/containerd.sock",
    "crio": "/var/run/crio/crio.sock",
    "k3s": "/run/k3s/containerd/containerd.sock",
    "microk8s": "/var/snap/microk8s/common/run/containerd.sock",
}


def run(command: list[str]) -> tuple[int, str, str]:
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    return result.returncode, result.stdout, result.stderr


def render(helm: str, *settings: str, kube_version: str = "") -> tuple[list[dict], str]:
    """The chart's objects with `settings` (--set a=b each), or ([], why) when it fails."""
    command = [helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE]
    if kube_version:
        command += ["--kube-version", kube_version]
    for setting in settings:
        command += ["--set", setting]
    code, out, err = run(command)
    if code:
        return [], err.strip() or out.strip()
    return [doc for doc in yaml.safe_load_all(out) if doc], ""


def key(doc: dict) -> tuple[str, str, str]:
    meta = doc.get("metadata") or {}
    return doc.get("kind", ""), meta.get("namespace", ""), meta.get("name", "")


def without_helm_labels(doc: dict) -> dict:
    """A copy of `doc` without Helm's labels on the object and on a pod template."""
    doc = yaml.safe_load(yaml.safe_dump(doc))
    for meta in (doc.get("metadata"), ((doc.get("spec") or {}).get("template") or {}).get("metadata")):
        if isinstance(meta, dict) and isinstance(meta.get("labels"), dict):
            for label in HELM_LABELS:
                meta["labels"].pop(label, None)
    return doc


def differences(want, got, path: str = "") -> list[str]:
    """Where `got` differs from `want`, as `path: want X, got Y` lines."""
    if isinstance(want, dict) and isinstance(got, dict):
        out = []
        for k in sorted(set(want) | set(got), key=str):
            if k not in got:
                out.append(f"{path}.{k}: missing in the chart (kustomize: {want[k]!r})")
            elif k not in want:
                out.append(f"{path}.{k}: only in the chart ({got[k]!r})")
            else:
                out += differences(want[k], got[k], f"{path}.{k}")
        return out
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{path}: {len(want)} items in kustomize, {len(got)} in the chart: {want!r} vs {got!r}"]
        return [d for i, (w, g) in enumerate(zip(want, got)) for d in differences(w, g, f"{path}[{i}]")]
    if want != got or type(want) is not type(got):
        return [f"{path}: kustomize {want!r}, chart {got!r}"]
    return []


def compare(wanted: list[dict], rendered: list[dict]) -> list[str]:
    """Problems when `rendered` is not `wanted` object for object (Helm's labels aside)."""
    want = {key(d): without_helm_labels(d) for d in wanted}
    got = {key(d): without_helm_labels(d) for d in rendered}
    problems = [f"{k[0]} {k[1]}/{k[2]}: not rendered by the chart" for k in sorted(set(want) - set(got))]
    problems += [f"{k[0]} {k[1]}/{k[2]}: rendered by the chart, not in kustomize" for k in sorted(set(got) - set(want))]
    for k in sorted(set(want) & set(got)):
        problems += [f"{k[0]} {k[2]}{d}" for d in differences(want[k], got[k])]
    return problems


def kustomize_objects() -> list[dict]:
    """The objects of deploy/kustomization.yaml's resources (read directly: no kubectl needed)."""
    kustomization = yaml.safe_load((HERE / "kustomization.yaml").read_text())
    docs = []
    for resource in kustomization.get("resources", []):
        docs += [d for d in yaml.safe_load_all((HERE / resource).read_text()) if d]
    return docs


def file_objects(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((HERE / name).read_text()) if d]


def agent_container(objects: list[dict]) -> dict:
    daemonset = next((o for o in objects if o.get("kind") == "DaemonSet"), {})
    return ((((daemonset.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers") or [{}])[0]


def preset_problems(objects: list[dict], socket: str) -> list[str]:
    daemonset = next((o for o in objects if o.get("kind") == "DaemonSet"), None)
    if daemonset is None:
        return ["no DaemonSet rendered"]
    agent = agent_container(objects)
    args = agent.get("args", [])
    problems = []
    if "--cri-socket" not in args or args[args.index("--cri-socket") + 1] != socket:
        problems.append(f"args do not pass --cri-socket {socket}")
    directory = str(Path(socket).parent)
    mounts = [m for m in agent.get("volumeMounts", []) if m.get("mountPath") == directory]
    if len(mounts) != 1 or not mounts[0].get("readOnly"):
        problems.append(f"{directory} is not mounted read-only once")
    volumes = {v["name"]: v for v in daemonset["spec"]["template"]["spec"].get("volumes", [])}
    host = (volumes.get(mounts[0]["name"]) if mounts else {}) or {}
    if host.get("hostPath", {}).get("path") != directory or host.get("hostPath", {}).get("type") != "Directory":
        problems.append(f"the volume is not hostPath {directory} of type Directory")
    stale = {"/run/containerd", "/var/run/crio"} - {directory}
    if any(m.get("mountPath") in stale for m in agent.get("volumeMounts", [])):
        problems.append("another runtime's directory is still mounted")
    return problems


def validate_all(report: check_manifests.Report, label: str, objects: list[dict]) -> None:
    for index, doc in enumerate(objects):
        check_manifests.validate(report, Path(f"chart({label})"), index, doc)


def workspace_version() -> str:
    text = (ROOT / "Cargo.toml").read_text()
    section = text.split("[workspace.package]", 1)[-1]
    match = re.search(r'^version\s*=\s*"([^"]+)"', section, re.M)
    return match.group(1) if match else ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--helm", default=shutil.which("helm"), help="the helm binary (default: helm on PATH)")
    args = parser.parse_args()
    report = check_manifests.Report()
    if not args.helm:
        report.check("helm available", ["no helm: pass --helm (xtask/x.sh test --tier checks builds one)"])
        print(f"{report.passed} passed, {report.failed} failed")
        return 1
    helm = args.helm

    for label, settings in (("default values", []), ("every toggle on", TOGGLES)):
        command = [helm, "lint", "--strict", str(CHART), "--namespace", NAMESPACE]
        for setting in settings:
            command += ["--set", setting]
        code, out, err = run(command)
        summary = next((l for l in out.splitlines() if "linted" in l), "").strip()
        report.check(f"helm lint --strict ({label})", [out.strip() + err.strip()] if code else [], summary)

    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = workspace_version()
    report.check("Chart.yaml appVersion is the workspace version (the image's tag)",
                 [] if str(chart.get("appVersion")) == version else [f"appVersion {chart.get('appVersion')!r}, Cargo.toml {version!r}"])

    default, failure = render(helm)
    kustomize = kustomize_objects()
    namespaces = [d for d in kustomize if d.get("kind") == "Namespace"]
    problems = [failure] if failure else compare([d for d in kustomize if d.get("kind") != "Namespace"], default)
    report.check("helm template (default values) renders deploy/kustomization.yaml's objects, field for field "
                 "(the Namespace and Helm's labels aside)", problems, f"{len(default)} objects")
    report.check("the chart renders no Namespace (Helm's: --create-namespace); kustomize's is lifecycle-system",
                 [] if not any(d.get("kind") == "Namespace" for d in default)
                 and [key(n)[2] for n in namespaces] == [NAMESPACE] else ["a Namespace in the chart, or kustomize's differs"])
    validate_all(report, "default values", default)

    toggled, failure = render(helm, *TOGGLES)
    if failure:
        report.check("helm template (every toggle on)", [failure])
    else:
        for name, kind in (("podmonitor.yaml", "PodMonitor"), ("prometheusrule.yaml", "PrometheusRule")):
            rendered = [d for d in toggled if d.get("kind") == kind]
            report.check(f"{kind} (toggle on) equals deploy/{name}", compare(file_objects(name), rendered))
        values = yaml.safe_load((CHART / "values.yaml").read_text())
        base = ((values.get("prometheusRule") or {}).get("runbookBaseUrl"))
        report.check("values.yaml prometheusRule.runbookBaseUrl is extract_rules.RUNBOOK_BASE",
                     [] if base == extract_rules.RUNBOOK_BASE else [f"{base!r}, extract_rules.py {extract_rules.RUNBOOK_BASE!r}"])
        elsewhere = "https://runbooks.example.org/lifecycle.md"
        moved, failure = render(helm, "prometheusRule.enabled=true", f"prometheusRule.runbookBaseUrl={elsewhere}")
        want = file_objects("prometheusrule.yaml")
        for doc in want:
            extract_rules.rebase_runbooks(doc["spec"]["groups"], elsewhere)
        urls = [r["annotations"]["runbook_url"] for d in want for g in d["spec"]["groups"] for r in g["rules"] if "alert" in r]
        problems = [failure] if failure else compare(want, [d for d in moved if d.get("kind") == "PrometheusRule"])
        if not failure and not all(u.startswith(elsewhere + "#") for u in urls):
            problems.append(f"runbook_url not under {elsewhere}: {urls}")
        report.check("prometheusRule.runbookBaseUrl moves every runbook_url under another base, keeping its section", problems,
                     f"{len(urls)} alerts")
        maps = {d["metadata"]["name"]: d for d in toggled if d.get("kind") == "ConfigMap"}
        problems = []
        files = sorted((ROOT / "dashboards").glob("*.json"))
        for path in files:
            name = f"{RELEASE}-dashboard-{path.stem}"
            data = (maps.get(name) or {}).get("data") or {}
            if name not in maps:
                problems.append(f"no ConfigMap {name}")
            elif data.get(path.name) != path.read_text().rstrip("\n"):
                problems.append(f"{name}: data.{path.name} is not dashboards/{path.name}")
            elif maps[name]["metadata"]["labels"].get("grafana_dashboard") != "1":
                problems.append(f"{name}: no grafana_dashboard: \"1\" label")
        if len(maps) != len(files):
            problems.append(f"{len(maps)} ConfigMaps for {len(files)} dashboards")
        report.check("dashboards (toggle on): one ConfigMap per dashboards/*.json, its content, the sidecar label",
                     problems, f"{len(files)} dashboards")
        quota = next((d for d in toggled if d.get("kind") == "ResourceQuota"), {})
        scope = (((quota.get("spec") or {}).get("scopeSelector") or {}).get("matchExpressions") or [{}])[0]
        report.check("resourceQuota (toggle on) covers the priority class system-node-critical",
                     [] if scope.get("scopeName") == "PriorityClass" and scope.get("values") == ["system-node-critical"]
                     else [f"scope {scope}"])
        services = [d for d in toggled if d.get("kind") == "Service"]
        monitors = [d for d in toggled if d.get("kind") == "ServiceMonitor"]
        endpoint = (((monitors or [{}])[0].get("spec") or {}).get("endpoints") or [{}])[0]
        report.check("serviceMonitor (toggle on): a headless Service on the --listen port, honorLabels",
                     [] if len(services) == 1 and services[0]["spec"].get("clusterIP") == "None"
                     and services[0]["spec"]["ports"][0]["targetPort"] == 9890 and endpoint.get("honorLabels") is True
                     else ["Service or ServiceMonitor missing or wrong"])
        validate_all(report, "every toggle on", toggled)

    for runtime, socket in CRI_PRESETS.items():
        objects, failure = render(helm, f"criSocket.runtime={runtime}")
        report.check(f"criSocket.runtime={runtime}: --cri-socket {socket}, its directory mounted",
                     [failure] if failure else preset_problems(objects, socket))
        if not failure:
            validate_all(report, f"criSocket {runtime}", objects)
    custom = "/run/custom-runtime/cri.sock"
    objects, failure = render(helm, "criSocket.runtime=custom", f"criSocket.path={custom}")
    report.check("criSocket.runtime=custom with criSocket.path", [failure] if failure else preset_problems(objects, custom))

    objects, failure = render(helm, "privileged=true", "apiAuth=none", "events=false", "podProbePort=19891")
    agent = agent_container(objects)
    security, args = agent.get("securityContext", {}), agent.get("args", [])
    problems = [failure] if failure else []
    if security.get("privileged") is not True or "capabilities" in security:
        problems.append(f"securityContext {security}")
    if "--api-auth" in args or "--events" in args or args[-2:] != ["--pod-probe-port", "19891"]:
        problems.append(f"args {args}")
    report.check("privileged=true, apiAuth=none, events=false, podProbePort: the container and args follow", problems)
    if not failure:
        validate_all(report, "privileged", objects)

    for kube_version, want in (("1.20.2", {"maxUnavailable": 1}), ("1.21.0", {"maxUnavailable": 1}),
                               ("1.22.0", {"maxSurge": "10%", "maxUnavailable": 0})):
        objects, failure = render(helm, kube_version=kube_version)
        daemonset = next((o for o in objects if o.get("kind") == "DaemonSet"), {})
        got = ((daemonset.get("spec") or {}).get("updateStrategy") or {}).get("rollingUpdate")
        report.check(f"Kubernetes {kube_version}: rollingUpdate {want} (DaemonSet maxSurge is served from 1.22)",
                     [failure] if failure else ([] if got == want else [f"rollingUpdate {got}"]))

    for settings, why in ((["criSocket.runtime=docker"], "an unknown runtime"),
                          (["criSocket.runtime=custom"], "custom without a path"),
                          (["criSocket.runtime=custom", "criSocket.path=relative.sock"], "a relative socket path"),
                          (["apiAuth=tokens"], "an unknown apiAuth")):
        objects, failure = render(helm, *settings)
        report.check(f"{' '.join(settings)} fails to render ({why})", [] if failure else ["it rendered"],
                     next((l for l in failure.splitlines() if "rror" in l), failure)[:160] if failure else "")

    print(f"{report.passed} passed, {report.failed} failed")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
