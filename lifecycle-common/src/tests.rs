//! The shared types checked on the host: event kinds round-trip and are uniquely named, the
//! signals the kernel records are the ones a verdict needs, counters add field by field.

use super::*;

#[test]
fn kinds_round_trip_through_their_discriminant() {
    for kind in EventKind::ALL {
        assert_eq!(EventKind::from_u32(kind as u32), Some(kind));
    }
    assert_eq!(EventKind::from_u32(EVENT_KIND_COUNT as u32), None);
}

#[test]
fn kind_names_are_unique() {
    for a in EventKind::ALL {
        for b in EventKind::ALL {
            assert!(a == b || a.name() != b.name(), "{a:?} and {b:?} share a name");
        }
    }
}

#[test]
fn only_signals_a_verdict_or_a_death_can_hang_on_are_recorded() {
    use signals::*;
    const SIGUSR1: u32 = 10;
    const SIGSEGV: u32 = 11;
    const SIGPIPE: u32 = 13;
    const SIGALRM: u32 = 14;
    const SIGTSTP: u32 = 20;
    const SIGPROF: u32 = 27;
    // From outside the cgroup: always, to the init too.
    for signal in 1..=64 {
        assert!(signal_is_recorded(signal, true, false, false, false), "{signal} from outside");
        assert!(signal_is_recorded(signal, true, true, true, false), "{signal} from outside to an init");
    }
    // Inside it, another process's signal to the container's init: never (issue 18: a child
    // flooding its init with ignored SIGHUPs).
    for signal in 1..=64 {
        assert!(!signal_is_recorded(signal, false, true, false, false), "{signal} to an init from inside");
        assert!(!signal_is_recorded(signal, false, true, true, false), "{signal} to an init from inside");
    }
    // Inside, stop requests the init passes on to another process, handled or not...
    for signal in [SIGHUP, SIGINT, SIGQUIT, SIGKILL, SIGTERM, SIGSTOP] {
        assert!(signal_is_recorded(signal, false, false, false, true), "{signal} from the init, handled");
        // ...but a handled one from anyone else (issue 18: self-sent stop signals flooded the ring).
        assert!(!signal_is_recorded(signal, false, false, false, false), "{signal} handled");
    }
    // Real-time signals have no slot to be counted in: recorded (rare).
    for signal in [32, 64] {
        assert!(signal_is_recorded(signal, false, false, false, false), "{signal}");
    }
    // ... the rest when the target would die or stop of it ...
    for signal in [SIGUSR1, SIGSEGV, SIGPIPE, SIGALRM, SIGTSTP, SIGPROF, SIGTERM, SIGKILL] {
        assert!(signal_is_recorded(signal, false, false, true, false), "{signal} unhandled");
    }
    for signal in [SIGUSR1, SIGSEGV, SIGPIPE, SIGALRM, SIGTSTP, SIGPROF] {
        assert!(!signal_is_recorded(signal, false, false, false, true), "{signal} handled, from the init");
    }
    // ... and never when the default is harmless.
    for signal in [SIGCHLD, SIGCONT, SIGURG, SIGWINCH] {
        assert!(!signal_is_recorded(signal, false, false, true, false), "{signal} by default");
    }
    assert_eq!((1..SIGNAL_SLOTS as u32).filter(|&s| signal_default_ends_or_stops(s)).count(), 27);
}

#[test]
fn counters_add_field_by_field() {
    let mut a = CgroupCounters { execs: 1, events_lost: 2, ..Default::default() };
    let mut quiet = [0; SIGNAL_SLOTS];
    quiet[10] = 5;
    a += CgroupCounters { execs: 3, tcp_accepts: 4, unrecorded_signals: quiet, ..Default::default() };
    a += CgroupCounters { unrecorded_signals: quiet, ..Default::default() };
    quiet[10] = 10;
    assert_eq!(
        a,
        CgroupCounters { execs: 4, tcp_accepts: 4, events_lost: 2, unrecorded_signals: quiet, ..Default::default() }
    );
}
