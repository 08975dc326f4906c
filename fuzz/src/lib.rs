//! Properties the fuzz targets share: what the agent promises about every error and message it
//! derives from outside input (one line, bounded size), checked the same way in each target.

use std::error::Error;

/// Asserts that `text` is one line: the agent's logs, 400/503 bodies and CLI output put each
/// message on a line of its own, so outside input must never break one into several.
pub fn assert_one_line(what: &str, text: &str) {
    assert!(!text.contains(['\n', '\r']), "{what} spans several lines: {text:?}");
}

/// Asserts that an error and every cause in its `source()` chain display as one line each, and
/// that the top message is at most `max_len` bytes (errors quote the input, escaped).
pub fn assert_error_one_line(what: &str, error: &dyn Error, max_len: usize) {
    let top = error.to_string();
    assert_one_line(what, &top);
    assert!(top.len() <= max_len, "{what} is {} bytes, more than {max_len}: {top:?}", top.len());
    let mut cause = error.source();
    while let Some(err) = cause {
        assert_one_line(what, &err.to_string());
        cause = err.source();
    }
}

/// The longest `{:?}` rendering of `len` input bytes: `\u{10ffff}` (10 characters) per byte at
/// worst, plus the quotes.
pub const fn debug_len_bound(len: usize) -> usize {
    10 * len + 2
}
