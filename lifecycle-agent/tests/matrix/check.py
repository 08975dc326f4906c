#!/usr/bin/python3
"""The kernel matrix's work in an amd64 guest (systemd PID 1), run at boot by the root
filesystem's lifecycle-matrix.service from the payload disk (/payload), which then powers off.

It starts the agent delivered on the payload, drives a workload through systemd and a real
containerd, and writes what the agent answered into /payload/results for the host
(lifecycle-agent/tests/matrix.rs) to judge. It judges nothing: it only waits, each wait bounded
by a deadline, until the agent has had its chance to see each step, so what it collects is the
agent's settled answer; when a deadline passes it goes on and the host finds out.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import traceback
import urllib.request

PAYLOAD = "/payload"
RESULTS = os.path.join(PAYLOAD, "results")
AGENT = os.path.join(PAYLOAD, "lifecycle-agent")
API = "http://127.0.0.1:9890"
PYTHON = "/usr/bin/python3"
READY_DIR = "/run/lifecycle-matrix"
BACKLOG_PORT = 9101
ACCEPT_PORT = 9102
UNIX_SOCKET = READY_DIR + "/unix.sock"
UNIX_CONNECTIONS = 3
NO_RUNTIME = READY_DIR + "/no-runtime.sock"
# Under TCG everything is slow: generous, but bounded.
AGENT_START_DEADLINE = 180
SEEN_DEADLINE = 60

facts = {"steps": {}, "errors": []}
began = time.monotonic()


def log(message):
    print(f"matrix: {message}", flush=True)


def write(name, text):
    with open(os.path.join(RESULTS, name), "w") as out:
        out.write(text)


def write_json(name, value):
    write(name, json.dumps(value, indent=1, sort_keys=True))


class Step:
    """Times a step and records its error instead of stopping the check."""

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        log(f"step {self.name}")
        self.start = time.monotonic()
        return self

    def __exit__(self, kind, error, trace):
        facts["steps"][self.name] = round(time.monotonic() - self.start, 2)
        if error is not None:
            detail = "".join(traceback.format_exception(kind, error, trace))
            facts["errors"].append(f"{self.name}: {detail}")
            log(f"step {self.name} failed: {error}")
        return True


def run(*command, check=True, timeout=120, **kwargs):
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and done.returncode != 0:
        raise RuntimeError(f"{command} exited {done.returncode}: {done.stderr.strip()}")
    return done


def get(path, timeout=20):
    with urllib.request.urlopen(API + path, timeout=timeout) as answer:
        return answer.read().decode()


def containers():
    return json.loads(get("/api/v1/containers"))["containers"]


def unit(containers_now, path):
    return next((c for c in containers_now if c.get("container") == path and c.get("namespace") == "host"), None)


def wait_until(what, predicate, deadline=SEEN_DEADLINE):
    """Polls `predicate` until it returns a true value; records a miss instead of failing."""
    end = time.monotonic() + deadline
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception:  # the agent may be between answers; the deadline bounds this
            pass
        if time.monotonic() >= end:
            facts["errors"].append(f"waited {deadline}s for {what}")
            log(f"gave up waiting for {what}")
            return None
        time.sleep(0.25)


def terminated(path):
    """The host unit at `path` with a judged last termination."""
    found = unit(containers(), path)
    return found if found and found.get("last_termination") else None


def settings_read(path):
    """The systemd settings the agent read for the host unit at `path`, once it has."""
    found = unit(containers(), path)
    return found.get("systemd") if found else None


def cgroup_mode():
    kind = run("stat", "-fc", "%T", "/sys/fs/cgroup").stdout.strip()
    if kind == "cgroup2fs":
        return "unified"
    with open("/proc/self/mountinfo") as mounts:
        v2 = any(" - cgroup2 " in line for line in mounts)
    return "hybrid" if v2 else "legacy"


def service(name, program, *properties):
    """Starts `program` (Python source) as transient service `name`, waiting until it says it
    is ready (it touches READY_DIR/<name>)."""
    ready = os.path.join(READY_DIR, name)
    if os.path.exists(ready):
        os.remove(ready)
    command = ["systemd-run", "--quiet", f"--unit={name}"]
    command += [f"--property={p}" for p in properties]
    run(*command, PYTHON, "-c", program)
    wait_until(f"{name} to be ready", lambda: os.path.exists(ready), deadline=30)
    return int(run("systemctl", "show", "--property=MainPID", "--value", name).stdout.strip())


READY = "open('{ready}', 'w').close()\n"


def workload(boot):
    """The steps whose outcome the host judges; what each did is recorded in workload.json."""
    done = {}
    os.makedirs(READY_DIR, exist_ok=True)

    with Step("exit"):
        # A unit of its own whose process exits with a code.
        code = run("systemd-run", "--quiet", "--wait", "--unit=matrix-exit", "/bin/sh", "-c", "exit 7",
                   check=False).returncode
        done["exit"] = {"systemd_run_status": code}
        wait_until("the exit", lambda: terminated("/system.slice/matrix-exit.service"))

    with Step("signal"):
        # SIGUSR1 from `kill` (another process, in another unit), which the service takes as
        # its cue to exit 0.
        program = ("import signal, sys\nsignal.signal(signal.SIGUSR1, lambda *_: sys.exit(0))\n"
                   + READY.format(ready=READY_DIR + "/matrix-signal") + "while True: signal.pause()\n")
        pid = service("matrix-signal", program)
        run("/usr/bin/kill", "-USR1", str(pid))
        done["signal"] = {"pid": pid, "signal": 10}
        wait_until("the signalled exit", lambda: terminated("/system.slice/matrix-signal.service"))

    with Step("stop"):
        # `systemctl stop` of a service that ignores SIGTERM: systemd escalates to SIGKILL
        # after TimeoutStopSec.
        program = ("import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                   + READY.format(ready=READY_DIR + "/matrix-stop") + "while True: time.sleep(60)\n")
        pid = service("matrix-stop", program, "TimeoutStopSec=2")
        # What is judged is the stop against the unit's TimeoutStopSec=, so the agent has its
        # chance to read it first: a stop in the seconds before the read (systemd slow to answer
        # on a busy guest) is judged by no grace, which the view says (`systemd` absent).
        read = wait_until("the agent to read matrix-stop's settings",
                          lambda: settings_read("/system.slice/matrix-stop.service"))
        done["stop_settings_read"] = read is not None
        start = time.monotonic()
        run("systemctl", "stop", "matrix-stop")
        done["stop"] = {"pid": pid, "stop_seconds": round(time.monotonic() - start, 3), "timeout_stop_sec": 2}
        wait_until("the stopped service", lambda: terminated("/system.slice/matrix-stop.service"))

    held = []
    with Step("backlog"):
        # A listener that never accepts, with two connections completed into its queue.
        program = ("import socket, time\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
                   f"s.bind(('127.0.0.1', {BACKLOG_PORT}))\ns.listen(8)\n"
                   + READY.format(ready=READY_DIR + "/matrix-backlog") + "while True: time.sleep(60)\n")
        service("matrix-backlog", program)
        for _ in range(2):
            held.append(socket.create_connection(("127.0.0.1", BACKLOG_PORT), timeout=10))
        done["backlog"] = {"port": BACKLOG_PORT, "queued": 2}
        wait_until("the queued connections", lambda: port_stats("matrix-backlog", BACKLOG_PORT, "established", 2))

    with Step("accept"):
        program = ("import socket, time\ns = socket.socket()\ns.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
                   f"s.bind(('127.0.0.1', {ACCEPT_PORT}))\ns.listen(8)\n"
                   + READY.format(ready=READY_DIR + "/matrix-accept")
                   + "kept = []\nwhile True:\n    c, _ = s.accept()\n    kept.append(c)\n")
        service("matrix-accept", program)
        held.append(socket.create_connection(("127.0.0.1", ACCEPT_PORT), timeout=10))
        done["accept"] = {"port": ACCEPT_PORT, "connections": 1}
        wait_until("the accept", lambda: port_stats("matrix-accept", ACCEPT_PORT, "accepts", 1))

    with Step("unix"):
        # A Unix-socket server accepting connections: none of it is TCP.
        program = ("import os, socket\ns = socket.socket(socket.AF_UNIX)\n"
                   f"s.bind('{UNIX_SOCKET}')\ns.listen(8)\n"
                   + READY.format(ready=READY_DIR + "/matrix-unix")
                   + "kept = []\nwhile True:\n    c, _ = s.accept()\n    kept.append(c)\n")
        if os.path.exists(UNIX_SOCKET):
            os.remove(UNIX_SOCKET)
        service("matrix-unix", program)
        for _ in range(UNIX_CONNECTIONS):
            client = socket.socket(socket.AF_UNIX)
            client.connect(UNIX_SOCKET)
            held.append(client)
        # A second TCP accept after the Unix ones: once the agent counted it, it has read the
        # records of the Unix accepts before it too (one CPU, one ring, in order).
        held.append(socket.create_connection(("127.0.0.1", ACCEPT_PORT), timeout=10))
        done["unix"] = {"socket": UNIX_SOCKET, "connections": UNIX_CONNECTIONS, "barrier_port": ACCEPT_PORT}
        wait_until("the accept after the Unix ones", lambda: port_stats("matrix-accept", ACCEPT_PORT, "accepts", 2))

    with Step("oom"):
        # A unit with MemoryMax whose process allocates (and touches) without end.
        program = "chunks = []\nwhile True: chunks.append(b'x' * (1 << 20))\n"
        code = run("systemd-run", "--quiet", "--wait", "--unit=matrix-oom", "--property=MemoryMax=64M",
                   PYTHON, "-c", program, check=False, timeout=300).returncode
        done["oom"] = {"systemd_run_status": code, "memory_max": 64 << 20}
        wait_until("the OOM kill", lambda: terminated("/system.slice/matrix-oom.service"))

    with Step("container"):
        done["container"] = container(boot)

    for connection in held:
        connection.close()
    return done


def port_stats(name, port, field, at_least):
    found = unit(containers(), f"/system.slice/{name}.service")
    stats = (found or {}).get("tcp", {}).get(str(port), {})
    return stats.get(field, 0) >= at_least


def container(boot):
    """A container in the kubelet's systemd-driver layout, made by containerd (runc's systemd
    cgroup driver): kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice/
    cri-containerd-<id>.scope."""
    uid, cid = boot["pod_uid"], boot["container_id"]
    ctr = ["ctr", "--namespace", "k8s.io"]
    run("modprobe", "overlay", check=False)
    run("systemctl", "start", "containerd")
    wait_until("containerd's socket", lambda: os.path.exists("/run/containerd/containerd.sock"), deadline=60)
    run(*ctr, "images", "import", os.path.join(PAYLOAD, boot["image_file"]), timeout=300)
    slice_name = "kubepods-burstable-pod" + uid.replace("-", "_") + ".slice"
    run(*ctr, "run", "--detach", "--runc-systemd-cgroup", "--cgroup", f"{slice_name}:cri-containerd:{cid}",
        boot["image"], cid, "/bin/sleep", "3600", timeout=120)
    pid = int(run(*ctr, "task", "ls").stdout.split(cid, 1)[1].split()[0])
    with open(f"/proc/{pid}/cgroup") as cgroups:
        cgroup = [line.strip() for line in cgroups]
    seen = wait_until("the container", lambda: any(c.get("container_id") == cid for c in containers()))
    # Kept for the host: the answer while it ran.
    write("containers-running.json", get("/api/v1/containers"))
    run(*ctr, "task", "kill", "--signal", "SIGKILL", cid)
    wait_until("the container's task to stop", lambda: "STOPPED" in run(*ctr, "task", "ls").stdout, deadline=60)
    run(*ctr, "task", "delete", cid, check=False)
    run(*ctr, "container", "delete", cid, check=False)
    return {"pod_uid": uid, "container_id": cid, "pid": pid, "proc_cgroup": cgroup, "seen": bool(seen)}


def collect(agent):
    """The agent's answers at the end, in every form the host reads."""
    write("metrics.txt", get("/metrics"))
    answer = get("/api/v1/containers")
    write("containers.json", answer)
    # History is kept per named pod (host units and containers named by id have none).
    pods = {(c.get("namespace", ""), c.get("pod", "")) for c in json.loads(answer)["containers"]}
    histories = {}
    for namespace, pod in sorted(p for p in pods if p[0] and p[1]):
        query = urllib.parse.urlencode({"namespace": namespace, "pod": pod})
        try:
            histories[f"{namespace}/{pod}"] = json.loads(get(f"/api/v1/history?{query}"))
        except Exception as error:  # recorded; the host reads what there is
            facts["errors"].append(f"history of {namespace}/{pod}: {error}")
    write_json("history.json", histories)
    status = run(AGENT, "status", "-o", "json", check=False)
    write("status.json", status.stdout)
    write("status.stderr", status.stderr)


def main():
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(PAYLOAD, "boot.json")) as boot_file:
        boot = json.load(boot_file)
    with open("/proc/uptime") as uptime:
        facts["uptime_at_check"] = float(uptime.read().split()[0])
    facts["uname"] = os.uname().release
    with open("/proc/version") as version:
        facts["proc_version"] = version.read().strip()
    with open("/proc/cmdline") as cmdline:
        facts["cmdline"] = cmdline.read().strip()
    facts["cgroup_mode"] = cgroup_mode()
    facts["systemd"] = run("systemctl", "--version").stdout.splitlines()[0]
    write_json("facts.json", facts)

    with Step("doctor"):
        doctor = run(AGENT, "doctor", "-o", "json", check=False, timeout=300)
        write("doctor.json", doctor.stdout)
        write("doctor.stderr", doctor.stderr)
        facts["doctor_status"] = doctor.returncode

    agent_log = open(os.path.join(RESULTS, "agent.log"), "w")
    agent_out = open(os.path.join(RESULTS, "agent.stdout"), "w")
    agent = None
    with Step("agent_start"):
        # The guest's container is made with ctr, and the CRI lists only the containers made
        # through it: pointed at a socket where no runtime answers, the agent names containers
        # by the pod uid and container id it reads from their cgroup path, which is the
        # classification under test. (With a CRI that answers without that container, the
        # agent shows nothing of its cgroup.)
        command = [AGENT, "run", "--listen", "127.0.0.1:9890", "--cri-socket", NO_RUNTIME]
        agent = subprocess.Popen(command, stdout=agent_out, stderr=agent_log)

        def healthy():
            if agent.poll() is not None:
                return "exited"
            return "up" if get("/healthz", timeout=5) is not None else None

        state = wait_until("the agent's /healthz", healthy, deadline=AGENT_START_DEADLINE)
        facts["agent_started"] = state == "up"
        facts["agent_exit_at_start"] = agent.poll()

    if facts.get("agent_started"):
        with Step("metrics_at_start"):
            write("metrics-start.txt", get("/metrics"))
        facts["workload"] = workload(boot)
        with Step("collect"):
            collect(agent)
        with Step("agent_stop"):
            agent.send_signal(signal.SIGTERM)
            try:
                facts["agent_exit_at_stop"] = agent.wait(timeout=60)
            except subprocess.TimeoutExpired:
                facts["errors"].append("the agent did not exit within 60 s of SIGTERM")
                agent.kill()
                facts["agent_exit_at_stop"] = agent.wait()
    elif agent is not None and agent.poll() is None:
        agent.kill()
        agent.wait()

    with Step("kernel_log"):
        write("dmesg.txt", run("dmesg", check=False).stdout)
        write("journal.txt", run("journalctl", "-b", "--no-pager", "-o", "short-monotonic", check=False,
                                 timeout=120).stdout)
    facts["check_seconds"] = round(time.monotonic() - began, 2)
    write_json("facts.json", facts)
    os.sync()


if __name__ == "__main__":
    try:
        main()
    except Exception:
        facts["errors"].append("check.py: " + traceback.format_exc())
        write_json("facts.json", facts)
        os.sync()
        sys.exit(1)
