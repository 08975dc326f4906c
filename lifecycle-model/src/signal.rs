//! Signal numbers as people read them: the one table every output (`status`, `explain`, the
//! pages, the verdict log) names signals from.

/// The names of signals 1-31 as Linux numbers them on x86-64 and arm64 (`kill -l`).
const NAMES: [&str; 32] = [
    "",
    "SIGHUP",
    "SIGINT",
    "SIGQUIT",
    "SIGILL",
    "SIGTRAP",
    "SIGABRT",
    "SIGBUS",
    "SIGFPE",
    "SIGKILL",
    "SIGUSR1",
    "SIGSEGV",
    "SIGUSR2",
    "SIGPIPE",
    "SIGALRM",
    "SIGTERM",
    "SIGSTKFLT",
    "SIGCHLD",
    "SIGCONT",
    "SIGSTOP",
    "SIGTSTP",
    "SIGTTIN",
    "SIGTTOU",
    "SIGURG",
    "SIGXCPU",
    "SIGXFSZ",
    "SIGVTALRM",
    "SIGPROF",
    "SIGWINCH",
    "SIGIO",
    "SIGPWR",
    "SIGSYS",
];
/// The first real-time signal as glibc hands it out (the kernel's 32 and 33 are its own).
const SIGRTMIN: u32 = 34;
/// The last signal number.
const SIGRTMAX: u32 = 64;

/// `SIGTERM` for 15, `SIGRTMIN+2` for 36, `signal 99` for what no kernel sends.
pub fn name(signal: u32) -> String {
    match signal {
        1..=31 => NAMES[signal as usize].to_owned(),
        SIGRTMIN => "SIGRTMIN".to_owned(),
        n if n > SIGRTMIN && n <= SIGRTMAX => format!("SIGRTMIN+{}", n - SIGRTMIN),
        n => format!("signal {n}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_are_named_as_kill_lists_them() {
        assert_eq!(name(9), "SIGKILL");
        assert_eq!(name(11), "SIGSEGV");
        assert_eq!(name(15), "SIGTERM");
        assert_eq!(name(31), "SIGSYS");
        assert_eq!(name(36), "SIGRTMIN+2");
        assert_eq!(name(0), "signal 0");
        assert_eq!(name(65), "signal 65");
    }
}
