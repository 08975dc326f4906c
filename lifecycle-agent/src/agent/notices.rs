//! The agent's sink for the model's notices and warnings (`owner::NoticeSink`): each is handed
//! to the loop that acts on it (ask the runtime, rescan cgroupfs, read the kernel's OOM line, ask
//! systemd, read the kubelet's configuration, publish Events) or counted and logged. It runs on
//! the owner's thread, so it only hands work over: it never waits and does no file I/O.

use std::sync::Arc;

use prometheus::{IntCounter, IntCounterVec};
use tokio::sync::{mpsc, Notify};

use super::{kubelet::KubeletStarts, systemd::SystemdRequests};
use crate::{
    model::node::{Notice, PodWarning, Resync},
    owner::NoticeSink,
};

/// Where each notice goes (see the module header).
pub(crate) struct NoticeHandlers {
    /// Wakes the runtime link: a container waits for its name.
    pub(crate) metadata_wanted: Arc<Notify>,
    /// Wakes the rescan loop (`tasks.rs`): an event named a cgroup the model did not know.
    pub(crate) rescan_wanted: Arc<Notify>,
    /// The OOM victims whose kernel log line is wanted (`tasks::oom_log_loop`); None when the
    /// kernel log cannot be read.
    pub(crate) oom_victims: Option<mpsc::UnboundedSender<u32>>,
    /// Where host units' settings are asked of systemd (never waited for here).
    pub(crate) systemd: SystemdRequests,
    /// Where a kubelet's start is told, for its configuration to be read again.
    pub(crate) kubelet: KubeletStarts,
    /// `lifecycle_state_repairs_total{kind}`.
    pub(crate) repairs: IntCounterVec,
    /// `lifecycle_kubernetes_notices_refused_total`, with the Kubernetes API.
    pub(crate) notices_refused: Option<IntCounter>,
    /// The Event publisher's queue (`events.rs`, with `--events`).
    pub(crate) warnings: Option<mpsc::UnboundedSender<Vec<PodWarning>>>,
}

impl NoticeSink for NoticeHandlers {
    fn notices(&mut self, notices: Vec<Notice>) {
        for notice in notices {
            match notice {
                Notice::MetadataNeeded { .. } => self.metadata_wanted.notify_one(),
                Notice::UnknownCgroup(_) => self.rescan_wanted.notify_one(),
                Notice::BadCgroupPath { path, error } => log::warn!("cgroup {path}: {error}"),
                Notice::OomLimitWanted { pid } => {
                    if let Some(victims) = &self.oom_victims {
                        let _ = victims.send(pid);
                    }
                }
                Notice::SystemdUnitWanted { path, unit } => self.systemd.ask(path, unit),
                Notice::KubeletStarted { pid } => self.kubelet.started(pid),
                Notice::Repaired(report) => self.repaired(report),
                Notice::ProbeWatchRefused { key } => log::warn!(
                    "probes of container {} of pod {}: more than {} probed containers; not watched",
                    key.container,
                    key.uid,
                    crate::model::node::MAX_PROBE_WATCHES
                ),
                Notice::ForgedNotice { namespace, name } => {
                    if let Some(refused) = &self.notices_refused {
                        refused.inc();
                    }
                    log::warn!(
                        "an Event in namespace {namespace:?} names pod {name:?} by the uid of another pod of this \
                         node; ignored (forged?)"
                    );
                }
            }
        }
    }

    fn warnings(&mut self, warnings: Vec<PodWarning>) {
        if let Some(queue) = &self.warnings {
            let _ = queue.send(warnings);
        }
    }
}

impl NoticeHandlers {
    /// Counts what a repair or a rescan found, and says so when it repaired something.
    fn repaired(&self, report: Resync) {
        self.repairs.with_label_values(&["exit"]).inc_by(report.exits_unseen as u64);
        self.repairs.with_label_values(&["cgroup_removed"]).inc_by(report.cgroups_removed_unseen as u64);
        self.repairs.with_label_values(&["cgroup_created"]).inc_by(report.cgroups_created_unseen as u64);
        if report != Resync::default() {
            log::warn!(
                "records were lost (lifecycle_events_lost_total): repaired from /proc and cgroupfs: {} exits, {} cgroups removed, {} created",
                report.exits_unseen,
                report.cgroups_removed_unseen,
                report.cgroups_created_unseen
            );
        }
    }
}
