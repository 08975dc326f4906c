//! One spelling per value of the enums that become words: metric label values, the API's JSON
//! and the verdict log all take it from the enum's `as_str`, and serde writes and reads that same
//! text, so a label and a JSON field cannot spell one value two ways.
//!
//! `spelling!(Enum { Variant => "text", ... })` gives the enum `as_str`, `ALL` (every value, in
//! the order listed) and the serde impls. The `match` in `as_str` is exhaustive, so a variant
//! added without a spelling does not compile.

/// See the module's documentation.
macro_rules! spelling {
    ($name:ident { $($variant:ident => $text:literal),+ $(,)? }) => {
        impl $name {
            /// Every value, in label order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The value as one word: its label value, and what the API writes.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }
        }

        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct Words;
                impl serde::de::Visitor<'_> for Words {
                    type Value = $name;

                    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                        f.write_str(concat!("a ", stringify!($name)))
                    }

                    fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<$name, E> {
                        const WORDS: &[&str] = &[$($text),+];
                        $name::ALL
                            .iter()
                            .copied()
                            .find(|value| value.as_str() == text)
                            .ok_or_else(|| E::unknown_variant(text, WORDS))
                    }
                }
                deserializer.deserialize_str(Words)
            }
        }
    };
}

pub(crate) use spelling;

#[cfg(test)]
mod tests {
    use crate::{
        backoff::Verdict,
        container_state::{TerminatedReason, WaitingReason},
        kubelet::{Gate, KubeletSource},
        node::{DisagreementKind, DroppedKind, PodPhase},
        spec::StopCause,
        termination::{OutcomeKind, SenderKind, SignalSender, TerminationOutcome},
    };

    /// Every value of `values` is written as its `as_str`, read back as itself, and spelled
    /// differently from every other.
    fn one_spelling_each<T>(values: &[T])
    where
        T: Copy + PartialEq + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
    {
        let words: std::collections::HashSet<String> = values
            .iter()
            .map(|value| {
                let written = serde_json::to_value(value).expect("serializes");
                assert_eq!(serde_json::from_value::<T>(written.clone()).expect("reads back"), *value);
                written.as_str().expect("a word").to_owned()
            })
            .collect();
        assert_eq!(words.len(), values.len(), "{values:?} share a spelling");
    }

    #[test]
    fn every_spelled_value_round_trips_as_its_own_word() {
        one_spelling_each(StopCause::ALL);
        one_spelling_each(DisagreementKind::ALL);
        one_spelling_each(WaitingReason::ALL);
        one_spelling_each(TerminatedReason::ALL);
        one_spelling_each(SenderKind::ALL);
        one_spelling_each(OutcomeKind::ALL);
        one_spelling_each(Verdict::ALL);
        one_spelling_each(PodPhase::ALL);
        one_spelling_each(DroppedKind::ALL);
        one_spelling_each(Gate::ALL);
        one_spelling_each(KubeletSource::ALL);
        let refused = serde_json::from_value::<StopCause>(serde_json::json!("Deleted")).expect_err("not a spelling");
        assert!(refused.to_string().contains("deleted"), "the error lists the words: {refused}");
    }

    #[test]
    fn reasons_are_the_kubelets_words() {
        assert_eq!(TerminatedReason::OomKilled.as_str(), "OOMKilled");
        assert_eq!(serde_json::to_value(TerminatedReason::OomKilled).expect("serializes"), "OOMKilled");
        assert_eq!(WaitingReason::CrashLoopBackOff.as_str(), "CrashLoopBackOff");
        assert_eq!(PodPhase::Succeeded.as_str(), "Succeeded");
        assert_eq!(OutcomeKind::SigkilledAfterGrace.as_str(), "sigkilled_after_grace");
        assert_eq!(SenderKind::SameContainer.as_str(), "same_container");
        assert_eq!(Verdict::TooEarly.as_str(), "too_early");
    }

    #[test]
    fn an_outcomes_kind_is_spelled_as_the_outcome_is_tagged() {
        let sender = Some(SignalSender::Kubelet);
        let killed = |early: bool| {
            let (grace_ns, stop_to_kill_ns, expected_kill_after_ns) = (30, 31, 30);
            let (accepts_after_stop, still_listening) = (0, false);
            match early {
                false => TerminationOutcome::SigkilledAfterGrace {
                    grace_ns,
                    stop_to_kill_ns,
                    expected_kill_after_ns,
                    sender: sender.clone(),
                    accepts_after_stop,
                    still_listening,
                },
                true => TerminationOutcome::SigkilledEarly {
                    grace_ns,
                    stop_to_kill_ns,
                    expected_kill_after_ns,
                    sender: sender.clone(),
                    accepts_after_stop,
                    still_listening,
                },
            }
        };
        let outcomes = [
            TerminationOutcome::ExitedWithinGrace { duration_ns: 1, grace_used_ratio: 0.5 },
            killed(false),
            killed(true),
            TerminationOutcome::KilledWithoutGrace { sender: sender.clone() },
            TerminationOutcome::StopSignalNotObserved { sender: sender.clone() },
            TerminationOutcome::SigkilledAfterStopSignal { stop_to_kill_ns: 3, sender: sender.clone() },
            TerminationOutcome::ExitedAfterStopSignal { duration_ns: 1 },
            TerminationOutcome::OomKilled,
            TerminationOutcome::ExitedWithoutStopSignal { exit_status: Some(1), signal: None },
        ];
        let kinds: Vec<OutcomeKind> = outcomes.iter().map(TerminationOutcome::kind).collect();
        assert_eq!(kinds, OutcomeKind::ALL, "one outcome of every kind");
        for outcome in outcomes {
            let tagged = serde_json::to_value(&outcome).expect("serializes");
            assert_eq!(tagged["kind"], outcome.kind().as_str(), "{outcome:?}");
        }
    }
}
