//! The timestamp of an access-log line, formatted once a second.

use super::line::AccessLogFormat;

/// The timestamp of the current second, formatted when the second changes.
pub(super) struct Stamp {
    format: AccessLogFormat,
    secs: u64,
    text: [u8; 26],
    len: usize,
}

impl Stamp {
    pub fn new(format: AccessLogFormat) -> Stamp {
        let mut s = Stamp {
            format,
            secs: 0,
            text: [0; 26],
            len: 0,
        };
        s.format_secs(0);
        s
    }

    #[inline]
    pub fn refresh(&mut self, secs: u64) {
        if secs != self.secs {
            self.format_secs(secs);
        }
    }

    pub fn text(&self) -> &[u8] {
        &self.text[..self.len]
    }

    /// `23/Nov/2026:21:12:08 +0000` (combined, in UTC) or `2026-11-23T21:12:08Z` (JSON).
    #[cold]
    fn format_secs(&mut self, secs: u64) {
        const MONTHS: [&[u8; 3]; 12] = [
            b"Jan", b"Feb", b"Mar", b"Apr", b"May", b"Jun", b"Jul", b"Aug", b"Sep", b"Oct", b"Nov",
            b"Dec",
        ];
        self.secs = secs;
        let (y, m, d) = civil_from_days((secs / 86_400) as i64);
        let t = secs % 86_400;
        let (hh, mm, ss) = ((t / 3600) as u32, (t / 60 % 60) as u32, (t % 60) as u32);
        let mut out = Vec::with_capacity(26);
        let two = |out: &mut Vec<u8>, v: u32| {
            out.push(b'0' + (v / 10) as u8);
            out.push(b'0' + (v % 10) as u8);
        };
        let year = |out: &mut Vec<u8>| {
            for div in [1000, 100, 10, 1] {
                out.push(b'0' + (y / div % 10) as u8);
            }
        };
        match self.format {
            AccessLogFormat::Combined => {
                two(&mut out, d);
                out.push(b'/');
                out.extend_from_slice(MONTHS[m as usize - 1]);
                out.push(b'/');
                year(&mut out);
                out.push(b':');
                two(&mut out, hh);
                out.push(b':');
                two(&mut out, mm);
                out.push(b':');
                two(&mut out, ss);
                out.extend_from_slice(b" +0000");
            }
            AccessLogFormat::Json => {
                year(&mut out);
                out.push(b'-');
                two(&mut out, m);
                out.push(b'-');
                two(&mut out, d);
                out.push(b'T');
                two(&mut out, hh);
                out.push(b':');
                two(&mut out, mm);
                out.push(b':');
                two(&mut out, ss);
                out.push(b'Z');
            }
        }
        self.len = out.len();
        self.text[..out.len()].copy_from_slice(&out);
    }
}

/// Year, month (1-12) and day (1-31) of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn timestamps_match_the_calendar() {
        for secs in [0, 784_111_777, 951_782_400, 1_709_164_800, 4_102_444_799] {
            let mut s = Stamp::new(AccessLogFormat::Json);
            s.refresh(secs);
            let when = std::time::UNIX_EPOCH + Duration::from_secs(secs);
            // httpdate gives `Sun, 06 Nov 1994 08:49:37 GMT`.
            let http = httpdate::fmt_http_date(when);
            let parts: Vec<&str> = http.split([' ', ':']).collect();
            let month = [
                "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
            ]
            .iter()
            .position(|m| *m == parts[2])
            .unwrap()
                + 1;
            let want = format!(
                "{}-{month:02}-{}T{}:{}:{}Z",
                parts[3], parts[1], parts[4], parts[5], parts[6]
            );
            assert_eq!(std::str::from_utf8(s.text()).unwrap(), want);
            let mut c = Stamp::new(AccessLogFormat::Combined);
            c.refresh(secs);
            let want = format!(
                "{}/{}/{}:{}:{}:{} +0000",
                parts[1], parts[2], parts[3], parts[4], parts[5], parts[6]
            );
            assert_eq!(std::str::from_utf8(c.text()).unwrap(), want);
        }
    }
}
