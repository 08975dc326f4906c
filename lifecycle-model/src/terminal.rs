//! Text from an agent's answer made safe to print on a terminal (`status`, `explain`, the kubectl
//! plugin).
//!
//! An answer carries words a pod chose (its names, its processes' names, the paths it declared)
//! and, from an agent that is not what it claims, anything at all. Printed raw, an escape
//! sequence in them can clear the screen, rewrite lines already shown, retitle the window or,
//! on some terminals, answer back with input. Every field a table or an explanation prints
//! goes through [`safe`] on its way out, and JSON output through [`safe_json`].

use std::borrow::Cow;

/// `text` with every control character (C0, DEL, C1) and every bidirectional override or
/// isolate (which reorder what is shown, "Trojan Source") written as a `\u{..}` escape; text
/// without any is returned as it is.
pub fn safe(text: &str) -> Cow<'_, str> {
    if !text.chars().any(unsafe_on_a_terminal) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if unsafe_on_a_terminal(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// JSON text (as serde_json writes it, which escapes only C0 controls) with DEL, the C1
/// controls and the reordering marks escaped too (`\u009b`). Outside strings JSON has no such
/// characters, so the document means the same.
pub fn safe_json(json: String) -> String {
    if !json.chars().any(|c| unsafe_on_a_terminal(c) && !c.is_ascii_whitespace()) {
        return json;
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if unsafe_on_a_terminal(c) && !c.is_ascii_whitespace() {
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    out
}

fn unsafe_on_a_terminal(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_and_reordering_marks_are_escaped_and_the_rest_kept() {
        assert!(matches!(safe("web-1 ünïcode"), Cow::Borrowed("web-1 ünïcode")));
        assert_eq!(safe("a\u{1b}[2Jb"), "a\\u{1b}[2Jb");
        assert_eq!(safe("x\ny\rz\t"), "x\\u{a}y\\u{d}z\\u{9}");
        assert_eq!(safe("\u{9b}31m"), "\\u{9b}31m", "a C1 control sequence introducer");
        assert_eq!(safe("abc\u{202e}fed"), "abc\\u{202e}fed");
        assert_eq!(safe("\u{7f}"), "\\u{7f}");
    }

    #[test]
    fn json_keeps_its_meaning_with_every_control_escaped() {
        let value = serde_json::json!({"pod": "a\u{1b}b\u{9b}c\u{7f}d\u{202e}e", "n": [1, 2]});
        let text = safe_json(serde_json::to_string_pretty(&value).expect("JSON"));
        assert!(!text.chars().any(|c| unsafe_on_a_terminal(c) && c != '\n'), "{text:?}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&text).expect("still JSON"), value);
    }
}
