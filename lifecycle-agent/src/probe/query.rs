//! The query string of a probe request, decoded once: `a=1&b&c=x%20y` into ordered pairs. The
//! pod listener, the node listener and the agent's `/api/v1/probe` route all read requests
//! through it, and pass typed values on from there.

use super::check::ParseError;

/// Decoded `key[=value]` pairs in request order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Query {
    params: Vec<(String, Option<String>)>,
}

impl Query {
    /// Decodes a raw query (without the `?`); `+` is a space, `%XX` a byte, the result UTF-8.
    pub fn parse(raw: Option<&str>) -> Result<Self, ParseError> {
        let params = raw
            .unwrap_or("")
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
    fn bad_encodings_are_refused() {
        for bad in ["a=%zz", "a=%f", "%ff%fe"] {
            assert!(matches!(Query::parse(Some(bad)), Err(ParseError::BadEncoding(_))), "{bad}");
        }
        assert_eq!(Query::parse(None), Ok(Query::default()));
    }
}
