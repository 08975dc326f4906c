//! Durations as people write them on the command line and in probe URLs: `500ms`, `5s`, `1.5s`,
//! `2m`, `1h`, and compounds as Go and kubectl write them, `1h30m`, `2m30s`, `1m0.5s`. The one
//! parser for both, so a value means the same wherever it is typed.

/// A duration that is not one or more non-negative numbers each followed by `ms`, `s`, `m` or `h`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("not a duration like 500ms, 5s, 1.5m, 1h or 1h30m")]
pub struct BadDuration;

/// Parses `text` into nanoseconds: a sum of `<number><unit>` parts.
pub fn parse_ns(text: &str) -> Result<u64, BadDuration> {
    let mut rest = text;
    let mut total = 0.0_f64;
    if rest.is_empty() {
        return Err(BadDuration);
    }
    while !rest.is_empty() {
        let number_end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or(BadDuration)?;
        let (number, after) = rest.split_at(number_end);
        let unit_end = after.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_end);
        let scale: f64 = match unit {
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return Err(BadDuration),
        };
        let number: f64 = number.parse().map_err(|_| BadDuration)?;
        total += number * scale;
        rest = next;
    }
    if !total.is_finite() || total < 0.0 || total > u64::MAX as f64 / 2.0 {
        return Err(BadDuration);
    }
    Ok(total.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_fractions() {
        assert_eq!(parse_ns("500ms"), Ok(500_000_000));
        assert_eq!(parse_ns("1.5s"), Ok(1_500_000_000));
        assert_eq!(parse_ns("10m"), Ok(600_000_000_000));
        for bad in ["", "s", "5", "5d", "-1s", "1e30h", "..s", "1h30", "h1", "1h 30m", "1hm"] {
            assert_eq!(parse_ns(bad), Err(BadDuration), "{bad:?}");
        }
    }

    #[test]
    fn compound_durations_add_their_parts_as_kubectl_and_go_write_them() {
        // Issue 41 item 8: `1h30m` was refused.
        assert_eq!(parse_ns("1h30m"), Ok(5_400_000_000_000));
        assert_eq!(parse_ns("2m30s"), Ok(150_000_000_000));
        assert_eq!(parse_ns("1m0.5s"), Ok(60_500_000_000));
        assert_eq!(parse_ns("1s500ms"), Ok(1_500_000_000));
        assert_eq!(parse_ns("1h1h"), Ok(7_200_000_000_000));
    }
}
