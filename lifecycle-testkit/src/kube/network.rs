//! Pod networking through containerd's CNI with the node's plugins (Debian's for the 1.20 node,
//! the kubernetes-modern cache's for the current one): a bridge of the node's own
//! (`lck<pid>-<n>`), host-local addresses from a /24 kept in the run directory, and a gateway
//! address on the bridge so the host (the kubelet's HTTP probes) reaches pod IPs. No masquerade,
//! no port mapping: nothing touches iptables.
//!
//! containerd reads the plugins from its run directory's `cni/bin` (links to the plugin
//! directory of the node's version) and the config from `cni/conf`, which it watches, and puts
//! the pods' network namespaces under its state directory. libcni caches results in `/var/lib/cni/results`
//! (`<network>-<sandbox>-eth0`, `cni-loopback-<sandbox>-lo`); pod teardown removes them, and
//! [`clean`] removes what a crash left, then the bridge.

use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::containerd::host::run as run_command;

const PLUGINS: &[&str] = &["bridge", "host-local", "loopback"];
const CNI_RESULTS: &str = "/var/lib/cni/results";

/// The node's network: names and the subnet, recorded in the run directory.
pub(super) struct Network {
    pub(super) name: String,
    pub(super) bridge: String,
    pub(super) subnet: String,
}

impl Network {
    /// Names unique to this run, and a /24 in 10.244.0.0/16 no route of the host uses.
    pub(super) fn choose(pid: u32, sequence: usize) -> Result<Self> {
        let routes = String::from_utf8_lossy(
            &Command::new("ip").args(["-4", "route", "show"]).output().context("ip route")?.stdout,
        )
        .into_owned();
        let start = (pid as usize + sequence) % 250;
        let third = (0..250)
            .map(|i| (start + i) % 250)
            .find(|third| !routes.contains(&format!("10.244.{third}.")))
            .context("no free /24 in 10.244.0.0/16")?;
        Ok(Self {
            name: format!("lifecycle-{pid}-{sequence}"),
            bridge: format!("lck{pid}-{sequence}"),
            subnet: format!("10.244.{third}.0/24"),
        })
    }

    /// Records the names for the sweep, links the plugins into containerd's CNI bin directory
    /// and writes the config into its conf directory, which containerd watches.
    pub(super) fn install(&self, run: &Path, containerd_run: &Path, plugin_dir: &Path) -> Result<()> {
        fs::write(run.join("network"), format!("{}\n{}\n", self.name, self.bridge)).context("record the network")?;
        let bin = containerd_run.join("cni/bin");
        let conf = containerd_run.join("cni/conf");
        for dir in [&bin, &conf] {
            fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        }
        for plugin in PLUGINS {
            let source = plugin_dir.join(plugin);
            if !source.is_file() {
                bail!("{} missing", source.display());
            }
            let link = bin.join(plugin);
            if !link.exists() {
                symlink(&source, &link).with_context(|| format!("link {}", link.display()))?;
            }
        }
        let config = serde_json::json!({
            "cniVersion": "0.4.0",
            "name": self.name,
            "plugins": [{
                "type": "bridge",
                "bridge": self.bridge,
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": false,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{ "subnet": self.subnet }]],
                    "dataDir": run.join("ipam"),
                },
            }],
        });
        // Written in place, in one write: containerd 1.6 ignores the CREATE event (a rename into
        // the directory goes unnoticed) and reloads on the WRITE that follows.
        fs::write(conf.join("10-lifecycle.conflist"), serde_json::to_vec(&config).context("encode the CNI config")?)
            .context("write the CNI config")
    }
}

/// Removes libcni's cache entries of the recorded network (and the loopback entries of the same
/// sandboxes) and deletes the bridge; returns what failed.
pub(super) fn clean(run: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    let text = fs::read_to_string(run.join("network")).unwrap_or_default();
    let mut lines = text.lines();
    let (Some(name), Some(bridge)) = (lines.next(), lines.next()) else {
        return problems;
    };
    let prefix = format!("{name}-");
    let ours: Vec<PathBuf> = fs::read_dir(CNI_RESULTS)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect();
    for file in ours {
        let sandbox = fs::read_to_string(&file)
            .ok()
            .and_then(|text| serde_json::from_str::<serde_json::Value>(&text).ok())
            .and_then(|cache| cache["containerId"].as_str().map(str::to_owned));
        if let Some(sandbox) = sandbox {
            let _ = fs::remove_file(Path::new(CNI_RESULTS).join(format!("cni-loopback-{sandbox}-lo")));
        }
        if let Err(e) = fs::remove_file(&file) {
            problems.push(format!("remove {}: {e}", file.display()));
        }
    }
    if Path::new("/sys/class/net").join(bridge).exists() {
        if let Err(e) = run_command(Command::new("ip").args(["link", "delete", bridge])) {
            problems.push(format!("delete bridge {bridge}: {e:#}"));
        }
    }
    problems
}
