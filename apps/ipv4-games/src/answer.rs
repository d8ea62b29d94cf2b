//! How a successful claim is answered: an HTML page (the default), a text line, or a 1×1 GIF
//! for an `<img>` beacon, chosen by the Accept header.

use std::net::Ipv4Addr;

use tern_server::{Body, Response};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerKind {
    Html,
    Text,
    Gif,
}

/// An image request (`image/…` listed before any `text/html`) gets the GIF; a request that
/// names text/plain and not text/html gets the text line; everything else the page.
pub fn choose(accept: Option<&[u8]>) -> AnswerKind {
    let Some(a) = accept else {
        return AnswerKind::Html;
    };
    let find = |needle: &[u8]| a.windows(needle.len()).position(|w| w == needle);
    let html = find(b"text/html");
    match (find(b"image/"), html) {
        (Some(_), None) => return AnswerKind::Gif,
        (Some(i), Some(h)) if i < h => return AnswerKind::Gif,
        _ => {}
    }
    if html.is_none() && find(b"text/plain").is_some() {
        AnswerKind::Text
    } else {
        AnswerKind::Html
    }
}

/// The smallest transparent 1×1 GIF.
pub const GIF_1X1: &[u8] = &[
    0x47, 0x49, 0x46, 0x38, 0x39, 0x61, 0x01, 0x00, 0x01, 0x00, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00,
    0xff, 0xff, 0xff, 0x21, 0xf9, 0x04, 0x01, 0x00, 0x00, 0x00, 0x00, 0x2c, 0x00, 0x00, 0x00, 0x00,
    0x01, 0x00, 0x01, 0x00, 0x00, 0x02, 0x02, 0x44, 0x01, 0x00, 0x3b,
];

pub fn claimed(kind: AnswerKind, ip: u32, nick: &str) -> Response {
    let r = Response::new(200).with_header("Cache-Control", "no-store");
    match kind {
        AnswerKind::Gif => r
            .with_header("Content-Type", "image/gif")
            .with_body(Body::Static(GIF_1X1)),
        AnswerKind::Text => {
            // Written piece by piece rather than with format!: the answer is built for every
            // claim, and Ipv4Addr's Display (padding support, one write per octet) was a
            // tenth of a claim's own CPU in the profile.
            let mut line = Vec::with_capacity(15 + 19 + nick.len() + 1);
            push_ip(&mut line, ip);
            line.extend_from_slice(b" is now claimed by ");
            line.extend_from_slice(nick.as_bytes());
            line.push(b'\n');
            r.with_header("Content-Type", "text/plain; charset=utf-8")
                .with_body(Body::Owned(line))
        }
        AnswerKind::Html => {
            let ip = Ipv4Addr::from(ip);
            // Names are limited to a charset without <>&"' so they need no escaping; escape
            // anyway in case the rules ever widen.
            let nick = html_escape(nick);
            let page = format!(
                "<!doctype html><html lang=\"en\"><meta charset=\"utf-8\">\
                 <meta name=\"viewport\" content=\"width=device-width,initial-scale=1\">\
                 <title>{ip} claimed</title><link rel=\"stylesheet\" href=\"/style.css\">\
                 <main><h1>{ip} is now claimed by {nick}</h1>\
                 <p><a href=\"/\">Back to the board</a> · \
                 <a href=\"/user.html?name={nick}\">{nick}'s holdings</a></p></main></html>\n"
            );
            r.with_header("Content-Type", "text/html; charset=utf-8")
                .with_body(Body::Owned(page.into_bytes()))
        }
    }
}

/// `ip` in dotted-quad form, as `Ipv4Addr`'s Display writes it.
fn push_ip(out: &mut Vec<u8>, ip: u32) {
    for (i, octet) in ip.to_be_bytes().into_iter().enumerate() {
        if i > 0 {
            out.push(b'.');
        }
        if octet >= 100 {
            out.push(b'0' + octet / 100);
        }
        if octet >= 10 {
            out.push(b'0' + octet / 10 % 10);
        }
        out.push(b'0' + octet % 10);
    }
}

fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_negotiation() {
        assert_eq!(choose(None), AnswerKind::Html);
        assert_eq!(choose(Some(b"*/*")), AnswerKind::Html);
        assert_eq!(choose(Some(b"text/plain")), AnswerKind::Text);
        assert_eq!(
            choose(Some(
                b"text/html,application/xhtml+xml,image/webp,*/*;q=0.8"
            )),
            AnswerKind::Html
        );
        assert_eq!(
            choose(Some(b"image/avif,image/webp,image/apng,image/*,*/*;q=0.8")),
            AnswerKind::Gif
        );
        assert_eq!(choose(Some(b"text/plain, text/html")), AnswerKind::Html);
    }

    #[test]
    fn gif_is_a_gif() {
        assert!(GIF_1X1.starts_with(b"GIF89a"));
        assert_eq!(GIF_1X1.last(), Some(&0x3b));
    }

    #[test]
    fn addresses_are_written_as_ipv4addr_displays_them() {
        for ip in [
            0u32,
            1,
            9,
            10,
            99,
            100,
            255,
            0x0a00_0001,
            0xc0a8_6401,
            0x6464_6464,
            u32::MAX,
        ]
        .into_iter()
        .chain((0..100_000u32).map(|i| i.wrapping_mul(0x9E37_79B1)))
        {
            let mut out = Vec::new();
            push_ip(&mut out, ip);
            assert_eq!(out, Ipv4Addr::from(ip).to_string().as_bytes(), "{ip:#x}");
        }
        let Body::Owned(line) = claimed(AnswerKind::Text, 0xc000_0201, "bob").body else {
            panic!("the text answer owns its body");
        };
        assert_eq!(line, b"192.0.2.1 is now claimed by bob\n");
    }

    #[test]
    fn html_is_escaped() {
        assert_eq!(html_escape("<a&\"'>"), "&lt;a&amp;&quot;&#39;&gt;");
    }
}
