//! Durations as people write them on the command line and in probe URLs: `500ms`, `5s`, `1.5s`,
//! `2m`, `1h`. The one parser for both, so a value means the same wherever it is typed.

/// A duration that is not a non-negative number followed by `ms`, `s`, `m` or `h`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not a duration like 500ms, 5s, 1.5m or 1h")]
pub struct BadDuration;

/// Parses `text` into nanoseconds.
pub fn parse_ns(text: &str) -> Result<u64, BadDuration> {
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or(BadDuration)?;
    let (number, unit) = text.split_at(split);
    let scale: f64 = match unit {
        "ms" => 1e6,
        "s" => 1e9,
        "m" => 60e9,
        "h" => 3600e9,
        _ => return Err(BadDuration),
    };
    let number: f64 = number.parse().map_err(|_| BadDuration)?;
    let ns = number * scale;
    if !ns.is_finite() || ns < 0.0 || ns > u64::MAX as f64 / 2.0 {
        return Err(BadDuration);
    }
    Ok(ns.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_fractions() {
        assert_eq!(parse_ns("500ms"), Ok(500_000_000));
        assert_eq!(parse_ns("1.5s"), Ok(1_500_000_000));
        assert_eq!(parse_ns("10m"), Ok(600_000_000_000));
        for bad in ["", "s", "5", "5d", "-1s", "1e30h", "..s"] {
            assert_eq!(parse_ns(bad), Err(BadDuration), "{bad:?}");
        }
    }
}
