//! A probe URL's query string: `probe::query::Query::parse`, then `CheckSpec::from_query` for
//! every kind (`tcp`, `process`, `file`, `all`) and an unknown one.
//!
//! Properties: decoding round-trips (the pairs, percent-encoded again, parse to the same pairs);
//! `take` removes every pair of its key; a spec that parses keeps the limits its parser promises
//! (port 1-65535, absolute file paths without `..` or NUL, the kind asked for); every refusal is
//! one line of bounded length (it is the 400 body), and the same as `CheckSpec::parse` gives.

#![no_main]

use libfuzzer_sys::fuzz_target;
use lifecycle_agent::probe::{check::CheckSpec, query::Query};
use lifecycle_fuzz::{assert_error_one_line, debug_len_bound};

fuzz_target!(|data: &[u8]| {
    let Ok(raw) = std::str::from_utf8(data) else { return };
    let query = match Query::parse(Some(raw)) {
        Ok(query) => query,
        Err(err) => {
            assert_error_one_line("query ParseError", &err, 200 + debug_len_bound(raw.len()));
            return;
        }
    };

    let encoded = encode(query.params());
    assert_eq!(Query::parse(Some(&encoded)).as_ref(), Ok(&query), "{raw:?} re-encoded as {encoded:?}");

    for kind in ["tcp", "process", "file", "all", "exec"] {
        let spec = CheckSpec::from_query(kind, &query);
        assert_eq!(spec, CheckSpec::parse(&format!("/{kind}"), Some(raw)), "kind {kind}, query {raw:?}");
        match spec {
            Ok(spec) => {
                assert_eq!(spec.kind(), kind, "{raw:?}");
                check_spec(raw, &spec);
            }
            Err(err) => assert_error_one_line("check ParseError", &err, 200 + debug_len_bound(raw.len())),
        }
    }

    if let Some((key, _)) = query.params().first() {
        let mut rest = query.clone();
        let value = rest.take(key);
        assert!(value.is_some(), "take({key:?}) found nothing in {raw:?}");
        assert!(rest.params().iter().all(|(k, _)| k != key), "take({key:?}) left a pair in {raw:?}");
        assert_eq!(
            rest.params().len(),
            query.params().iter().filter(|(k, _)| k != key).count(),
            "take({key:?}) removed other pairs from {raw:?}"
        );
    }
});

fn check_spec(raw: &str, spec: &CheckSpec) {
    match spec {
        CheckSpec::Tcp { port, .. } => assert_ne!(*port, 0, "{raw:?}"),
        CheckSpec::Process { .. } => {}
        CheckSpec::File { path, .. } => {
            let bad = !path.starts_with('/') || path.contains('\0') || path.split('/').any(|c| c == "..");
            assert!(!bad, "file path {path:?} accepted from {raw:?}");
        }
        CheckSpec::AllOf(checks) => {
            assert!(!checks.is_empty(), "an empty all accepted from {raw:?}");
            for check in checks {
                assert!(!matches!(check, CheckSpec::AllOf(_)), "nested all from {raw:?}");
                check_spec(raw, check);
            }
        }
    }
}

/// The pairs as a query again: every byte but the unreserved ones percent-encoded.
fn encode(params: &[(String, Option<String>)]) -> String {
    fn escape(out: &mut String, text: &str) {
        for b in text.bytes() {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                out.push(char::from(b));
            } else {
                const HEX: &[u8; 16] = b"0123456789ABCDEF";
                out.extend(['%', char::from(HEX[usize::from(b >> 4)]), char::from(HEX[usize::from(b & 15)])]);
            }
        }
    }
    let mut out = String::new();
    for (i, (key, value)) in params.iter().enumerate() {
        if i > 0 {
            out.push('&');
        }
        escape(&mut out, key);
        if let Some(value) = value {
            out.push('=');
            escape(&mut out, value);
        }
    }
    out
}
