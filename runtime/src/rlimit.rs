use std::io;

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (a server's connection count is bounded by
/// it) and returns `(before, after)`.
pub fn raise_fd_limit() -> io::Result<(u64, u64)> {
    let (soft, hard) = rlimit::Resource::NOFILE.get()?;
    if soft < hard {
        rlimit::Resource::NOFILE.set(hard, hard)?;
    }
    let (after, _) = rlimit::Resource::NOFILE.get()?;
    Ok((soft, after))
}

#[cfg(test)]
mod tests {
    #[test]
    fn soft_limit_reaches_hard_limit() {
        let (_, after) = super::raise_fd_limit().unwrap();
        let (_, hard) = rlimit::Resource::NOFILE.get().unwrap();
        assert_eq!(after, hard);
    }
}
