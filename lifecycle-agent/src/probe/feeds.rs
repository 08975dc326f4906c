//! Where the model's facts of each probed container are published: one `watch` channel per
//! container, so a change costs the containers it concerns and wakes only their probes. The
//! probe supervisor opens a container's feed before the model watches it; the model's owner
//! publishes into it (a sink, `owner.rs`) each time a command names the container
//! (`model::node::ProbeChanges`), before that command's sender is answered.

use std::{collections::HashMap, sync::Arc};

use parking_lot::Mutex;

use tokio::sync::watch;

use super::metrics::ProbeMetrics;
use crate::model::node::{ProbeChanges, ProbeFacts, ProbeKey};

/// The feeds of the probed containers (see the module header).
#[derive(Default)]
pub struct ProbeFeeds {
    senders: Mutex<HashMap<ProbeKey, watch::Sender<Arc<ProbeFacts>>>>,
    metrics: Option<Arc<ProbeMetrics>>,
}

impl ProbeFeeds {
    /// Feeds whose untracked ports are counted in `metrics`.
    pub fn new(metrics: Option<Arc<ProbeMetrics>>) -> Self {
        Self { metrics, ..Self::default() }
    }

    /// Opens `key`'s feed, empty until the model publishes: a feed opened again replaces the
    /// old one, whose readers then see it closed.
    pub fn open(&self, key: &ProbeKey) -> watch::Receiver<Arc<ProbeFacts>> {
        let (sender, receiver) = watch::channel(Arc::default());
        self.senders.lock().insert(key.clone(), sender);
        receiver
    }

    /// Closes `key`'s feed.
    pub(crate) fn close(&self, key: &ProbeKey) {
        self.senders.lock().remove(key);
    }

    /// Publishes the facts of the containers `changes` names, as `facts` tells them now, and
    /// counts the ports it left out.
    pub fn publish(&self, changes: ProbeChanges, mut facts: impl FnMut(&ProbeKey) -> Option<ProbeFacts>) {
        if changes.untracked_ports > 0 {
            if let Some(metrics) = &self.metrics {
                metrics.record_untracked_ports(changes.untracked_ports);
            }
        }
        if changes.changed.is_empty() {
            return;
        }
        let mut keys = changes.changed;
        keys.sort_unstable();
        keys.dedup();
        let senders = self.senders.lock();
        for key in &keys {
            if let (Some(sender), Some(now)) = (senders.get(key), facts(key)) {
                sender.send_replace(Arc::new(now));
            }
        }
    }
}

/// The sink of the probed containers' facts (`owner.rs`).
impl crate::owner::ProbeSink for ProbeFeeds {
    fn publish(&self, changes: ProbeChanges, facts: &mut dyn FnMut(&ProbeKey) -> Option<ProbeFacts>) {
        ProbeFeeds::publish(self, changes, facts);
    }
}
