//! Unit tests of probe URL parsing and check evaluation (pure; no root).

use super::*;

const S: u64 = 1_000_000_000;

fn parse(path: &str, query: &str) -> Result<CheckSpec, ParseError> {
    CheckSpec::parse(path, (!query.is_empty()).then_some(query))
}

#[test]
fn parses_every_probe_kind() {
    assert_eq!(parse("/tcp", "port=8080"), Ok(CheckSpec::Tcp { port: 8080, stall_ns: DEFAULT_STALL_NS }));
    assert_eq!(parse("/tcp", "port=8080&stall=1.5s"), Ok(CheckSpec::Tcp { port: 8080, stall_ns: 1_500_000_000 }));
    assert_eq!(parse("/process", ""), Ok(CheckSpec::Process { max_uninterruptible_ns: None }));
    assert_eq!(parse("/process", "max_d_state=10s"), Ok(CheckSpec::Process { max_uninterruptible_ns: Some(10 * S) }));
    assert_eq!(
        parse("/file", "path=/tmp/healthy&fresh=30s&contains=all%20ok"),
        Ok(CheckSpec::File { path: "/tmp/healthy".into(), max_age_ns: Some(30 * S), contains: Some("all ok".into()) })
    );
    assert_eq!(
        parse("/all", "tcp=8080&process&file=/tmp/healthy&stall=2s"),
        Ok(CheckSpec::AllOf(vec![
            CheckSpec::Tcp { port: 8080, stall_ns: 2 * S },
            CheckSpec::Process { max_uninterruptible_ns: None },
            CheckSpec::File { path: "/tmp/healthy".into(), max_age_ns: None, contains: None },
        ]))
    );
}

#[test]
fn bad_input_gives_one_line_errors() {
    let cases = [
        ("/tcp", "", "tcp probe needs port="),
        ("/tcp", "port=0", "bad port \"0\": expected 1-65535"),
        ("/tcp", "port=70000", "bad port \"70000\": expected 1-65535"),
        ("/tcp", "port=80&port=81", "parameter \"port\" given more than once"),
        ("/tcp", "port=80&stall=5", "bad duration \"5\" for stall: expected a number with ms, s, m or h, e.g. 5s"),
        ("/tcp", "port=80&bogus=1", "tcp probe does not take parameter \"bogus\""),
        (
            "/file",
            "path=tmp/x",
            "bad file path \"tmp/x\": must be absolute, without '..' components or control characters",
        ),
        (
            "/file",
            "path=/../../etc/hostname",
            "bad file path \"/../../etc/hostname\": must be absolute, without '..' components or control characters",
        ),
        ("/file", "path=%zz", "bad percent-encoding in \"%zz\""),
        ("/all", "", "all probe needs at least one of tcp=, process, file="),
        ("/exec", "", "unknown probe path \"/probe/exec\": use /probe/tcp, /probe/process, /probe/file or /probe/all"),
    ];
    for (path, query, want) in cases {
        let err = parse(path, query).expect_err(query);
        assert_eq!(err.to_string(), want);
        assert!(!err.to_string().contains('\n'));
    }
}

#[test]
fn durations_take_units() {
    assert_eq!(parse_duration("x", "250ms"), Ok(250_000_000));
    assert_eq!(parse_duration("x", "2m"), Ok(120 * S));
    assert_eq!(parse_duration("x", "1h"), Ok(3600 * S));
    assert!(parse_duration("x", "s").is_err());
    assert!(parse_duration("x", "-1s").is_err());
    assert_eq!(seconds(7_240_000_000), "7.2s");
    assert_eq!(seconds(5 * S), "5s");
}

#[test]
fn labels_are_canonical() {
    let all = parse("/all", "process&tcp=80&file=/a").expect("parses");
    assert_eq!(all.label(), "all:process+tcp:80+file:/a");
    assert_eq!(all.kind(), "all");
}

fn observed_with_process(state: ProcessState, since: u64) -> Observed {
    Observed { process: Some(ProcessFacts { pid: 4242, state, state_since_ns: since }), ..Observed::default() }
}

#[test]
fn process_states_judge_as_expected() {
    let check = CheckSpec::Process { max_uninterruptible_ns: Some(10 * S) };
    let v = |state, since, now| check.evaluate(&observed_with_process(state, since), now);
    assert!(v(ProcessState::Running, 0, S).pass);
    assert!(v(ProcessState::Sleeping, 0, S).pass);
    assert_eq!(v(ProcessState::Zombie, 0, S), Verdict::fail("main process 4242 is a zombie"));
    assert_eq!(v(ProcessState::Stopped, 0, S), Verdict::fail("main process 4242 is stopped"));
    assert_eq!(v(ProcessState::Dead, 0, S), Verdict::fail("main process 4242 is gone"));
    assert!(v(ProcessState::Uninterruptible, S, 10 * S).pass);
    assert_eq!(
        v(ProcessState::Uninterruptible, S, 12 * S),
        Verdict::fail("main process 4242 in uninterruptible sleep (D) for 11s (limit 10s)")
    );
    assert_eq!(check.next_deadline(&observed_with_process(ProcessState::Uninterruptible, S), 2 * S), Some(11 * S));
    assert_eq!(check.evaluate(&Observed::default(), 0), Verdict::fail("main process not observed yet"));
}

#[test]
fn process_facts_keep_the_time_a_state_began() {
    let first = ProcessFacts::after_sample(None, 7, ProcessState::Uninterruptible, 5);
    let again = ProcessFacts::after_sample(Some(&first), 7, ProcessState::Uninterruptible, 9);
    assert_eq!(again.state_since_ns, 5);
    let woke = ProcessFacts::after_sample(Some(&again), 7, ProcessState::Running, 10);
    assert_eq!(woke.state_since_ns, 10);
}

#[test]
fn files_judge_presence_freshness_and_content() {
    let mut observed = Observed::default();
    let files = Arc::make_mut(&mut observed.files);
    files.insert("/tmp/healthy".into(), FileFacts::Present { modified_ns: 100 * S, head: b"status: ok\n".to_vec() });
    files.insert("/tmp/gone".into(), FileFacts::Unreadable("No such file or directory".into()));
    let file = |path: &str, fresh: Option<u64>, contains: Option<&str>| CheckSpec::File {
        path: path.into(),
        max_age_ns: fresh,
        contains: contains.map(str::to_owned),
    };
    assert!(file("/tmp/healthy", Some(30 * S), Some("ok")).evaluate(&observed, 120 * S).pass);
    assert_eq!(
        file("/tmp/healthy", Some(30 * S), None).evaluate(&observed, 140 * S),
        Verdict::fail("file /tmp/healthy last modified 40s ago (fresh limit 30s)")
    );
    assert_eq!(file("/tmp/healthy", Some(30 * S), None).next_deadline(&observed, 120 * S), Some(130 * S));
    assert_eq!(
        file("/tmp/healthy", None, Some("fail")).evaluate(&observed, 0),
        Verdict::fail("file /tmp/healthy does not contain \"fail\" in its first 4096 bytes")
    );
    assert_eq!(
        file("/tmp/gone", None, None).evaluate(&observed, 0),
        Verdict::fail("file /tmp/gone: No such file or directory")
    );
    assert_eq!(file("/tmp/other", None, None).evaluate(&observed, 0), Verdict::fail("file /tmp/other not read yet"));
}

#[test]
fn all_of_reports_the_first_failure_and_the_earliest_deadline() {
    let mut observed = observed_with_process(ProcessState::Running, 0);
    let mut listener = crate::model::probe::AcceptProgress::already_listening(1);
    listener.on_established(3 * S);
    Arc::make_mut(&mut observed.tcp).insert(8080, listener.facts());
    let all = parse("/all", "process&tcp=8080&stall=2s").expect("parses");
    assert!(all.evaluate(&observed, 4 * S).pass);
    assert_eq!(all.next_deadline(&observed, 4 * S), Some(5 * S));
    assert_eq!(
        all.evaluate(&observed, 5 * S),
        Verdict::fail("port 8080: 1 connection waiting unaccepted for 2s (stall limit 2s)")
    );
    let missing = parse("/tcp", "port=9").expect("parses");
    assert_eq!(missing.evaluate(&observed, 0), Verdict::fail("no listener on port 9"));
}

#[test]
fn check_labels_are_bounded_and_stay_distinct() {
    // Issue 18: a long declared path became a `check` label of any length.
    let long = |tail: &str| CheckSpec::File {
        path: format!("/{}{tail}", "d/".repeat(1000)),
        max_age_ns: None,
        contains: None,
    };
    let (a, b) = (long("a"), long("b"));
    assert!(a.label().len() <= MAX_CHECK_LABEL, "{}", a.label().len());
    assert_ne!(a.label(), b.label(), "distinct checks keep distinct labels");
    assert_eq!(a.label(), long("a").label(), "the same check, the same label");
    assert_eq!(CheckSpec::Tcp { port: 8080, stall_ns: 1 }.label(), "tcp:8080");
}
