//! Privileged tier (runtime): the `explain` pages as a person sees them. A real containerd + runc
//! runs a container that ignores SIGTERM and is SIGKILLed at its grace; the real agent judges
//! it; headless Chromium (Debian's `chromium`) renders `/explain/<ns>/<pod>` and `/explain`,
//! and the test reads what was drawn (the DOM after layout) and checks the screenshot.
//!
//! Run: `cargo test -p lifecycle-agent --test explain_page -- --test-threads=1`

use std::path::Path;

use lifecycle_testkit::{
    agent::{get, Agent},
    browser::{chromium, screenshot, CHROMIUM},
    containerd::{start_or_skip, KubeletAnnotations},
};

const AGENT: &str = env!("CARGO_BIN_EXE_lifecycle-agent");
#[test]
fn the_explain_pages_render_a_timeline_a_person_can_read() {
    let Some(mut h) = start_or_skip("the_explain_pages_render_a_timeline_a_person_can_read") else { return };
    assert!(Path::new(CHROMIUM).exists(), "{CHROMIUM} (Debian's chromium; the runtime tier installs it)");
    let agent = Agent::start(AGENT, &h, &[]);
    let pod = h.new_pod("stubborn").expect("pod");
    let annotations = KubeletAnnotations { termination_grace_period_s: Some(2), ..KubeletAnnotations::default() };
    let script = "trap '' TERM; while true; do sleep 0.1; done";
    let id = h.run_container(&pod, "app", &["sh", "-c", script], &annotations, None).expect("container");
    agent.wait(&pod, "app", "running", |c| c["state"]["state"] == "running");
    h.stop_container(&id, 2).expect("stop");
    agent.wait(&pod, "app", "judged", |c| c["last_termination"]["outcome"]["kind"] == "sigkilled_after_grace");

    let url = format!("http://{}/explain/{}/{}", agent.addr, pod.namespace, pod.name);
    let (code, html) = get(&agent.addr, &format!("/explain/{}/{}", pod.namespace, pod.name)).expect("page");
    assert_eq!(code, 200, "{html}");
    let dir = std::env::temp_dir().join(format!("lifecycle-explain-page-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");

    // What the browser built: the verdict, one mark per timed line with its label.
    let dom = chromium(&dir, &url, "--dump-dom");
    assert!(dom.contains("<h1>Why default/stubborn stopped</h1>"), "{dom}");
    assert!(dom.contains("SIGKILLed 2.0s after SIGTERM: it did not exit within its 2.0s grace"), "{dom}");
    let marks = dom.matches("<g class=\"mark\">").count();
    assert_eq!(marks, 3, "the stop signal, the SIGKILL and the exit are drawn: {dom}");
    assert!(dom.contains("<rect class=\"grace\""), "the grace window is shaded: {dom}");
    for label in
        ["SIGTERM to PID 1 from the container runtime", "SIGKILL from the container runtime", "PID 1 killed by SIGKILL"]
    {
        assert!(dom.contains(label), "{label:?} on the page: {dom}");
    }

    // What a person sees: a screenshot of the page, a real picture.
    screenshot(&dir, &url);

    // The node page lists the stop and links to the pod's page.
    let node = chromium(&dir, &format!("http://{}/explain", agent.addr), "--dump-dom");
    assert!(node.contains("<a href=\"/explain/default/stubborn\">default/stubborn</a>"), "{node}");

    let _ = std::fs::remove_dir_all(&dir);
}
