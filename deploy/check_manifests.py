#!/usr/bin/env python3
"""Checks the deploy/ manifests and alert rules.

    target/pyenv/bin/python deploy/check_manifests.py

- every Kubernetes object in deploy/*.yaml (except the rule and rule-test files) validates with
  kubernetes-validate in strict mode against the oldest and newest Kubernetes versions below;
  custom resources it has no schema for (PodMonitor, PrometheusRule) are reported with a note and
  get apiVersion/kind/metadata checks instead;
- the DaemonSet keeps the properties the agent depends on (hostPID, capabilities, mounts, probes,
  --listen 0.0.0.0:9890, --health-listen 127.0.0.1:9892 and the probes on it, --handoff-dir and a
  surge update strategy, no container ports, tolerations,
  priority class);
- every alert has summary, description and runbook_url annotations and a severity label; its
  runbook_url is extract_rules.RUNBOOK_BASE#<alert name in lower case>, an absolute https URL, and
  docs/runbook.md has that section (its heading's anchor) saying what the alert means, how to
  confirm it and what to do, and no section for an alert that does not exist; `$value` in an
  annotation is always formatted (humanize, humanizeDuration, printf, ...), never printed raw;
- deploy/alerts.rules.yaml equals the extraction of deploy/prometheusrule.yaml (extract_rules.py);
- `promtool check rules deploy/alerts.rules.yaml` and `promtool test rules deploy/alerts.test.yaml`
  pass, and the tests make every alert fire at least once and stay silent at least once;
- every lifecycle_* metric the rules use is documented in docs/metrics.md.

One line per check (PASS/FAIL/NOTE), then "N passed, M failed"; exit status 1 on any failure.
Needs PyYAML and kubernetes-validate (deploy/requirements.txt) and promtool (Debian: prometheus).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import extract_rules  # noqa: E402  (sibling module)

KUBERNETES_VERSIONS = ("1.28.0", "1.37.0")
NOT_MANIFESTS = {"alerts.rules.yaml", "alerts.test.yaml", "kustomization.yaml"}
# The agent's whole API access: nothing else, nothing cluster-wide beyond it.
EXPECTED_RULES = {
    ("", "pods"): {"get", "list", "watch"},
    # The Node object, read alone: the kubelet's release. Not nodes/proxy (the kubelet's API,
    # which runs commands in pods); not list/watch (every node's).
    ("", "nodes"): {"get"},
    ("", "events"): {"get", "list", "watch", "create", "patch"},
    ("events.k8s.io", "events"): {"get", "list", "watch", "create", "patch"},
    ("authentication.k8s.io", "tokenreviews"): {"create"},
    ("authorization.k8s.io", "subjectaccessreviews"): {"create"},
    ("lifecycle.dev", "containers"): {"list"},
}
# The agent's JSON API as --api-auth asks RBAC about it (never non-resource URLs under /api/,
# which every authenticated user may get): the reader role grants exactly this.
READER_RULES = {("lifecycle.dev", "containers"): {"list"}, ("lifecycle.dev", "probes"): {"get"}}
CRD_GROUPS = {"monitoring.coreos.com"}
EXPECTED_CAPABILITIES = {"BPF", "PERFMON", "SYS_ADMIN", "SYS_PTRACE", "SYSLOG", "SYS_NICE"}
EXPECTED_MOUNTS = {
    "/sys/fs/cgroup",
    "/sys/kernel/btf",
    "/sys/kernel/tracing",
    "/host/proc",
    "/run/containerd",
    "/var/run/crio",
    "/run/lifecycle-agent",
}
# Runtime sockets are replaced on every runtime restart: mount their directories, never the file.
RUNTIME_DIRECTORIES = {"/run/containerd", "/var/run/crio"}
NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


class Report:
    def __init__(self) -> None:
        self.passed = 0
        self.failed = 0

    def check(self, what: str, problems: list[str], note: str = "") -> None:
        if problems:
            self.failed += 1
            print(f"FAIL {what}: " + "; ".join(problems))
        else:
            self.passed += 1
            print(f"PASS {what}" + (f" ({note})" if note else ""))


def manifests() -> list[tuple[Path, int, dict]]:
    out = []
    for path in sorted(HERE.glob("*.yaml")):
        if path.name in NOT_MANIFESTS:
            continue
        for index, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc:
                out.append((path, index, doc))
    return out


def basic_problems(doc: dict) -> list[str]:
    problems = []
    if not re.fullmatch(r"([a-z0-9.-]+/)?v[0-9]+((alpha|beta)[0-9]+)?", str(doc.get("apiVersion", ""))):
        problems.append(f"apiVersion {doc.get('apiVersion')!r}")
    if not re.fullmatch(r"[A-Z][A-Za-z0-9]*", str(doc.get("kind", ""))):
        problems.append(f"kind {doc.get('kind')!r}")
    meta = doc.get("metadata")
    if not isinstance(meta, dict) or not NAME_RE.match(str(meta.get("name", ""))):
        problems.append("metadata.name missing or not a DNS name")
    elif "namespace" in meta and not NAME_RE.match(str(meta["namespace"])):
        problems.append(f"metadata.namespace {meta['namespace']!r}")
    for key in ("labels", "annotations"):
        if isinstance(meta, dict) and key in meta and not all(isinstance(v, str) for v in (meta[key] or {}).values()):
            problems.append(f"metadata.{key} values must be strings")
    return problems


def validate(report: Report, path: Path, index: int, doc: dict) -> None:
    import kubernetes_validate

    what = f"{path.name}[{index}] {doc.get('kind')}/{(doc.get('metadata') or {}).get('name')}"
    problems = basic_problems(doc)
    group = str(doc.get("apiVersion", "")).split("/")[0]
    if group in CRD_GROUPS:
        print(f"NOTE {what}: kubernetes-validate has no schema for {doc.get('apiVersion')} {doc.get('kind')}; checked apiVersion/kind/metadata and spec below")
        problems += crd_problems(doc)
        report.check(what, problems, "custom resource")
        return
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as err:
            location = ".".join(str(p) for p in err.path)
            problems.append(f"k8s {version}: {location}: {err.message}")
        except kubernetes_validate.SchemaNotFoundError as err:
            problems.append(f"k8s {version}: no schema ({err})")
    report.check(what, problems, f"kubernetes-validate strict, k8s {' and '.join(KUBERNETES_VERSIONS)}")


def crd_problems(doc: dict) -> list[str]:
    """The few spec fields whose mistakes would silently disable scraping or alerting."""
    spec = doc.get("spec") or {}
    problems = []
    if doc.get("kind") == "PodMonitor":
        endpoints = spec.get("podMetricsEndpoints") or []
        if not spec.get("selector", {}).get("matchLabels"):
            problems.append("PodMonitor without spec.selector.matchLabels")
        if not endpoints:
            problems.append("PodMonitor without podMetricsEndpoints")
        for endpoint in endpoints:
            # By number: the agent declares no container ports (they would be host ports, which
            # rule out the DaemonSet's surge update).
            if endpoint.get("targetPort") != 9890:
                problems.append("endpoint targetPort is not the agent's --listen port 9890")
            if endpoint.get("honorLabels") is not True:
                problems.append("honorLabels must be true (the agent's namespace/pod/container labels)")
    elif doc.get("kind") == "ServiceMonitor":
        # The Helm chart's (serviceMonitor.enabled): the same scrape through a headless Service.
        endpoints = spec.get("endpoints") or []
        if not spec.get("selector", {}).get("matchLabels"):
            problems.append("ServiceMonitor without spec.selector.matchLabels")
        if not endpoints:
            problems.append("ServiceMonitor without endpoints")
        for endpoint in endpoints:
            if endpoint.get("honorLabels") is not True:
                problems.append("honorLabels must be true (the agent's namespace/pod/container labels)")
    elif doc.get("kind") == "PrometheusRule":
        if not spec.get("groups"):
            problems.append("PrometheusRule without spec.groups")
    else:
        problems.append(f"unexpected custom resource kind {doc.get('kind')}")
    return problems


def daemonset_problems(doc: dict) -> list[str]:
    pod = doc["spec"]["template"]["spec"]
    problems = []
    if pod.get("hostPID") is not True:
        problems.append("hostPID must be true")
    if pod.get("priorityClassName") != "system-node-critical":
        problems.append("priorityClassName must be system-node-critical")
    if not any(t.get("operator") == "Exists" and "key" not in t for t in pod.get("tolerations", [])):
        problems.append("needs a toleration {operator: Exists} to run on every node")
    agent = pod["containers"][0]
    args = agent.get("args", [])
    # Issue 37: the agents take only tokens minted for them, never a user's own credential.
    if not any(a == "--api-auth-audience" and b == "lifecycle-agent" for a, b in zip(args, args[1:])):
        problems.append("the agent must require the agents' audience: --api-auth-audience lifecycle-agent")
    security = agent.get("securityContext", {})
    caps = set(security.get("capabilities", {}).get("add", []))
    if security.get("privileged"):
        problems.append("privileged: true (use the listed capabilities)")
    if caps != EXPECTED_CAPABILITIES:
        problems.append(f"capabilities {sorted(caps)} != {sorted(EXPECTED_CAPABILITIES)}")
    if security.get("capabilities", {}).get("drop") != ["ALL"]:
        problems.append("capabilities.drop must be [ALL]")
    mounts = {m["mountPath"] for m in agent.get("volumeMounts", [])}
    if EXPECTED_MOUNTS - mounts:
        problems.append(f"missing mounts {sorted(EXPECTED_MOUNTS - mounts)}")
    volumes = {v.get("name"): v for v in (doc["spec"]["template"]["spec"].get("volumes") or [])}
    for mount in agent.get("volumeMounts", []):
        host_path = (volumes.get(mount.get("name")) or {}).get("hostPath") or {}
        if host_path.get("type") == "Socket" or str(host_path.get("path", "")).endswith(".sock"):
            problems.append(f"{mount['mountPath']}: mount the runtime's socket directory, not the socket file")
        if mount["mountPath"] in RUNTIME_DIRECTORIES and not mount.get("readOnly"):
            problems.append(f"{mount['mountPath']} must be read-only")
    args = agent.get("args", [])
    if "--listen" not in args or args[args.index("--listen") + 1] != "0.0.0.0:9890":
        problems.append("args must contain --listen 0.0.0.0:9890")
    # 0.0.0.0 with hostNetwork: every pod can reach the listener, so its API must ask who is asking.
    if "--api-auth" not in args or args[args.index("--api-auth") + 1:][:1] != ["kubernetes"]:
        problems.append("args must contain --api-auth kubernetes (the API is on every node address)")
    if agent.get("ports"):
        problems.append("the agent declares no container ports (with hostNetwork they are host ports, "
                        "which rule out maxSurge)")
    # The kubelet's probes of the agent have a listener of their own, whose places no client of
    # --listen can take.
    # On the node's loopback: no client elsewhere in the cluster reaches it.
    if "--health-listen" not in args or args[args.index("--health-listen") + 1] != "127.0.0.1:9892":
        problems.append("args must contain --health-listen 127.0.0.1:9892")
    if "--handoff-dir" not in args or args[args.index("--handoff-dir") + 1] != "/run/lifecycle-agent":
        problems.append("args must contain --handoff-dir /run/lifecycle-agent")
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = (agent.get(probe) or {}).get("httpGet") or {}
        if get.get("path") != path or get.get("port") != 9892 or get.get("host") != "127.0.0.1":
            problems.append(f"{probe} must be httpGet {path} on 127.0.0.1, the health port 9892")
    # The socket keeper: a second container with the agent's --keeper-dir, in a volume only the
    # pod mounts, with no capability at all.
    keeper_dir = args[args.index("--keeper-dir") + 1] if "--keeper-dir" in args else None
    keepers = [c for c in pod["containers"][1:] if (c.get("args") or [])[:1] == ["keep-sockets"]]
    if keeper_dir is None or len(keepers) != 1:
        problems.append("a `keep-sockets` container and the agent's --keeper-dir are required (listeners that "
                        "survive an in-place restart of the agent)")
    else:
        keeper = keepers[0]
        keeper_args = keeper.get("args") or []
        if "--dir" not in keeper_args or keeper_args[keeper_args.index("--dir") + 1] != keeper_dir:
            problems.append("the keeper's --dir must be the agent's --keeper-dir")
        keeper_caps = (keeper.get("securityContext") or {}).get("capabilities") or {}
        if keeper_caps.get("drop") != ["ALL"] or keeper_caps.get("add"):
            problems.append("the keeper drops every capability and adds none")
        for container in (agent, keeper):
            mount = next((m for m in container.get("volumeMounts", []) if m.get("mountPath") == keeper_dir), None)
            volume = volumes.get((mount or {}).get("name")) or {}
            if "emptyDir" not in volume:
                problems.append(f"{container['name']}: {keeper_dir} must be an emptyDir (only the pod mounts it)")
    rolling = ((doc["spec"].get("updateStrategy") or {}).get("rollingUpdate")) or {}
    if rolling.get("maxUnavailable") not in (0, "0", "0%") or not rolling.get("maxSurge"):
        problems.append("updateStrategy must surge (maxSurge > 0, maxUnavailable 0): the next agent takes "
                        "the pod probe listeners before this one stops")
    resources = agent.get("resources", {})
    if not resources.get("requests") or not resources.get("limits"):
        problems.append("resources.requests and resources.limits are required")
    return problems


RUNBOOK = ROOT / "docs" / "runbook.md"
# The parts every runbook section has.
RUNBOOK_PARTS = ("**What it means.**", "**Confirm.**", "**What to do.**")
RAW_VALUE = re.compile(r"\{\{-?\s*\$value\s*-?\}\}")


def rule_problems(groups: list[dict]) -> list[str]:
    problems = []
    for group in groups:
        for rule in group.get("rules", []):
            if "alert" not in rule:
                continue
            annotations = rule.get("annotations", {})
            missing = [a for a in ("summary", "description", "runbook_url") if not annotations.get(a)]
            if missing:
                problems.append(f"{rule['alert']}: no {', '.join(missing)}")
            if "{{ $labels.pod }}" not in annotations.get("summary", ""):
                problems.append(f"{rule['alert']}: summary does not name the pod")
            if not rule.get("labels", {}).get("severity"):
                problems.append(f"{rule['alert']}: no severity label")
            want = f"{extract_rules.RUNBOOK_BASE}#{rule['alert'].lower()}"
            if annotations.get("runbook_url") != want or not want.startswith("https://"):
                problems.append(f"{rule['alert']}: runbook_url {annotations.get('runbook_url')!r}, want {want!r}")
            raw = [name for name, text in annotations.items() if RAW_VALUE.search(str(text))]
            if raw:
                problems.append(f"{rule['alert']}: $value printed unformatted in {', '.join(raw)} (humanize, printf, ...)")
    return problems


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def runbook_problems(alerts: list[str]) -> list[str]:
    """docs/runbook.md: one `## <alert>` section per alert (its anchor the runbook_url's), each with
    RUNBOOK_PARTS, and no section for an alert that does not exist."""
    if not RUNBOOK.exists():
        return [f"{RUNBOOK} is missing"]
    sections: dict[str, str] = {}
    for chunk in re.split(r"^## ", RUNBOOK.read_text(), flags=re.M)[1:]:
        heading, _, body = chunk.partition("\n")
        sections[github_anchor(heading)] = body
    problems = []
    for alert in alerts:
        body = sections.get(alert.lower())
        if body is None:
            problems.append(f"no section #{alert.lower()} for {alert}")
            continue
        missing = [part for part in RUNBOOK_PARTS if part not in body]
        if missing:
            problems.append(f"#{alert.lower()} lacks {', '.join(missing)}")
    stale = sorted(set(sections) - {a.lower() for a in alerts})
    if stale:
        problems.append(f"sections for no alert: {', '.join(stale)}")
    return problems


def alerts_in(groups: list[dict]) -> list[str]:
    return [r["alert"] for g in groups for r in g.get("rules", []) if "alert" in r]


def test_coverage_problems(alerts: list[str], tests: dict) -> list[str]:
    fires, silent = set(), set()
    for test in tests.get("tests", []):
        for case in test.get("alert_rule_test", []):
            (fires if case.get("exp_alerts") else silent).add(case.get("alertname"))
    problems = []
    for alert in alerts:
        if alert not in fires:
            problems.append(f"{alert} is never expected to fire")
        if alert not in silent:
            problems.append(f"{alert} is never expected to stay silent")
    return problems


def run(command: list[str]) -> tuple[int, str]:
    result = subprocess.run(command, cwd=HERE, capture_output=True, text=True)
    return result.returncode, (result.stdout + result.stderr).strip()


def granted_by(role: dict) -> tuple[dict, dict, list[str]]:
    """(resource grants, non-resource URL grants, wildcard problems) of a ClusterRole."""
    resources: dict[tuple[str, str], set[str]] = {}
    urls: dict[str, set[str]] = {}
    problems = []
    for rule in role.get("rules") or []:
        verbs = rule.get("verbs") or []
        if "*" in verbs:
            problems.append(f"wildcard verb in {rule}")
        for group in rule.get("apiGroups") or []:
            for resource in rule.get("resources") or []:
                if "*" in (group, resource):
                    problems.append(f"wildcard in {rule}")
                resources.setdefault((group, resource), set()).update(verbs)
        for url in rule.get("nonResourceURLs") or []:
            if url in ("*", "/*"):
                problems.append(f"wildcard URL in {rule}")
            urls.setdefault(url, set()).update(verbs)
    return resources, urls, problems


# What a `kubectl lifecycle` user needs across the cluster (a pod's node, a namespace's nodes, a
# gone pod's node from Events), and in the agents' namespace: mint the reader account's token
# (that account alone), read the agents' DaemonSet, reach the agent pods through the proxy.
PLUGIN_USER_RULES = {("", "pods"): {"get", "list"}, ("", "events"): {"list"}}
PLUGIN_USER_NAMESPACED = {("", "serviceaccounts/token"): {"create"}, ("apps", "daemonsets"): {"get"},
                          ("", "pods"): {"list"}, ("", "pods/proxy"): {"get"}}


def plugin_role_problems(roles: list[dict]) -> list[str]:
    """The plugin user's Role: its grants, and the token and DaemonSet rules limited by name."""
    role = next((r for r in roles if r.get("metadata", {}).get("name") == "lifecycle-plugin-user"), None)
    if role is None:
        return ["no Role lifecycle-plugin-user"]
    resources, urls, problems = granted_by(role)
    if resources != PLUGIN_USER_NAMESPACED or urls:
        problems.append(f"lifecycle-plugin-user (Role) grants {resources}, want {PLUGIN_USER_NAMESPACED}")
    for rule in role.get("rules") or []:
        named = {"serviceaccounts/token": ["lifecycle-reader"], "daemonsets": ["lifecycle-agent"]}
        for resource, names in named.items():
            if resource in (rule.get("resources") or []) and rule.get("resourceNames") != names:
                problems.append(f"{resource} must be limited to {names}: {rule}")
    return problems


def krew_problems() -> list[str]:
    """deploy/krew/lifecycle.yaml: the plugin for linux, darwin and windows, each archive named by
    the placeholders a release fills, the binary the crate builds."""
    path = HERE / "krew" / "lifecycle.yaml"
    if not path.exists():
        return [f"{path} is missing"]
    doc = yaml.safe_load(path.read_text())
    problems = []
    if (doc.get("kind"), doc.get("metadata", {}).get("name")) != ("Plugin", "lifecycle"):
        problems.append("want kind Plugin named lifecycle")
    seen = set()
    for platform in doc.get("spec", {}).get("platforms", []):
        labels = platform.get("selector", {}).get("matchLabels", {})
        os_arch = (labels.get("os"), labels.get("arch"))
        seen.add(os_arch)
        want_sha = "${SHA256_%s_%s}" % (str(os_arch[0]).upper(), str(os_arch[1]).upper())
        if platform.get("sha256") != want_sha:
            problems.append(f"{os_arch}: sha256 {platform.get('sha256')!r}, want the placeholder {want_sha}")
        if not str(platform.get("uri", "")).startswith("${RELEASE_URL}/kubectl-lifecycle-${VERSION}-"):
            problems.append(f"{os_arch}: uri {platform.get('uri')!r}")
        want_bin = "kubectl-lifecycle.exe" if os_arch[0] == "windows" else "kubectl-lifecycle"
        if platform.get("bin") != want_bin:
            problems.append(f"{os_arch}: bin {platform.get('bin')!r}, want {want_bin}")
    for needed in [("linux", "amd64"), ("darwin", "arm64"), ("windows", "amd64")]:
        if needed not in seen:
            problems.append(f"no platform {needed}")
    return problems


def rbac_problems(roles: list[dict]) -> list[str]:
    by_name = {role.get("metadata", {}).get("name"): role for role in roles}
    if set(by_name) != {"lifecycle-agent", "lifecycle-api-reader", "lifecycle-plugin-user"}:
        return [f"ClusterRoles {sorted(map(str, by_name))}, want lifecycle-agent, lifecycle-api-reader and "
                "lifecycle-plugin-user"]
    resources, urls, plugin = granted_by(by_name["lifecycle-plugin-user"])
    if resources != PLUGIN_USER_RULES or urls or plugin:
        return [f"lifecycle-plugin-user grants {resources} and URLs {urls}, want only {PLUGIN_USER_RULES}"] + plugin
    resources, urls, problems = granted_by(by_name["lifecycle-agent"])
    if resources != EXPECTED_RULES or urls:
        problems.append(f"lifecycle-agent grants {resources} and URLs {urls}, want {EXPECTED_RULES}")
    resources, urls, reader = granted_by(by_name["lifecycle-api-reader"])
    problems += reader
    if resources != READER_RULES or urls:
        problems.append(f"lifecycle-api-reader grants {resources} and URLs {urls}, want only {READER_RULES}")
    return problems


def main() -> int:
    report = Report()

    docs = manifests()
    for path, index, doc in docs:
        validate(report, path, index, doc)
    for path, index, doc in docs:
        if doc.get("kind") == "DaemonSet":
            report.check(f"{path.name}[{index}] DaemonSet agent requirements", daemonset_problems(doc))

    roles = [doc for _, _, doc in docs if doc.get("kind") == "ClusterRole"]
    report.check("rbac.yaml: the agent's ClusterRole grants exactly pods get/list/watch, nodes get, events get/list/watch/create/patch, "
                 "token and access reviews, and its own API; the reader role only the API; the plugin user's only "
                 "pods get/list and events list",
                 rbac_problems(roles))
    namespaced = [doc for _, _, doc in docs if doc.get("kind") == "Role"]
    report.check("rbac.yaml: the plugin user's Role mints the reader account's token alone, reads the agents' "
                 "DaemonSet alone, lists and proxies to pods", plugin_role_problems(namespaced))
    report.check("krew/lifecycle.yaml: the plugin for linux, darwin and windows, with a release's placeholders",
                 krew_problems())
    kubectl = shutil.which("kubectl")
    if kubectl:
        code, output = run([kubectl, "kustomize", str(HERE)])
        kinds = sorted(set(re.findall(r"^kind: (\w+)$", output, re.M))) if not code else []
        want = ["ClusterRole", "ClusterRoleBinding", "DaemonSet", "Namespace", "Role", "ServiceAccount"]
        report.check("kubectl kustomize deploy/ renders the agent (apply -k deploy/)",
                     [output] if code else ([] if kinds == want else [f"kinds {kinds}, want {want}"]))
    else:
        print("NOTE kubectl not on PATH: kustomization not rendered")

    rule = next((doc for _, _, doc in docs if doc.get("kind") == "PrometheusRule"), None)
    groups = (rule or {}).get("spec", {}).get("groups", [])
    report.check("prometheusrule.yaml: alerts have severity, summary naming the pod, description, runbook_url under "
                 "RUNBOOK_BASE, $value formatted",
                 rule_problems(groups) if rule else ["no PrometheusRule found"], f"{len(alerts_in(groups))} alerts")
    report.check("docs/runbook.md: a section per alert (what it means, confirm, what to do), none for other names",
                 runbook_problems(alerts_in(groups)), extract_rules.RUNBOOK_BASE)

    rules_file = HERE / "alerts.rules.yaml"
    extracted = extract_rules.extract()
    current = rules_file.read_text() if rules_file.exists() else ""
    report.check("alerts.rules.yaml equals extract_rules.py output of prometheusrule.yaml",
                 [] if current == extracted else ["differs: run `python3 deploy/extract_rules.py`"])

    promtool = shutil.which("promtool")
    if not promtool:
        report.check("promtool available", ["promtool not on PATH (apt-get install --no-install-recommends prometheus)"])
    else:
        code, output = run([promtool, "check", "rules", "alerts.rules.yaml"])
        report.check("promtool check rules alerts.rules.yaml", [output] if code else [], output.splitlines()[-1].strip() if output else "")
        code, output = run([promtool, "test", "rules", "alerts.test.yaml"])
        report.check("promtool test rules alerts.test.yaml", [output] if code else [])

    tests_file = HERE / "alerts.test.yaml"
    tests = yaml.safe_load(tests_file.read_text()) if tests_file.exists() else {}
    report.check("alerts.test.yaml: every alert fires in a test and stays silent in one", test_coverage_problems(alerts_in(groups), tests or {}))

    doc_path = ROOT / "docs" / "metrics.md"
    if doc_path.exists():
        documented = set(re.findall(r"`(lifecycle_[a-z0-9_]+)", doc_path.read_text()))
        used = set(re.findall(r"\b(lifecycle_[a-z0-9_]+)", " ".join(str(r.get("expr", "")) for g in groups for r in g.get("rules", []))))
        report.check("metrics used by the rules are documented in docs/metrics.md",
                     [f"undocumented: {', '.join(sorted(used - documented))}"] if used - documented else [])
    else:
        report.check("metrics used by the rules are documented in docs/metrics.md", [f"{doc_path} is missing"])

    print(f"{report.passed} passed, {report.failed} failed")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
