//! Privileged tier: `lifecycle-agent doctor` on this machine prints every check with a result
//! and exits 0 exactly when nothing is missing; with the kernel's BTF hidden (an empty file bound
//! over it in a mount namespace of the doctor's own) it names BTF as missing; without
//! capabilities (the bounding set emptied before exec) it names each missing one. Both exit
//! non-zero. The namespace and the dropped capabilities are the child's alone and end with it.

use std::{
    ffi::CString,
    os::unix::process::CommandExt as _,
    process::{Command, Output},
};

use lifecycle_testkit::require_privileges;

const AGENT: &str = env!("CARGO_BIN_EXE_lifecycle-agent");
const BTF: &str = "/sys/kernel/btf/vmlinux";
/// Every check the report has on any machine (health-listen only appears when given).
const CHECKS: [&str; 16] = [
    "kernel",
    "btf",
    "tracepoints",
    "programs",
    "features",
    "kernel-cost",
    "capabilities",
    "memlock",
    "cgroups",
    "cri",
    "kubernetes",
    "kubelet",
    "listen",
    "pod-probe-port",
    "clock",
    "clock-sync",
];

/// The report's lines as (result, check, rest).
fn lines(output: &Output) -> Vec<(String, String, String)> {
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let (result, check) = (words.next()?.to_owned(), words.next()?.to_owned());
            Some((result, check, words.collect::<Vec<_>>().join(" ")))
        })
        .filter(|(result, _, _)| ["ok", "warn", "missing", "skip"].contains(&result.as_str()))
        .collect()
}

fn line_of<'a>(report: &'a [(String, String, String)], check: &str) -> &'a (String, String, String) {
    report.iter().find(|(_, name, _)| name == check).unwrap_or_else(|| panic!("no {check} line in {report:?}"))
}

fn doctor() -> Command {
    let mut command = Command::new(AGENT);
    // The API check is the same with or without these here; without them it is one skip line,
    // whatever another tier left in the environment.
    command.arg("doctor").env_remove("KUBECONFIG").env_remove("NODE_NAME");
    command
}

fn show(output: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn doctor_prints_every_check_and_exits_zero_only_when_nothing_is_missing() {
    require_privileges!();
    let output = Command::new(AGENT).arg("doctor").output().expect("run doctor");
    let report = lines(&output);
    for check in CHECKS {
        let (result, _, found) = line_of(&report, check);
        assert!(!found.is_empty(), "{check} says what it found: {}", show(&output));
        eprintln!("{result:<7} {check}: {found}");
    }
    let missing = report.iter().any(|(result, _, _)| result == "missing");
    assert_eq!(output.status.success(), !missing, "exit 0 exactly when nothing is missing: {}", show(&output));
    // Root on a BTF kernel (what require_privileges! checked): these hold on any such machine.
    for check in ["kernel", "btf", "capabilities"] {
        assert_eq!(line_of(&report, check).0, "ok", "{check}: {}", show(&output));
    }
    // Every feature attached here made its record when doctor made its event, OOM kills included.
    let (result, _, found) = line_of(&report, "features");
    assert_eq!(result, "ok", "{}", show(&output));
    for feature in
        ["process_exec", "process_exit", "signals", "oom_kills", "tcp_sockets", "tcp_accepts", "cgroup_events"]
    {
        assert!(found.contains(feature), "{feature} proven: {}", show(&output));
    }

    let json = Command::new(AGENT).args(["doctor", "-o", "json", "--no-load"]).output().expect("run doctor -o json");
    let value: serde_json::Value = serde_json::from_slice(&json.stdout).expect("JSON report");
    let checks = value["checks"].as_array().expect("checks");
    assert!(checks.len() >= CHECKS.len(), "{value}");
    assert_eq!(value["ready"].as_bool(), Some(json.status.success()), "{value}");
    assert!(checks.iter().any(|c| c["check"] == "programs" && c["result"] == "skip"), "--no-load: {value}");
}

fn c_string(text: &str) -> CString {
    CString::new(text).expect("no NUL")
}

#[test]
fn doctor_names_hidden_btf_as_missing() {
    require_privileges!();
    let empty = std::env::temp_dir().join(format!("lifecycle-doctor-empty-btf-{}", std::process::id()));
    std::fs::write(&empty, b"").expect("empty file");
    let (root, source, target) = (c_string("/"), c_string(&empty.to_string_lossy()), c_string(BTF));
    let mut command = doctor();
    // SAFETY: between fork and exec the closure only makes system calls on memory prepared
    // before the fork (no allocation, no locks).
    unsafe {
        command.pre_exec(move || {
            // A mount namespace of the child's own, with nothing propagating back to the host:
            // the bind mount below is seen by this process alone and ends with it.
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            let private = libc::MS_REC | libc::MS_PRIVATE;
            if libc::mount(std::ptr::null(), root.as_ptr(), std::ptr::null(), private, std::ptr::null()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::mount(source.as_ptr(), target.as_ptr(), std::ptr::null(), libc::MS_BIND, std::ptr::null()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let output = command.output().expect("run doctor with BTF hidden");
    let _ = std::fs::remove_file(&empty);
    let report = lines(&output);
    let (result, _, found) = line_of(&report, "btf");
    assert_eq!(result, "missing", "{}", show(&output));
    assert!(found.contains(BTF) && found.contains("empty"), "{}", show(&output));
    assert_eq!(line_of(&report, "programs").0, "skip", "not loaded without BTF: {}", show(&output));
    assert!(!output.status.success(), "{}", show(&output));
    assert!(String::from_utf8_lossy(&output.stderr).contains("missing btf"), "{}", show(&output));
    // The host's BTF is untouched.
    assert!(std::fs::metadata(BTF).expect("host BTF").len() > 0);
}

#[test]
fn doctor_names_each_missing_capability() {
    require_privileges!();
    let mut command = doctor();
    // SAFETY: between fork and exec the closure only makes system calls (no allocation, no locks).
    unsafe {
        command.pre_exec(|| {
            // Emptying the bounding set leaves root without capabilities across exec (uid 0
            // gains only what the bounding set allows); it is the child's and ends with it.
            for capability in 0..64 {
                // Numbers past the kernel's last capability fail with EINVAL: nothing to drop.
                libc::prctl(libc::PR_CAPBSET_DROP, capability, 0, 0, 0);
            }
            Ok(())
        });
    }
    let output = command.output().expect("run doctor without capabilities");
    let report = lines(&output);
    let (result, _, found) = line_of(&report, "capabilities");
    assert_eq!(result, "missing", "{}", show(&output));
    for name in ["CAP_BPF", "CAP_PERFMON", "CAP_SYS_ADMIN", "CAP_SYS_PTRACE"] {
        assert!(found.contains(name), "{name}: {}", show(&output));
    }
    assert!(found.contains("CapEff 0000000000000000"), "{}", show(&output));
    assert_eq!(line_of(&report, "programs").0, "skip", "not loaded without capabilities: {}", show(&output));
    assert!(!output.status.success(), "{}", show(&output));
    assert!(String::from_utf8_lossy(&output.stderr).contains("capabilities"), "{}", show(&output));
}
