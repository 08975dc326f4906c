//! `explain` as a page: the same stories (`lifecycle_model::explain`) drawn as an SVG timeline per stop, and a
//! node page listing the recent stops with their verdicts and causes. Served by the agent on
//! `/explain/<namespace>/<pod>` and `/explain`, behind the same authorization as `/api/*`.
//!
//! One self-contained document: inline CSS, inline SVG, no script, no external asset (the agent
//! sends it with a Content-Security-Policy that forbids both). Every text from the agent's data
//! is HTML-escaped: process names come from pods.

use std::fmt::Write as _;

use lifecycle_model::{
    explain::{ContainerStory, Line},
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

/// The wall time of a line, from its story's origin and the agent's clock.
fn wall_time(story: &ContainerStory, line: &Line, clock: WallClock) -> Option<String> {
    let origin = story.origin?;
    let offset_ns = (line.offset_ms? * MILLISECOND as f64) as i64;
    clock.rfc3339(BootTime::from_ns(origin.ns().checked_add_signed(offset_ns)?))
}

/// The page of one pod (or one host unit, `namespace` `host`): a section per stop, newest first.
pub(crate) fn pod_page(namespace: &str, pod: &str, stories: &[ContainerStory], clock: WallClock) -> String {
    let host = namespace == lifecycle_model::explain::HOST_NAMESPACE;
    let subject = if host { format!("host unit {pod}") } else { format!("{namespace}/{pod}") };
    let mut body = format!("<h1>Why {} stopped</h1>", escape(&subject));
    if stories.is_empty() {
        body.push_str("<p>This node's agent knows no container or stop of this pod.</p>");
    }
    for (index, story) in stories.iter().enumerate() {
        let heading = if story.is_host_unit() { "unit".to_owned() } else { format!("container {}", story.container) };
        let _ = write!(body, "<section id=\"stop-{index}\"><h2>{}</h2>", escape(&heading));
        let _ = write!(body, "<p class=\"verdict\">{}</p>", escape(&story.verdict));
        if let Some(cause) = &story.cause {
            let _ = write!(body, "<p class=\"cause\">cause: {}</p>", escape(cause));
        }
        body.push_str(&timeline_svg(&story.timeline));
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

/// Percent-encodes a path segment or a query value (names may hold any byte a client types).
pub fn percent_encoded(segment: &str) -> String {
    segment
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The timed lines on an axis: a mark and a label per line, the first (the stop signal) at 0.
fn timeline_svg(lines: &[Line]) -> String {
    let timed: Vec<(f64, &Line)> = lines.iter().filter_map(|l| l.offset_ms.map(|ms| (ms, l))).collect();
    if timed.is_empty() {
        return String::new();
    }
    const WIDTH: f64 = 900.0;
    const LEFT: f64 = 40.0;
    const RIGHT: f64 = 40.0;
    const ROW: f64 = 20.0;
    let start = timed.iter().map(|(ms, _)| *ms).fold(f64::INFINITY, f64::min).min(0.0);
    let end = timed.iter().map(|(ms, _)| *ms).fold(f64::NEG_INFINITY, f64::max).max(start + 1.0);
    let x = |ms: f64| LEFT + (ms - start) / (end - start) * (WIDTH - LEFT - RIGHT);
    let height = 40.0 + ROW * timed.len() as f64;
    let mut svg = format!(
        "<svg class=\"timeline\" role=\"img\" aria-label=\"timeline\" width=\"{WIDTH}\" height=\"{height}\" \
         viewBox=\"0 0 {WIDTH} {height}\" xmlns=\"http://www.w3.org/2000/svg\">\
         <line x1=\"{LEFT}\" y1=\"20\" x2=\"{}\" y2=\"20\" stroke=\"#8a93a6\" stroke-width=\"2\"/>",
        WIDTH - RIGHT
    );
    for (row, (ms, line)) in timed.iter().enumerate() {
        let color = if line.text.starts_with("SIGKILL") {
            "#c62828"
        } else if line.text.starts_with("PID 1") {
            "#1d2330"
        } else {
            "#1565c0"
        };
        let (mark, y) = (x(*ms), 40.0 + ROW * row as f64);
        // The label starts at its mark when there is room to the right, else ends at it.
        let anchor = if mark > WIDTH * 0.6 { "end" } else { "start" };
        let label = format!("{ms:+.0} ms  {}", line.text);
        let _ = write!(
            svg,
            "<g class=\"mark\"><circle cx=\"{mark:.1}\" cy=\"20\" r=\"6\" fill=\"{color}\"/>\
             <line x1=\"{mark:.1}\" y1=\"26\" x2=\"{mark:.1}\" y2=\"{:.1}\" stroke=\"{color}\" stroke-dasharray=\"2,3\"/>\
             <text x=\"{mark:.1}\" y=\"{y:.1}\" text-anchor=\"{anchor}\" fill=\"{color}\">{}</text></g>",
            y - 12.0,
            escape(&truncate(&label, 110))
        );
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
        }
    }

    /// Unix time 1,700,000,000 s at boot.
    fn clock() -> WallClock {
        WallClock::from_offset_seconds(1_700_000_000.0)
    }

    #[test]
    fn a_pod_page_draws_a_mark_per_timed_line_and_lists_every_line() {
        let html = pod_page("shop", "web-1", &[story()], clock());
        assert!(html.starts_with("<!DOCTYPE html>"));
        assert_eq!(html.matches("<g class=\"mark\">").count(), 3, "one mark per timed line");
        assert!(html.contains("+30001 ms  SIGKILL from the container runtime"), "{html}");
        assert_eq!(html.matches("<tr><td class=\"t\">").count(), 4, "every line in the table");
        assert!(html.contains("2023-11-14T22:15:30.001Z"), "the SIGKILL's wall time: {html}");
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
