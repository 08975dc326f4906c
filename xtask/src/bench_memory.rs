//! `xtask/x.sh bench memory`: the agent's resident memory, idle and while it tracks N units.
//!
//! Each condition is one agent binary (this tree's release build; `--baseline` adds another,
//! e.g. a build of an older commit) started with its defaults and no Kubernetes credentials
//! (`KUBECONFIG` and the in-cluster variables removed: the API client stays idle). Per round and
//! condition:
//!
//! 1. start the agent, wait for /healthz, let it settle, read its memory (idle);
//! 2. create N kubepods-style container cgroups (`.../kubepods/besteffort/pod<uid>/<id>`, under a
//!    private parent so no kubelet on the machine sees them) and start one process in each, the
//!    way a runtime starts a container's init (`exec` into the cgroup from outside it);
//! 3. wait until /api/v1/containers lists all N, scrape /metrics and the API 10 times each (a
//!    node is scraped), let it settle, read its memory again;
//! 4. stop the agent, the processes, remove the cgroups.
//!
//! Memory is read from `/proc/<pid>`: VmRSS (and its anon/file split), VmHWM (the peak, reached
//! while loading), the resident size of the ring buffer's mapping (smaps, `anon_inode:bpf-map`:
//! the kernel maps the ring's data pages twice, so it counts double), and the kernel memory of
//! the agent's BPF maps (`memlock` in fdinfo; not part of RSS, but charged to the agent's memory
//! cgroup on kernels >= 5.11).

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};

use super::{free_port, loadavg, median, plain_host_agent, sample_values, wait_http, Tracer};
use crate::{cargo, shell, workspace_root};

/// Quiet time before each reading.
const SETTLE: Duration = Duration::from_secs(3);
/// How long the agent gets to list every unit.
const UNITS_DEADLINE: Duration = Duration::from_secs(120);

/// One agent binary under test.
struct Agent {
    label: String,
    path: PathBuf,
}

/// One reading of the agent's memory, in KiB.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Reading {
    pub(super) rss: u64,
    anon: u64,
    file: u64,
    peak: u64,
    ring: u64,
    kernel_maps: u64,
}

/// Readings of one agent in one round.
#[derive(Clone, Debug, Default)]
struct Round {
    idle: Reading,
    loaded: Reading,
    /// Seconds from the first unit's creation until the API listed them all.
    listed_after_s: f64,
    /// Entries used in the per-cgroup counter map, and its capacity.
    counter_entries: String,
    metrics_bytes: usize,
}

pub fn run(units: usize, rounds: usize, baseline: Option<PathBuf>) -> Result<()> {
    if rounds == 0 || units == 0 {
        bail!("--rounds and --units must be at least 1");
    }
    shell::run(cargo().args(["build", "--release", "-p", "lifecycle-agent"]))?;
    let mut agents = Vec::new();
    if let Some(path) = baseline {
        if !path.is_file() {
            bail!("--baseline {}: no such file", path.display());
        }
        agents.push(Agent { label: format!("baseline ({})", path.display()), path });
    }
    agents.push(Agent { label: "this tree".into(), path: workspace_root().join("target/release/lifecycle-agent") });
    let root = cgroup2_root()?;
    let load_before = loadavg();
    let started = Instant::now();
    let mut results: Vec<Vec<Round>> = vec![Vec::new(); agents.len()];
    for round in 0..rounds {
        for offset in 0..agents.len() {
            // Alternate the order so neither binary always runs on a warmer machine.
            let index = (round + offset) % agents.len();
            let agent = &agents[index];
            let result =
                measure(agent, &root, units).with_context(|| format!("round {} of {}", round + 1, agent.label))?;
            eprintln!(
                "xtask: round {}/{rounds} {}: idle {} KiB, {units} units {} KiB (listed after {:.1} s)",
                round + 1,
                agent.label,
                result.idle.rss,
                result.loaded.rss,
                result.listed_after_s
            );
            results[index].push(result);
        }
    }
    print_table(&agents, &results, units);
    println!(
        "\n{rounds} rounds, medians (KiB = 1024 bytes); load average before {load_before}, after {}; {:.0} s\n\
         command: xtask/x.sh bench memory --units {units} --rounds {rounds}{}",
        loadavg(),
        started.elapsed().as_secs_f64(),
        if agents.len() > 1 { " --baseline <binary>" } else { "" }
    );
    Ok(())
}

fn print_table(agents: &[Agent], results: &[Vec<Round>], units: usize) {
    // The median over rounds of one field of one state (0 idle, 1 loaded).
    let med = |rounds: &[Round], state: usize, pick: fn(&Reading) -> u64| {
        median(&rounds.iter().map(|r| pick(&[r.idle, r.loaded][state]) as f64).collect::<Vec<_>>())
    };
    let mib = |kib: f64| format!("{:.1} MiB", kib / 1024.0);
    println!();
    println!(
        "| agent | state | RSS | RSS vs {} | anon | file-backed | of which ring mapping | peak RSS (VmHWM) | \
         kernel map memory |",
        if agents.len() > 1 { "baseline" } else { "idle" }
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    let loaded_state = format!("{units} units");
    for (agent, rounds) in agents.iter().zip(results) {
        for (state, name) in [(0, "idle"), (1, loaded_state.as_str())] {
            let rss = med(rounds, state, |r| r.rss);
            // Against the baseline binary in the same state, or else against this one idle.
            let versus = if agents.len() > 1 { med(&results[0], state, |r| r.rss) } else { med(rounds, 0, |r| r.rss) };
            println!(
                "| {} | {name} | {} | {:.2} | {} | {} | {} | {} | {} |",
                agent.label,
                mib(rss),
                rss / versus,
                mib(med(rounds, state, |r| r.anon)),
                mib(med(rounds, state, |r| r.file)),
                mib(med(rounds, state, |r| r.ring)),
                mib(med(rounds, state, |r| r.peak)),
                mib(med(rounds, state, |r| r.kernel_maps)),
            );
        }
    }
    println!();
    println!("| agent | units listed by the API after | counter map entries (used/capacity) | /metrics body |");
    println!("|---|---|---|---|");
    for (agent, rounds) in agents.iter().zip(results) {
        let listed = median(&rounds.iter().map(|r| r.listed_after_s).collect::<Vec<_>>());
        let last = rounds.last().cloned().unwrap_or_default();
        println!("| {} | {listed:.1} s | {} | {} KiB |", agent.label, last.counter_entries, last.metrics_bytes / 1024);
    }
}

/// One agent, one round: idle, then with `units` units.
fn measure(agent: &Agent, root: &Path, units: usize) -> Result<Round> {
    let addr = format!("127.0.0.1:{}", free_port()?);
    let mut tracer = Tracer::spawn(agent.label.clone(), &mut plain_host_agent(&agent.path, &addr))?;
    wait_http(&mut tracer, &addr)?;
    std::thread::sleep(SETTLE);
    let pid = tracer.pid();
    let idle = read_memory(pid)?;

    let mut node = FakeNode::new(root)?;
    let created = Instant::now();
    node.start(units)?;
    let deadline = created + UNITS_DEADLINE;
    loop {
        tracer.check_alive()?;
        let body = get(&addr, "/api/v1/containers")?;
        let listed = body.matches(&format!("\"pod_uid\":\"{}", node.uid_prefix)).count();
        if listed >= units {
            break;
        }
        if Instant::now() > deadline {
            bail!("the agent listed {listed} of {units} units within {UNITS_DEADLINE:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let listed_after_s = created.elapsed().as_secs_f64();
    let mut metrics = String::new();
    for _ in 0..10 {
        metrics = get(&addr, "/metrics")?;
        get(&addr, "/api/v1/containers")?;
    }
    std::thread::sleep(SETTLE);
    let loaded = read_memory(pid)?;
    let gauge = |family: &str| {
        let value = sample_values(&metrics, family, &["map=\"cgroup_counters\""]).next();
        value.map_or_else(|| "?".to_owned(), |v| v.to_string())
    };
    let counter_entries =
        format!("{}/{}", gauge("lifecycle_kernel_map_entries"), gauge("lifecycle_kernel_map_capacity"));
    drop(tracer);
    drop(node);
    Ok(Round { idle, loaded, listed_after_s, counter_entries, metrics_bytes: metrics.len() })
}

/// The body of `GET path` from the agent.
pub(super) fn get(addr: &str, path: &str) -> Result<String> {
    let mut stream = TcpStream::connect(addr).with_context(|| format!("connecting to {addr}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    stream.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())?;
    let mut response = String::new();
    stream.read_to_string(&mut response).with_context(|| format!("reading {path}"))?;
    let (head, body) = response.split_once("\r\n\r\n").context("response without a head")?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        bail!("GET {path}: {}", head.lines().next().unwrap_or(head));
    }
    Ok(body.to_owned())
}

pub(super) fn read_memory(pid: u32) -> Result<Reading> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).context("reading status")?;
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    // The ring's mapping: resident pages of the bpf-map mappings in smaps.
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).context("reading smaps")?;
    let mut ring = 0;
    let mut in_map = false;
    for line in smaps.lines() {
        let is_header =
            line.split_whitespace().next().is_some_and(|first| first.contains('-') && !first.ends_with(':'));
        if is_header {
            in_map = line.ends_with("anon_inode:bpf-map");
        } else if in_map {
            if let Some(rest) = line.strip_prefix("Rss:") {
                ring += rest.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            }
        }
    }
    // Kernel memory of every BPF map the agent holds: `memlock` (bytes) in each map fd's fdinfo.
    let mut kernel_maps = 0;
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd")).context("listing fds")? {
        let entry = entry?;
        let is_map = std::fs::read_link(entry.path()).is_ok_and(|target| target == Path::new("anon_inode:bpf-map"));
        if !is_map {
            continue;
        }
        let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{}", entry.file_name().to_string_lossy()))
            .unwrap_or_default();
        kernel_maps += info
            .lines()
            .find_map(|l| l.strip_prefix("memlock:"))
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
            / 1024;
    }
    Ok(Reading {
        rss: field("VmRSS:"),
        anon: field("RssAnon:"),
        file: field("RssFile:") + field("RssShmem:"),
        peak: field("VmHWM:"),
        ring,
        kernel_maps,
    })
}

/// Where cgroup v2 is mounted (`/sys/fs/cgroup` on unified hosts, `/sys/fs/cgroup/unified` on
/// hybrid ones).
pub(super) fn cgroup2_root() -> Result<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").context("reading mountinfo")?;
    mountinfo
        .lines()
        .find_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let mount_point = left.split_whitespace().nth(4)?;
            (right.split_whitespace().next() == Some("cgroup2")).then(|| PathBuf::from(mount_point))
        })
        .context("no cgroup v2 mount")
}

/// Container cgroups with one process each, under a private parent; removed on drop.
pub(super) struct FakeNode {
    parent: PathBuf,
    pub(super) uid_prefix: String,
    children: Vec<Child>,
    dirs: Vec<PathBuf>,
}

impl FakeNode {
    pub(super) fn new(root: &Path) -> Result<Self> {
        let parent = root.join(format!("lifecycle-bench-memory-{}", std::process::id()));
        std::fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
        // A marker per run, so a leftover from an earlier run is never counted.
        let marker = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let uid_prefix = format!("{:08x}-", (marker as u32) | 0x1000_0000);
        Ok(Self { parent, uid_prefix, children: Vec::new(), dirs: Vec::new() })
    }

    /// `units` container cgroups, each with a process started into it from outside (as a
    /// runtime starts a container's init): `sh` moves itself in, then execs `sleep`.
    pub(super) fn start(&mut self, units: usize) -> Result<()> {
        for i in 0..units {
            let uid = format!("{}0000-0000-0000-{i:012x}", self.uid_prefix);
            let pod = self.parent.join(format!("kubepods/besteffort/pod{uid}"));
            let dir = pod.join(format!("{:064x}", i + 1));
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            self.dirs.push(dir.clone());
            self.dirs.push(pod);
            let procs = dir.join("cgroup.procs");
            let child = Command::new("/bin/sh")
                .args(["-c", "echo $$ > \"$1\" && exec /bin/sleep infinity", "sh"])
                .arg(&procs)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .context("starting a unit's process")?;
            self.children.push(child);
        }
        Ok(())
    }
}

impl Drop for FakeNode {
    fn drop(&mut self) {
        // Only the processes this benchmark started, by pid.
        for child in &mut self.children {
            let _ = child.kill();
        }
        for child in &mut self.children {
            let _ = child.wait();
        }
        // A cgroup can be removed once its last process is reaped; give the kernel a moment.
        for dir in self.dirs.iter().chain([
            &self.parent.join("kubepods/besteffort"),
            &self.parent.join("kubepods"),
            &self.parent,
        ]) {
            for _ in 0..50 {
                if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}
