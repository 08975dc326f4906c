//! `explain` as a page: the same stories (`lifecycle_model::explain`) drawn as the pod's story on
//! one time axis (a lane per container, the grace window shaded, the stop signal, the SIGKILL and
//! the exit marked with who ran then), each stop's verdict and timeline as a table, and a node
//! page listing the recent stops with their verdicts and causes. Served by the agent on
//! `/explain/<namespace>/<pod>` and `/explain`, behind the same authorization as `/api/*`.
//!
//! One self-contained document: inline CSS, inline SVG, no script, no external asset (the agent
//! sends it with a Content-Security-Policy that forbids both). Every text from the agent's data
//! is HTML-escaped: process names come from pods.

use std::fmt::Write as _;

use lifecycle_model::{
    explain::{ContainerStory, Line, StopAxis},
    time::{BootTime, MILLISECOND},
    wire::at::WallClock,
};

/// Escapes `text` for HTML element content and attribute values.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

const STYLE: &str = "body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#1d2330;background:#fff}\
h1{font-size:20px}h2{font-size:16px;margin:28px 0 4px}.verdict{font-weight:600;margin:4px 0 8px}\
.cause{color:#5a6275}table{border-collapse:collapse}td,th{padding:3px 10px;border-bottom:1px solid #e3e6ee;\
text-align:left;vertical-align:top}td.t{font-variant-numeric:tabular-nums;white-space:nowrap;color:#5a6275}\
td.s{color:#5a6275}svg text{font:12px system-ui,sans-serif}";

fn page(title: &str, body: &str) -> String {
    format!(
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{STYLE}</style></head>\
         <body>{body}</body></html>\n",
        escape(title)
    )
}

/// A moment as wall time to the millisecond, UTC (`2026-11-29T04:04:29.438Z`).
fn short_time(clock: WallClock, at: BootTime) -> String {
    let full = clock.rfc3339(at).unwrap_or_default();
    match (full.find('.'), full.ends_with('Z')) {
        (Some(dot), true) => format!("{}Z", &full[..(dot + 4).min(full.len() - 1)]),
        _ => full,
    }
}

/// The wall time of a line, from its story's origin and the agent's clock.
fn wall_time(story: &ContainerStory, line: &Line, clock: WallClock) -> Option<String> {
    let origin = story.origin?;
    let offset_ns = (line.offset_ms? * MILLISECOND as f64) as i64;
    Some(short_time(clock, BootTime::from_ns(origin.ns().checked_add_signed(offset_ns)?)))
}

/// The page of one pod (or one host unit, `namespace` `host`): a section per stop, newest first.
pub(crate) fn pod_page(namespace: &str, pod: &str, stories: &[ContainerStory], clock: WallClock) -> String {
    let host = namespace == lifecycle_model::explain::HOST_NAMESPACE;
    let subject = if host { format!("host unit {pod}") } else { format!("{namespace}/{pod}") };
    let mut body = format!("<h1>Why {} stopped</h1>", escape(&subject));
    if stories.is_empty() {
        body.push_str("<p>This node's agent knows no container or stop of this pod.</p>");
    }
    body.push_str(&pod_svg(stories, clock));
    for (index, story) in stories.iter().enumerate() {
        let heading = if story.is_host_unit() { "unit".to_owned() } else { format!("container {}", story.container) };
        let _ = write!(body, "<section id=\"stop-{index}\"><h2>{}</h2>", escape(&heading));
        let _ = write!(body, "<p class=\"verdict\">{}</p>", escape(&story.verdict));
        if let Some(cause) = &story.cause {
            let _ = write!(body, "<p class=\"cause\">cause: {}</p>", escape(cause));
        }
        body.push_str("<table><tr><th>time</th><th>offset</th><th>source</th><th>what</th></tr>");
        for line in &story.timeline {
            let at = line.offset_ms.map(|ms| format!("{ms:+.1} ms")).unwrap_or_default();
            let wall = wall_time(story, line, clock).unwrap_or_default();
            let _ = write!(
                body,
                "<tr><td class=\"t\">{}</td><td class=\"t\">{}</td><td class=\"s\">{}</td><td>{}</td></tr>",
                escape(&wall),
                escape(&at),
                line.source,
                escape(&line.text)
            );
        }
        body.push_str("</table></section>");
    }
    page(&format!("{subject}: lifecycle explain"), &body)
}

/// Where a story's page is: its pod's, or its host unit's.
fn page_of(story: &ContainerStory) -> String {
    if story.is_host_unit() {
        let path: Vec<String> = story.container.trim_start_matches('/').split('/').map(percent_encoded).collect();
        format!("/explain/host/{}", path.join("/"))
    } else {
        format!("/explain/{}/{}", percent_encoded(&story.namespace), percent_encoded(&story.pod))
    }
}

/// The node page: recent stops, newest first, each linking to its pod's (or host unit's) page.
pub(crate) fn node_page(node: &str, stories: &[ContainerStory], clock: WallClock) -> String {
    let mut body = format!("<h1>Recent stops on {}</h1>", escape(node));
    if stories.is_empty() {
        body.push_str("<p>No stop judged yet.</p>");
    } else {
        body.push_str("<table><tr><th>when</th><th>pod</th><th>container</th><th>cause</th><th>verdict</th></tr>");
        for story in stories {
            let when = story.origin.and_then(|origin| clock.rfc3339(origin)).unwrap_or_default();
            let (owner, container) = if story.is_host_unit() {
                ("host".to_owned(), story.container.clone())
            } else {
                (format!("{}/{}", story.namespace, story.pod), story.container.clone())
            };
            let _ = write!(
                body,
                "<tr><td class=\"t\">{}</td><td><a href=\"{}\">{}</a></td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&when),
                escape(&page_of(story)),
                escape(&owner),
                escape(&container),
                escape(story.cause.as_deref().unwrap_or("")),
                escape(&story.verdict)
            );
        }
        body.push_str("</table>");
    }
    page(&format!("{node}: recent stops"), &body)
}

/// Percent-encodes a path segment or a query value: the API's own encoding, shared with its clients.
pub use lifecycle_model::wire::percent_encoded;

/// Pixels of the pod drawing: its width, the lane labels' column, a lane's height.
const WIDTH: f64 = 960.0;
const LABELS: f64 = 150.0;
const RIGHT: f64 = 30.0;
const LANE: f64 = 64.0;
/// A drawing spans at least this much time, so one moment is a point on an axis, not a line
/// stretched across the page.
const MIN_SPAN_NS: u64 = 2 * lifecycle_model::time::SECOND;

/// The pod's stops on one time axis: a lane per container (sidecars first, then the others by
/// name), the grace window shaded from the stop signal to its deadline, the stop signal, the
/// SIGKILL and the exit marked, and who ran at each mark. Wall-clock times at both ends.
fn pod_svg(stories: &[ContainerStory], clock: WallClock) -> String {
    let mut lanes: Vec<(&ContainerStory, &StopAxis)> =
        stories.iter().filter_map(|story| story.axis.as_ref().map(|axis| (story, axis))).collect();
    if lanes.is_empty() {
        return String::new();
    }
    lanes.sort_by(|(a, x), (b, y)| (!x.sidecar, &a.container, x.exit).cmp(&(!y.sidecar, &b.container, y.exit)));
    let moments: Vec<u64> = lanes
        .iter()
        .flat_map(|(_, axis)| [axis.stop, axis.deadline, axis.kill, Some(axis.exit)])
        .flatten()
        .map(BootTime::ns)
        .collect();
    let (first, last) = (moments.iter().min().copied().unwrap_or(0), moments.iter().max().copied().unwrap_or(0));
    let pad = (last - first).max(MIN_SPAN_NS) / 10;
    let (start, end) = (first.saturating_sub(pad), last.max(first + MIN_SPAN_NS) + pad);
    let x =
        |t: BootTime| LABELS + (t.ns().saturating_sub(start)) as f64 / (end - start) as f64 * (WIDTH - LABELS - RIGHT);
    let height = 40.0 + LANE * lanes.len() as f64;
    let when = |ns: u64| short_time(clock, BootTime::from_ns(ns));
    let mut svg = format!(
        "<svg class=\"pod-timeline\" role=\"img\" aria-label=\"the pod's stops on one time axis\" width=\"{WIDTH}\" \
         height=\"{height}\" viewBox=\"0 0 {WIDTH} {height}\" xmlns=\"http://www.w3.org/2000/svg\">\
         <text x=\"{LABELS}\" y=\"14\" fill=\"#5a6275\">{}</text>\
         <text x=\"{}\" y=\"14\" text-anchor=\"end\" fill=\"#5a6275\">{}</text>",
        escape(&when(start)),
        WIDTH - RIGHT,
        escape(&when(end))
    );
    for (row, (story, axis)) in lanes.iter().enumerate() {
        let y = 40.0 + LANE * row as f64;
        let name = if story.is_host_unit() { "unit".to_owned() } else { story.container.clone() };
        let role = if axis.sidecar { " (sidecar)" } else { "" };
        let _ = write!(
            svg,
            "<g class=\"lane\"><text x=\"0\" y=\"{:.1}\" font-weight=\"600\">{}{role}</text>\
             <line x1=\"{LABELS}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#c9ced9\" stroke-width=\"2\"/>",
            y + 4.0,
            escape(&truncate(&name, 20)),
            WIDTH - RIGHT
        );
        if let (Some(stop), Some(deadline)) = (axis.stop, axis.deadline) {
            let (from, to) = (x(stop), x(deadline));
            let _ = write!(
                svg,
                "<rect class=\"grace\" x=\"{from:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"16\" fill=\"#ffe7b3\">\
                 <title>grace window: {} to {}</title></rect>\
                 <line x1=\"{to:.1}\" y1=\"{:.1}\" x2=\"{to:.1}\" y2=\"{:.1}\" stroke=\"#b26a00\" stroke-dasharray=\"3,2\"/>",
                y - 8.0,
                (to - from).max(1.0),
                escape(&when(stop.ns())),
                escape(&when(deadline.ns())),
                y - 12.0,
                y + 12.0
            );
        }
        // The exit first: the SIGKILL, usually at the same moment, is drawn over it.
        let mut marks: Vec<(BootTime, &str, String, &[String])> = vec![(axis.exit, "#1d2330", "exit".to_owned(), &[])];
        if let Some(stop) = axis.stop {
            marks.push((stop, "#1565c0", "stop signal".to_owned(), &axis.running_at_stop));
        }
        if let Some(kill) = axis.kill {
            marks.push((kill, "#c62828", "SIGKILL".to_owned(), &axis.alive_at_kill));
        }
        for (at, color, what, who) in marks {
            let mark = x(at);
            let anchor = if mark > WIDTH * 0.7 { "end" } else { "start" };
            let who = if who.is_empty() { String::new() } else { format!(": {}", who.join(", ")) };
            let label = truncate(&format!("{what}{who}"), 90);
            let text_y = match what.as_str() {
                "exit" => y + 26.0,
                "SIGKILL" => y + 40.0,
                _ => y - 14.0,
            };
            let _ = write!(
                svg,
                "<g class=\"mark\"><circle cx=\"{mark:.1}\" cy=\"{y:.1}\" r=\"6\" fill=\"{color}\"><title>{}</title></circle>\
                 <text x=\"{mark:.1}\" y=\"{text_y:.1}\" text-anchor=\"{anchor}\" fill=\"{color}\">{}</text></g>",
                escape(&when(at.ns())),
                escape(&label)
            );
        }
        svg.push_str("</g>");
    }
    svg.push_str("</svg>");
    svg
}

fn truncate(text: &str, chars: usize) -> String {
    if text.chars().count() <= chars {
        return text.to_owned();
    }
    let mut cut: String = text.chars().take(chars - 1).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    fn story() -> ContainerStory {
        ContainerStory {
            namespace: "shop".into(),
            pod: "web-1".into(),
            container: "app".into(),
            verdict: "SIGKILLed 30.0s after SIGTERM".into(),
            cause: Some("deleted".into()),
            timeline: vec![
                Line { offset_ms: None, source: "api", text: "stopped because: deleted; grace 30.0s".into() },
                Line {
                    offset_ms: Some(0.0),
                    source: "kernel",
                    text: "SIGTERM to PID 1 from the container runtime".into(),
                },
                Line { offset_ms: Some(30_001.0), source: "kernel", text: "SIGKILL from the container runtime".into() },
                Line {
                    offset_ms: Some(30_002.0),
                    source: "kernel",
                    text: "PID 1 killed by SIGKILL (exit code 137)".into(),
                },
            ],
            origin: Some(BootTime::from_ns(100 * lifecycle_model::time::SECOND)),
            axis: Some(StopAxis {
                sidecar: false,
                stop: Some(at(100.0)),
                deadline: Some(at(130.0)),
                kill: Some(at(130.001)),
                exit: at(130.002),
                running_at_stop: vec!["PID 1 `sh`".into(), "`java` (pid 4107)".into()],
                alive_at_kill: vec!["PID 1 `sh`".into(), "2 processes named `java` (pids 4107, 4108)".into()],
            }),
        }
    }

    fn at(s: f64) -> BootTime {
        BootTime::from_ns((s * lifecycle_model::time::SECOND as f64) as u64)
    }

    /// Unix time 1,700,000,000 s at boot.
    fn clock() -> WallClock {
        WallClock::from_offset_seconds(1_700_000_000.0)
    }

    #[test]
    fn a_pod_page_draws_its_stops_on_one_axis_and_lists_every_line() {
        let sidecar = ContainerStory {
            container: "proxy".into(),
            axis: Some(StopAxis { sidecar: true, kill: None, exit: at(131.0), ..story().axis.expect("axis") }),
            ..story()
        };
        let html = pod_page("shop", "web-1", &[story(), sidecar], clock());
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert_eq!(html.matches("<svg class=\"pod-timeline\"").count(), 1, "one axis for the pod");
        assert_eq!(html.matches("<g class=\"lane\">").count(), 2, "a lane per container");
        assert!(html.find("proxy (sidecar)") < html.find(">app<"), "the sidecar's lane comes first: {html}");
        assert_eq!(html.matches("<rect class=\"grace\"").count(), 2, "each lane's grace window is shaded");
        // app: stop, kill, exit; proxy: stop, exit.
        assert_eq!(html.matches("<g class=\"mark\">").count(), 5, "{html}");
        assert!(html.contains("SIGKILL: PID 1 `sh`, 2 processes named `java` (pids 4107, 4108)"), "{html}");
        assert!(html.contains("SIGKILL from the container runtime"), "the timeline's lines in the table: {html}");
        assert!(html.contains("2023-11-14T22:15:00Z"), "the stop signal's wall time: {html}");
        assert_eq!(html.matches("<tr><td class=\"t\">").count(), 8, "every line of both stops in the tables");
        assert!(html.contains("2023-11-14T22:15:30.001Z"), "the SIGKILL's wall time, to the millisecond: {html}");
        assert!(!html.contains("<script") && !html.contains("src=") && !html.contains("href=\"http"));
    }

    #[test]
    fn text_from_a_pod_cannot_become_markup() {
        let mut hostile = story();
        hostile.timeline[1].text = "running: `<script>alert(1)</script>` \"quoted\"".into();
        hostile.container = "<img src=x>".into();
        let html = pod_page("shop", "web-1", &[hostile.clone()], clock()) + &node_page("node-a", &[hostile], clock());
        assert!(!html.contains("<script>") && !html.contains("<img"), "{html}");
        assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    }

    #[test]
    fn the_node_page_links_each_stop_to_its_pod_or_host_unit() {
        let host = ContainerStory {
            namespace: "host".into(),
            pod: String::new(),
            container: "/system.slice/web.service".into(),
            ..story()
        };
        let html = node_page("node-a", &[story(), host], clock());
        assert!(html.contains("<a href=\"/explain/shop/web-1\">shop/web-1</a>"), "{html}");
        assert!(html.contains("<a href=\"/explain/host/system.slice/web.service\">host</a>"), "{html}");
        assert!(html.contains("SIGKILLed 30.0s after SIGTERM"));
        assert!(html.contains("2023-11-14T22:15:00Z"), "when: {html}");
    }
}
