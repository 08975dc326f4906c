//! Kubernetes Events for the warnings the model notes (opt-in `--events`): published on the
//! Pod with kube's event recorder, which folds repeats into one Event series, and rate limited
//! per pod so a crash-looping pod cannot flood the API server.

use crate::export::{families::AgentFamily, metrics::vec_of};
use std::{
    collections::HashMap,
    sync::Arc,
    time::{Duration, Instant},
};

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use prometheus::{IntCounterVec, Registry};
use tokio::sync::{mpsc, watch};

use crate::{
    discovery::kube::{watch::KubeSource, words::ApiWords},
    model::node::{Command, PodWarning, WarningReason},
    probe::metrics::ProbeMetrics,
};

/// How often the model is asked for the warnings it noted.
const PERIOD: Duration = Duration::from_secs(1);
/// Events a pod may get in a burst...
const BURST: f64 = 5.0;
/// ... and one more per this long after that.
const REFILL: Duration = Duration::from_secs(60);
/// A pod's bucket is forgotten after this long without warnings.
const IDLE: Duration = Duration::from_secs(600);

/// Per-pod token buckets.
#[derive(Default)]
struct RateLimit {
    pods: HashMap<String, (f64, Instant)>,
}

impl RateLimit {
    /// Whether pod `uid` may get one more Event at `now`.
    fn allow(&mut self, uid: &str, now: Instant) -> bool {
        self.pods.retain(|_, (_, last)| now.duration_since(*last) < IDLE);
        let (tokens, last) = self.pods.entry(uid.to_owned()).or_insert((BURST, now));
        *tokens = (*tokens + now.duration_since(*last).as_secs_f64() / REFILL.as_secs_f64()).min(BURST);
        *last = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// `lifecycle_kubernetes_events_total{result}`: published, rate_limited, failed.
pub(super) fn register(registry: &Registry) -> Result<IntCounterVec, prometheus::Error> {
    let events = vec_of(AgentFamily::KubernetesEvents, IntCounterVec::new)?;
    registry.register(Box::new(events.clone()))?;
    Ok(events)
}

/// Publishes the tracker's warnings as Events until shutdown.
pub(super) async fn event_loop(
    source: KubeSource,
    model: crate::owner::ModelHandle,
    mut noted: mpsc::UnboundedReceiver<Vec<PodWarning>>,
    probes: Arc<ProbeMetrics>,
    counts: IntCounterVec,
    mut shutdown: watch::Receiver<bool>,
) {
    let reporter = Reporter { controller: "lifecycle-agent".into(), instance: Some(source.node().to_owned()) };
    let recorder = Recorder::new(source.client(), reporter);
    let mut limit = RateLimit::default();
    let mut ticker = tokio::time::interval(PERIOD);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = shutdown.changed() => return,
        }
        // The model hands its warnings to the notice sink, which queues them here.
        model.update(Command::FlushWarnings).await;
        let mut warnings = Vec::new();
        while let Ok(noted) = noted.try_recv() {
            warnings.extend(noted);
        }
        warnings.extend(probes.take_stall_warnings());
        for warning in warnings {
            if !limit.allow(&warning.pod_uid, Instant::now()) {
                counts.with_label_values(&["rate_limited"]).inc();
                continue;
            }
            let (event, reference) = event_for(&warning);
            match recorder.publish(&event, &reference).await {
                Ok(()) => counts.with_label_values(&["published"]).inc(),
                Err(err) => {
                    counts.with_label_values(&["failed"]).inc();
                    log::debug!("event for {}/{} not published: {}", warning.namespace, warning.pod, ApiWords(&err));
                }
            }
        }
    }
}

/// The Event and the Pod it is about.
fn event_for(warning: &PodWarning) -> (Event, ObjectReference) {
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        name: Some(warning.pod.clone()),
        namespace: Some(warning.namespace.clone()),
        // A probe's warning knows the pod by name only; the name and namespace identify it.
        uid: Some(warning.pod_uid.clone()).filter(|uid| !uid.is_empty()),
        field_path: Some(format!("spec.containers{{{}}}", warning.container)),
        ..ObjectReference::default()
    };
    let event = Event {
        type_: EventType::Warning,
        reason: warning.reason.as_str().to_owned(),
        note: Some(note_for(warning)),
        action: "Judging".into(),
        secondary: None,
    };
    (event, reference)
}

/// Longest note the API server takes on an Event (events.k8s.io/v1 `note`).
const MAX_NOTE_BYTES: usize = 1024;

/// The Event's note: the container, the model's one line, and where the rest is. Cut to what
/// the API server takes (a note comes partly from a pod: its process names).
fn note_for(warning: &PodWarning) -> String {
    let hint = match warning.reason {
        WarningReason::GracePeriodExceeded | WarningReason::KilledBeforeGracePeriod => {
            format!(" (timeline: lifecycle-agent explain {}/{})", warning.namespace, warning.pod)
        }
        _ => String::new(),
    };
    let mut note = format!("container {}: {}", warning.container, warning.note);
    let room = MAX_NOTE_BYTES.saturating_sub(hint.len());
    if note.len() > room {
        let mut cut = room.saturating_sub(3);
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
        note.push_str("...");
    }
    note + &hint
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_gets_a_burst_then_one_event_a_minute() {
        let mut limit = RateLimit::default();
        let start = Instant::now();
        let allowed = (0..10).filter(|_| limit.allow("u", start)).count();
        assert_eq!(allowed, 5);
        assert!(!limit.allow("u", start + Duration::from_secs(30)));
        assert!(limit.allow("u", start + Duration::from_secs(61)));
        assert!(limit.allow("other", start), "pods are limited apart");
    }

    #[test]
    fn a_termination_note_says_where_the_timeline_is_and_fits_the_api() {
        let warning = |note: String| PodWarning {
            namespace: "shop".into(),
            pod: "web-1".into(),
            pod_uid: "u".into(),
            container: "app".into(),
            reason: WarningReason::GracePeriodExceeded,
            note,
        };
        let note = note_for(&warning("SIGKILLed 30.0s after the stop signal".into()));
        assert_eq!(
            note,
            "container app: SIGKILLed 30.0s after the stop signal (timeline: lifecycle-agent explain shop/web-1)"
        );
        let long = note_for(&warning("é".repeat(2000)));
        assert!(long.len() <= MAX_NOTE_BYTES && long.ends_with("(timeline: lifecycle-agent explain shop/web-1)"));
    }
}
