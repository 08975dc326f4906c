#!/usr/bin/env python3
"""Checks the lifecycle Grafana dashboards.

    check_dashboards.py --structure                 structure only (no network)
    check_dashboards.py --prometheus URL            structure, then every panel query against URL

--structure, per dashboard: the JSON loads; schemaVersion >= 39; a stable uid; the generator
(build_dashboards.py) reproduces the file; a grafana-foundation-sdk round trip (when the package is
importable) loses no key, which catches misspelled or misplaced keys; unique panel ids; every
gridPos fits in 24 columns; every target has an expr; every variable used is defined; the
`datasource` variable exists and is of type prometheus, and every panel and target uses it; every
lifecycle_* metric the queries use is documented in docs/metrics.md.

--prometheus URL additionally runs each panel's expressions through /api/v1/query, after replacing
$__rate_interval -> 1m, $__interval -> 15s, $__range -> 1h and every query variable ($namespace,
$pod, ...) -> .*. A panel whose queries all return no series fails ("no data"), as does a query
Prometheus rejects. One exception: a panel that needs a metric of CONDITIONAL_METRICS (below: series
that exist only in some set-ups, such as the Kubernetes API's or kube-state-metrics') is reported
SKIP, with the reason, when it returns no series AND that Prometheus has no series of the metric at
all; where the metric exists, the panel must return data like any other.

One line per check (PASS/FAIL/SKIP), then "N passed, M failed" (and ", K skipped" when some were);
exit status 1 on any failure.
Standard library only, plus grafana-foundation-sdk when it can be imported.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
METRICS_DOC = ROOT / "docs" / "metrics.md"

# Grafana's own variables; anything else starting with __ is Grafana's as well.
BUILTIN_VARIABLES = {"timeFilter", "interval", "interval_ms", "range", "range_s", "range_ms", "rate_interval"}
# $name, ${name}, ${name:format}, [[name]]
VARIABLE_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_.]*)(?::[^}]*)?\}|\$([A-Za-z_][A-Za-z0-9_]*)|\[\[([A-Za-z_][A-Za-z0-9_]*)\]\]")
METRIC_RE = re.compile(r"\b(lifecycle_[a-z0-9_]+)")
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
# Metrics that exist only in some set-ups, and when. A panel needing one of them may have no data
# against a Prometheus that has no series of it (check_live reports it SKIP, not PASS).
# kube-state-metrics' kube_pod_owner is deliberately not here: the panels join it where present and
# fall back to the pod without it (by_owner() in build_dashboards.py), so they must have data either way.
CONDITIONAL_METRICS = {
    "lifecycle_kubernetes_api_up": "only agents given the Kubernetes API export it",
    "lifecycle_kubernetes_events_total": "only agents run with --events and the Kubernetes API export it, from their first Event",
    "lifecycle_status_disagreements_total": "exported from the first disagreement between a pod status the Kubernetes API "
                                            "reports and what the kernel saw: only agents given the API",
}
CONDITIONAL_RE = re.compile(r"\b(" + "|".join(map(re.escape, CONDITIONAL_METRICS)) + r")\b")


class Report:
    """Collects PASS/FAIL lines and counts."""

    def __init__(self) -> None:
        self.passed = 0
        self.failed = 0
        self.skipped = 0

    def skip(self, what: str, why: str) -> None:
        self.skipped += 1
        print(f"SKIP {what}: {why}")

    def ok(self, what: str, note: str = "") -> None:
        self.passed += 1
        print(f"PASS {what}" + (f" ({note})" if note else ""))

    def fail(self, what: str, why: str) -> None:
        self.failed += 1
        print(f"FAIL {what}: {why}")

    def check(self, what: str, problems: list[str], note: str = "") -> None:
        if problems:
            self.fail(what, "; ".join(problems))
        else:
            self.ok(what, note)


def dashboard_files() -> list[Path]:
    return sorted(HERE.glob("*.json"))


def all_panels(dashboard: dict) -> list[dict]:
    """Top-level panels plus the panels nested in collapsed rows."""
    out = []
    for panel in dashboard.get("panels", []):
        out.append(panel)
        out.extend(panel.get("panels", []) if panel.get("type") == "row" else [])
    return out


def variables_used(value) -> set[str]:
    """Every template variable referenced anywhere in a JSON value."""
    found: set[str] = set()
    if isinstance(value, dict):
        for item in value.values():
            found |= variables_used(item)
    elif isinstance(value, list):
        for item in value:
            found |= variables_used(item)
    elif isinstance(value, str):
        for match in VARIABLE_RE.finditer(value):
            name = next(group for group in match.groups() if group)
            found.add(name.split(".")[0])
    return found


def is_builtin(name: str) -> bool:
    return name.startswith("__") or name in BUILTIN_VARIABLES


def lost_keys(original, round_tripped, path: str = "") -> list[str]:
    """Key paths present in the original but missing or changed after the SDK round trip."""
    problems: list[str] = []
    if isinstance(original, dict):
        if not isinstance(round_tripped, dict):
            return [f"{path or '/'} became {type(round_tripped).__name__}"]
        for key, value in original.items():
            if key not in round_tripped:
                problems.append(f"{path}.{key} dropped")
            else:
                problems.extend(lost_keys(value, round_tripped[key], f"{path}.{key}"))
    elif isinstance(original, list):
        if not isinstance(round_tripped, list) or len(original) != len(round_tripped):
            return [f"{path} list changed"]
        for index, (a, b) in enumerate(zip(original, round_tripped)):
            problems.extend(lost_keys(a, b, f"{path}[{index}]"))
    elif original != round_tripped and not (isinstance(original, (int, float)) and original == round_tripped):
        problems.append(f"{path} {original!r} -> {round_tripped!r}")
    return problems


def sdk_round_trip():
    """Returns a function dashboard-dict -> list of problems, or None without the SDK."""
    try:
        from grafana_foundation_sdk.cog.encoder import JSONEncoder
        from grafana_foundation_sdk.cog.plugins import register_default_plugins
        from grafana_foundation_sdk.models.dashboard import Dashboard
    except ImportError:
        return None
    register_default_plugins()

    def run(data: dict) -> list[str]:
        try:
            again = json.loads(json.dumps(Dashboard.from_json(data), cls=JSONEncoder))
        except Exception as err:  # the SDK raises whatever its decoders raise
            return [f"SDK could not decode the dashboard: {err!r}"]
        return lost_keys(data, again)

    return run


def documented_metrics() -> set[str] | None:
    if not METRICS_DOC.exists():
        return None
    return set(re.findall(r"`(lifecycle_[a-z0-9_]+)", METRICS_DOC.read_text()))


def check_structure(report: Report, path: Path, data: dict, round_trip, documented: set[str] | None) -> None:
    name = path.name
    panels = all_panels(data)

    problems = []
    if not isinstance(data.get("schemaVersion"), int) or data["schemaVersion"] < 39:
        problems.append(f"schemaVersion {data.get('schemaVersion')!r} < 39")
    if not re.fullmatch(r"[a-z0-9-]{1,40}", str(data.get("uid", ""))):
        problems.append(f"uid {data.get('uid')!r} is not a stable slug")
    if not data.get("title"):
        problems.append("no title")
    report.check(f"{name}: schema version, uid, title", problems, f"uid {data.get('uid')}")

    if round_trip is None:
        print(f"SKIP {name}: grafana-foundation-sdk round trip (package not importable)")
    else:
        problems = round_trip(data)
        report.check(f"{name}: grafana-foundation-sdk round trip", problems[:10] + ([f"... {len(problems) - 10} more"] if len(problems) > 10 else []))

    ids = [panel.get("id") for panel in panels]
    duplicates = sorted({i for i in ids if ids.count(i) > 1 or i is None}, key=str)
    report.check(f"{name}: unique panel ids", [f"duplicate or missing ids {duplicates}"] if duplicates else [], f"{len(ids)} panels")

    problems = []
    for panel in panels:
        grid = panel.get("gridPos") or {}
        x, w, h, y = grid.get("x"), grid.get("w"), grid.get("h"), grid.get("y")
        if not all(isinstance(v, int) for v in (x, y, w, h)):
            problems.append(f"panel {panel.get('id')} gridPos incomplete: {grid}")
        elif x < 0 or w < 1 or h < 1 or x + w > 24:
            problems.append(f"panel {panel.get('id')} gridPos x={x} w={w} exceeds 24 columns")
    occupied: dict[tuple[int, int], object] = {}
    for panel in data.get("panels", []):  # nested row panels are laid out when the row opens
        grid = panel.get("gridPos") or {}
        if not all(isinstance(grid.get(k), int) for k in ("x", "y", "w", "h")):
            continue
        for cx in range(grid["x"], grid["x"] + grid["w"]):
            for cy in range(grid["y"], grid["y"] + grid["h"]):
                other = occupied.setdefault((cx, cy), panel.get("id"))
                if other != panel.get("id"):
                    problems.append(f"panel {panel.get('id')} overlaps panel {other}")
                    break
            else:
                continue
            break
    report.check(f"{name}: grid within 24 columns, no overlaps", problems)

    variables = {v.get("name"): v for v in data.get("templating", {}).get("list", [])}
    problems = []
    source = variables.get("datasource")
    if not source or source.get("type") != "datasource" or source.get("query") != "prometheus":
        problems.append("no `datasource` variable of type datasource/prometheus")
    for panel in panels:
        if panel.get("type") == "row":
            continue
        refs = [panel.get("datasource")] + [t.get("datasource") for t in panel.get("targets", [])]
        for ref in refs:
            if not isinstance(ref, dict) or ref.get("uid") not in ("${datasource}", "$datasource") or ref.get("type") != "prometheus":
                problems.append(f"panel {panel.get('id')} datasource {ref!r} is not the templated prometheus source")
                break
    for var_name, var in variables.items():
        if var.get("type") == "query" and (var.get("datasource") or {}).get("uid") not in ("${datasource}", "$datasource"):
            problems.append(f"variable {var_name} does not query ${{datasource}}")
    for wanted in ("namespace", "pod"):
        var = variables.get(wanted)
        if not var or not var.get("multi") or not var.get("includeAll"):
            problems.append(f"variable {wanted} missing or not multi/includeAll")
    report.check(f"{name}: datasource templated, namespace/pod variables", problems)

    problems = []
    for panel in panels:
        if panel.get("type") == "row":
            continue
        targets = panel.get("targets") or []
        if not targets:
            problems.append(f"panel {panel.get('id')} '{panel.get('title')}' has no targets")
        for target in targets:
            if not str(target.get("expr", "")).strip():
                problems.append(f"panel {panel.get('id')} target {target.get('refId')} has no expr")
        refs = [t.get("refId") for t in targets]
        if len(set(refs)) != len(refs):
            problems.append(f"panel {panel.get('id')} has duplicate refIds")
    report.check(f"{name}: every target has an expr", problems)

    # A table of what happened in the time range lists only what did: a row per container that
    # had none is noise an operator scrolls past (its first column is the one the rows are of).
    problems = []
    for panel in panels:
        if panel.get("type") != "table":
            continue
        first = (panel.get("targets") or [{}])[0]
        expr = str(first.get("expr", ""))
        if "increase(" in expr and not re.search(r">\s*0\s*$", expr):
            problems.append(f"panel {panel.get('id')} '{panel.get('title')}' lists rows whose count is 0 (end its query with > 0)")
    report.check(f"{name}: time-range tables list only what happened", problems)

    used = {v for v in variables_used({"panels": data.get("panels"), "templating": data.get("templating"), "links": data.get("links")}) if not is_builtin(v)}
    undefined = sorted(used - set(variables))
    report.check(f"{name}: every variable used is defined", [f"undefined: {', '.join(undefined)}"] if undefined else [],
                 f"uses {', '.join(sorted(used))}")

    exprs = " ".join(t.get("expr", "") for p in panels for t in p.get("targets", []))
    if documented is None:
        report.fail(f"{name}: metrics documented", f"{METRICS_DOC} is missing")
    else:
        def base(metric: str) -> str:
            for suffix in HISTOGRAM_SUFFIXES:
                if metric.endswith(suffix) and metric[: -len(suffix)] in documented:
                    return metric[: -len(suffix)]
            return metric
        missing = sorted({base(m) for m in METRIC_RE.findall(exprs)} - documented)
        report.check(f"{name}: metrics documented in docs/metrics.md", [f"undocumented: {', '.join(missing)}"] if missing else [])


def substitute(expr: str, variables: dict[str, dict]) -> str:
    expr = expr.replace("$__rate_interval", "1m").replace("${__rate_interval}", "1m")
    expr = expr.replace("$__interval", "15s").replace("${__interval}", "15s")
    expr = expr.replace("$__range", "1h").replace("${__range}", "1h")
    for name, var in variables.items():
        if var.get("type") in ("query", "custom", "textbox", "constant"):
            expr = re.sub(r"\$\{" + re.escape(name) + r"(?::[^}]*)?\}|\$" + re.escape(name) + r"\b|\[\[" + re.escape(name) + r"\]\]", ".*", expr)
    return expr


def query(base_url: str, expr: str, timeout: float) -> tuple[int | None, str]:
    """(series count, error text)."""
    url = base_url.rstrip("/") + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            body = json.load(response)
    except urllib.error.HTTPError as err:
        try:
            body = json.load(err)
        except ValueError:
            return None, f"HTTP {err.code}"
    except (urllib.error.URLError, TimeoutError, ValueError) as err:
        return None, f"cannot query {base_url}: {err}"
    if body.get("status") != "success":
        return None, f"{body.get('errorType')}: {body.get('error')}"
    result = body["data"]["result"]
    return (len(result) if isinstance(result, list) else 1), ""


def check_live(report: Report, path: Path, data: dict, base_url: str, timeout: float) -> None:
    variables = {v.get("name"): v for v in data.get("templating", {}).get("list", [])}
    for panel in all_panels(data):
        if panel.get("type") == "row":
            continue
        what = f"{path.name} panel {panel.get('id')} '{panel.get('title')}'"
        errors, series = [], 0
        for target in panel.get("targets", []):
            count, error = query(base_url, substitute(target.get("expr", ""), variables), timeout)
            if error:
                errors.append(f"{target.get('refId')}: {error}")
            else:
                series += count or 0
        if errors:
            report.fail(what, "; ".join(errors))
        elif series == 0:
            absent = absent_conditional_metrics(base_url, panel, timeout)
            if absent:
                report.skip(what, "no data, and this Prometheus has no series of "
                            + "; ".join(f"{m} ({CONDITIONAL_METRICS[m]})" for m in absent))
            else:
                report.fail(what, "no data")
        else:
            report.ok(what, f"{series} series")


def absent_conditional_metrics(base_url: str, panel: dict, timeout: float) -> list[str]:
    """The CONDITIONAL_METRICS the panel's queries use of which Prometheus has no series at all."""
    needed = {m for target in panel.get("targets", []) for m in CONDITIONAL_RE.findall(target.get("expr", ""))}
    absent = []
    for metric in sorted(needed):
        count, error = query(base_url, f"count({{__name__={json.dumps(metric)}}})", timeout)
        if not error and count == 0:
            absent.append(metric)
    return absent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--structure", action="store_true", help="structural checks only (the default without --prometheus)")
    parser.add_argument("--prometheus", metavar="URL", help="also run every panel query against this Prometheus, e.g. http://127.0.0.1:9090")
    parser.add_argument("--timeout", type=float, default=10.0, help="seconds per query (default 10)")
    args = parser.parse_args()

    report = Report()
    files = dashboard_files()
    report.check("dashboards present", [] if len(files) >= 4 else [f"expected 4 dashboards, found {len(files)}"],
                 ", ".join(f.name for f in files))

    generator = HERE / "build_dashboards.py"
    if generator.exists():
        result = subprocess.run([sys.executable, str(generator), "--check"], capture_output=True, text=True)
        report.check("JSON files match build_dashboards.py", [result.stderr.strip() or f"exit {result.returncode}"] if result.returncode else [])

    round_trip = sdk_round_trip()
    documented = documented_metrics()
    loaded: list[tuple[Path, dict]] = []
    uids: dict[str, str] = {}
    for path in files:
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            report.fail(f"{path.name}: JSON loads", str(err))
            continue
        report.ok(f"{path.name}: JSON loads")
        if data.get("uid") in uids:
            report.fail(f"{path.name}: uid unique", f"same uid as {uids[data['uid']]}")
        uids[data.get("uid")] = path.name
        check_structure(report, path, data, round_trip, documented)
        loaded.append((path, data))

    if args.prometheus:
        for path, data in loaded:
            check_live(report, path, data, args.prometheus, args.timeout)

    print(f"{report.passed} passed, {report.failed} failed" + (f", {report.skipped} skipped" if report.skipped else ""))
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
