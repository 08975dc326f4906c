//! A Kubernetes client error as one line of words for the log, `doctor` and the CLI.
//!
//! kube's own Display of an API error appends the Status' Debug form, and when the server is not
//! an API server (a proxy's or load balancer's HTML page, a wrong port) the whole page becomes
//! the error's message: dozens of log lines of markup per retry. Here each level of the error
//! chain says only what it adds, an API answer is its code, reason and message, an answer that
//! is not the API's is named as such, and the whole is one line of bounded length.

use std::fmt;

/// How long the line may be: enough for a reason and the API's message, not for a page.
const MAX_CHARS: usize = 300;
/// How much of a body that is not a Kubernetes Status is quoted.
const QUOTED_BODY_CHARS: usize = 80;

/// What kube-client puts in `reason` when the body of an error answer is not a Status.
const UNPARSED_BODY: &str = "Failed to parse error data";

/// Displays an error chain holding a [`kube::Error`] as one line.
pub(crate) struct ApiWords<'a>(pub &'a (dyn std::error::Error + 'static));

impl fmt::Display for ApiWords<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut parts: Vec<String> = Vec::new();
        let mut level = Some(self.0);
        while let Some(error) = level {
            if let Some(words) = error.downcast_ref::<kube::Error>().and_then(kube_words) {
                parts.push(words);
                break;
            }
            let text = error.to_string();
            // What this level adds: its text without its source's, which wrappers repeat.
            let own = match error.source().map(|source| source.to_string()) {
                Some(source) if !source.is_empty() && text.contains(&source) => {
                    text.replace(&source, "").trim().trim_end_matches(':').trim().to_owned()
                }
                _ => text,
            };
            if !own.is_empty() && !parts.iter().any(|part| part.contains(&own)) {
                parts.push(own);
            }
            level = error.source();
        }
        f.write_str(&one_line(&parts.join(": "), MAX_CHARS))
    }
}

/// Words for the kube errors whose Display is not fit for a log line.
fn kube_words(error: &kube::Error) -> Option<String> {
    match error {
        kube::Error::Api(status) if status.reason == UNPARSED_BODY => {
            let body = status.message.trim();
            let kind = if body.starts_with('<') { "an HTML page" } else { "a body" };
            Some(format!(
                "HTTP {} with {kind} that is not the Kubernetes API's (is the server an API server?): {}",
                status.code,
                one_line(body, QUOTED_BODY_CHARS)
            ))
        }
        kube::Error::Api(status) => {
            let reason = if status.reason.is_empty() { String::new() } else { format!(" {}", status.reason) };
            Some(format!("HTTP {}{reason}: {}", status.code, status.message.trim()))
        }
        kube::Error::SerdeError(err) => Some(format!("an answer that is not the Kubernetes API's JSON ({err})")),
        _ => None,
    }
}

/// `text` with every run of whitespace (newlines included) made one space, cut at `max` chars.
fn one_line(text: &str, max: usize) -> String {
    let words: Vec<&str> = text.split_whitespace().collect();
    let joined = words.join(" ");
    match joined.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &joined[..cut]),
        None => joined,
    }
}

#[cfg(test)]
mod tests {
    use kube::core::Status;

    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("the pod watch failed: {0}")]
    struct Watch(#[source] kube::Error);

    #[test]
    fn a_page_that_is_not_the_apis_is_named_and_quoted_on_one_line() {
        let page = "<!DOCTYPE HTML>\n<html lang=\"en\">\n  <head><title>Error response</title></head>\n  \
                    <body><h1>Error response</h1><p>Error code: 404</p>"
            .repeat(20);
        let error = Watch(kube::Error::Api(Status::failure(&page, UNPARSED_BODY).with_code(404).boxed()));
        let line = ApiWords(&error).to_string();
        assert!(!line.contains('\n'), "{line}");
        assert!(line.chars().count() <= MAX_CHARS + 1, "{line}");
        assert!(
            line.starts_with("the pod watch failed: HTTP 404 with an HTML page that is not the Kubernetes API's"),
            "{line}"
        );
        assert!(!line.contains("Status {"), "no Debug text: {line}");
    }

    #[test]
    fn an_api_answer_is_its_code_reason_and_message() {
        let status = Status::failure("pods is forbidden: User \"x\" cannot list resource \"pods\"", "Forbidden")
            .with_code(403)
            .boxed();
        let error = Watch(kube::Error::Api(status));
        assert_eq!(
            ApiWords(&error).to_string(),
            "the pod watch failed: HTTP 403 Forbidden: pods is forbidden: User \"x\" cannot list resource \"pods\""
        );
    }

    #[test]
    fn other_errors_keep_their_chain_without_repeats() {
        let io = std::io::Error::other("connection refused");
        let error = Watch(kube::Error::ReadEvents(io));
        assert_eq!(
            ApiWords(&error).to_string(),
            "the pod watch failed: Error reading events stream: connection refused"
        );
    }
}
