//! Text from an agent made safe for a terminal, and quoted on one line. Pod, container and process
//! names, paths and the kubelet's messages are chosen by whoever runs a pod, and an agent's error
//! body by whatever answered on its port: an escape sequence in any of them would move the
//! cursor, retitle the window or rewrite what the user reads. Every client output goes through
//! here: tables, YAML and text by [`terminal_safe`], JSON by [`json_safe`]; the escaping itself is
//! the model's (`lifecycle_model::terminal`, which explain's rendering uses too).

use lifecycle_model::terminal;

/// `text` with every control character written as `\u{1b}` (inert and readable), line breaks
/// kept only when `lines` (a multi-line output; never in a table cell or a one-line message).
pub fn terminal_safe(text: &str, lines: bool) -> String {
    if !lines {
        return terminal::safe(text).into_owned();
    }
    let safe_lines: Vec<String> = text.split('\n').map(|line| terminal::safe(line).into_owned()).collect();
    safe_lines.join("\n")
}

/// JSON text (serde_json's) with what serde_json leaves as it is — DEL, C1 controls, the bidi
/// overrides — written as `\uXXXX` escapes: the same document, read back equal.
pub fn json_safe(json: &str) -> String {
    terminal::safe_json(json.to_owned())
}

/// `text` on one line of words: runs of whitespace (line breaks included) become one space,
/// control characters are escaped, and it is cut at `max` characters with `…`. For an error
/// body quoted in a message.
pub fn one_line(text: &str, max: usize) -> String {
    let words: Vec<&str> = text.split_whitespace().collect();
    let joined = terminal_safe(&words.join(" "), false);
    match joined.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &joined[..cut]),
        None => joined,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_from_an_agent_never_reach_the_terminal_raw() {
        // Issue 37 item 9: terminal escapes in an agent's answers were printed raw.
        let hostile = "web\u{1b}]0;owned\u{7}\u{1b}[2J\r\u{9b}31m\u{202e}x";
        let safe = terminal_safe(hostile, false);
        assert!(!safe.chars().any(|c| c.is_control()), "{safe:?}");
        assert_eq!(safe, "web\\u{1b}]0;owned\\u{7}\\u{1b}[2J\\u{d}\\u{9b}31m\\u{202e}x");
        assert_eq!(terminal_safe("a\nb\u{1b}c", true), "a\nb\\u{1b}c");
        assert_eq!(terminal_safe("a\nb", false), "a\\u{a}b");
    }

    #[test]
    fn json_keeps_its_value_and_loses_its_escapes() {
        let value = serde_json::json!({"pod": "web\u{9b}31m\u{7f}\u{202e}"});
        let safe = json_safe(&serde_json::to_string_pretty(&value).expect("JSON"));
        assert!(!safe.chars().any(|c| c.is_control() && c != '\n'), "{safe:?}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&safe).expect("still JSON"), value);
    }

    #[test]
    fn an_error_body_is_one_line_of_words() {
        assert_eq!(one_line("  forbidden:\n  user x\r\n", 100), "forbidden: user x");
        assert_eq!(one_line("abcdef", 3), "abc…");
        assert_eq!(one_line("a\u{1b}[31mb", 100), "a\\u{1b}[31mb");
    }
}
