//! The server name of a TLS ClientHello (`docs/reliability.md`, "Network egress"): read from
//! the first TLS record a kernel sends through a CONNECT tunnel, never trusting a length it
//! gives beyond the bytes held.

/// Most bytes of a ClientHello the proxy holds while looking for its server name (one TLS
/// record is at most 16 KiB plus its 5-byte header).
pub const MAX_CLIENT_HELLO: usize = 16 * 1024 + 5;

/// What the first bytes of a tunnel are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// More bytes are needed: at least this many in all.
    Incomplete(usize),
    /// Not a TLS ClientHello (or one cut across records, which browsers and pip never send).
    NotTls,
    /// A ClientHello, with its server name when it has one (lower case).
    ClientHello(Option<String>),
}

/// Reads the ClientHello at the start of `buf`.
pub fn parse(buf: &[u8]) -> Hello {
    if buf.len() < 5 {
        return Hello::Incomplete(5);
    }
    // A handshake record (22), TLS 1.0..1.3 record version (3.x).
    if buf[0] != 22 || buf[1] != 3 {
        return Hello::NotTls;
    }
    let record_len = usize::from(u16::from_be_bytes([buf[3], buf[4]]));
    if record_len == 0 || record_len > 16 * 1024 {
        return Hello::NotTls;
    }
    if buf.len() < 5 + record_len {
        return Hello::Incomplete(5 + record_len);
    }
    match client_hello(&buf[5..5 + record_len]) {
        Some(name) => Hello::ClientHello(name),
        None => Hello::NotTls,
    }
}

/// A cursor over a byte slice: every read checked.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }
    fn u24(&mut self) -> Option<usize> {
        self.take(3)
            .map(|b| usize::from(b[0]) << 16 | usize::from(b[1]) << 8 | usize::from(b[2]))
    }
}

/// The server name of a ClientHello handshake message held whole in `record`: `Some(None)`
/// when it names none, `None` when it is no well-formed ClientHello.
fn client_hello(record: &[u8]) -> Option<Option<String>> {
    let mut r = Reader(record);
    if r.u8()? != 1 {
        return None;
    }
    let len = r.u24()?;
    let mut r = Reader(r.take(len)?);
    r.take(2 + 32)?; // version, random
    let session = r.u8()?;
    r.take(session)?;
    let suites = r.u16()?;
    r.take(suites)?;
    let methods = r.u8()?;
    r.take(methods)?;
    if r.0.is_empty() {
        return Some(None);
    }
    let ext_len = r.u16()?;
    let mut exts = Reader(r.take(ext_len)?);
    let mut name = None;
    while !exts.0.is_empty() {
        let kind = exts.u16()?;
        let len = exts.u16()?;
        let body = exts.take(len)?;
        if kind != 0 {
            continue;
        }
        if name.is_some() {
            return None; // two server_name extensions
        }
        let mut list = Reader(body);
        let list_len = list.u16()?;
        let mut list = Reader(list.take(list_len)?);
        while !list.0.is_empty() {
            let kind = list.u8()?;
            let len = list.u16()?;
            let host = list.take(len)?;
            if kind == 0 {
                if name.is_some() {
                    return None;
                }
                let host = std::str::from_utf8(host).ok()?;
                name = Some(host.to_ascii_lowercase());
            }
        }
    }
    Some(name)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A minimal ClientHello record naming `name` (or none).
    pub(crate) fn hello(name: Option<&str>) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend([7u8; 32]);
        body.push(0); // session id
        body.extend([0, 2, 0x13, 0x01]); // one cipher suite
        body.extend([1, 0]); // null compression
        let mut exts = Vec::new();
        if let Some(name) = name {
            let n = name.as_bytes();
            let mut sni = Vec::new();
            sni.extend(((n.len() + 3) as u16).to_be_bytes());
            sni.push(0);
            sni.extend((n.len() as u16).to_be_bytes());
            sni.extend(n);
            exts.extend([0, 0]);
            exts.extend((sni.len() as u16).to_be_bytes());
            exts.extend(sni);
        }
        exts.extend([0, 0x2b, 0, 3, 2, 3, 4]); // supported_versions
        body.extend((exts.len() as u16).to_be_bytes());
        body.extend(exts);
        let mut hs = vec![1];
        hs.extend(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend(body);
        let mut rec = vec![22, 3, 1];
        rec.extend((hs.len() as u16).to_be_bytes());
        rec.extend(hs);
        rec
    }

    #[test]
    fn the_server_name_is_read_and_partial_input_asks_for_more() {
        let rec = hello(Some("PyPI.org"));
        assert_eq!(parse(&rec), Hello::ClientHello(Some("pypi.org".into())));
        assert_eq!(parse(&rec[..3]), Hello::Incomplete(5));
        assert_eq!(parse(&rec[..10]), Hello::Incomplete(rec.len()));
        assert_eq!(parse(&hello(None)), Hello::ClientHello(None));
    }

    #[test]
    fn anything_else_is_not_tls_and_lengths_are_never_trusted() {
        assert_eq!(parse(b"GET / HTTP/1.1\r\n"), Hello::NotTls);
        let mut rec = hello(Some("a.com"));
        // A server-name length past the extension.
        let at = rec.len() - 7 - 5 - 2;
        rec[at] = 0xff;
        assert_eq!(parse(&rec), Hello::NotTls);
        for cut in 0..hello(Some("a.com")).len() {
            let mut r = hello(Some("a.com"));
            r[cut] ^= 0xff;
            let _ = parse(&r); // never panics
        }
    }
}
