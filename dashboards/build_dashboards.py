#!/usr/bin/env python3
"""Generates the four lifecycle Grafana dashboards as JSON (schemaVersion 39).

The JSON files in this directory are the deliverable that Grafana imports; this script is how they
are written, so that ids, grid positions, variables and datasource references stay consistent.
Edit the panel lists below, then run:

    python3 dashboards/build_dashboards.py           # rewrite the JSON files
    python3 dashboards/build_dashboards.py --check   # exit 1 if a JSON file differs from the output

Standard library only. `check_dashboards.py --structure` runs the `--check` comparison too.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCHEMA_VERSION = 39
DS = {"type": "prometheus", "uid": "${datasource}"}

# Label selectors. Container series carry the kube-state-metrics labels; agent-health series carry
# only the labels the scrape adds (the agent's own namespace/pod and, with the PodMonitor in deploy/,
# `node`), so they are filtered by node only.
S = 'namespace=~"$namespace", pod=~"$pod", node=~"$node"'
N = 'node=~"$node"'
# The termination histograms are aggregated per namespace (and outcome) by the agent: no pod label.
NS = 'namespace=~"$namespace", node=~"$node"'

RANGE = "$__range"
RATE = "$__rate_interval"
STEP = "$__interval"
# The agent's scrape job: the PodMonitor in deploy/ names it `lifecycle-system/lifecycle-agent`, the
# chart's ServiceMonitor `lifecycle-agent-metrics`, a plain scrape config usually `lifecycle-agent`.
# The alerts in deploy/prometheusrule.yaml select it the same way.
JOB = 'job=~".*lifecycle-agent.*"'


def inc(metric: str, selector: str, window: str) -> str:
    """increase() of `metric{selector}` over `window` that also counts series born inside the window.

    Plain increase() takes a series' first sample as its baseline. Several of the agent's series
    are only created with their first event (exits per reason and code, signals per sender,
    termination histograms per outcome, probe requests per code), and every series of a container
    that lived less than one scrape interval appears already non-zero (an OOM kill at start-up, a
    first crash): plain increase() shows 0 for all of them. A series with no sample one window ago
    counts in full instead, which is exact because the agent's counters start at 0 when their series
    is created (the same rule the alerts in deploy/prometheusrule.yaml use)."""
    series = f"{metric}{{{selector}}}"
    return f"((increase({series}[{window}]) and {series} offset {window}) or ({series} unless {series} offset {window}))"

def pod_owner(window: str) -> str:
    """kube-state-metrics' kube_pod_owner reduced to one series per pod: the controller that owns it
    (owner_kind, owner_name), remembered over `window` so that a pod deleted since (most grace
    violations happen on deletion) keeps its owner. Empty without kube-state-metrics."""
    return ("topk by (namespace, pod) (1, max by (namespace, pod, owner_kind, owner_name) "
            f'(last_over_time(kube_pod_owner{{owner_is_controller="true"}}[{window}])))')


def by_owner(expr: str, window: str) -> str:
    """`expr` (series with namespace and pod labels) with the pod's owner_kind and owner_name from
    kube_pod_owner; a pod kube-state-metrics does not know (or every pod, without kube-state-metrics)
    is its own owner: owner_kind="Pod", owner_name=<the pod> (host cgroups, without a pod, get neither)."""
    return (f"(({expr}) * on (namespace, pod) group_left (owner_kind, owner_name) {pod_owner(window)})"
            f' or on (namespace, pod) label_join(label_replace({expr}, "owner_kind", "Pod", "pod", ".+"), "owner_name", "", "pod")')


def last_increase(metric: str, selector: str, window: str, step: str) -> str:
    """Per series of `metric{selector}` that increased within `window`: the Unix time (at `step`
    resolution) from which it has had its last value, i.e. when it last increased. A series born
    inside the window counts from its first sample, as in inc(). The subquery's steps are aligned
    to multiples of `step`: an increase after the last of them is dated by the series' last sample."""
    series = f"{metric}{{{selector}}}"
    return (f"((min_over_time(timestamp({series} == last_over_time({series}[{window}] @ end()))[{window}:{step}])"
            f" or timestamp({series})) and ({inc(metric, selector, window)} > 0))")


TERMINATION_UID = "lifecycle-termination"
RESTARTS_UID = "lifecycle-restarts"
PROBES_UID = "lifecycle-probes"
OVERVIEW_UID = "lifecycle-overview"


# ----------------------------------------------------------------------------------------------
# Panel builders. Each returns a dict without id/gridPos; `layout` assigns both.
# ----------------------------------------------------------------------------------------------

def target(expr: str, legend: str = "__auto", ref: str = "A", instant: bool = False, fmt: str = "time_series") -> dict:
    return {
        "datasource": DS,
        "editorMode": "code",
        "expr": expr,
        "format": fmt,
        "instant": instant,
        "legendFormat": legend,
        "range": not instant,
        "refId": ref,
    }


def targets(*specs: tuple, instant: bool = False, fmt: str = "time_series") -> list[dict]:
    """specs are (expr, legend) pairs; refIds are A, B, C..."""
    return [target(expr, legend, chr(ord("A") + i), instant, fmt) for i, (expr, legend) in enumerate(specs)]


def thresholds(*steps: tuple) -> dict:
    """steps: (value or None for the base, colour)."""
    return {"mode": "absolute", "steps": [{"color": c, "value": v} for v, c in steps]}


GREEN_ONLY = thresholds((None, "green"))
ANY_IS_RED = thresholds((None, "green"), (1, "red"))


def field_defaults(unit: str, thr: dict, custom: dict | None = None, mappings: list | None = None,
                   links: list | None = None, min_: float | None = None) -> dict:
    defaults: dict = {"color": {"mode": "palette-classic"}, "mappings": mappings or [], "thresholds": thr, "unit": unit}
    if custom is not None:
        defaults["custom"] = custom
    if links:
        defaults["links"] = links
    if min_ is not None:
        defaults["min"] = min_
    return {"defaults": defaults, "overrides": []}


def timeseries(title: str, description: str, tgts: list[dict], unit: str = "short", w: int = 12, h: int = 8,
               bars: bool = False, stack: bool = False, interpolation: str = "linear") -> dict:
    custom = {
        "axisBorderShow": False,
        "axisCenteredZero": False,
        "axisColorMode": "text",
        "axisLabel": "",
        "axisPlacement": "auto",
        "barAlignment": 0,
        "drawStyle": "bars" if bars else "line",
        "fillOpacity": 60 if bars else 10,
        "gradientMode": "none",
        "hideFrom": {"legend": False, "tooltip": False, "viz": False},
        "insertNulls": False,
        "lineInterpolation": interpolation,
        "lineWidth": 1,
        "pointSize": 4,
        "scaleDistribution": {"type": "linear"},
        "showPoints": "auto",
        "spanNulls": False,
        "stacking": {"group": "A", "mode": "normal" if stack else "none"},
        "thresholdsStyle": {"mode": "off"},
    }
    return {
        "type": "timeseries",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": tgts,
        "fieldConfig": field_defaults(unit, GREEN_ONLY, custom=custom),
        "options": {
            "legend": {"calcs": ["max", "lastNotNull"], "displayMode": "table", "placement": "right", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        },
        "_size": (w, h),
    }


def stat(title: str, description: str, expr: str, unit: str = "short", thr: dict = GREEN_ONLY, w: int = 4, h: int = 4,
         legend: str = "__auto", mappings: list | None = None, links: list | None = None, instant: bool = True) -> dict:
    return {
        "type": "stat",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": [target(expr, legend, instant=instant)],
        "fieldConfig": field_defaults(unit, thr, mappings=mappings, links=links),
        "options": {
            "colorMode": "value",
            "graphMode": "none",
            "justifyMode": "auto",
            "orientation": "auto",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "showPercentChange": False,
            "textMode": "auto",
            "wideLayout": True,
        },
        "_size": (w, h),
    }


def table(title: str, description: str, expr: str, unit: str = "short", w: int = 24, h: int = 8,
          links: list | None = None, hide: tuple = ("Time",)) -> dict:
    return {
        "type": "table",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": [target(expr, "__auto", instant=True, fmt="table")],
        "fieldConfig": field_defaults(unit, GREEN_ONLY, custom={"align": "auto", "cellOptions": {"type": "auto"}, "inspect": False},
                                      links=links),
        "options": {
            "cellHeight": "sm",
            "footer": {"countRows": False, "fields": "", "reducer": ["sum"], "show": False},
            "showHeader": True,
            "sortBy": [{"desc": True, "displayName": "Value"}],
        },
        "transformations": [{"id": "organize", "options": {"excludeByName": {name: True for name in hide}, "indexByName": {}, "renameByName": {}}}],
        "_size": (w, h),
    }


def merged_table(title: str, description: str, columns: list[tuple], w: int = 24, h: int = 8,
                 hide: tuple = ("Time",)) -> dict:
    """A table of several instant queries joined on their labels (Grafana's merge transformation):
    columns are (expr, column title, unit); the first column sorts the rows."""
    tgts = [target(expr, "__auto", chr(ord("A") + i), instant=True, fmt="table") for i, (expr, _, _) in enumerate(columns)]
    rename = {f"Value #{chr(ord('A') + i)}": name for i, (_, name, _) in enumerate(columns)}
    overrides = [{"matcher": {"id": "byName", "options": name}, "properties": [{"id": "unit", "value": unit}]}
                 for _, name, unit in columns]
    config = field_defaults("short", GREEN_ONLY, custom={"align": "auto", "cellOptions": {"type": "auto"}, "inspect": False})
    config["overrides"] = overrides
    return {
        "type": "table",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": tgts,
        "fieldConfig": config,
        "options": {
            "cellHeight": "sm",
            "footer": {"countRows": False, "fields": "", "reducer": ["sum"], "show": False},
            "showHeader": True,
            "sortBy": [{"desc": True, "displayName": columns[0][1]}],
        },
        "transformations": [
            {"id": "merge", "options": {}},
            {"id": "organize", "options": {"excludeByName": {name: True for name in hide}, "indexByName": {}, "renameByName": rename}},
        ],
        "_size": (w, h),
    }


def bargauge(title: str, description: str, expr: str, legend: str, unit: str = "short", w: int = 12, h: int = 8) -> dict:
    return {
        "type": "bargauge",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": [target(expr, legend, instant=True)],
        "fieldConfig": field_defaults(unit, GREEN_ONLY, min_=0),
        "options": {
            "displayMode": "gradient",
            "maxVizHeight": 300,
            "minVizHeight": 16,
            "minVizWidth": 8,
            "namePlacement": "auto",
            "orientation": "horizontal",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "showUnfilled": True,
            "sizing": "auto",
            "valueMode": "color",
        },
        "_size": (w, h),
    }


def heatmap(title: str, description: str, expr: str, unit: str, w: int = 12, h: int = 8) -> dict:
    return {
        "type": "heatmap",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": [target(expr, "{{le}}", fmt="heatmap")],
        "fieldConfig": {"defaults": {"custom": {"hideFrom": {"legend": False, "tooltip": False, "viz": False},
                                                "scaleDistribution": {"type": "linear"}}}, "overrides": []},
        "options": {
            "calculate": False,
            "cellGap": 1,
            "color": {"exponent": 0.5, "fill": "dark-orange", "mode": "scheme", "reverse": False, "scale": "exponential",
                      "scheme": "Oranges", "steps": 64},
            "exemplars": {"color": "rgba(255,0,255,0.7)"},
            "filterValues": {"le": 1e-9},
            "legend": {"show": True},
            "rowsFrame": {"layout": "auto"},
            "tooltip": {"mode": "single", "showColorScale": False, "yHistogram": True},
            "yAxis": {"axisPlacement": "left", "reverse": False, "unit": unit},
        },
        "_size": (w, h),
    }


PASS_FAIL = [{"type": "value", "options": {"0": {"color": "red", "index": 1, "text": "fail"},
                                           "1": {"color": "green", "index": 0, "text": "pass"}}}]
ON_OFF = [{"type": "value", "options": {"0": {"color": "red", "index": 1, "text": "off"},
                                        "1": {"color": "green", "index": 0, "text": "on"}}}]
UP_DOWN = [{"type": "value", "options": {"0": {"color": "red", "index": 1, "text": "down"},
                                         "1": {"color": "green", "index": 0, "text": "up"}}}]


def state_timeline(title: str, description: str, expr: str, legend: str, w: int = 24, h: int = 8,
                   mappings: list = PASS_FAIL) -> dict:
    return {
        "type": "state-timeline",
        "title": title,
        "description": description,
        "datasource": DS,
        "targets": [target(expr, legend)],
        "fieldConfig": field_defaults("short", thresholds((None, "red"), (1, "green")),
                                      custom={"fillOpacity": 80, "hideFrom": {"legend": False, "tooltip": False, "viz": False},
                                              "lineWidth": 0},
                                      mappings=mappings),
        "options": {
            "alignValue": "left",
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "mergeValues": True,
            "rowHeight": 0.9,
            "showValue": "auto",
            "tooltip": {"mode": "single", "sort": "none"},
        },
        "_size": (w, h),
    }


def row(title: str) -> dict:
    return {"type": "row", "title": title, "collapsed": False, "panels": [], "_size": (24, 1)}


def link_to(uid: str, slug: str, title: str) -> list[dict]:
    """A data link that opens another lifecycle dashboard on the clicked series' pod."""
    return [{
        "title": title,
        "url": f"/d/{uid}/{slug}?var-namespace=${{__field.labels.namespace}}&var-pod=${{__field.labels.pod}}&${{__url_time_range}}",
    }]


# ----------------------------------------------------------------------------------------------
# Layout and dashboard shell.
# ----------------------------------------------------------------------------------------------

def layout(panels: list[dict]) -> list[dict]:
    """Assigns ids in order and packs panels left to right into 24 columns, starting a new line when
    a panel does not fit and always for a row."""
    out, x, y, line_h = [], 0, 0, 0
    for number, panel in enumerate(panels, start=1):
        w, h = panel.pop("_size")
        if panel["type"] == "row" or x + w > 24:
            y, x, line_h = y + line_h, 0, 0
        panel = {"id": number, "gridPos": {"h": h, "w": w, "x": x, "y": y}, **panel}
        out.append(panel)
        x += w
        line_h = max(line_h, h)
        if panel["type"] == "row":
            y, x, line_h = y + h, 0, 0
    return out


def query_variable(name: str, label: str, query: str) -> dict:
    return {
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "datasource": DS,
        "hide": 0,
        "includeAll": True,
        "label": label,
        "multi": True,
        "name": name,
        "options": [],
        "query": {"qryType": 1, "query": query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "refresh": 2,
        "regex": "",
        "skipUrlSync": False,
        "sort": 1,
        "type": "query",
    }


def templating() -> dict:
    return {"list": [
        {
            "current": {},
            "hide": 0,
            "includeAll": False,
            "label": "Data source",
            "multi": False,
            "name": "datasource",
            "options": [],
            "query": "prometheus",
            "refresh": 1,
            "regex": "",
            "skipUrlSync": False,
            "type": "datasource",
        },
        query_variable("node", "Node", "label_values(lifecycle_build_info, node)"),
        query_variable("namespace", "Namespace", 'label_values(lifecycle_container_state{node=~"$node"}, namespace)'),
        query_variable("pod", "Pod", 'label_values(lifecycle_container_state{node=~"$node", namespace=~"$namespace"}, pod)'),
    ]}


def dashboard(uid: str, title: str, description: str, panels: list[dict]) -> dict:
    return {
        "annotations": {"list": [{
            "builtIn": 1,
            "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True,
            "hide": True,
            "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts",
            "type": "dashboard",
        }]},
        "description": description,
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "links": [{
            "asDropdown": True,
            "icon": "external link",
            "includeVars": True,
            "keepTime": True,
            "tags": ["lifecycle"],
            "targetBlank": False,
            "title": "Lifecycle dashboards",
            "tooltip": "",
            "type": "dashboards",
            "url": "",
        }],
        "liveNow": False,
        "panels": layout(panels),
        "refresh": "30s",
        "schemaVersion": SCHEMA_VERSION,
        "tags": ["lifecycle", "kubernetes", "ebpf"],
        "templating": templating(),
        "time": {"from": "now-3h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "title": title,
        "uid": uid,
        "version": 1,
        "weekStart": "",
    }


# ----------------------------------------------------------------------------------------------
# The dashboards.
# ----------------------------------------------------------------------------------------------

def overview() -> dict:
    to_term = link_to(TERMINATION_UID, "termination-and-grace", "Termination and grace for this pod")
    panels = [
        row("Containers"),
        stat("Running containers", "Containers whose current state is running.",
             f'sum(lifecycle_container_state{{{S}, state="running"}})'),
        stat("Waiting containers", "Containers whose current state is waiting (ContainerCreating or CrashLoopBackOff).",
             f'sum(lifecycle_container_state{{{S}, state="waiting"}})'),
        stat("In CrashLoopBackOff", "Containers waiting in CrashLoopBackOff now.",
             f'sum(lifecycle_container_waiting_reason{{{S}, reason="CrashLoopBackOff"}})', thr=ANY_IS_RED),
        stat("Restarts (time range)", "Container restarts seen in the selected time range.",
             f"sum({inc('lifecycle_container_restarts_total', S, RANGE)})"),
        stat("Grace-period violations (time range)",
             "Containers SIGKILLed after their grace period ran out. Open 'Termination and grace' to find the pod.",
             f"sum({inc('lifecycle_grace_period_violations_total', S, RANGE)})", thr=ANY_IS_RED,
             links=[{"title": "Termination and grace", "url": f"/d/{TERMINATION_UID}/termination-and-grace?${{__all_variables}}&${{__url_time_range}}"}]),
        stat("OOM kills (time range)", "Processes the kernel OOM killer chose inside containers.",
             f"sum({inc('lifecycle_oom_kills_total', S, RANGE)})", thr=ANY_IS_RED),
        timeseries("Containers by state", "Number of containers in each state.",
                   targets((f"sum by (state) (lifecycle_container_state{{{S}}})", "{{state}}")), stack=True),
        timeseries("Restarts by container", "Restarts per container in each interval.",
                   targets((f"sum by (namespace, pod, container) ({inc('lifecycle_container_restarts_total', S, RATE)})",
                            "{{namespace}}/{{pod}}/{{container}}")), bars=True),
        timeseries("Terminations by outcome", "How containers that stopped ended: within grace, SIGKILLed after grace, killed without grace, OOM-killed, or exited on their own.",
                   targets((f"sum by (outcome) ({inc('lifecycle_terminations_total', S, RATE)})", "{{outcome}}")),
                   bars=True, stack=True),
        timeseries("Container exits by reason", "Container exits by the reason the agent derived, in the kubelet's words (Completed, Error — a non-zero exit or a signal death —, OOMKilled, or Unknown when the exit status was not seen).",
                   targets((f"sum by (reason) ({inc('lifecycle_container_exits_total', S, RATE)})", "{{reason}}")),
                   bars=True, stack=True),
        table("Container states", "One row per container with its current state. Click a row to open its termination view.",
              f"lifecycle_container_state{{{S}}} == 1", links=to_term, hide=("Time", "Value", "__name__", "instance", "job", "endpoint")),
        row("Processes, signals and sockets"),
        timeseries("Process execs / s", "exec() calls inside containers.",
                   targets((f"sum by (namespace, pod) (rate(lifecycle_process_execs_total{{{S}}}[$__rate_interval]))", "{{namespace}}/{{pod}}")),
                   unit="ops", w=8),
        timeseries("Process exits / s", "Process exits inside containers.",
                   targets((f"sum by (namespace, pod) (rate(lifecycle_process_exits_total{{{S}}}[$__rate_interval]))", "{{namespace}}/{{pod}}")),
                   unit="ops", w=8),
        timeseries("Signals received by sender", "Signals delivered to container processes, by who sent them.",
                   targets((f"sum by (sender) (rate(lifecycle_signals_received_total{{{S}}}[$__rate_interval]))", "{{sender}}")),
                   unit="ops", w=8),
        timeseries("TCP accepts / s", "Connections accepted by the application, per listening port.",
                   targets((f"sum by (namespace, pod, port) (rate(lifecycle_tcp_accepts_total{{{S}}}[$__rate_interval]))", "{{namespace}}/{{pod}}:{{port}}")),
                   unit="ops", w=8),
        timeseries("TCP connections established / s", "Handshakes the kernel completed, per listening port (before the application accepts).",
                   targets((f"sum by (namespace, pod, port) (rate(lifecycle_tcp_connections_established_total{{{S}}}[$__rate_interval]))", "{{namespace}}/{{pod}}:{{port}}")),
                   unit="ops", w=8),
        timeseries("Accept queue depth", "Connections waiting in a listener's accept queue. A queue that stays above zero while accepts stay flat is an accept stall.",
                   targets((f"max by (namespace, pod, container, port) (lifecycle_tcp_accept_queue_depth{{{S}}})", "{{namespace}}/{{pod}}/{{container}}:{{port}}")),
                   w=8),
        row("Agent health"),
        stat("Agents reporting", "Agents whose build_info series is present.", f"count(lifecycle_build_info{{{N}}})"),
        stat("Events lost (time range)", "Event records dropped because the ring buffer was full. States derived from events may be stale; counters stay exact.",
             f"sum({inc('lifecycle_events_lost_total', N, RANGE)})", thr=ANY_IS_RED),
        stat("Counter-map full (time range)", "Counter updates dropped because the per-cgroup counters map was full.",
             f"sum({inc('lifecycle_kernel_map_full_total', N, RANGE)})", thr=ANY_IS_RED),
        stat("Decode errors (time range)", "Ring records the agent could not decode (kernel/agent layout mismatch).",
             f"sum({inc('lifecycle_event_decode_errors_total', N, RANGE)})", thr=ANY_IS_RED),
        stat("Ring buffer size", "Size of the kernel event ring buffer (largest across agents).",
             f"max(lifecycle_ring_buffer_bytes{{{N}}})", unit="bytes"),
        stat("Event to state p99", "99th percentile of the time from a kernel event to the state being visible in the agent.",
             f"histogram_quantile(0.99, sum by (le) (rate(lifecycle_event_to_state_seconds_bucket{{{N}}}[$__rate_interval])))", unit="s"),
        stat("Agent targets down", "Agent scrape targets whose last scrape failed (LifecycleAgentDown alert after 5 minutes). "
             "An agent missing from a node altogether shows in 'Agent scrape targets' as a node that stopped.",
             f"sum(up{{{JOB}, {N}}} == bool 0)", thr=ANY_IS_RED),
        stat("Kubernetes API unreachable", "Agents whose watch of their node's pods does not work now (LifecycleKubernetesApiUnreachable "
             "alert after 5 minutes): their verdicts say spec api_unreachable and every stop's cause is runtime_or_unknown. "
             "The series exists only where the agent is given the Kubernetes API.",
             f"sum(lifecycle_kubernetes_api_up{{{N}}} == bool 0)", thr=ANY_IS_RED),
        stat("Runtime unreachable", "Agents whose container runtime's CRI socket did not answer the last metadata refresh "
             "(LifecycleRuntimeUnreachable alert after 5 minutes): new containers are named by id meanwhile.",
             f"sum(lifecycle_runtime_metadata_up{{{N}}} == bool 0)", thr=ANY_IS_RED),
        stat("Runtime metadata age", "Time since the container runtime last answered, for the agent that waited longest.",
             f"max(time() - (lifecycle_runtime_metadata_last_success_timestamp_seconds{{{N}}} > 0))", unit="s",
             thr=thresholds((None, "green"), (60, "orange"), (300, "red"))),
        stat("Events rate limited (time range)", "Signal records the kernel programs did not send because the sending cgroup had spent its "
             "budget: a container flooding signals. Counters stay exact; the per-signal breakdown lacks them.",
             f"sum({inc('lifecycle_events_rate_limited_total', N, RANGE)})", thr=thresholds((None, "green"), (1, "orange"))),
        stat("State dropped (time range)", "Records the agent's node model dropped to stay within its bounds (signals, ports, kept "
             "history, ...): a container flooding its own PID 1 with signals or listening on thousands of ports.",
             f"sum({inc('lifecycle_state_dropped_total', N, RANGE)})", thr=thresholds((None, "green"), (1, "orange"))),
        stat("Kernel features", "Each kernel feature, off if any agent has it off (the agent log says why).",
             f"min by (feature) (lifecycle_feature_enabled{{{N}}})", legend="{{feature}}", mappings=ON_OFF,
             thr=thresholds((None, "red"), (1, "green")), w=24, h=4),
        state_timeline("Agent scrape targets", "Whether Prometheus could scrape each agent (up). A node whose line stops has lost "
                       "its agent (LifecycleAgentDown).",
                       f"max by (node, pod) (up{{{JOB}, {N}}})", "{{node}} {{pod}}", w=8, h=6, mappings=UP_DOWN),
        state_timeline("Kubernetes API watch", "Whether each agent's watch of its node's pods works (lifecycle_kubernetes_api_up). "
                       "Only agents given the Kubernetes API have this series.",
                       f"max by (node) (lifecycle_kubernetes_api_up{{{N}}})", "{{node}}", w=8, h=6, mappings=UP_DOWN),
        state_timeline("Container runtime metadata", "Whether each agent's container runtime answered its last metadata refresh "
                       "(lifecycle_runtime_metadata_up).",
                       f"max by (node) (lifecycle_runtime_metadata_up{{{N}}})", "{{node}}", w=8, h=6, mappings=UP_DOWN),
        timeseries("Events / s by kind", "Event records the kernel programs sent, by kind.",
                   targets((f"sum by (kind) (rate(lifecycle_events_total{{{N}}}[$__rate_interval]))", "{{kind}}")), unit="ops", w=8),
        timeseries("Lost and rate-limited events / s by kind",
                   "Event records lost to a full ring buffer (LifecycleEventsLost), and records not sent because the sending cgroup "
                   "had spent its budget, by kind.",
                   targets((f"sum by (kind) (rate(lifecycle_events_lost_total{{{N}}}[$__rate_interval]))", "lost {{kind}}"),
                           (f"sum by (kind) (rate(lifecycle_events_rate_limited_total{{{N}}}[$__rate_interval]))", "rate limited {{kind}}")),
                   unit="ops", w=8),
        timeseries("Kernel map fill", "Used entries over capacity, per agent and map. At 100% new containers lose their counters.",
                   targets((f'lifecycle_kernel_map_entries{{{N}}} / lifecycle_kernel_map_capacity{{{N}}}',
                            "{{node}} {{map}}")), unit="percentunit", w=8),
        timeseries("Kubernetes events / s by result", "Warning events the agents sent on pods (GracePeriodExceeded, BackOffDeviation, "
                   "StatusDisagreement, ...): published, rate limited (5 per pod in a burst, then one a minute) or failed "
                   "(LifecycleEventsFailing). Only agents run with --events have this series.",
                   targets((f"sum by (result) (rate(lifecycle_kubernetes_events_total{{{N}}}[$__rate_interval]))", "{{result}}")),
                   unit="ops", w=8),
        timeseries("State dropped / s by kind", "Records the node model dropped to stay within its bounds, by kind (docs/security.md "
                   "lists the bounds). Verdicts never depend on a dropped record.",
                   targets((f"sum by (kind) (rate(lifecycle_state_dropped_total{{{N}}}[$__rate_interval]))", "{{kind}}")),
                   unit="ops", w=8),
        timeseries("Event to state latency", "Time from a kernel event to the state being visible, quantiles over all agents.",
                   targets((f"histogram_quantile(0.5, sum by (le) (rate(lifecycle_event_to_state_seconds_bucket{{{N}}}[$__rate_interval])))", "p50"),
                           (f"histogram_quantile(0.99, sum by (le) (rate(lifecycle_event_to_state_seconds_bucket{{{N}}}[$__rate_interval])))", "p99")),
                   unit="s", w=8),
        table("Agent versions", "Agents by version.", f"count by (version) (lifecycle_build_info{{{N}}})", w=24, h=5),
        row("What the agent costs this node"),
        timeseries("Kernel time per event by program",
                   "What one event costs in the kernel, per program of the agent, as the kernel itself accounts it "
                   "(BPF_ENABLE_STATS, held by the agent unless --kernel-stats off): the exec and exit programs run on every "
                   "process of the node.",
                   targets((f"sum by (program) (rate(lifecycle_kernel_program_run_seconds_total{{{N}}}[$__rate_interval])) "
                            f"/ sum by (program) (rate(lifecycle_kernel_program_runs_total{{{N}}}[$__rate_interval]))",
                            "{{program}}")), unit="s", w=6),
        timeseries("Agent CPU (process and kernel programs)",
                   "CPU the agent takes from each node, in cores: its own process, and the time the kernel spent in its programs.",
                   targets((f"sum by (node) (rate(lifecycle_agent_cpu_seconds_total{{{N}}}[$__rate_interval]))", "{{node}} process"),
                           (f"sum by (node) (rate(lifecycle_kernel_program_run_seconds_total{{{N}}}[$__rate_interval]))",
                            "{{node}} kernel programs")), unit="percentunit", w=6),
        timeseries("Agent resident memory", "Resident memory of the agent's process on each node.",
                   targets((f"max by (node) (lifecycle_agent_resident_memory_bytes{{{N}}})", "{{node}}")), unit="bytes", w=6),
        timeseries("Ring loss / s", "Event records lost to a full ring buffer, per node (counters stay exact; "
                   "states derived from the lost records are repaired from /proc and cgroupfs).",
                   targets((f"sum by (node) (rate(lifecycle_events_lost_total{{{N}}}[$__rate_interval]))", "{{node}}")),
                   unit="ops", w=6),
    ]
    return dashboard(OVERVIEW_UID, "Lifecycle / Node overview",
                     "Every container on the selected nodes as the kernel sees it, plus the health of the lifecycle agent itself.", panels)


def termination() -> dict:
    to_self = link_to(TERMINATION_UID, "termination-and-grace", "Show only this pod")
    killed = f'{S}, outcome=~"sigkilled_after_grace|sigkilled_early|killed_without_grace"'
    oom = f'{S}, outcome="oom_killed"'
    violated = f'{S}, outcome="sigkilled_after_grace"'
    per_owner = "node, namespace, owner_kind, owner_name, cause"
    panels = [
        row("From the alert to the pod"),
        stat("Grace-period violations (time range)", "Containers SIGKILLed after their grace period ran out (GracePeriodViolation alert).",
             f"sum({inc('lifecycle_grace_period_violations_total', S, RANGE)})", thr=ANY_IS_RED, w=6),
        stat("Terminations (time range)", "Container terminations of any outcome.",
             f"sum({inc('lifecycle_terminations_total', S, RANGE)})", w=6),
        stat("Ended by SIGKILL", "Share of terminations that ended with SIGKILL (after the grace period or without one).",
             f"sum({inc('lifecycle_terminations_total', killed, RANGE)}) / sum({inc('lifecycle_terminations_total', S, RANGE)})",
             unit="percentunit", thr=thresholds((None, "green"), (0.01, "orange"), (0.1, "red")), w=6),
        stat("OOM-killed terminations (time range)", "Terminations whose cause was the OOM killer.",
             f'sum({inc("lifecycle_terminations_total", oom, RANGE)})', thr=ANY_IS_RED, w=6),
        merged_table("Grace-period violations by cause, node and owner (time range)",
                     "Violations (terminations SIGKILLed after their grace period) grouped by why the container was stopped "
                     "(deleted, liveness_probe, evicted, ...; runtime_or_unknown without the Kubernetes API), the node, and the "
                     "workload that owns the pod (kube-state-metrics' kube_pod_owner; a pod it does not know, or every pod without "
                     "kube-state-metrics, is its own owner, kind Pod). Last seen: when the count last grew.",
                     [(f"sum by ({per_owner}) ({by_owner(inc('lifecycle_terminations_total', violated, RANGE), RANGE)}) > 0",
                       "Violations", "short"),
                      (f"1000 * max by ({per_owner}) ({by_owner(last_increase('lifecycle_terminations_total', violated, RANGE, STEP), RANGE)})",
                       "Last seen", "dateTimeFromNow")],
                     h=7),
        table("Violations by container (time range)", "Containers with grace-period violations, most first. Click a row to narrow the dashboard to that pod.",
              f"sum by (namespace, pod, container, uid) ({inc('lifecycle_grace_period_violations_total', S, RANGE)}) > 0",
              links=to_self, h=7),
        timeseries("Violations", "Grace-period violations per container in each interval.",
                   targets((f"sum by (namespace, pod, container) ({inc('lifecycle_grace_period_violations_total', S, RATE)})",
                            "{{namespace}}/{{pod}}/{{container}}")), bars=True),
        timeseries("Terminations by outcome", "How stopping containers ended.",
                   targets((f"sum by (outcome) ({inc('lifecycle_terminations_total', S, RATE)})", "{{outcome}}")),
                   bars=True, stack=True),
        timeseries("Terminations by cause", "Why containers were stopped (deleted, liveness_probe, startup_probe, evicted, preempted, "
                   "node_shutdown, restart_all_containers, resize, deadline_exceeded; runtime_or_unknown when the agent could not tell, "
                   "always without the Kubernetes API; none when nothing stopped it: it ended on its own), and how each stop ended.",
                   targets((f'sum by (cause, outcome) (label_replace({inc("lifecycle_terminations_total", S, RATE)}, "cause", "none", "cause", ""))',
                            "{{cause}}: {{outcome}}")),
                   bars=True, stack=True),
        timeseries("Status disagreements by kind",
                   "Where the kubelet's reported status disagreed with what the kernel saw: oom_not_reported (the OOM killer "
                   "killed PID 1, the kubelet reported another reason; OOMNotReported alert), oom_reported_not_oom, exit_code, "
                   "restart_count. Counted once per container instance and kind; `lifecycle-agent status -o wide` shows both sides. "
                   "Only agents given the Kubernetes API compare statuses.",
                   targets((f"sum by (kind) ({inc('lifecycle_status_disagreements_total', S, RATE)})", "{{kind}}")),
                   bars=True, stack=True),
        row("Stop signals"),
        timeseries("Signals by sender and signal", "Signals delivered to container processes: runtime (StopContainer), kubelet, the container itself, or another host process.",
                   targets((f"sum by (sender, signal) ({inc('lifecycle_signals_received_total', S, RATE)})", "{{sender}} {{signal}}")),
                   bars=True, stack=True),
        table("Signals by container (time range)", "Who signalled which container, and with what.",
              f"sum by (namespace, pod, container, signal, sender) ({inc('lifecycle_signals_received_total', S, RANGE)}) > 0", w=12),
        row("Grace used and termination duration"),
        heatmap("Grace period used (selected namespaces)",
                "Fraction of the grace period containers that exited within it took to exit after their stop signal (close to 1: only just in time). "
                "Containers the runtime had to SIGKILL are not in this histogram; see Violations. The agent keeps this histogram per namespace, so the pod selection does not apply.",
                f"sum by (le) ({inc('lifecycle_termination_grace_used_ratio_bucket', NS, RATE)})", unit="percentunit"),
        timeseries("Termination duration by outcome (selected namespaces)",
                   "Stop signal to exit, quantiles per outcome (only terminations that began with a stop signal). The agent keeps this histogram per namespace and outcome, so the pod selection does not apply.",
                   targets((f"histogram_quantile(0.5, sum by (outcome, le) ({inc('lifecycle_termination_duration_seconds_bucket', NS, RATE)}))", "p50 {{outcome}}"),
                           (f"histogram_quantile(0.9, sum by (outcome, le) ({inc('lifecycle_termination_duration_seconds_bucket', NS, RATE)}))", "p90 {{outcome}}"),
                           (f"histogram_quantile(0.99, sum by (outcome, le) ({inc('lifecycle_termination_duration_seconds_bucket', NS, RATE)}))", "p99 {{outcome}}")),
                   unit="s"),
        timeseries("Grace used by the last termination, per container",
                   "Fraction of the grace period each container's last exit within grace used (close to 1: only just in time).",
                   targets((f"max by (namespace, pod, container) (lifecycle_container_last_grace_used_ratio{{{S}}})",
                            "{{namespace}}/{{pod}}/{{container}}")), unit="percentunit", interpolation="stepAfter"),
        timeseries("Stop to exit of the last termination, per container",
                   "Stop signal to exit of each container's last termination that began with a stop signal (any outcome).",
                   targets((f"max by (namespace, pod, container) (lifecycle_container_last_termination_seconds{{{S}}})",
                            "{{namespace}}/{{pod}}/{{container}}")), unit="s", interpolation="stepAfter"),
        table("Last termination per container", "Last terminated reason (label) and exit code (value) of each container.",
              f"max by (namespace, pod, container, uid, reason) (lifecycle_container_last_terminated_reason{{{S}}} == 1)"
              f" * on (namespace, pod, container, uid) group_left () max by (namespace, pod, container, uid) (lifecycle_container_last_terminated_exit_code{{{S}}})",
              w=24),
    ]
    return dashboard(TERMINATION_UID, "Lifecycle / Termination and grace",
                     "From a GracePeriodViolation alert to the pod: violations, termination outcomes, who sent the stop signals, how much of the grace period was used.",
                     panels)


def restarts() -> dict:
    per_container = "namespace, pod, container"
    abnormal = f'{S}, verdict!="within_tolerance"'
    panels = [
        row("Back-off: observed against the kubelet's rules"),
        stat("Abnormal back-off verdicts (time range)", "Restarts that came too early or too late for the kubelet's back-off rules (CrashLoopAbnormalBackoff alert).",
             f'sum({inc("lifecycle_backoff_verdicts_total", abnormal, RANGE)})', thr=ANY_IS_RED, w=6),
        stat("In CrashLoopBackOff", "Containers waiting in CrashLoopBackOff now.",
             f'sum(lifecycle_container_waiting_reason{{{S}, reason="CrashLoopBackOff"}})', thr=ANY_IS_RED, w=6),
        stat("Restarts (time range)", "Container restarts.", f"sum({inc('lifecycle_container_restarts_total', S, RANGE)})", w=6),
        stat("Exits (time range)", "Container exits of any reason.", f"sum({inc('lifecycle_container_exits_total', S, RANGE)})", w=6),
        timeseries("Observed vs expected back-off (last restart)",
                   "For each container's last restart: the delay the agent measured between exit and restart, and the delay the kubelet's rules call for (10 s doubling to 300 s by default).",
                   targets((f"max by ({per_container}) (lifecycle_backoff_observed_seconds{{{S}}})", "observed {{namespace}}/{{pod}}/{{container}}"),
                           (f"max by ({per_container}) (lifecycle_backoff_expected_seconds{{{S}}})", "expected {{namespace}}/{{pod}}/{{container}}")),
                   unit="s", w=24, interpolation="stepAfter"),
        timeseries("Observed / expected", "Ratio of observed to expected back-off; 1 is on schedule. Containers whose expected delay is 0 (first restart) are left out.",
                   targets((f"max by ({per_container}) (lifecycle_backoff_observed_seconds{{{S}}}) / max by ({per_container}) (lifecycle_backoff_expected_seconds{{{S}}} > 0)",
                            "{{namespace}}/{{pod}}/{{container}}")), unit="none", interpolation="stepAfter"),
        timeseries("Back-off verdicts", "Verdicts on each restart: within tolerance, too early, too late.",
                   targets((f"sum by (verdict) ({inc('lifecycle_backoff_verdicts_total', S, RATE)})", "{{verdict}}")),
                   bars=True, stack=True),
        table("Verdicts by container (time range)", "Back-off verdicts per container; abnormal ones first when sorted.",
              f"sum by (namespace, pod, container, verdict) ({inc('lifecycle_backoff_verdicts_total', S, RANGE)}) > 0"),
        row("Restarts and exits"),
        timeseries("Restarts by container", "Restarts per container in each interval.",
                   targets((f"sum by ({per_container}) ({inc('lifecycle_container_restarts_total', S, RATE)})",
                            "{{namespace}}/{{pod}}/{{container}}")), bars=True),
        timeseries("Exits by reason", "Container exits by reason.",
                   targets((f"sum by (reason) ({inc('lifecycle_container_exits_total', S, RATE)})", "{{reason}}")),
                   bars=True, stack=True),
        table("Exits by reason, exit code and signal (time range)", "Every distinct way containers exited.",
              f"sum by (namespace, pod, container, reason, exit_code, signal) ({inc('lifecycle_container_exits_total', S, RANGE)}) > 0", w=12),
        bargauge("Exit codes (time range)", "Container exits per exit code.",
                 f"sum by (exit_code) ({inc('lifecycle_container_exits_total', S, RANGE)})", "exit {{exit_code}}"),
        timeseries("OOM kills", "OOM-killer victims per container in each interval.",
                   targets((f"sum by ({per_container}) ({inc('lifecycle_oom_kills_total', S, RATE)})",
                            "{{namespace}}/{{pod}}/{{container}}")), bars=True),
        timeseries("Memory stalls", "Share of time each container's tasks stalled on memory (PSI some), throttling at memory.high included; "
                   "a container throttled into probe timeouts shows here before any OOM kill.",
                   targets((f"sum by ({per_container}) (rate(lifecycle_container_memory_pressure_seconds_total{{{S},kind=\"some\"}}[$__rate_interval]))",
                            "{{namespace}}/{{pod}}/{{container}}")), unit="percentunit"),
        table("Memory events by container (time range)", "Times containers went over memory.high, reached memory.max, or were OOM-killed "
              "(memory.events; only oom_kill where the memory controller is cgroup v1's).",
              f"sum by (namespace, pod, container, event) ({inc('lifecycle_container_memory_events_total', S, RANGE)}) > 0", w=12),
        table("Waiting reasons", "Current waiting reason per container (1 = the container is waiting for this reason).",
              f"max by (namespace, pod, container, reason) (lifecycle_container_waiting_reason{{{S}}})", w=12),
    ]
    return dashboard(RESTARTS_UID, "Lifecycle / Restarts and back-off",
                     "Restart back-off as observed from the kernel against what the kubelet's rules say, with restarts and exits by reason and code.",
                     panels)


def probes() -> dict:
    per_container = "namespace, pod, container"
    panels = [
        row("Probe results"),
        stat("Failing checks", "Probe-listener checks that fail now.", f"sum(1 - lifecycle_probe_result{{{S}}})", thr=ANY_IS_RED, w=6),
        stat("Check transitions (time range)", "Pass/fail flips; many flips mean a flapping check.",
             f"sum({inc('lifecycle_probe_transitions_total', S, RANGE)})", w=6),
        stat("Probe requests / s", "Requests to the per-pod probe listener.",
             f"sum(rate(lifecycle_probe_requests_total{{{S}}}[$__rate_interval]))", unit="reqps", w=6, instant=False),
        stat("Exec-probe CPU", "CPU the runtime-spawned processes (exec probes, exec sessions, hooks) use, in cores.",
             f"sum(rate(lifecycle_exec_probe_cpu_seconds_total{{{S}}}[$__rate_interval]))", unit="short", w=6, instant=False),
        state_timeline("Check results", "Result of each probe-listener check over time.",
                       f"max by (namespace, pod, container, check) (lifecycle_probe_result{{{S}}})", "{{namespace}}/{{pod}}/{{container}} {{check}}"),
        timeseries("Check transitions", "Pass/fail transitions per check.",
                   targets((f"sum by (namespace, pod, check) ({inc('lifecycle_probe_transitions_total', S, RATE)})",
                            "{{namespace}}/{{pod}} {{check}}")), bars=True),
        timeseries("Probe requests by check and code", "Requests to the probe listener by check and HTTP status.",
                   targets((f"sum by (check, code) (rate(lifecycle_probe_requests_total{{{S}}}[$__rate_interval]))", "{{check}} {{code}}")),
                   unit="reqps"),
        timeseries("Probe listener latency by check (all pods)",
                   "Time the probe listener took to answer, per check. This histogram has only the check label, so the namespace and pod selections do not apply.",
                   targets((f"histogram_quantile(0.5, sum by (check, le) (rate(lifecycle_probe_duration_seconds_bucket{{{N}}}[$__rate_interval])))", "p50 {{check}}"),
                           (f"histogram_quantile(0.99, sum by (check, le) (rate(lifecycle_probe_duration_seconds_bucket{{{N}}}[$__rate_interval])))", "p99 {{check}}")),
                   unit="s", w=24),
        row("Exec-probe cost"),
        timeseries("Exec-probe processes / s", "Processes the runtime spawned into each container outside its init's process tree.",
                   targets((f"sum by ({per_container}) (rate(lifecycle_exec_probe_processes_total{{{S}}}[$__rate_interval]))",
                            "{{namespace}}/{{pod}}/{{container}}")), unit="ops"),
        timeseries("Exec-probe CPU by container", "CPU those processes used, in cores.",
                   targets((f"sum by ({per_container}) (rate(lifecycle_exec_probe_cpu_seconds_total{{{S}}}[$__rate_interval]))",
                            "{{namespace}}/{{pod}}/{{container}}")), unit="short"),
        timeseries("CPU per exec-probe process", "Average CPU time of one exec-probe process.",
                   targets((f"sum by ({per_container}) ({inc('lifecycle_exec_probe_cpu_seconds_total', S, RATE)})"
                            f" / sum by ({per_container}) ({inc('lifecycle_exec_probe_processes_total', S, RATE)} > 0)",
                            "{{namespace}}/{{pod}}/{{container}}")), unit="s"),
        timeseries("Exec-probe share of all execs", "Runtime-spawned processes as a share of all exec() calls in the selected containers.",
                   targets((f"sum({inc('lifecycle_exec_probe_processes_total', S, RATE)}) / sum({inc('lifecycle_process_execs_total', S, RATE)})",
                            "share")), unit="percentunit"),
        bargauge("Top 10 containers by exec-probe CPU (time range)", "CPU seconds spent in exec probes, sessions and hooks.",
                 f"topk(10, sum by ({per_container}) ({inc('lifecycle_exec_probe_cpu_seconds_total', S, RANGE)}))",
                 "{{namespace}}/{{pod}}/{{container}}", unit="s", w=24),
    ]
    return dashboard(PROBES_UID, "Lifecycle / Probes and probe cost",
                     "Probe-listener results, transitions and latency, and what exec probes cost the node.", panels)


DASHBOARDS = {
    "node-lifecycle-overview.json": overview,
    "termination-and-grace.json": termination,
    "restarts-and-backoff.json": restarts,
    "probes-and-probe-cost.json": probes,
}


def render(builder) -> str:
    return json.dumps(builder(), indent=2, ensure_ascii=False) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    args = parser.parse_args()
    stale = []
    for name, builder in DASHBOARDS.items():
        path = HERE / name
        text = render(builder)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print("out of date (run dashboards/build_dashboards.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
