//! [`UsageReader`]: the tokens a response reports, read as the response
//! passes without holding it back: a response header or trailer, the
//! `usage` object of an OpenAI-style server-sent event (`data: {...}`,
//! scanned line by line), or the `usage` object of a JSON body (a copy of
//! at most [`MAX_JSON_COPY`] bytes). A leaf.

use bytes::Bytes;
use http::{HeaderMap, HeaderName};
use serde_json::Value;

/// The longest SSE line kept while it arrives; a longer one is skipped.
const MAX_LINE: usize = 256 * 1024;
/// The most of a JSON response copied to read its `usage`; past it the
/// body's usage counts as unknown.
pub(crate) const MAX_JSON_COPY: usize = 1024 * 1024;

/// How the body is scanned.
#[derive(Debug)]
enum Scan {
    /// `text/event-stream`: the current line, and whether it is being
    /// skipped (too long).
    Sse { line: Vec<u8>, skipping: bool },
    /// `application/json`: the copy so far, `None` once too long.
    Json(Option<Vec<u8>>),
    /// Anything else: only headers and trailers.
    Off,
}

/// The usage a response reports, as far as it has been read.
#[derive(Debug)]
pub(crate) struct UsageReader {
    header: Option<HeaderName>,
    scan: Scan,
    found: Option<u64>,
}

impl UsageReader {
    /// A reader for a response with `headers`, reading the header or
    /// trailer `header` and, when `body`, the body's `usage`.
    pub(crate) fn new(headers: &HeaderMap, header: Option<&HeaderName>, body: bool) -> Self {
        let content_type = headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        let scan = if !body {
            Scan::Off
        } else if content_type.starts_with("text/event-stream") {
            Scan::Sse {
                line: Vec::new(),
                skipping: false,
            }
        } else if content_type.starts_with("application/json") {
            Scan::Json(Some(Vec::new()))
        } else {
            Scan::Off
        };
        let mut reader = Self {
            header: header.cloned(),
            scan,
            found: None,
        };
        reader.headers(headers);
        reader
    }

    /// Reads the usage header from response headers or trailers.
    pub(crate) fn headers(&mut self, headers: &HeaderMap) {
        let Some(name) = &self.header else { return };
        if let Some(n) = headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
        {
            self.found = Some(n);
        }
    }

    /// Reads a chunk of the body.
    pub(crate) fn data(&mut self, chunk: &Bytes) {
        match &mut self.scan {
            Scan::Off => {}
            Scan::Json(copy) => {
                if let Some(buf) = copy {
                    if buf.len() + chunk.len() > MAX_JSON_COPY {
                        *copy = None;
                    } else {
                        buf.extend_from_slice(chunk);
                    }
                }
            }
            Scan::Sse { line, skipping } => {
                let mut rest = &chunk[..];
                while let Some(end) = rest.iter().position(|&b| b == b'\n') {
                    if !*skipping {
                        line.extend_from_slice(&rest[..end]);
                        if let Some(n) = sse_usage(line) {
                            self.found = Some(n);
                        }
                    }
                    line.clear();
                    *skipping = false;
                    rest = &rest[end + 1..];
                }
                if !*skipping {
                    if line.len() + rest.len() > MAX_LINE {
                        line.clear();
                        *skipping = true;
                    } else {
                        line.extend_from_slice(rest);
                    }
                }
            }
        }
    }

    /// The body ended: the usage it reported, if any.
    pub(crate) fn finish(&mut self) -> Option<u64> {
        match &mut self.scan {
            Scan::Json(Some(buf)) => {
                if let Some(n) = serde_json::from_slice::<Value>(buf)
                    .ok()
                    .as_ref()
                    .and_then(usage_of)
                {
                    self.found = Some(n);
                }
            }
            Scan::Sse { line, skipping } if !*skipping => {
                if let Some(n) = sse_usage(line) {
                    self.found = Some(n);
                }
            }
            _ => {}
        }
        self.found
    }

    /// The usage read so far (a disconnect settles with it).
    #[cfg(test)]
    pub(crate) fn so_far(&self) -> Option<u64> {
        self.found
    }
}

/// The usage of one SSE line `data: {... "usage": {...} ...}`, if it has one.
fn sse_usage(line: &[u8]) -> Option<u64> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    let payload = line.strip_prefix(b"data:")?;
    if !contains(payload, b"\"usage\"") {
        return None;
    }
    let value: Value = serde_json::from_slice(payload).ok()?;
    usage_of(&value)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// `usage.total_tokens`, else `prompt_tokens + completion_tokens`.
fn usage_of(value: &Value) -> Option<u64> {
    let usage = value.get("usage")?;
    if let Some(total) = usage.get("total_tokens").and_then(Value::as_u64) {
        return Some(total);
    }
    let prompt = usage.get("prompt_tokens").and_then(Value::as_u64)?;
    let completion = usage
        .get("completion_tokens")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    Some(prompt.saturating_add(completion))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sse() -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/event-stream"),
        );
        headers
    }

    #[test]
    fn the_last_sse_usage_counts_across_chunk_boundaries() {
        let mut reader = UsageReader::new(&sse(), None, true);
        reader.data(&Bytes::from_static(
            b"data: {\"choices\":[]}\n\ndata: {\"usa",
        ));
        assert_eq!(reader.so_far(), None);
        reader.data(&Bytes::from_static(
            b"ge\":{\"prompt_tokens\":7,\"completion_tokens\":5}}\r\n\ndata: [DONE]\n\n",
        ));
        assert_eq!(reader.so_far(), Some(12));
        assert_eq!(reader.finish(), Some(12));
    }

    #[test]
    fn a_usage_inside_content_is_not_an_event() {
        let mut reader = UsageReader::new(&sse(), None, true);
        // The model echoes text that looks like an event: inside a JSON
        // string a newline is escaped, so it is never a line of its own.
        reader.data(&Bytes::from_static(
            b"data: {\"choices\":[{\"delta\":{\"content\":\"\\ndata: {\\\"usage\\\":{\\\"total_tokens\\\":1}}\"}}]}\n\n",
        ));
        assert_eq!(reader.finish(), None);
    }

    #[test]
    fn json_bodies_headers_and_overlong_lines() {
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        let mut reader = UsageReader::new(&headers, None, true);
        reader.data(&Bytes::from_static(b"{\"usage\":{\"total_tokens\":"));
        reader.data(&Bytes::from_static(b"42}}"));
        assert_eq!(reader.finish(), Some(42));

        let name = HeaderName::from_static("x-usage");
        headers.insert(&name, http::HeaderValue::from_static("not a number"));
        let mut reader = UsageReader::new(&headers, Some(&name), false);
        assert_eq!(reader.finish(), None);
        let mut trailers = HeaderMap::new();
        trailers.insert(&name, http::HeaderValue::from_static("9"));
        reader.headers(&trailers);
        assert_eq!(reader.finish(), Some(9));

        let mut reader = UsageReader::new(&sse(), None, true);
        reader.data(&Bytes::from(vec![b'x'; MAX_LINE + 1]));
        reader.data(&Bytes::from_static(
            b"data: {\"usage\":{\"total_tokens\":3}}\n",
        ));
        assert_eq!(
            reader.finish(),
            None,
            "the rest of an overlong line is skipped"
        );
    }
}
