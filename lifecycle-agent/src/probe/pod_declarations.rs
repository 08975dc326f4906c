//! What each pod declared for its probes, from both of its sources: the `lifecycle.dev/probes`
//! annotation (from the CRI) and the `httpGet` probes of its spec aimed at the probe port (from
//! the Kubernetes API): the kubelet will send exactly those paths. Each pod's declaration is
//! parsed once per text it has: refused entries are logged then, once, and counted. Pods are
//! told apart by uid: one recreated under its name has a declaration of its own.

use std::collections::HashMap;

use super::{
    declaration::{Declaration, Refusal, RefusalReason, MAX_ENTRIES_PER_POD},
    metrics::ProbeMetrics,
    CheckSpec,
};
use crate::model::node::{RunningContainer, UnitLabels};

/// A pod's declaration, as parsed from its sources.
struct PodDeclaration {
    sources: DeclarationSources,
    parsed: Declaration,
}

/// Where a pod's declared checks come from: its annotation's text, and the `httpGet` paths of
/// its containers' probes aimed at the probe port (container name, path), in spec order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(super) struct DeclarationSources {
    annotation: Option<String>,
    spec: Vec<(String, String)>,
}

impl DeclarationSources {
    pub(super) fn of(container: &RunningContainer, probe_port: Option<u16>) -> Self {
        let spec = match probe_port {
            Some(port) => container
                .spec_probes
                .iter()
                .filter(|(_, probe)| probe.port == port)
                .map(|(name, probe)| (name.clone(), probe.path.clone()))
                .collect(),
            // Without per-pod listeners no kubelet probe reaches the agent through a pod spec.
            None => Vec::new(),
        };
        Self { annotation: container.probe_declaration.clone(), spec }
    }

    fn is_empty(&self) -> bool {
        self.annotation.is_none() && self.spec.is_empty()
    }

    /// The annotation's entries first, then the spec's (each for its own container); the bound
    /// on entries counts both.
    fn parse(&self) -> (Declaration, Vec<Refusal>) {
        let (mut declaration, mut refusals) = Declaration::from_annotation(self.annotation.as_deref().unwrap_or(""));
        for (container, path) in &self.spec {
            if let Err(refusal) = declaration.add(Some(container), path) {
                refusals.push(refusal);
            }
        }
        (declaration, refusals)
    }
}

/// The pods' parsed declarations, by pod uid, each with the sources it was parsed from.
#[derive(Default)]
pub(super) struct PodDeclarations(HashMap<String, PodDeclaration>);

impl PodDeclarations {
    /// The checks the pod of the container labelled `labels` declared for it, parsing (and
    /// reporting on, in `metrics` and the log) the pod's declaration the first time these
    /// sources are seen.
    pub(super) fn checks_for(
        &mut self,
        labels: &UnitLabels,
        sources: DeclarationSources,
        metrics: &ProbeMetrics,
    ) -> Vec<CheckSpec> {
        // Nothing declared, or not known yet: nothing answers, and nothing cached changes.
        if sources.is_empty() {
            return Vec::new();
        }
        let UnitLabels { namespace, pod, uid, .. } = labels;
        if self.0.get(uid).is_none_or(|known| known.sources != sources) {
            let (parsed, refusals) = sources.parse();
            let mut too_many = 0;
            for refusal in &refusals {
                metrics.record_refusal(refusal.reason);
                match refusal.reason {
                    RefusalReason::TooMany => too_many += 1,
                    _ => log::warn!("probe declaration of {namespace}/{pod}: {refusal}"),
                }
            }
            if too_many > 0 {
                log::warn!(
                    "probe declaration of {namespace}/{pod}: {too_many} entries past the first {MAX_ENTRIES_PER_POD} refused"
                );
            }
            self.0.insert(uid.clone(), PodDeclaration { sources, parsed });
        }
        self.0.get(uid).map(|d| d.parsed.checks_for(&labels.container)).unwrap_or_default()
    }

    /// Keeps the declarations of the pods whose uid `keep` holds to.
    pub(super) fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.0.retain(|uid, _| keep(uid));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{node::UnitLabels, spec::HttpProbe};
    use crate::probe::query::Query;

    fn running(annotation: Option<&str>, spec: &[(&str, u16, &str)]) -> RunningContainer {
        RunningContainer {
            labels: UnitLabels { namespace: "ns".into(), pod: "p".into(), container: "app".into(), uid: "u".into() },
            main_pid: 1,
            probe_declaration: annotation.map(str::to_owned),
            spec_probes: spec
                .iter()
                .map(|&(c, port, path)| (c.to_owned(), HttpProbe { port, path: path.to_owned() }))
                .collect(),
        }
    }

    #[test]
    fn spec_probes_on_the_probe_port_declare_checks_for_their_own_container() {
        let container = running(
            None,
            &[
                ("app", 9891, "/probe/process"),
                ("app", 8080, "/probe/tcp?port=1"),
                ("side", 9891, "/probe/tcp?port=80"),
            ],
        );
        let sources = DeclarationSources::of(&container, Some(9891));
        assert_eq!(sources.spec.len(), 2, "the probe aimed at another port declares nothing");
        let (declaration, refusals) = sources.parse();
        assert!(refusals.is_empty());
        assert_eq!(
            declaration.checks_for("app"),
            vec![CheckSpec::from_query("process", &Query::default()).expect("valid")]
        );
        assert_eq!(declaration.checks_for("side").len(), 1);
        assert!(declaration.checks_for("other").is_empty(), "a spec probe speaks for its container only");
        assert!(DeclarationSources::of(&container, None).is_empty(), "no pod listener, no spec declarations");
    }

    #[test]
    fn spec_probes_go_through_the_same_refusals_and_bound_as_the_annotation() {
        let annotation: String = (0..15).map(|p| format!("/probe/tcp?port={}\n", p + 1)).collect();
        let container = running(
            Some(&annotation),
            &[
                ("app", 9891, "/probe/file?path=/proc/1/environ&contains=x"),
                ("app", 9891, "/healthz"),
                ("app", 9891, "/probe/process"),
            ],
        );
        let (declaration, refusals) = DeclarationSources::of(&container, Some(9891)).parse();
        let reasons: Vec<RefusalReason> = refusals.iter().map(|r| r.reason).collect();
        assert_eq!(reasons, [RefusalReason::ForbiddenPath, RefusalReason::TooMany, RefusalReason::TooMany]);
        assert_eq!(declaration.checks_for("app").len(), 15);
    }
}
