/// Length of `Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n`.
pub const DATE_LINE_LEN: usize = 37;

/// Formats the complete `Date` header line for a Unix time. Callers cache the result and
/// re-format once per second (the codec itself never reads a clock).
pub fn format_date_line(unix_secs: u64) -> [u8; DATE_LINE_LEN] {
    let when = std::time::UNIX_EPOCH + std::time::Duration::from_secs(unix_secs);
    let text = httpdate::fmt_http_date(when);
    let mut line = [0u8; DATE_LINE_LEN];
    line[..6].copy_from_slice(b"Date: ");
    line[6..35].copy_from_slice(text.as_bytes());
    line[35..].copy_from_slice(b"\r\n");
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_rfc_7231_date() {
        assert_eq!(
            &format_date_line(784111777)[..],
            b"Date: Sun, 06 Nov 1994 08:49:37 GMT\r\n"
        );
    }
}
