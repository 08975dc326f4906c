#!/usr/bin/env python3
"""Serves synthetic lifecycle_* metrics for exercising the dashboards without an agent.

    python3 dashboards/sample_exporter.py --listen 127.0.0.1:19890     # serve /metrics
    python3 dashboards/sample_exporter.py --print                      # print one exposition

Every metric of the catalogue in docs/metrics.md is present, with the documented types and labels,
for two pods and the plain-host mode (namespace="host", pod=""). Counters and histograms grow with
the time since start, so rate() and increase() panels have data after two scrapes. The values are
made up: this checks that every dashboard query matches the catalogue, not that the agent is right
(lifecycle-agent/tests/dashboards.rs runs the panels against a Prometheus scraping the real agent).
Standard library only.
"""

from __future__ import annotations

import argparse
import http.server
import sys
import time

START = time.time()

CONTAINERS = [
    # (namespace, pod, container, uid)
    ("shop", "cart-0", "app", "6f1c-cart"),
    ("jobs", "crashy-0", "worker", "91aa-crashy"),
    ("host", "", "/system.slice/containerd.service", ""),
]
# The agent's buckets (tracker.rs, agent.rs, probe/metrics.rs).
TERMINATION_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)
RATIO_BUCKETS = (0.1, 0.25, 0.5, 0.75, 0.9, 1, 1.5, 2)
EVENT_TO_STATE_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1)
PROBE_BUCKETS = (1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2)
EVENT_KINDS = ("exec", "exit", "signal", "oom_victim", "tcp_listen", "tcp_listen_close", "tcp_established",
               "tcp_accept", "cgroup_mkdir", "cgroup_rmdir")
FEATURES = ("process_exec", "process_exit", "signals", "oom_kills", "tcp_sockets", "tcp_accepts", "cgroup_events")


def labels(**pairs: str) -> str:
    body = ",".join(f'{k}="{v}"' for k, v in pairs.items())
    return "{" + body + "}" if body else ""


class Exposition:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        self.lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]

    def sample(self, name: str, value: float, **pairs: str) -> None:
        self.lines.append(f"{name}{labels(**pairs)} {value:g}")

    def histogram(self, name: str, bounds: tuple, observations: int, typical: float, **pairs: str) -> None:
        for bound in bounds:
            self.sample(f"{name}_bucket", observations if bound >= typical else 0, **pairs, le=f"{bound:g}")
        self.sample(f"{name}_bucket", observations, **pairs, le="+Inf")
        self.sample(f"{name}_sum", observations * typical, **pairs)
        self.sample(f"{name}_count", observations, **pairs)

    def text(self) -> str:
        return "\n".join(self.lines) + "\n"


def render() -> str:
    tick = int((time.time() - START) // 5) + 1  # grows every 5 s
    e = Exposition()
    per = [dict(namespace=n, pod=p, container=c, uid=u) for n, p, c, u in CONTAINERS]
    short = [dict(namespace=n, pod=p, container=c) for n, p, c, _ in CONTAINERS]

    e.family("lifecycle_container_state", "gauge", "1 for the container's current state.")
    for i, l in enumerate(per):
        for state in ("waiting", "running", "terminated"):
            e.sample("lifecycle_container_state", int(state == ("waiting" if i == 1 else "running")), **l, state=state)
    e.family("lifecycle_container_waiting_reason", "gauge", "1 for the reason a waiting container waits.")
    # Like the agent: one series for the reason a waiting container waits, none otherwise.
    e.sample("lifecycle_container_waiting_reason", 1, **per[1], reason="CrashLoopBackOff")
    e.family("lifecycle_container_last_terminated_reason", "gauge", "1 for the reason of the last termination.")
    for l in per:
        e.sample("lifecycle_container_last_terminated_reason", 1, **l, reason="Error")
    e.family("lifecycle_container_last_terminated_exit_code", "gauge", "Exit code of the last termination.")
    e.family("lifecycle_container_last_terminated_timestamp_seconds", "gauge", "When the last termination happened.")
    for l in per:
        e.sample("lifecycle_container_last_terminated_exit_code", 1, **l)
        e.sample("lifecycle_container_last_terminated_timestamp_seconds", START, **l)
    e.family("lifecycle_container_restarts_total", "counter", "Container restarts.")
    for l in per:
        e.sample("lifecycle_container_restarts_total", tick, **l)
    e.family("lifecycle_container_exits_total", "counter", "Container exits.")
    for l in short:
        e.sample("lifecycle_container_exits_total", tick, **l, reason="Error", exit_code="1", signal="")
        e.sample("lifecycle_container_exits_total", tick // 2, **l, reason="Error", exit_code="137", signal="9")

    # Like the agent: the histograms per namespace (and outcome), each container's last value a gauge.
    e.family("lifecycle_termination_duration_seconds", "histogram", "Stop signal to exit, per namespace and outcome.")
    e.family("lifecycle_termination_grace_used_ratio", "histogram", "Fraction of the grace period used, per namespace.")
    for namespace in sorted({n for n, _, _, _ in CONTAINERS}):
        e.histogram("lifecycle_termination_duration_seconds", TERMINATION_BUCKETS, tick, 2, namespace=namespace, outcome="exited_within_grace")
        e.histogram("lifecycle_termination_duration_seconds", TERMINATION_BUCKETS, tick // 3, 30, namespace=namespace, outcome="sigkilled_after_grace")
        e.histogram("lifecycle_termination_grace_used_ratio", RATIO_BUCKETS, tick, 0.5, namespace=namespace)
    e.family("lifecycle_container_last_termination_seconds", "gauge", "Stop signal to exit of the last termination.")
    e.family("lifecycle_container_last_grace_used_ratio", "gauge", "Grace used by the last exit within grace.")
    for l in short:
        e.sample("lifecycle_container_last_termination_seconds", 2, **l)
        e.sample("lifecycle_container_last_grace_used_ratio", 0.5, **l)
    e.family("lifecycle_terminations_total", "counter", "Terminations by outcome and cause.")
    for i, l in enumerate(short):
        for outcome in ("exited_within_grace", "sigkilled_after_grace", "sigkilled_early", "killed_without_grace", "stop_signal_not_observed", "oom_killed", "exited_without_stop_signal"):
            # Like the agent: no cause when nothing stopped the container.
            cause = {"exited_without_stop_signal": "", "sigkilled_after_grace": ("deleted", "liveness_probe", "runtime_or_unknown")[i],
                     "oom_killed": "runtime_or_unknown"}.get(outcome, "deleted")
            e.sample("lifecycle_terminations_total", tick if outcome == "exited_within_grace" else tick // 3, **l, outcome=outcome, cause=cause)
    e.family("lifecycle_status_disagreements_total", "counter", "Kubelet status against the kernel.")
    e.sample("lifecycle_status_disagreements_total", tick // 6, **short[1], kind="oom_not_reported")
    e.family("lifecycle_grace_period_violations_total", "counter", "SIGKILLs after the grace period.")
    for l in per:
        e.sample("lifecycle_grace_period_violations_total", tick // 3, **l)

    e.family("lifecycle_backoff_observed_seconds", "gauge", "Observed back-off before the last restart.")
    e.family("lifecycle_backoff_expected_seconds", "gauge", "Expected back-off before the last restart.")
    for l in per:
        e.sample("lifecycle_backoff_observed_seconds", 41, **l)
        e.sample("lifecycle_backoff_expected_seconds", 40, **l)
    e.family("lifecycle_backoff_verdicts_total", "counter", "Back-off verdicts.")
    for l in short:
        for verdict in ("within_tolerance", "too_early", "too_late"):
            e.sample("lifecycle_backoff_verdicts_total", tick if verdict == "within_tolerance" else 0, **l, verdict=verdict)

    e.family("lifecycle_signals_received_total", "counter", "Signals received.")
    e.family("lifecycle_oom_kills_total", "counter", "OOM-killer victims.")
    e.family("lifecycle_process_execs_total", "counter", "exec() calls.")
    e.family("lifecycle_process_exits_total", "counter", "Process exits.")
    for l in short:
        e.sample("lifecycle_signals_received_total", tick, **l, signal="15", sender="runtime")
        e.sample("lifecycle_signals_received_total", tick // 3, **l, signal="9", sender="runtime")
        e.sample("lifecycle_oom_kills_total", tick // 10, **l)
        e.sample("lifecycle_process_execs_total", tick * 7, **l)
        e.sample("lifecycle_process_exits_total", tick * 7, **l)

    e.family("lifecycle_container_memory_events_total", "counter", "memory.events counts.")
    e.family("lifecycle_container_memory_pressure_seconds_total", "counter", "Memory stall time (PSI).")
    for l in short:
        e.sample("lifecycle_container_memory_events_total", tick * 3, **l, event="high")
        e.sample("lifecycle_container_memory_events_total", tick // 10, **l, event="oom_kill")
        e.sample("lifecycle_container_memory_pressure_seconds_total", tick * 0.2, **l, kind="some")
        e.sample("lifecycle_container_memory_pressure_seconds_total", tick * 0.05, **l, kind="full")

    e.family("lifecycle_tcp_listeners", "gauge", "Listening sockets per port.")
    e.family("lifecycle_tcp_connections_established_total", "counter", "Handshakes completed.")
    e.family("lifecycle_tcp_accepts_total", "counter", "Connections accepted.")
    e.family("lifecycle_tcp_accept_queue_depth", "gauge", "Connections waiting to be accepted.")
    for l in short[:2]:
        e.sample("lifecycle_tcp_listeners", 1, **l, port="8080")
        e.sample("lifecycle_tcp_connections_established_total", tick * 20, **l, port="8080")
        e.sample("lifecycle_tcp_accepts_total", tick * 20, **l, port="8080")
        e.sample("lifecycle_tcp_accept_queue_depth", tick % 3, **l, port="8080")

    e.family("lifecycle_probe_result", "gauge", "1 when the check passes.")
    e.family("lifecycle_probe_transitions_total", "counter", "Pass/fail transitions.")
    e.family("lifecycle_probe_requests_total", "counter", "Probe-listener requests.")
    for l in per[:2]:
        for check in ("tcp:8080", "process", "file:/tmp/healthy"):
            e.sample("lifecycle_probe_result", int(check != "file:/tmp/healthy"), **l, check=check)
            e.sample("lifecycle_probe_transitions_total", tick // 4, **l, check=check)
            e.sample("lifecycle_probe_requests_total", tick * 2, **l, check=check, code="200")
    e.family("lifecycle_probe_duration_seconds", "histogram", "Probe-listener answer time.")
    for check in ("tcp", "process", "file"):
        e.histogram("lifecycle_probe_duration_seconds", PROBE_BUCKETS, tick * 4, 0.00001, check=check)
    e.family("lifecycle_exec_probe_processes_total", "counter", "Runtime-spawned processes.")
    e.family("lifecycle_exec_probe_cpu_seconds_total", "counter", "CPU of runtime-spawned processes.")
    for l in short:
        e.sample("lifecycle_exec_probe_processes_total", tick * 2, **l)
        e.sample("lifecycle_exec_probe_cpu_seconds_total", tick * 0.01, **l)

    e.family("lifecycle_events_total", "counter", "Events sent by the kernel.")
    e.family("lifecycle_events_lost_total", "counter", "Events lost to a full ring buffer.")
    e.family("lifecycle_kernel_map_full_total", "counter", "Counter updates lost to a full map.")
    for kind in EVENT_KINDS:
        e.sample("lifecycle_events_total", tick * 100, kind=kind)
        e.sample("lifecycle_events_lost_total", 0, kind=kind)
        e.sample("lifecycle_kernel_map_full_total", 0, map="cgroup_counters", kind=kind)
    e.family("lifecycle_events_rate_limited_total", "counter", "Records not sent: the sending cgroup spent its budget.")
    for kind in EVENT_KINDS:
        e.sample("lifecycle_events_rate_limited_total", tick if kind == "signal" else 0, kind=kind)
    e.family("lifecycle_state_dropped_total", "counter", "Records the node model dropped to stay within its bounds.")
    for kind in ("signal", "oom_kill", "exec_session", "listener_change", "accept", "port", "departed_instance",
                 "departed_unit", "pod", "kill_notice", "history", "oom_log", "probe_watch"):
        e.sample("lifecycle_state_dropped_total", tick // 2 if kind == "signal" else 0, kind=kind)
    e.family("lifecycle_runtime_metadata_up", "gauge", "1 when the CRI socket answered.")
    e.sample("lifecycle_runtime_metadata_up", 1)
    e.family("lifecycle_runtime_metadata_refresh_failures_total", "counter", "Failed metadata refreshes.")
    e.sample("lifecycle_runtime_metadata_refresh_failures_total", 0)
    e.family("lifecycle_runtime_metadata_last_success_timestamp_seconds", "gauge", "Last refresh the runtime answered.")
    e.sample("lifecycle_runtime_metadata_last_success_timestamp_seconds", time.time())
    e.family("lifecycle_kubernetes_api_up", "gauge", "1 while the pod watch works.")
    e.sample("lifecycle_kubernetes_api_up", 1)
    e.family("lifecycle_kubernetes_api_watch_errors_total", "counter", "Watch failures.")
    e.sample("lifecycle_kubernetes_api_watch_errors_total", 0)
    e.family("lifecycle_kubernetes_events_total", "counter", "Warning events on pods by result.")
    e.sample("lifecycle_kubernetes_events_total", tick, result="published")
    e.sample("lifecycle_kubernetes_events_total", tick // 5, result="rate_limited")
    e.family("lifecycle_event_decode_errors_total", "counter", "Undecodable ring records.")
    e.sample("lifecycle_event_decode_errors_total", 0)
    e.family("lifecycle_feature_enabled", "gauge", "1 when a kernel feature is attached.")
    for feature in FEATURES:
        e.sample("lifecycle_feature_enabled", 1, feature=feature)
    e.family("lifecycle_kernel_map_entries", "gauge", "Entries in use in a kernel map.")
    e.sample("lifecycle_kernel_map_entries", 42, map="cgroup_counters")
    e.family("lifecycle_kernel_map_capacity", "gauge", "Entries a kernel map can hold.")
    e.sample("lifecycle_kernel_map_capacity", 16384, map="cgroup_counters")
    e.family("lifecycle_ring_buffer_bytes", "gauge", "Ring buffer size.")
    e.sample("lifecycle_ring_buffer_bytes", 4194304)
    e.family("lifecycle_kernel_program_run_seconds_total", "counter", "Kernel time in each program.")
    e.family("lifecycle_kernel_program_runs_total", "counter", "Runs of each program.")
    for program, ns in (("sched_process_exec", 900), ("sched_process_exit", 800), ("signal_generate", 250),
                        ("inet_sock_set_state", 75), ("sys_exit_accept4", 400)):
        e.sample("lifecycle_kernel_program_run_seconds_total", tick * 100 * ns / 1e9, program=program)
        e.sample("lifecycle_kernel_program_runs_total", tick * 100, program=program)
    e.family("lifecycle_agent_cpu_seconds_total", "counter", "The agent's CPU time.")
    e.sample("lifecycle_agent_cpu_seconds_total", tick * 0.002)
    e.family("lifecycle_agent_resident_memory_bytes", "gauge", "The agent's resident memory.")
    e.sample("lifecycle_agent_resident_memory_bytes", 24 << 20)
    e.family("lifecycle_systemd_unit_reads_total", "counter", "Reads of host units' systemd settings.")
    for result in ("read", "failed", "unreachable", "dropped"):
        e.sample("lifecycle_systemd_unit_reads_total", tick if result == "read" else 0, result=result)
    e.family("lifecycle_build_info", "gauge", "Always 1.")
    e.sample("lifecycle_build_info", 1, version="0.1.0")
    e.family("lifecycle_event_to_state_seconds", "histogram", "Kernel event to visible state.")
    e.histogram("lifecycle_event_to_state_seconds", EVENT_TO_STATE_BUCKETS, tick * 100, 0.002)
    if KUBE_STATE_METRICS:
        # kube-state-metrics' owner of the first pod (the second one it does not know: the
        # dashboards fall back to the pod itself).
        e.family("kube_pod_owner", "gauge", "Information about the Pod's owner.")
        e.sample("kube_pod_owner", 1, namespace="shop", pod="cart-0", uid="6f1c-cart", owner_kind="StatefulSet",
                 owner_name="cart", owner_is_controller="true")
    return e.text()


KUBE_STATE_METRICS = False


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        if self.path.split("?")[0] != "/metrics":
            self.send_error(404)
            return
        body = render().encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", default="127.0.0.1:19890", help="host:port to serve /metrics on")
    parser.add_argument("--print", action="store_true", help="print one exposition and exit")
    parser.add_argument("--kube-state-metrics", action="store_true",
                        help="also serve kube-state-metrics' kube_pod_owner for one of the pods (the owner joins)")
    args = parser.parse_args()
    global KUBE_STATE_METRICS
    KUBE_STATE_METRICS = args.kube_state_metrics
    if args.print:
        sys.stdout.write(render())
        return 0
    host, port = args.listen.rsplit(":", 1)
    http.server.ThreadingHTTPServer((host, int(port)), Handler).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
