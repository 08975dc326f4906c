//! `/healthz` and `/readyz` on the health listener (`--health-listen`), answered from the
//! loops' heartbeats (`heartbeats.rs`).

use std::time::Duration;

use crate::heartbeats::Heartbeats;

/// `/healthz` and `/readyz` as the health listener answers them (`--health-listen`), on a loop of
/// its own (the probe listeners' event loop, `probe/listener.rs`, on a thread of its own): a
/// request that comes whole is answered on its first read, without needing a place, so clients
/// that hold connections, however many and from wherever, cannot keep the kubelet's probe from
/// an answer; and no request on `--listen` or the async workers stands before it.
pub(crate) struct HealthAnswer(pub(crate) std::sync::Arc<Heartbeats>);

impl crate::probe::ProbeAnswer for HealthAnswer {
    fn answer(&self, path: &str, _query: Option<&str>) -> (u16, String) {
        let state = match path {
            "/healthz" => self.0.check(),
            "/readyz" => self.0.ready(),
            _ => return (404, "this listener serves /healthz and /readyz only\n".to_owned()),
        };
        match state {
            Ok(()) => (200, "ok\n".to_owned()),
            Err(why) => (503, format!("unhealthy: {why}\n")),
        }
    }
}

/// Serves `listener` (`--health-listen`) with [`HealthAnswer`] on a loop of its own, to anyone
/// (the kubelet's source is the node's, whichever it is), each request head within 1 s, until
/// the returned handle is dropped.
pub(crate) fn serve(
    listener: std::net::TcpListener,
    heartbeats: std::sync::Arc<Heartbeats>,
    counters: crate::probe::metrics::ConnectionCounters,
) -> Result<crate::probe::listener::ProbeListener, crate::probe::server::ServerError> {
    use crate::probe::{
        listener::{ListenerLimits, ProbeListener},
        source::{AllowFrom, SourceFilter},
    };
    let limits = ListenerLimits { head_deadline: Duration::from_secs(1), ..ListenerLimits::default() };
    let answer = std::sync::Arc::new(HealthAnswer(heartbeats));
    ProbeListener::start(listener, answer, SourceFilter::new(&[AllowFrom::Any]), counters, limits)
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;
    use crate::heartbeats::{Heartbeats, Loop};

    #[test]
    fn the_health_listener_answers_from_the_heartbeats_and_serves_nothing_else() {
        use crate::probe::ProbeAnswer as _;
        let beats = std::sync::Arc::new(Heartbeats::new(Duration::from_millis(50), Duration::from_secs(10)));
        let answer = HealthAnswer(beats.clone());
        beats.beat(Loop::RingReader);
        assert_eq!(answer.answer("/healthz", None), (200, "ok\n".to_owned()));
        // The reader stops beating: the kubelet is told, with the reason.
        let silent = beats.origin.elapsed() + Duration::from_millis(200);
        assert!(beats.check_at(silent).is_err());
        let deadline = Instant::now() + Duration::from_secs(5);
        let (code, why) = loop {
            let (code, why) = answer.answer("/healthz", None);
            if code != 200 || Instant::now() > deadline {
                break (code, why);
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        assert_eq!(code, 503);
        assert!(why.contains("ring reader made no progress"), "{why}");
        assert_eq!(answer.answer("/readyz", None).0, 503, "not live is not ready");
        assert_eq!(answer.answer("/metrics", None).0, 404);
    }
}
