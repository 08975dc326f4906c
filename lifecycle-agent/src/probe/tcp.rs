//! Judges the accept progress of one port (the model's [`AcceptFacts`], kept from the kernel's
//! TCP events and /proc samples by `model::probe::accept`) for a tcp check.
//!
//! Failure, in order of precedence: the listener closed; the accept queue overflowed (for one
//! stall time); connections have waited unaccepted longer than the stall time.

use super::check::{seconds, Verdict};
pub(crate) use crate::model::probe::AcceptFacts;

/// Judges the listener at `now` against `stall_ns`.
pub(crate) fn verdict(facts: &AcceptFacts, port: u16, now: u64, stall_ns: u64) -> Verdict {
    if !facts.listening {
        return Verdict::fail(format!("listener on {port} closed"));
    }
    if let Some((at, drops)) = facts.overflow {
        if now < at.saturating_add(stall_ns) {
            return Verdict::fail(format!(
                "port {port}: accept queue overflowed ({drops} connections dropped {} ago)",
                seconds(now.saturating_sub(at))
            ));
        }
    }
    if let Some(start) = facts.stall_start {
        let waited = now.saturating_sub(start);
        if waited >= stall_ns {
            let n = facts.waiting.max(1);
            return Verdict::fail(format!(
                "port {port}: {n} connection{} waiting unaccepted for {} (stall limit {})",
                if n == 1 { "" } else { "s" },
                seconds(waited),
                seconds(stall_ns)
            ));
        }
    }
    Verdict::pass(format!("port {port} accepting ({} waiting)", facts.waiting))
}

/// When the verdict changes next with no new input: a stall or an overflow window ending.
pub(crate) fn next_deadline(facts: &AcceptFacts, now: u64, stall_ns: u64) -> Option<u64> {
    if !facts.listening {
        return None;
    }
    let stall = facts.stall_start.map(|s| s.saturating_add(stall_ns));
    let overflow_ends = facts.overflow.map(|(at, _)| at.saturating_add(stall_ns));
    [stall, overflow_ends].into_iter().flatten().filter(|&d| d > now).min()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::probe::{AcceptProgress, QueueSample};

    /// The progress judged as the probe layer judges its published facts.
    trait Judged {
        fn verdict(&self, port: u16, now: u64, stall_ns: u64) -> Verdict;
        fn next_deadline(&self, now: u64, stall_ns: u64) -> Option<u64>;
    }

    impl Judged for AcceptProgress {
        fn verdict(&self, port: u16, now: u64, stall_ns: u64) -> Verdict {
            verdict(&self.facts(), port, now, stall_ns)
        }

        fn next_deadline(&self, now: u64, stall_ns: u64) -> Option<u64> {
            next_deadline(&self.facts(), now, stall_ns)
        }
    }

    const S: u64 = 1_000_000_000;

    fn listening() -> AcceptProgress {
        let mut p = AcceptProgress::default();
        p.on_listen(0);
        p
    }

    fn sample(depth: u32, drops: u64) -> QueueSample {
        QueueSample { depth, backlog: Some(4), netns_drops: drops, sole_listener: false }
    }

    #[test]
    fn fresh_listener_with_nothing_waiting_passes_and_has_no_deadline() {
        let p = listening();
        assert!(p.verdict(8080, 100 * S, 5 * S).pass);
        assert_eq!(p.next_deadline(100 * S, 5 * S), None);
    }

    #[test]
    fn accepted_connections_keep_it_passing() {
        let mut p = listening();
        for i in 0..100 {
            p.on_established(i * S);
            p.on_accept(i * S + 1000);
        }
        assert!(p.verdict(8080, 200 * S, 5 * S).pass);
        assert_eq!(p.waiting(), 0);
    }

    #[test]
    fn stall_fails_exactly_when_the_oldest_waiting_connection_reaches_the_limit() {
        let mut p = listening();
        p.on_established(10 * S);
        p.on_established(11 * S);
        p.on_established(12 * S);
        let deadline = p.next_deadline(12 * S, 5 * S).expect("deadline");
        assert_eq!(deadline, 15 * S);
        assert!(p.verdict(8080, deadline - 1, 5 * S).pass);
        let v = p.verdict(8080, 17 * S + 200_000_000, 5 * S);
        assert_eq!(v, Verdict::fail("port 8080: 3 connections waiting unaccepted for 7.2s (stall limit 5s)"));
        // An accept takes the oldest; the next oldest is younger.
        p.on_accept(17 * S);
        assert_eq!(p.next_deadline(13 * S, 5 * S), Some(16 * S));
    }

    #[test]
    fn close_flips_at_once_and_a_new_listen_starts_over() {
        let mut p = listening();
        p.on_established(1);
        p.on_close(2);
        assert_eq!(p.verdict(8080, 2, 5 * S), Verdict::fail("listener on 8080 closed"));
        assert_eq!(p.next_deadline(2, 5 * S), None);
        p.on_listen(3);
        assert!(p.verdict(8080, 100 * S, 5 * S).pass);
    }

    #[test]
    fn dual_stack_port_is_closed_only_when_both_listeners_are() {
        let mut p = listening();
        p.on_listen(1);
        p.on_close(2);
        assert!(p.verdict(80, 3, S).pass);
        p.on_close(4);
        assert!(!p.verdict(80, 5, S).pass);
    }

    #[test]
    fn queue_sample_without_events_stalls_from_the_sample_time() {
        let mut p = AcceptProgress::already_listening(1);
        p.observe_queue(10 * S, sample(2, 0));
        assert_eq!(p.waiting(), 2);
        assert_eq!(p.next_deadline(10 * S, 5 * S), Some(15 * S));
        assert!(!p.verdict(8080, 15 * S, 5 * S).pass);
        // An empty queue later means they were taken.
        p.observe_queue(16 * S, sample(0, 0));
        assert!(p.verdict(8080, 16 * S, 5 * S).pass);
    }

    #[test]
    fn sample_trims_connections_that_left_without_an_accept_event() {
        let mut p = listening();
        p.on_established(S);
        p.on_established(2 * S);
        p.observe_queue(3 * S, sample(1, 0));
        assert_eq!(p.waiting(), 1);
        // The survivor is the newer one (2 s).
        assert_eq!(p.next_deadline(3 * S, 5 * S), Some(7 * S));
    }

    #[test]
    fn drops_fail_only_when_attributable_and_only_for_one_stall_time() {
        let mut p = listening();
        p.observe_queue(S, sample(0, 7));
        // Another listener's drops: our queue is not full and we are not alone.
        p.observe_queue(2 * S, sample(1, 9));
        assert!(p.verdict(80, 2 * S, 5 * S).pass, "{:?}", p.verdict(80, 2 * S, 5 * S));
        p.on_accept(2 * S);
        // Our queue full when drops rose.
        p.observe_queue(3 * S, sample(4, 12));
        let v = p.verdict(80, 3 * S, 5 * S);
        assert_eq!(v, Verdict::fail("port 80: accept queue overflowed (3 connections dropped 0s ago)"));
        p.observe_queue(3 * S, sample(0, 12));
        assert_eq!(p.next_deadline(3 * S, 5 * S), Some(8 * S));
        assert!(p.verdict(80, 8 * S, 5 * S).pass);
        // Sole listener: any rise is ours.
        p.observe_queue(9 * S, QueueSample { depth: 0, backlog: Some(4), netns_drops: 13, sole_listener: true });
        assert!(!p.verdict(80, 9 * S, 5 * S).pass);
    }

    #[test]
    fn a_lost_close_record_is_repaired_by_the_next_sample_and_a_later_event_wins() {
        // Issue 18: refresh never closed ports sock_diag no longer showed.
        let mut p = AcceptProgress::default();
        p.on_listen(10);
        assert!(p.is_listening());
        // The close record was lost; the kernel lists no listener at 20.
        p.reconcile_listeners(20, 0);
        assert!(!p.is_listening(), "closed by the sample");
        // A listen at 30 is newer than a sample taken at 25 that did not see it.
        p.on_listen(30);
        p.reconcile_listeners(25, 0);
        assert!(p.is_listening(), "the event after the sample wins");
        // A lost listen record: the sample shows one.
        let mut q = AcceptProgress::default();
        q.reconcile_listeners(40, 2);
        assert!(q.is_listening());
    }
}
