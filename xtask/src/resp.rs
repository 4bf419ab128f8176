//! A minimal, blocking RESP2 client: just enough to PING a server, read
//! `CLUSTER INFO` and build a Cluster by hand.
//!
//! xtask stays std-only so that `cargo xtask` compiles in seconds; the real
//! client code of the project lives in `portcullis-redis`.

use std::fmt;
use std::io::{self, BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// Longest bulk string or array accepted from a server (a guard against a
/// corrupt length turning into a huge allocation).
const MAX_LEN: usize = 64 * 1024 * 1024;

/// One RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reply {
    /// `+OK`-style status line.
    Status(String),
    /// `-ERR ...` error line (the server's message, without the `-`).
    Error(String),
    /// `:42` integer.
    Integer(i64),
    /// `$n` bulk string; `None` for the null bulk string `$-1`.
    Bulk(Option<Vec<u8>>),
    /// `*n` array; `None` for the null array `*-1`.
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// The reply as text when it is a status or a (non-null) bulk string.
    pub(crate) fn text(&self) -> Option<String> {
        match self {
            Reply::Status(s) => Some(s.clone()),
            Reply::Bulk(Some(bytes)) => Some(String::from_utf8_lossy(bytes).into_owned()),
            _ => None,
        }
    }
}

impl fmt::Display for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reply::Status(s) => write!(f, "{s}"),
            Reply::Error(e) => write!(f, "(error) {e}"),
            Reply::Integer(i) => write!(f, "(integer) {i}"),
            Reply::Bulk(None) | Reply::Array(None) => write!(f, "(nil)"),
            Reply::Bulk(Some(bytes)) => write!(f, "{}", String::from_utf8_lossy(bytes)),
            Reply::Array(Some(items)) => {
                write!(f, "[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    write!(f, "{item}")?;
                }
                write!(f, "]")
            }
        }
    }
}

/// A blocking connection to one server on 127.0.0.1.
#[derive(Debug)]
pub(crate) struct Connection {
    /// The socket, buffered for reading replies line by line.
    stream: BufReader<TcpStream>,
}

impl Connection {
    /// Connects to `127.0.0.1:<port>`, with `timeout` for the connect and
    /// for every later read and write.
    pub(crate) fn open(port: u16, timeout: Duration) -> io::Result<Self> {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let stream = TcpStream::connect_timeout(&addr, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        stream.set_nodelay(true)?;
        Ok(Self {
            stream: BufReader::new(stream),
        })
    }

    /// Sends one command and reads its reply. A Redis error reply is
    /// returned as [`Reply::Error`], not as an `Err`.
    pub(crate) fn command<S: AsRef<str>>(&mut self, args: &[S]) -> io::Result<Reply> {
        let request = encode(args);
        self.stream.get_mut().write_all(&request)?;
        read_reply(&mut self.stream)
    }

    /// Sends one command and returns its reply as text, turning error
    /// replies and non-text replies into an `Err` that names the command.
    pub(crate) fn text<S: AsRef<str>>(&mut self, args: &[S]) -> io::Result<String> {
        let reply = self.command(args)?;
        reply.text().ok_or_else(|| {
            let name: Vec<&str> = args.iter().take(2).map(AsRef::as_ref).collect();
            io::Error::other(format!("`{}` replied {reply}", name.join(" ")))
        })
    }
}

/// Encodes a command as a RESP array of bulk strings.
pub(crate) fn encode<S: AsRef<str>>(args: &[S]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        let arg = arg.as_ref();
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Reads one reply (recursively for arrays).
pub(crate) fn read_reply(reader: &mut impl BufRead) -> io::Result<Reply> {
    let line = read_line(reader)?;
    let (kind, rest) = line.split_at(1);
    match kind {
        "+" => Ok(Reply::Status(rest.to_owned())),
        "-" => Ok(Reply::Error(rest.to_owned())),
        ":" => parse_int(rest).map(Reply::Integer),
        "$" => match parse_len(rest)? {
            None => Ok(Reply::Bulk(None)),
            Some(len) => {
                let mut body = vec![0; len + 2];
                reader.read_exact(&mut body)?;
                if !body.ends_with(b"\r\n") {
                    return Err(protocol("bulk string not terminated by CRLF"));
                }
                body.truncate(len);
                Ok(Reply::Bulk(Some(body)))
            }
        },
        "*" => match parse_len(rest)? {
            None => Ok(Reply::Array(None)),
            Some(len) => {
                let mut items = Vec::with_capacity(len.min(1024));
                for _ in 0..len {
                    items.push(read_reply(reader)?);
                }
                Ok(Reply::Array(Some(items)))
            }
        },
        other => Err(protocol(&format!("unexpected reply type byte {other:?}"))),
    }
}

/// Reads one CRLF-terminated line (without the CRLF); never empty.
fn read_line(reader: &mut impl BufRead) -> io::Result<String> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the server closed the connection",
        ));
    }
    let Some(line) = line.strip_suffix("\r\n") else {
        return Err(protocol("reply line not terminated by CRLF"));
    };
    if line.is_empty() {
        return Err(protocol("empty reply line"));
    }
    Ok(line.to_owned())
}

/// Parses an integer reply.
fn parse_int(text: &str) -> io::Result<i64> {
    text.parse()
        .map_err(|_| protocol(&format!("bad integer {text:?}")))
}

/// Parses a bulk or array length; `-1` means null.
fn parse_len(text: &str) -> io::Result<Option<usize>> {
    match parse_int(text)? {
        -1 => Ok(None),
        n => usize::try_from(n)
            .ok()
            .filter(|&n| n <= MAX_LEN)
            .map(Some)
            .ok_or_else(|| protocol(&format!("bad length {n}"))),
    }
}

/// An `InvalidData` error for a malformed reply.
fn protocol(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("RESP protocol error: {what}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    fn parse(bytes: &[u8]) -> io::Result<Reply> {
        read_reply(&mut Cursor::new(bytes))
    }

    #[test]
    fn encodes_commands_as_bulk_string_arrays() {
        assert_eq!(encode(&["PING"]), b"*1\r\n$4\r\nPING\r\n");
        assert_eq!(
            encode(&["SET", "k", ""]),
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$0\r\n\r\n"
        );
    }

    #[test]
    fn parses_scalar_replies() {
        assert_eq!(parse(b"+PONG\r\n").unwrap(), Reply::Status("PONG".into()));
        assert_eq!(
            parse(b"-ERR unknown\r\n").unwrap(),
            Reply::Error("ERR unknown".into())
        );
        assert_eq!(parse(b":-12\r\n").unwrap(), Reply::Integer(-12));
        assert_eq!(parse(b"$-1\r\n").unwrap(), Reply::Bulk(None));
        assert_eq!(
            parse(b"$8\r\na\r\nb:c d\r\n").unwrap(),
            Reply::Bulk(Some(b"a\r\nb:c d".to_vec()))
        );
    }

    #[test]
    fn parses_nested_arrays() {
        let reply = parse(b"*2\r\n$6\r\nmaster\r\n*1\r\n:7\r\n").unwrap();
        assert_eq!(
            reply,
            Reply::Array(Some(vec![
                Reply::Bulk(Some(b"master".to_vec())),
                Reply::Array(Some(vec![Reply::Integer(7)])),
            ]))
        );
        assert_eq!(reply.to_string(), "[master, [(integer) 7]]");
        assert_eq!(parse(b"*-1\r\n").unwrap(), Reply::Array(None));
    }

    #[test]
    fn rejects_malformed_replies() {
        assert!(parse(b"").is_err(), "eof");
        assert!(parse(b"+OK\n").is_err(), "missing CR");
        assert!(parse(b"?x\r\n").is_err(), "unknown type");
        assert!(parse(b"$3\r\nab\r\n").is_err(), "short bulk");
        assert!(parse(b"$2\r\nabcd").is_err(), "bulk without CRLF");
        assert!(parse(b"$-2\r\n").is_err(), "negative length");
        assert!(parse(b":x\r\n").is_err(), "bad integer");
        assert!(parse(b"*1\r\n").is_err(), "truncated array");
    }

    #[test]
    fn text_accepts_status_and_bulk_only() {
        assert_eq!(Reply::Status("OK".into()).text().as_deref(), Some("OK"));
        assert_eq!(
            Reply::Bulk(Some(b"x".to_vec())).text().as_deref(),
            Some("x")
        );
        assert_eq!(Reply::Integer(1).text(), None);
        assert_eq!(Reply::Error("ERR".into()).text(), None);
    }
}
