use super::*;
use crate::probe::check::DEFAULT_STALL_NS;

const S: u64 = 1_000_000_000;

fn tcp(port: u16) -> CheckSpec {
    CheckSpec::Tcp { port, stall_ns: DEFAULT_STALL_NS }
}

fn file(path: &str) -> CheckSpec {
    CheckSpec::File { path: path.to_owned(), max_age_ns: Some(30 * S), contains: None }
}

#[test]
fn an_annotation_declares_pod_wide_and_per_container_checks() {
    let text = "\n  /probe/tcp?port=8080&stall=5s\n# a comment\n/probe/file?path=/tmp/healthy&fresh=30s&container=app\n/probe/process?container=sidecar\n";
    let (declaration, refusals) = Declaration::from_annotation(text);
    assert_eq!(refusals, vec![]);
    assert_eq!(
        declaration.checks(),
        &[
            DeclaredCheck { container: None, spec: tcp(8080) },
            DeclaredCheck { container: Some("app".into()), spec: file("/tmp/healthy") },
            DeclaredCheck {
                container: Some("sidecar".into()),
                spec: CheckSpec::Process { max_uninterruptible_ns: None }
            },
        ][..]
    );
    assert_eq!(declaration.checks_for("app"), vec![tcp(8080), file("/tmp/healthy")]);
    assert_eq!(declaration.checks_for("sidecar"), vec![tcp(8080), CheckSpec::Process { max_uninterruptible_ns: None }]);
    assert_eq!(declaration.checks_for("other"), vec![tcp(8080)]);
}

#[test]
fn requests_match_declarations_by_meaning_not_spelling() {
    let (declaration, _) = Declaration::from_annotation("/probe/tcp?port=8080\n");
    for (path, query) in [("/probe/tcp", "stall=5s&port=8080"), ("/probe/tcp/", "port=8080&stall=5000ms")] {
        let (container, spec) = parse_request(path, Some(query)).expect("parses");
        assert_eq!(container, None);
        assert!(declaration.checks_for("app").contains(&spec), "{path}?{query}");
    }
    let (_, other) = parse_request("/probe/tcp", Some("port=8080&stall=1s")).expect("parses");
    assert!(!declaration.checks_for("app").contains(&other), "another stall limit is another check");
}

#[test]
fn unparsable_entries_are_refused_one_by_one() {
    let text = "/probe/tcp?port=80a\n/healthz\n/probe/file?path=../etc/passwd\n/probe/process?container=a&container=b\n/probe/tcp?port=1&container=\n/probe/tcp/x?port=1\n/probe/process\n";
    let (declaration, refusals) = Declaration::from_annotation(text);
    assert_eq!(
        declaration.checks(),
        &[DeclaredCheck { container: None, spec: CheckSpec::Process { max_uninterruptible_ns: None } }][..]
    );
    assert_eq!(refusals.len(), 6, "{refusals:#?}");
    assert!(refusals.iter().all(|r| r.reason == RefusalReason::Unparsable));
    assert_eq!(
        refusals[0].to_string(),
        "probe entry \"/probe/tcp?port=80a\" refused: bad port \"80a\": expected 1-65535"
    );
}

#[test]
fn file_checks_under_proc_sys_or_dev_are_refused() {
    for path in ["/proc/1/environ", "/proc", "//proc/self/environ", "/./sys/kernel/x", "/dev/mem", "/sys"] {
        let entry = format!("/probe/file?path={path}&contains=X");
        let (declaration, refusals) = Declaration::from_annotation(&entry);
        assert!(declaration.is_empty(), "{path}");
        assert_eq!(refusals.len(), 1, "{path}");
        assert_eq!(refusals[0].reason, RefusalReason::ForbiddenPath, "{path}");
        assert!(refusals[0].detail.contains("/proc, /sys or /dev"), "{}", refusals[0].detail);
    }
    // Inside /all too; and only the first component counts.
    let (declaration, refusals) = Declaration::from_annotation(
        "/probe/all?process&file=/proc/1/cmdline\n/probe/file?path=/tmp/proc\n/probe/file?path=/procfs/x\n",
    );
    assert_eq!(refusals.iter().map(|r| r.reason).collect::<Vec<_>>(), vec![RefusalReason::ForbiddenPath]);
    assert_eq!(declaration.checks().len(), 2);
}

#[test]
fn at_most_sixteen_entries_per_pod() {
    let text: String = (1..=20).map(|port| format!("/probe/tcp?port={port}\n")).collect();
    let (declaration, refusals) = Declaration::from_annotation(&text);
    assert_eq!(declaration.checks().len(), MAX_ENTRIES_PER_POD);
    assert_eq!(refusals.len(), 4);
    assert!(refusals.iter().all(|r| r.reason == RefusalReason::TooMany));
    assert_eq!(refusals[0].entry, "/probe/tcp?port=17");
    // Refused entries count too: junk cannot push good ones out silently, nor in past the bound.
    let text: String = (0..16).map(|_| "junk\n").chain(["/probe/process\n"]).collect();
    let (declaration, refusals) = Declaration::from_annotation(&text);
    assert!(declaration.is_empty());
    assert_eq!(refusals.last().map(|r| r.reason), Some(RefusalReason::TooMany));
}

#[test]
fn another_source_declares_through_the_same_function() {
    // The pod spec's httpGet probes name their container; a path naming another one is refused.
    let mut declaration = Declaration::default();
    declaration.add(Some("app"), "/probe/tcp?port=8080").expect("ok");
    declaration.add(Some("app"), "/probe/process?container=app").expect("same container");
    let refused = declaration.add(Some("app"), "/probe/process?container=db").expect_err("other container");
    assert_eq!(refused.reason, RefusalReason::Unparsable);
    assert_eq!(declaration.checks_for("app"), vec![tcp(8080), CheckSpec::Process { max_uninterruptible_ns: None }]);
    assert_eq!(declaration.checks_for("db"), vec![]);
}

#[test]
fn long_entries_are_shortened_in_refusals() {
    let entry = format!("/probe/file?path=/proc/{}", "x".repeat(500));
    let (_, refusals) = Declaration::from_annotation(&entry);
    assert_eq!(refusals[0].entry.chars().count(), EXCERPT_CHARS + 3);
}

#[test]
fn refusals_quote_the_pods_words_so_they_cannot_forge_log_lines() {
    // Issue 18: declaration values reached the logs unescaped.
    let mut declaration = Declaration::default();
    let refusal = declaration
        .add(None, "/probe/file?path=/proc/1/environ%0Alevel=INFO%20msg=forged")
        .expect_err("a file under /proc is refused");
    let line = refusal.to_string();
    assert!(!line.contains('\n'), "{line}");
    assert!(line.contains("\\n"), "the newline is shown escaped: {line}");
    let refusal = declaration
        .add(Some("app"), "/probe/process?container=other%0Aforged")
        .expect_err("another container's name is refused");
    assert!(!refusal.to_string().contains('\n'), "{refusal}");
}

#[test]
fn a_declared_path_with_a_control_character_is_refused_so_no_label_or_log_line_carries_it() {
    // Issue 37: `path=/tmp/a%0Alevel=INFO msg=forged` was declared, and its `check` label, with
    // the newline, was logged at every change of its result.
    let mut declaration = Declaration::default();
    for entry in ["/probe/file?path=/tmp/a%0Alevel=INFO%20msg=forged", "/probe/all?file=/tmp/a%0D%1B[2J&process"] {
        let refusal = declaration.add(None, entry).expect_err("a control character in a path");
        assert_eq!(refusal.reason, RefusalReason::Unparsable, "{refusal}");
        assert!(refusal.detail.contains("control characters") && !refusal.to_string().contains('\n'), "{refusal}");
    }
    assert!(declaration.is_empty());
    declaration.add(None, "/probe/file?path=/tmp/a%20b").expect("a space is a path's own");
    let labels: Vec<String> = declaration.checks_for("app").iter().map(CheckSpec::label).collect();
    assert_eq!(labels, ["file:/tmp/a b"]);
}
