//! The query string of a probe request, decoded once: `a=1&b&c=x%20y` into ordered pairs. The
//! pod listener, the node listener and the agent's `/api/v1/probe` route all read requests
//! through it, and pass typed values on from there.
//!
//! Bounded before anything is decoded: a query longer than [`MAX_QUERY_BYTES`] or with more than
//! [`MAX_QUERY_PARAMS`] pairs is refused as it is, so a request's cost does not grow with what a
//! client sends (a 60 KB query of 8,000 `file=` pairs cost 48 ms of an async worker before).
//! No declared check needs more: a pod declares at most 16 entries in 4 KiB.

use super::check::ParseError;

/// Longest raw query read (bytes, before decoding).
pub const MAX_QUERY_BYTES: usize = 4096;
/// Most `key[=value]` pairs read.
pub const MAX_QUERY_PARAMS: usize = 32;

/// Decoded `key[=value]` pairs in request order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Query {
    params: Vec<(String, Option<String>)>,
}

impl Query {
    /// Decodes a raw query (without the `?`); `+` is a space, `%XX` a byte, the result UTF-8.
    /// Refused before decoding when it is longer than [`MAX_QUERY_BYTES`] or has more than
    /// [`MAX_QUERY_PARAMS`] pairs.
    pub fn parse(raw: Option<&str>) -> Result<Self, ParseError> {
        let raw = raw.unwrap_or("");
        if raw.len() > MAX_QUERY_BYTES {
            return Err(ParseError::QueryTooLarge { what: "bytes", max: MAX_QUERY_BYTES });
        }
        // One pass over the bytes: separators bound the pairs (empty ones are skipped below).
        if raw.bytes().filter(|&b| b == b'&').count() >= MAX_QUERY_PARAMS {
            let pairs = raw.split('&').filter(|part| !part.is_empty()).count();
            if pairs > MAX_QUERY_PARAMS {
                return Err(ParseError::QueryTooLarge { what: "parameters", max: MAX_QUERY_PARAMS });
            }
        }
        let params = raw
            .split('&')
            .filter(|part| !part.is_empty())
            .map(|part| match part.split_once('=') {
                Some((k, v)) => Ok((decode(k)?, Some(decode(v)?))),
                None => Ok((decode(part)?, None)),
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { params })
    }

    /// Removes every `key` pair and returns the first one's value (empty for a bare `key`).
    pub fn take(&mut self, key: &str) -> Option<String> {
        let first = self.params.iter().position(|(k, _)| k == key)?;
        let value = self.params[first].1.clone().unwrap_or_default();
        self.params.retain(|(k, _)| k != key);
        Some(value)
    }

    /// The pairs left, in order.
    pub fn params(&self) -> &[(String, Option<String>)] {
        &self.params
    }
}

/// `%XX` (and `+`, a space) decoded: a query value's, or a path segment's.
pub(crate) fn decode(text: &str) -> Result<String, ParseError> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = text.get(i + 1..i + 3).ok_or_else(|| ParseError::BadEncoding(text.to_owned()))?;
                out.push(u8::from_str_radix(hex, 16).map_err(|_| ParseError::BadEncoding(text.to_owned()))?);
                i += 2;
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8(out).map_err(|_| ParseError::BadEncoding(text.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_are_decoded_in_order_and_taken_out() {
        let mut query = Query::parse(Some("container=app&path=%2Ftmp%2Fx+y&process&&container=other")).expect("ok");
        assert_eq!(query.take("container"), Some("app".to_owned()));
        assert_eq!(query.take("container"), None);
        assert_eq!(
            query.params(),
            &[("path".to_owned(), Some("/tmp/x y".to_owned())), ("process".to_owned(), None)][..]
        );
        assert_eq!(query.take("process"), Some(String::new()));
    }

    #[test]
    fn a_parameter_is_taken_out_of_the_query() {
        let take = |q| {
            let mut query = Query::parse(q).expect("valid");
            let value = query.take("container");
            (value, query)
        };
        let pairs = |q| Query::parse(Some(q)).expect("valid");
        assert_eq!(take(None), (None, Query::default()));
        assert_eq!(take(Some("port=8080")), (None, pairs("port=8080")));
        assert_eq!(take(Some("container=app&port=8080")), (Some("app".into()), pairs("port=8080")));
        assert_eq!(take(Some("container=app")), (Some("app".into()), Query::default()));
        assert_eq!(take(Some("containers=x")), (None, pairs("containers=x")));
    }

    #[test]
    fn a_query_past_its_bounds_is_refused_before_it_is_decoded() {
        // Issue 37: 8,000 `file=` pairs were decoded, then scanned once per check.
        let long = format!("check=all&{}", "file=/a&".repeat(7_500));
        assert!(long.len() > 60_000);
        let refused = Query::parse(Some(&long)).expect_err("60 KB");
        assert_eq!(refused, ParseError::QueryTooLarge { what: "bytes", max: MAX_QUERY_BYTES });
        // Short pairs: the count is the bound (an invalid escape in them is never looked at).
        let many = "a&".repeat(MAX_QUERY_PARAMS + 1) + "%zz";
        assert!(many.len() < MAX_QUERY_BYTES);
        assert_eq!(
            Query::parse(Some(&many)),
            Err(ParseError::QueryTooLarge { what: "parameters", max: MAX_QUERY_PARAMS })
        );
        // At the bound, and with empty pairs between, it is read.
        let at_bound = vec!["a=1"; MAX_QUERY_PARAMS].join("&&");
        assert_eq!(Query::parse(Some(&at_bound)).expect("at the bound").params().len(), MAX_QUERY_PARAMS);
        let path = format!("path=/{}", "x".repeat(MAX_QUERY_BYTES - 6));
        assert_eq!(path.len(), MAX_QUERY_BYTES);
        assert!(Query::parse(Some(&path)).is_ok());
    }

    #[test]
    fn bad_encodings_are_refused() {
        for bad in ["a=%zz", "a=%f", "%ff%fe"] {
            assert!(matches!(Query::parse(Some(bad)), Err(ParseError::BadEncoding(_))), "{bad}");
        }
        assert_eq!(Query::parse(None), Ok(Query::default()));
    }
}
