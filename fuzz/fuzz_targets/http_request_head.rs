//! The per-pod probe listener's request-head handling: `probe::server::respond` on arbitrary
//! bytes, with an answer that records what it was asked.
//!
//! Properties: the status is the answer's (only for a GET or HEAD on HTTP/1.x) or 400/405; the
//! body of a refusal is one line; HEAD never sends a body; what reaches the answer is the request
//! target split at its first `?`, without spaces or CR.

#![no_main]

use std::sync::Mutex;

use libfuzzer_sys::fuzz_target;
use lifecycle_agent::probe::server::{respond, ProbeAnswer};
use lifecycle_fuzz::assert_one_line;

/// Answers 200 for `/probe...` and 404 otherwise, and keeps the path and query it was given.
#[derive(Default)]
struct Recorder {
    asked: Mutex<Option<(String, Option<String>)>>,
}

impl ProbeAnswer for Recorder {
    fn answer(&self, path: &str, query: Option<&str>) -> (u16, String) {
        let status = if path.starts_with("/probe") { 200 } else { 404 };
        let mut asked = self.asked.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        assert!(asked.is_none(), "answered twice");
        *asked = Some((path.to_owned(), query.map(str::to_owned)));
        (status, "answer\n".to_owned())
    }
}

fuzz_target!(|data: &[u8]| {
    let recorder = Recorder::default();
    let (status, body, send_body) = respond(data, &recorder);
    let asked = recorder.asked.into_inner().unwrap_or_else(|poisoned| poisoned.into_inner());
    let line = String::from_utf8_lossy(data.split(|&b| b == b'\r').next().unwrap_or_default()).into_owned();
    let mut words = line.split(' ');
    let (method, target) = (words.next().unwrap_or_default(), words.next().unwrap_or_default());
    match (status, asked) {
        (200 | 404, Some((path, query))) => {
            assert!(method == "GET" || method == "HEAD", "{method:?} reached the answer: {line:?}");
            assert_eq!(send_body, method == "GET", "{line:?}");
            assert_eq!(body, "answer\n");
            assert_eq!(status == 200, path.starts_with("/probe"));
            assert!(!path.contains('?'), "path {path:?} from {line:?}");
            let asked = match &query {
                Some(query) => format!("{path}?{query}"),
                None => path.clone(),
            };
            assert_eq!(asked, target, "{line:?}");
            assert!(!asked.contains([' ', '\r']), "target {asked:?} from {line:?}");
        }
        (400 | 405, None) => {
            assert!(send_body, "a refusal without body: {line:?}");
            let text = body.strip_suffix('\n').expect("refusals end in a newline");
            assert_one_line("refusal body", text);
        }
        (other, asked) => panic!("status {other} (answer asked: {asked:?}) for {line:?}"),
    }
});
