//! The PostgreSQL wire protocol as far as the proxy speaks it: the startup
//! packets, the authentication messages of both sides, and the few
//! messages it writes or rewrites itself. Everything read here comes from
//! a client or a compute and is checked: a bad length or field is an
//! error, never a panic or an unbounded allocation.

use tokio::io::{AsyncRead, AsyncReadExt};

use crate::limits::{MAX_MESSAGE, MAX_STARTUP_PACKET, MAX_STARTUP_PARAMS};

/// Startup codes (the packet's second word).
pub const SSL_REQUEST: u32 = 80_877_103;
pub const GSSENC_REQUEST: u32 = 80_877_104;
pub const CANCEL_REQUEST: u32 = 80_877_102;
/// Protocol 3.0; a minor version above 0 is negotiated down to it.
pub const PROTOCOL_3_0: u32 = 3 << 16;

/// Why bytes could not be read as the protocol.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("connection: {0}")]
    Io(#[from] std::io::Error),
    #[error("malformed {what}: {why}")]
    Malformed { what: &'static str, why: String },
}

fn malformed(what: &'static str, why: impl Into<String>) -> WireError {
    WireError::Malformed { what, why: why.into() }
}

/// The first packet of a connection.
#[derive(Debug, PartialEq)]
pub enum Startup {
    /// The client asks for TLS.
    Ssl,
    /// The client asks for GSSAPI encryption (refused: it then goes on).
    GssEnc,
    /// Cancel the query of the session with this key.
    Cancel { pid: u32, key: Vec<u8> },
    /// A session: protocol 3.`minor`, its parameters in order.
    Session { minor: u16, params: Vec<(String, String)> },
}

/// Reads one startup packet: a length, a code, the body.
pub async fn read_startup<R: AsyncRead + Unpin>(r: &mut R) -> Result<Startup, WireError> {
    let len = r.read_u32().await? as usize;
    if !(8..=MAX_STARTUP_PACKET).contains(&len) {
        return Err(malformed("startup packet", format!("a length of {len} bytes")));
    }
    let mut body = vec![0; len - 4];
    r.read_exact(&mut body).await?;
    parse_startup(&body)
}

/// A startup packet's code and body (after the length word).
pub fn parse_startup(body: &[u8]) -> Result<Startup, WireError> {
    let code = u32::from_be_bytes(
        body.get(..4)
            .and_then(|c| c.try_into().ok())
            .ok_or_else(|| malformed("startup packet", "shorter than its code"))?,
    );
    let rest = &body[4..];
    match code {
        SSL_REQUEST | GSSENC_REQUEST if !rest.is_empty() => Err(malformed("startup packet", "bytes after a request")),
        SSL_REQUEST => Ok(Startup::Ssl),
        GSSENC_REQUEST => Ok(Startup::GssEnc),
        CANCEL_REQUEST => {
            // 4 bytes of key in protocol 3.0, up to 256 in 3.2.
            if rest.len() < 8 || rest.len() > 4 + 256 {
                return Err(malformed("cancel request", format!("{} bytes", rest.len())));
            }
            let pid = u32::from_be_bytes(rest[..4].try_into().expect("4 bytes"));
            Ok(Startup::Cancel { pid, key: rest[4..].to_vec() })
        }
        c if c >> 16 == 3 => Ok(Startup::Session { minor: (c & 0xffff) as u16, params: parse_params(rest)? }),
        c => Err(malformed("startup packet", format!("protocol {}.{} (this proxy speaks 3)", c >> 16, c & 0xffff))),
    }
}

/// `name\0value\0`… ending in one more `\0`.
fn parse_params(mut rest: &[u8]) -> Result<Vec<(String, String)>, WireError> {
    let mut params = Vec::new();
    loop {
        let (name, after) = cstring(rest, "startup parameter")?;
        if name.is_empty() {
            if !after.is_empty() {
                return Err(malformed("startup packet", "bytes after its last parameter"));
            }
            return Ok(params);
        }
        let (value, after) = cstring(after, "startup parameter")?;
        if params.len() == MAX_STARTUP_PARAMS {
            return Err(malformed("startup packet", format!("more than {MAX_STARTUP_PARAMS} parameters")));
        }
        if params.iter().any(|(n, _)| n == name) {
            return Err(malformed("startup packet", format!("parameter {name:?} twice")));
        }
        params.push((name.to_string(), value.to_string()));
        rest = after;
    }
}

/// A NUL-terminated UTF-8 string at the start of `bytes`, and what follows.
fn cstring<'a>(bytes: &'a [u8], what: &'static str) -> Result<(&'a str, &'a [u8]), WireError> {
    let end = bytes.iter().position(|b| *b == 0).ok_or_else(|| malformed(what, "no terminating NUL"))?;
    let text = std::str::from_utf8(&bytes[..end]).map_err(|_| malformed(what, "not UTF-8"))?;
    Ok((text, &bytes[end + 1..]))
}

/// One regular message: its type byte and body, at most [`MAX_MESSAGE`].
pub async fn read_message<R: AsyncRead + Unpin>(r: &mut R) -> Result<(u8, Vec<u8>), WireError> {
    let tag = r.read_u8().await?;
    let len = r.read_u32().await? as usize;
    if !(4..=MAX_MESSAGE).contains(&len) {
        return Err(malformed("message", format!("type {:?} of {len} bytes", char::from(tag))));
    }
    let mut body = vec![0; len - 4];
    r.read_exact(&mut body).await?;
    Ok((tag, body))
}

/// A message: type byte, length, body.
pub fn message(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + body.len());
    out.push(tag);
    out.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
    out.extend_from_slice(body);
    out
}

/// An `ErrorResponse` of severity FATAL with SQLSTATE `code`.
pub fn error(code: &str, text: &str) -> Vec<u8> {
    let mut body = Vec::new();
    for (field, value) in [(b'S', "FATAL"), (b'V', "FATAL"), (b'C', code), (b'M', text)] {
        body.push(field);
        body.extend_from_slice(value.as_bytes());
        body.push(0);
    }
    body.push(0);
    message(b'E', &body)
}

/// An `Authentication*` message: its code and data.
fn authentication(code: u32, data: &[u8]) -> Vec<u8> {
    let mut body = code.to_be_bytes().to_vec();
    body.extend_from_slice(data);
    message(b'R', &body)
}

/// `AuthenticationSASL` offering one mechanism.
pub fn auth_sasl(mechanism: &str) -> Vec<u8> {
    let mut data = mechanism.as_bytes().to_vec();
    data.extend_from_slice(b"\0\0");
    authentication(10, &data)
}

/// `AuthenticationSASLContinue`.
pub fn auth_sasl_continue(data: &[u8]) -> Vec<u8> {
    authentication(11, data)
}

/// `AuthenticationSASLFinal`.
pub fn auth_sasl_final(data: &[u8]) -> Vec<u8> {
    authentication(12, data)
}

/// `AuthenticationOk`.
pub fn auth_ok() -> Vec<u8> {
    authentication(0, &[])
}

/// `BackendKeyData` of protocol 3.0.
pub fn backend_key_data(pid: u32, key: &[u8]) -> Vec<u8> {
    let mut body = pid.to_be_bytes().to_vec();
    body.extend_from_slice(key);
    message(b'K', &body)
}

/// `NegotiateProtocolVersion`: 3.0, and the `_pq_.` options not taken.
pub fn negotiate_protocol(unrecognized: &[&str]) -> Vec<u8> {
    let mut body = 0u32.to_be_bytes().to_vec();
    body.extend_from_slice(&(unrecognized.len() as u32).to_be_bytes());
    for option in unrecognized {
        body.extend_from_slice(option.as_bytes());
        body.push(0);
    }
    message(b'v', &body)
}

/// A 3.0 `StartupMessage` with `params`.
pub fn startup_message(params: &[(String, String)]) -> Vec<u8> {
    let mut body = PROTOCOL_3_0.to_be_bytes().to_vec();
    for (name, value) in params {
        for s in [name, value] {
            body.extend_from_slice(s.as_bytes());
            body.push(0);
        }
    }
    body.push(0);
    let mut out = (body.len() as u32 + 4).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    out
}

/// A request without a body (`SSLRequest`).
pub fn request(code: u32) -> [u8; 8] {
    let mut out = [0; 8];
    out[..4].copy_from_slice(&8u32.to_be_bytes());
    out[4..].copy_from_slice(&code.to_be_bytes());
    out
}

/// A `CancelRequest`.
pub fn cancel_request(pid: u32, key: &[u8]) -> Vec<u8> {
    let mut out = ((12 + key.len()) as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&CANCEL_REQUEST.to_be_bytes());
    out.extend_from_slice(&pid.to_be_bytes());
    out.extend_from_slice(key);
    out
}

/// `SASLInitialResponse`.
pub fn sasl_initial_response(mechanism: &str, data: &[u8]) -> Vec<u8> {
    let mut body = mechanism.as_bytes().to_vec();
    body.push(0);
    body.extend_from_slice(&(data.len() as u32).to_be_bytes());
    body.extend_from_slice(data);
    message(b'p', &body)
}

/// `SASLResponse`.
pub fn sasl_response(data: &[u8]) -> Vec<u8> {
    message(b'p', data)
}

/// A `SASLInitialResponse`'s mechanism and data.
pub fn parse_sasl_initial(body: &[u8]) -> Result<(&str, &[u8]), WireError> {
    let (mechanism, rest) = cstring(body, "SASL initial response")?;
    let len = rest.get(..4).map(|l| i32::from_be_bytes(l.try_into().expect("4 bytes")));
    match len {
        Some(n) if n >= 0 && n as usize == rest.len() - 4 => Ok((mechanism, &rest[4..])),
        _ => Err(malformed("SASL initial response", "its data's length")),
    }
}

/// What an `Authentication*` message from a compute asks.
#[derive(Debug, PartialEq)]
pub enum Auth<'a> {
    Ok,
    Sasl(Vec<&'a str>),
    SaslContinue(&'a [u8]),
    SaslFinal(&'a [u8]),
    /// Any other method (cleartext, MD5, GSS…), which the proxy cannot answer.
    Other(u32),
}

/// An `Authentication*` message's body.
pub fn parse_auth(body: &[u8]) -> Result<Auth<'_>, WireError> {
    let code = body.get(..4).map(|c| u32::from_be_bytes(c.try_into().expect("4 bytes")));
    let data = body.get(4..).unwrap_or_default();
    Ok(match code {
        None => return Err(malformed("authentication request", "shorter than its code")),
        Some(0) => Auth::Ok,
        Some(10) => {
            let mut mechanisms = Vec::new();
            let mut rest = data;
            loop {
                let (m, after) = cstring(rest, "SASL mechanisms")?;
                if m.is_empty() {
                    break;
                }
                mechanisms.push(m);
                rest = after;
            }
            Auth::Sasl(mechanisms)
        }
        Some(11) => Auth::SaslContinue(data),
        Some(12) => Auth::SaslFinal(data),
        Some(other) => Auth::Other(other),
    })
}

/// An `ErrorResponse`'s SQLSTATE and message, for logs and for errors
/// passed on.
pub fn parse_error(body: &[u8]) -> (String, String) {
    let (mut code, mut text) = (String::new(), String::new());
    let mut rest = body;
    while let Some((&field, after)) = rest.split_first() {
        if field == 0 {
            break;
        }
        let Ok((value, after)) = cstring(after, "error field") else { break };
        match field {
            b'C' => code = value.to_string(),
            b'M' => text = value.to_string(),
            _ => {}
        }
        rest = after;
    }
    (code, text)
}

/// Fuzzing entry: every decoder here on arbitrary bytes, which must
/// return an error and never panic.
pub fn fuzz_messages(data: &[u8]) {
    let _ = parse_startup(data);
    let _ = parse_sasl_initial(data);
    let _ = parse_auth(data);
    let _ = parse_error(data);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_startup_packet_round_trips() {
        let params = vec![("user".to_string(), "app".to_string()), ("database".into(), "postgres".into())];
        let bytes = startup_message(&params);
        assert_eq!(u32::from_be_bytes(bytes[..4].try_into().unwrap()) as usize, bytes.len());
        assert_eq!(parse_startup(&bytes[4..]).unwrap(), Startup::Session { minor: 0, params });
        assert_eq!(parse_startup(&request(SSL_REQUEST)[4..]).unwrap(), Startup::Ssl);
        let cancel = cancel_request(7, &[1, 2, 3, 4]);
        assert_eq!(u32::from_be_bytes(cancel[..4].try_into().unwrap()) as usize, cancel.len());
        assert_eq!(request(SSL_REQUEST).len(), 8);
        assert_eq!(parse_startup(&cancel[4..]).unwrap(), Startup::Cancel { pid: 7, key: vec![1, 2, 3, 4] });
    }

    #[test]
    fn bad_startup_packets_are_errors() {
        for bad in [
            &b""[..],
            b"\x00\x03\x00\x00user\0app",              // no NUL at the end
            b"\x00\x03\x00\x00user\0app\0user\0b\0\0", // twice
            b"\x00\x03\x00\x00user\0app\0\0x",         // after the end
            b"\x00\x02\x00\x00\0",                     // protocol 2
            b"\x04\xd2\x16\x2f\x01",                   // an SSL request with a body
            b"\x04\xd2\x16\x2e\0\0\0\x01",             // a cancel without a key
            b"\x00\x03\x00\x00us\xffer\0a\0\0",        // not UTF-8
        ] {
            assert!(parse_startup(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn authentication_messages_parse() {
        let sasl = auth_sasl("SCRAM-SHA-256");
        assert_eq!(parse_auth(&sasl[5..]).unwrap(), Auth::Sasl(vec!["SCRAM-SHA-256"]));
        assert_eq!(parse_auth(&auth_ok()[5..]).unwrap(), Auth::Ok);
        assert_eq!(parse_auth(&auth_sasl_final(b"v=x")[5..]).unwrap(), Auth::SaslFinal(b"v=x"));
        assert_eq!(parse_auth(&[0, 0, 0, 5, 1, 2, 3, 4]).unwrap(), Auth::Other(5));
        let initial = sasl_initial_response("SCRAM-SHA-256", b"n,,n=,r=abc");
        assert_eq!(parse_sasl_initial(&initial[5..]).unwrap(), ("SCRAM-SHA-256", &b"n,,n=,r=abc"[..]));
        assert!(parse_sasl_initial(b"SCRAM-SHA-256\0\0\0\0\x09abc").is_err());
        let e = error("28P01", "password authentication failed");
        assert_eq!(parse_error(&e[5..]), ("28P01".to_string(), "password authentication failed".to_string()));
    }

    #[tokio::test]
    async fn oversized_messages_are_refused_before_reading_them() {
        let mut huge: &[u8] = &[b'D', 0x7f, 0xff, 0xff, 0xff];
        assert!(matches!(read_message(&mut huge).await, Err(WireError::Malformed { .. })));
        let mut huge: &[u8] = &[0x7f, 0xff, 0xff, 0xff, 0, 3, 0, 0];
        assert!(matches!(read_startup(&mut huge).await, Err(WireError::Malformed { .. })));
    }
}
