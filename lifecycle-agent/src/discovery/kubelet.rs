//! The node's kubelet as its process shows it: found in `/proc` by name, its argument vector
//! (`/proc/<pid>/cmdline`), and the configuration files that vector names, read inside the
//! kubelet's own root (`/proc/<pid>/root`, resolved by the kernel with `RESOLVE_IN_ROOT`, so a
//! symlink in the kubelet's filesystem resolves there and not in the agent's). The merge, the
//! defaults and what they mean are the model's (`lifecycle-model/src/kubelet/`); this module
//! only reads.
//!
//! Why this source (`docs/kubelet-behaviour.md`, "What the agent reads of the kubelet"): the
//! agent is in the host's PID namespace already (it must be, to see the kernel's pids), so
//! reading the kubelet's command line and files costs no new privilege; the kubelet's own
//! `/configz` is reached through the API server's `nodes/proxy`, which also lets its holder run
//! commands in every pod of the node. The release is the Node object's (`discovery::kube`).
//!
//! Bounded: at most [`MAX_FILE_BYTES`] per file, [`MAX_DROP_INS`] drop-ins, [`MAX_DEPTH`]
//! directories deep; a file past the first is an error, not a truncated read.

use std::{
    fs::File,
    io,
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

use super::proc::{pin_root, read_file_in_pinned_root, ObserveError};
use crate::model::{
    identity::{classify, CgroupIdentity},
    kubelet::{config::effective, CommandLine, ConfigError, ConfigFile, KubeletConfig},
    time::SECOND,
};

/// The kubelet's process name as the kernel keeps it (`comm`).
const KUBELET_COMM: &str = "kubelet";
/// The largest configuration file read.
pub(crate) const MAX_FILE_BYTES: usize = 1024 * 1024;
/// The most drop-ins read from `--config-dir`.
pub(crate) const MAX_DROP_INS: usize = 64;
/// How deep `--config-dir` is walked (the kubelet walks all of it).
pub(crate) const MAX_DEPTH: usize = 4;
/// How much later than the kubelet's start a file may have been written and still be what it
/// read at its start.
const CHANGED_SLACK: Duration = Duration::from_secs(2);
/// The longest command line read.
const MAX_CMDLINE_BYTES: usize = 256 * 1024;

/// Why the kubelet's configuration could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KubeletReadError {
    /// No process named `kubelet` outside the containers (not a Kubernetes node, a kubelet
    /// embedded in another binary, or an agent outside the host's PID namespace).
    #[error("no kubelet process is visible (the agent needs the host's PID namespace: hostPID)")]
    NotFound,
    /// Several kubelets run and none names this node in `--hostname-override`.
    #[error("{} kubelet processes run ({}) and none has --hostname-override={node}", .pids.len(), pids_text(.pids))]
    Ambiguous { pids: Vec<u32>, node: String },
    /// `/proc/<pid>/cmdline` could not be read.
    #[error("cannot read the command line of the kubelet (pid {pid})")]
    CommandLine {
        pid: u32,
        #[source]
        source: io::Error,
    },
    /// A file inside the kubelet's root could not be read.
    #[error("cannot read {path} of the kubelet (pid {pid})")]
    File {
        pid: u32,
        path: String,
        #[source]
        source: ObserveError,
    },
    /// A file is larger than [`MAX_FILE_BYTES`].
    #[error("{path} is larger than {MAX_FILE_BYTES} bytes")]
    TooLarge { path: String },
    /// A file is neither JSON nor YAML (the parser's error is large: boxed).
    #[error("{path} is not YAML")]
    Yaml {
        path: String,
        #[source]
        source: Box<serde_saphyr::Error>,
    },
    /// A file that starts as JSON is not.
    #[error("{path} is not JSON")]
    Json {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    /// The drop-in directory could not be listed.
    #[error("cannot list {path} of the kubelet (pid {pid})")]
    Directory {
        pid: u32,
        path: String,
        #[source]
        source: io::Error,
    },
    /// More drop-ins than [`MAX_DROP_INS`].
    #[error("{path} holds more than {MAX_DROP_INS} drop-ins")]
    TooManyDropIns { path: String },
    /// The files merged are not a configuration the kubelet would run with.
    #[error("the kubelet's configuration")]
    Config(#[from] ConfigError),
}

fn pids_text(pids: &[u32]) -> String {
    pids.iter().map(u32::to_string).collect::<Vec<_>>().join(", ")
}

/// What was read of one kubelet.
#[derive(Debug)]
pub(crate) struct KubeletRead {
    pub(crate) pid: u32,
    pub(crate) command_line: CommandLine,
    /// The effective configuration, or why it could not be had.
    pub(crate) config: Result<KubeletConfig, KubeletReadError>,
    /// Where it came from, in words: `<file> + N drop-ins of <dir> + flags`.
    pub(crate) origin: String,
    /// Files changed after the kubelet started: it read them before (it never reads them again).
    pub(crate) changed_since_start: Vec<String>,
}

/// Finds the node's kubelet: the process named `kubelet` outside every container; among
/// several, the one whose `--hostname-override` is `node`.
pub(crate) fn find(node: &str) -> Result<u32, KubeletReadError> {
    let mut found = Vec::new();
    let all = procfs::process::all_processes().map_err(|_| KubeletReadError::NotFound)?;
    for process in all.flatten() {
        let Ok(stat) = process.stat() else { continue };
        if stat.comm != KUBELET_COMM {
            continue;
        }
        // A kubelet in a pod (kind, a node in a node) is that pod's, not this node's.
        let in_container = process.cgroups().ok().is_some_and(|groups| {
            groups.0.iter().filter(|g| g.hierarchy == 0).any(|g| {
                matches!(
                    classify(&g.pathname),
                    Ok(CgroupIdentity::Container { .. } | CgroupIdentity::Pod { .. }) | Err(_)
                )
            })
        });
        if !in_container {
            found.push(stat.pid as u32);
        }
    }
    match found.as_slice() {
        [] => Err(KubeletReadError::NotFound),
        [pid] => Ok(*pid),
        pids => {
            let named = pids
                .iter()
                .copied()
                .filter(|pid| command_line(*pid).is_ok_and(|line| line.hostname_override.as_deref() == Some(node)))
                .collect::<Vec<_>>();
            match named.as_slice() {
                [pid] => Ok(*pid),
                _ => Err(KubeletReadError::Ambiguous { pids: pids.to_vec(), node: node.to_owned() }),
            }
        }
    }
}

/// The kubelet's argument vector.
fn argv(pid: u32) -> Result<Vec<String>, KubeletReadError> {
    let path = format!("/proc/{pid}/cmdline");
    let read = |source| KubeletReadError::CommandLine { pid, source };
    let mut bytes = Vec::new();
    use std::io::Read as _;
    File::open(&path).and_then(|f| f.take(MAX_CMDLINE_BYTES as u64).read_to_end(&mut bytes)).map_err(read)?;
    Ok(bytes.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect())
}

fn command_line(pid: u32) -> Result<CommandLine, KubeletReadError> {
    argv(pid).map(|argv| CommandLine::parse(&argv))
}

/// Reads the kubelet `pid`'s command line and the configuration it names.
pub(crate) fn read(pid: u32) -> Result<KubeletRead, KubeletReadError> {
    let command_line = command_line(pid)?;
    let started = started_wall(pid);
    let mut changed_since_start = Vec::new();
    let mut origin = Vec::new();
    let config = (|| {
        let root = pin_root(pid).map_err(|source| KubeletReadError::File { pid, path: "/".into(), source })?;
        let cwd = std::fs::read_link(format!("/proc/{pid}/cwd")).unwrap_or_else(|_| PathBuf::from("/"));
        let mut note = |path: &str, modified: SystemTime| {
            // The start is known to a clock tick and read a moment apart from the wall clock; a
            // file written as the kubelet was spawned is not a later edit.
            if started.is_some_and(|started| modified > started + CHANGED_SLACK) {
                changed_since_start.push(path.to_owned());
            }
        };
        let file = match &command_line.config_file {
            Some(given) => {
                let path = in_kubelet_cwd(&cwd, given);
                let (content, modified) = read_config_file(&root, pid, &path)?;
                note(&path, modified);
                origin.push(path.clone());
                Some(ConfigFile { path, content })
            }
            None => None,
        };
        let mut drop_ins = Vec::new();
        if let Some(given) = &command_line.config_dir {
            let dir = in_kubelet_cwd(&cwd, given);
            let mut paths = Vec::new();
            walk_drop_ins(&root, pid, &dir, 0, &mut paths)?;
            for path in &paths {
                let (content, modified) = read_config_file(&root, pid, path)?;
                note(path, modified);
                // An empty drop-in changes nothing (the kubelet skips it).
                if !content.is_null() {
                    drop_ins.push(ConfigFile { path: path.clone(), content });
                }
            }
            origin.push(format!("{} drop-in(s) of {dir}", paths.len()));
        }
        Ok(effective(file.as_ref(), &drop_ins, &command_line)?)
    })();
    if !command_line.fields.is_empty() || !command_line.feature_gates.is_empty() {
        origin.push("flags".into());
    }
    let origin = match origin.is_empty() {
        true => format!("pid {pid}: no --config (flags and defaults)"),
        false => format!("pid {pid}: {}", origin.join(" + ")),
    };
    Ok(KubeletRead { pid, command_line, config, origin, changed_since_start })
}

/// `given` as the kubelet resolved it: relative to its working directory.
fn in_kubelet_cwd(cwd: &Path, given: &str) -> String {
    if given.starts_with('/') {
        given.to_owned()
    } else {
        cwd.join(given).to_string_lossy().into_owned()
    }
}

/// A configuration file, parsed (JSON or YAML; empty is null), and when it was last changed.
fn read_config_file(root: &File, pid: u32, path: &str) -> Result<(serde_json::Value, SystemTime), KubeletReadError> {
    let read = read_file_in_pinned_root(root, pid, path, MAX_FILE_BYTES + 1)
        .map_err(|source| KubeletReadError::File { pid, path: path.to_owned(), source })?;
    if read.head.len() > MAX_FILE_BYTES {
        return Err(KubeletReadError::TooLarge { path: path.to_owned() });
    }
    Ok((parse_config(path, &read.head)?, read.modified))
}

/// JSON when it starts as JSON (the kubelet's loader takes both), else YAML.
pub(crate) fn parse_config(path: &str, bytes: &[u8]) -> Result<serde_json::Value, KubeletReadError> {
    let text = String::from_utf8_lossy(bytes);
    let trimmed = text.trim_start();
    if trimmed.is_empty() {
        return Ok(serde_json::Value::Null);
    }
    if trimmed.starts_with('{') {
        return serde_json::from_str(trimmed)
            .map_err(|source| KubeletReadError::Json { path: path.to_owned(), source });
    }
    serde_saphyr::from_str(&text)
        .map_err(|source| KubeletReadError::Yaml { path: path.to_owned(), source: Box::new(source) })
}

/// The `.conf` files under `dir` (inside the kubelet's root) in the order the kubelet applies
/// them: `filepath.WalkDir`'s, entries in lexical order, a directory's files where it sorts.
fn walk_drop_ins(
    root: &File,
    pid: u32,
    dir: &str,
    depth: usize,
    into: &mut Vec<String>,
) -> Result<(), KubeletReadError> {
    use rustix::fs::{openat2, Dir, Mode, OFlags, ResolveFlags};
    let listed = |source: io::Error| KubeletReadError::Directory { pid, path: dir.to_owned(), source };
    let fd = openat2(
        root,
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::IN_ROOT | ResolveFlags::NO_MAGICLINKS,
    )
    .map_err(|errno| listed(errno.into()))?;
    let mut entries = Vec::new();
    for entry in Dir::read_from(&fd).map_err(|errno| listed(errno.into()))? {
        let entry = entry.map_err(|errno| listed(errno.into()))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "." || name == ".." {
            continue;
        }
        entries.push((name, entry.file_type()));
        if entries.len() > MAX_DROP_INS * 4 {
            return Err(KubeletReadError::TooManyDropIns { path: dir.to_owned() });
        }
    }
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    for (name, kind) in entries {
        let path = format!("{}/{name}", dir.trim_end_matches('/'));
        if kind == rustix::fs::FileType::Directory {
            if depth < MAX_DEPTH {
                walk_drop_ins(root, pid, &path, depth + 1, into)?;
            }
        } else if Path::new(&name).extension().is_some_and(|ext| ext == "conf") {
            if into.len() == MAX_DROP_INS {
                return Err(KubeletReadError::TooManyDropIns { path: dir.to_owned() });
            }
            into.push(path);
        }
    }
    Ok(())
}

/// When the kubelet `pid` started, on the wall clock (files' times are on it).
fn started_wall(pid: u32) -> Option<SystemTime> {
    let stat = procfs::process::Process::new(pid as i32).ok()?.stat().ok()?;
    let ticks = procfs::ticks_per_second().max(1);
    let started_boot_ns = stat.starttime.saturating_mul(SECOND / ticks);
    let age_ns = super::clock::boottime_ns().saturating_sub(started_boot_ns);
    SystemTime::now().checked_sub(Duration::from_nanos(age_ns))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_yaml_configurations_read_alike() {
        let yaml = b"apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
                     crashLoopBackOff:\n  maxContainerRestartPeriod: 20s\nfeatureGates:\n  MemoryQoS: true\n";
        let json = br#"{"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
                        "crashLoopBackOff": {"maxContainerRestartPeriod": "20s"}, "featureGates": {"MemoryQoS": true}}"#;
        let from_yaml = parse_config("/c.yaml", yaml).expect("yaml");
        assert_eq!(from_yaml, parse_config("/c.json", json).expect("json"));
        assert_eq!(from_yaml["crashLoopBackOff"]["maxContainerRestartPeriod"], "20s");
        assert_eq!(parse_config("/empty.conf", b"  \n").expect("empty"), serde_json::Value::Null);
    }

    #[test]
    fn broken_files_name_themselves() {
        let error = parse_config("/etc/kubelet.conf.d/10.conf", b"a: [unclosed").expect_err("not yaml");
        assert!(error.to_string().contains("/etc/kubelet.conf.d/10.conf"), "{error}");
        assert!(matches!(parse_config("/c.json", b"{\"a\": "), Err(KubeletReadError::Json { .. })));
    }

    #[test]
    fn relative_paths_are_the_kubelets_working_directorys() {
        assert_eq!(in_kubelet_cwd(Path::new("/var/lib/kubelet"), "config.yaml"), "/var/lib/kubelet/config.yaml");
        assert_eq!(in_kubelet_cwd(Path::new("/var/lib/kubelet"), "/etc/k.yaml"), "/etc/k.yaml");
    }

    /// A kubelet-like process (this test binary) whose files are in a temporary directory:
    /// the drop-ins are walked in the kubelet's order, bounded, and merged.
    #[test]
    fn drop_ins_are_walked_in_lexical_order_within_the_processes_root() {
        let dir = std::env::temp_dir().join(format!("lifecycle-kubelet-dropins-{}", std::process::id()));
        let conf = dir.join("conf.d");
        std::fs::create_dir_all(conf.join("20-sub")).expect("mkdir");
        let head = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";
        for (name, body) in [
            ("30-last.conf", "crashLoopBackOff:\n  maxContainerRestartPeriod: 45s\n"),
            ("10-first.conf", "crashLoopBackOff:\n  maxContainerRestartPeriod: 5s\n"),
            ("20-sub/1.conf", "featureGates:\n  MemoryQoS: true\n"),
            ("README", "not a drop-in"),
        ] {
            std::fs::write(conf.join(name), format!("{head}{body}")).expect("write");
        }
        let root = pin_root(std::process::id()).expect("own root");
        let mut paths = Vec::new();
        walk_drop_ins(&root, std::process::id(), &conf.to_string_lossy(), 0, &mut paths).expect("walked");
        let names: Vec<String> =
            paths.iter().map(|p| p.trim_start_matches(&*conf.to_string_lossy()).to_owned()).collect();
        assert_eq!(names, ["/10-first.conf", "/20-sub/1.conf", "/30-last.conf"]);
        let drop_ins: Vec<ConfigFile> = paths
            .iter()
            .map(|path| ConfigFile {
                path: path.clone(),
                content: read_config_file(&root, std::process::id(), path).expect("read").0,
            })
            .collect();
        let config = effective(None, &drop_ins, &CommandLine::default()).expect("merged");
        assert_eq!(config.max_container_restart_period_ns, Some(45 * SECOND));
        assert_eq!(config.feature_gates.get("MemoryQoS"), Some(&true));
        std::fs::remove_dir_all(&dir).expect("clean up");
    }
}
