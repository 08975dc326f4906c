//! Tests of the status table: ages as kubectl writes them, columns, filters, and answers from
//! agents that no terminal escape survives.
use super::*;

/// Renders one agent's API body as an aligned table; None when the body is not the API's JSON.
fn render_table(body: &str) -> Option<String> {
    let value: Value = serde_json::from_str(body).ok()?;
    render(&[Answer { node: None, body: &value }], Output::Table).ok()
}

#[test]
fn ages_read_like_kubectl() {
    assert_eq!(age(250_000_000), "250ms");
    assert_eq!(age(3_200_000_000), "3.2s");
    assert_eq!(age(45_000_000_000), "45s");
    assert_eq!(age(192_000_000_000), "3m12s");
    assert_eq!(age(7_500_000_000_000), "2h5m");
    assert_eq!(age(273_600_000_000_000), "3d4h");
}

use lifecycle_testkit::fixtures::{container_view, termination_report};

use lifecycle_model::{
    container_state::{TerminatedReason, WaitingReason},
    node::{Disagreement, DisagreementKind, PodConditions, PodPhase, PortStats},
    spec::StopCause,
    termination::TerminationReport,
    time::SECOND,
    wire::{at::WallClock, with_clock::WithClock},
};

/// An agent's answer at `now_s` seconds after boot, as the agent writes it.
fn answer(now_s: u64, containers: Vec<ContainerView>, pods: Vec<PodView>) -> Value {
    let body = ContainersResponse {
        boot_to_unix_seconds: 0.0,
        now: BootTime::from_ns(now_s * SECOND),
        resource_version: String::new(),
        containers,
        pods,
    };
    serde_json::to_value(WithClock::new(&body, WallClock::from_offset_seconds(0.0))).expect("serializes")
}

fn terminated(exit_code: i32, signal: Option<u8>, finished_s: u64) -> ContainerState {
    ContainerState::Terminated {
        reason: TerminatedReason::Error,
        exit_code,
        signal,
        started_at: None,
        finished_at: BootTime::from_ns(finished_s * SECOND),
    }
}

fn pod(name: &str, phase: PodPhase, api_phase: Option<&str>) -> PodView {
    PodView {
        namespace: "shop".into(),
        pod: name.into(),
        uid: format!("uid-{name}"),
        phase,
        api_phase: api_phase.map(str::to_owned),
        running_containers: 0,
        containers: 1,
        conditions: PodConditions::default(),
        api_status: None,
    }
}

#[test]
fn the_table_names_violations_and_back_off() {
    let mut web = container_view(
        "shop",
        "web-1",
        "app",
        ContainerState::Waiting { reason: WaitingReason::CrashLoopBackOff, message: String::new() },
    );
    web.status.restart_count = 4;
    web.status.last_state = Some(terminated(1, None, 90));
    let exited = TerminationOutcome::ExitedWithoutStopSignal { exit_status: Some(1), signal: None };
    web.last_termination = Some(termination_report(exited, BootTime::from_ns(90 * SECOND)));
    let mut db = container_view("shop", "db-0", "db", terminated(137, Some(9), 99));
    let killed = TerminationOutcome::SigkilledAfterGrace {
        grace_ns: 30 * SECOND,
        stop_to_kill_ns: 30 * SECOND,
        expected_kill_after_ns: 30 * SECOND,
        sender: None,
        accepts_after_stop: 0,
        still_listening: false,
    };
    db.last_termination = Some(TerminationReport {
        cause: Some(StopCause::Deleted),
        ..termination_report(killed, BootTime::from_ns(99 * SECOND))
    });
    let pods = vec![pod("web-1", PodPhase::Running, Some("Running")), pod("db-0", PodPhase::Failed, None)];
    let body = answer(100, vec![web, db], pods).to_string();
    let table = render_table(&body).expect("renders");
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("NAMESPACE  POD    CONTAINER  STATE"), "{table}");
    // Sorted by namespace, pod and container: db-0 before web-1.
    assert!(
        lines[2].contains("Waiting") && lines[2].contains("CrashLoopBackOff") && lines[2].contains("Error (1) 10s ago"),
        "{table}"
    );
    assert!(lines[4].starts_with("NAMESPACE  POD    PHASE    API PHASE  RUNNING"), "{table}");
    assert_eq!(lines[5], "shop       db-0   Failed   -          0/1", "{table}");
    assert!(
        lines[1].contains("SIGKILLED after 30s (grace violated); deleted")
            && lines[1].contains("Error (137, SIGKILL) 1s ago"),
        "{table}"
    );
    assert_eq!(render_table("not json"), None);
    // The README shows this very table (issue 41: its sample had drifted from the output).
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).expect("README");
    let shown = format!("```\n{}\n```", table.trim_end());
    assert!(readme.contains(&shown), "README.md's sample status table is not the output; it is:\n{shown}");
}

#[test]
fn a_unit_killed_by_a_plain_kill_names_the_signal_and_its_sender_never_no_stop_signal() {
    use lifecycle_model::termination::{SignalSender, StopRules, StopSignalSeen};
    let mut unit = container_view("host", "", "/t", terminated(143, Some(15), 99));
    let killed = TerminationOutcome::ExitedAfterStopSignal { duration_ns: 1_000_000 };
    unit.last_termination = Some(TerminationReport {
        rules: StopRules::Unmanaged,
        exit_signal: Some(15),
        stop_signal: Some(StopSignalSeen {
            time: BootTime::from_ns(99 * SECOND),
            signal: 15,
            sender: SignalSender::other("bash", 812),
            matches_configured: true,
        }),
        ..termination_report(killed, BootTime::from_ns(99 * SECOND))
    });
    let table = render_table(&answer(100, vec![unit], vec![]).to_string()).expect("renders");
    assert!(
        table.contains("Error (143, SIGTERM) 1s ago") && table.contains("killed by SIGTERM from `bash` (pid 812)"),
        "{table}"
    );
    assert!(!table.contains("without stop signal"), "{table}");
}

fn container(namespace: &str, pod: &str, name: &str) -> ContainerView {
    let mut view =
        container_view(namespace, pod, name, ContainerState::Running { started_at: BootTime::from_ns(SECOND) });
    view.container_id = Some("0123456789abcdef0123".into());
    view.tcp.insert(8080, PortStats { listeners: 1, ..PortStats::default() });
    view.tcp.insert(9090, PortStats { accepts: 3, ..PortStats::default() });
    let disagreement = |id: &str| Disagreement {
        kind: DisagreementKind::ExitCode,
        container_id: id.into(),
        kubelet: "1".into(),
        kernel: "2".into(),
    };
    view.disagreements = vec![disagreement("x"), disagreement("y")];
    view
}

#[test]
fn rows_from_several_agents_are_sorted_and_wide_names_the_node() {
    let node_b = answer(2, vec![container("shop", "web", "app")], vec![]);
    let node_a =
        answer(2, vec![container("shop", "web", "sidecar"), container("kube-system", "dns", "coredns")], vec![]);
    let answers = [Answer { node: Some("node-b"), body: &node_b }, Answer { node: Some("node-a"), body: &node_a }];
    let table = render(&answers, Output::Table).expect("renders");
    let firsts: Vec<String> =
        table.lines().skip(1).map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" ")).collect();
    assert_eq!(firsts, ["kube-system dns coredns", "shop web app", "shop web sidecar"], "{table}");
    assert!(!table.contains("NODE"), "the node column is for -o wide: {table}");
    let wide = render(&answers, Output::Wide).expect("renders");
    let header = wide.lines().next().expect("header");
    assert!(header.ends_with("CONTAINER ID   POD UID  LISTENING  ACCEPT STALL  DISAGREEMENTS  NODE"), "{wide}");
    let web = wide.lines().find(|l| l.contains(" app ")).expect("the app row");
    assert!(web.ends_with("0123456789abc  uid-web  8080       -             exit_code      node-b"), "{wide}");
}

#[test]
fn json_and_yaml_carry_the_agents_document() {
    let body = answer(1, vec![container("shop", "web", "app")], vec![]);
    let one = render(&[Answer { node: None, body: &body }], Output::Json).expect("JSON");
    assert_eq!(serde_json::from_str::<Value>(&one).expect("parses"), body);
    let yaml = render(&[Answer { node: None, body: &body }], Output::Yaml).expect("YAML");
    assert!(yaml.contains("namespace: shop") && yaml.contains("container_id: 0123456789abcdef0123"), "{yaml}");
    let several = render(&[Answer { node: Some("n1"), body: &body }], Output::Json).expect("JSON");
    let several: Value = serde_json::from_str(&several).expect("parses");
    assert_eq!(several, serde_json::json!([{"node": "n1", "answer": body}]));
    let not_the_api = serde_json::json!({"containers": []});
    assert!(render(&[Answer { node: None, body: &not_the_api }], Output::Table).is_err());
}

#[test]
fn names_and_reasons_from_an_answer_cannot_write_to_the_terminal() {
    // Issue 37: an agent's answers were printed raw by `status`.
    let mut view = container("shop\u{1b}]0;owned\u{7}", "web\u{1b}[2J", "app\n");
    view.labels.uid = "uid\u{9b}1m".into();
    let body = answer(2, vec![view], vec![pod("web\u{1b}[H", PodPhase::Running, Some("Run\u{1b}ning"))]);
    for output in [Output::Table, Output::Wide, Output::Json, Output::Yaml] {
        let shown = render(&[Answer { node: Some("node\u{1b}c"), body: &body }], output).expect("renders");
        assert!(!shown.chars().any(|c| c.is_control() && c != '\n'), "{output:?}: {shown:?}");
    }
    let table = render(&[Answer { node: None, body: &body }], Output::Wide).expect("renders");
    assert!(table.contains("web\\u{1b}[2J") && table.contains("uid\\u{9b}1m"), "{table}");
    assert_eq!(table.lines().count(), 5, "no row is split by a newline in a name: {table}");
}

#[test]
fn the_selection_is_the_apis_query_escaped() {
    assert_eq!(Selection::default().path(), "/api/v1/containers");
    let selection = Selection { namespace: Some("shop".into()), pod: Some("web 1&x".into()), container: None };
    assert_eq!(selection.path(), "/api/v1/containers?namespace=shop&pod=web%201%26x");
    let selection = Selection { container: Some("app".into()), ..Selection::default() };
    assert_eq!(selection.path(), "/api/v1/containers?container=app");
    assert_eq!(
        selection.waiting_path("17-4", 1),
        "/api/v1/containers?container=app&wait_seconds=1&resource_version=17-4"
    );
    assert_eq!(
        Selection::default().waiting_path("a&b", 30),
        "/api/v1/containers?wait_seconds=30&resource_version=a%26b"
    );
}

#[test]
fn an_empty_selection_says_no_resources_found_as_kubectl_does() {
    // Issue 41 item 8: an empty selection printed only a header.
    let empty = answer(1, vec![], vec![]);
    let answers = [Answer { node: None, body: &empty }];
    assert_eq!(render(&answers, Output::Table).expect("renders"), "");
    assert_eq!(render(&answers, Output::Wide).expect("renders"), "");
    let said = nothing_found(&answers, Output::Table, Some("shop"));
    assert_eq!(said.as_deref(), Some("No resources found in shop namespace."));
    assert_eq!(nothing_found(&answers, Output::Wide, None).as_deref(), Some("No resources found"));
    assert_eq!(nothing_found(&answers, Output::Json, Some("shop")), None, "JSON and YAML print the document");
    let full = answer(1, vec![container("shop", "web", "app")], vec![]);
    assert_eq!(nothing_found(&[Answer { node: None, body: &full }], Output::Table, Some("shop")), None);
}

/// A running container (since 1 s) whose listener on 8080 holds `established - accepts`
/// connections the app has not accepted, the last accept at `last_accept_s`.
fn stalled(established: u64, accepts: u64, last_accept_s: Option<u64>) -> ContainerView {
    let mut view = container("shop", "web", "app");
    view.tcp.clear();
    view.tcp.insert(
        8080,
        PortStats {
            listeners: 1,
            established,
            accepts,
            last_accept_ns: last_accept_s.map(|s| s * SECOND),
            ..PortStats::default()
        },
    );
    view
}

#[test]
fn an_accept_stall_shows_in_wide_and_in_explain() {
    // Issue 41 item 6: a listener with connections queued and none accepted showed only
    // `Running, LISTENING 8080`.
    let wide = |view: ContainerView| {
        let body = answer(100, vec![view], vec![]);
        render(&[Answer { node: None, body: &body }], Output::Wide).expect("renders")
    };
    let never = wide(stalled(3, 0, None));
    assert!(never.contains("port 8080: 3 connections waiting, none accepted since it started 99.0s ago"), "{never}");
    let since = wide(stalled(5, 2, Some(60)));
    assert!(since.contains("port 8080: 3 connections waiting, none accepted for 40.0s"), "{since}");
    let keeping_up = wide(stalled(5, 5, Some(99)));
    assert!(!keeping_up.contains("waiting"), "{keeping_up}");
    let view = stalled(3, 0, Some(60));
    let stories = lifecycle_model::explain::explain_at(&[view], "shop", "web", None, BootTime::from_ns(100 * SECOND));
    let text = lifecycle_model::explain::render_text(&stories, None);
    assert!(text.contains("kernel  port 8080: 3 connections waiting, none accepted for 40.0s"), "{text}");
}

#[test]
fn escapes_in_an_agents_answer_never_reach_the_terminal() {
    // Issue 37 item 9: terminal escapes from an agent's answers were printed raw by `status`.
    let mut view = container("shop", "web\u{1b}]0;owned\u{7}", "app\u{1b}[2J");
    view.labels.uid = "uid\r\u{9b}31m".into();
    let body = answer(2, vec![view], vec![]);
    let answers = [Answer { node: None, body: &body }];
    for output in [Output::Table, Output::Wide, Output::Yaml, Output::Json] {
        let shown = render(&answers, output).expect("renders");
        assert!(!shown.chars().any(|c| c.is_control() && c != '\n'), "{output:?}: {shown:?}");
        // JSON and YAML escape in their own way; the tables say `\u{1b}`.
        if matches!(output, Output::Table | Output::Wide) {
            assert!(shown.contains("app\\u{1b}[2J"), "{output:?}: {shown}");
        }
    }
}
