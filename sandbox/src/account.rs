//! The unprivileged account a server started as root drops to (`--user`, `--group`).

use std::fmt;
use std::path::Path;

use nix::fcntl::AtFlags;
use nix::unistd::{Gid, Group, Uid, User};

/// A user and group, looked up at start-up (so a typo fails before anything is bound).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub user: String,
    pub uid: u32,
    pub gid: u32,
}

impl Account {
    /// `user`'s account, in `group` if given, else in the user's primary group.
    pub fn lookup(user: &str, group: Option<&str>) -> Result<Account, String> {
        let found = User::from_name(user)
            .map_err(|e| format!("cannot look up user {user}: {e}"))?
            .ok_or_else(|| format!("no such user: {user}"))?;
        let gid = match group {
            None => found.gid,
            Some(name) => {
                Group::from_name(name)
                    .map_err(|e| format!("cannot look up group {name}: {e}"))?
                    .ok_or_else(|| format!("no such group: {name}"))?
                    .gid
            }
        };
        if found.uid.is_root() {
            return Err(format!(
                "--user {user} is root: name an unprivileged account"
            ));
        }
        Ok(Account {
            user: user.to_string(),
            uid: found.uid.as_raw(),
            gid: gid.as_raw(),
        })
    }

    /// Gives the account each path that exists: a file, or a folder and the files directly
    /// in it (not recursively, and never through a symbolic link), so that the account can go
    /// on writing what tern created as root. Only root can; as anyone else this is a no-op
    /// (the files are already theirs).
    pub fn give(&self, paths: &[impl AsRef<Path>]) -> Result<(), String> {
        if !Uid::effective().is_root() {
            return Ok(());
        }
        for path in paths {
            let path = path.as_ref();
            let Ok(meta) = std::fs::symlink_metadata(path) else {
                continue;
            };
            self.chown(path)?;
            if meta.is_dir() {
                let entries = std::fs::read_dir(path)
                    .map_err(|e| format!("cannot list {}: {e}", path.display()))?;
                for entry in entries.flatten() {
                    if entry.file_type().is_ok_and(|t| t.is_file()) {
                        self.chown(&entry.path())?;
                    }
                }
            }
        }
        Ok(())
    }

    fn chown(&self, path: &Path) -> Result<(), String> {
        nix::unistd::fchownat(
            nix::fcntl::AT_FDCWD,
            path,
            Some(Uid::from_raw(self.uid)),
            Some(Gid::from_raw(self.gid)),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(|e| format!("cannot give {} to {}: {e}", path.display(), self.user))
    }

    /// Becomes the account for good: supplementary groups, then group, then user (after
    /// setuid there is no right left to change groups). Checks that root cannot be regained.
    pub fn become_it(&self) -> Result<(), String> {
        let (uid, gid) = (Uid::from_raw(self.uid), Gid::from_raw(self.gid));
        let fail = |what: &str, e: nix::Error| format!("cannot drop privileges ({what}): {e}");
        nix::unistd::setgroups(&[gid]).map_err(|e| fail("setgroups", e))?;
        nix::unistd::setresgid(gid, gid, gid).map_err(|e| fail("setresgid", e))?;
        nix::unistd::setresuid(uid, uid, uid).map_err(|e| fail("setresuid", e))?;
        if nix::unistd::setuid(Uid::from_raw(0)).is_ok() {
            return Err("privileges were not dropped: setuid(0) still works".into());
        }
        Ok(())
    }
}

impl fmt::Display for Account {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (uid {}, gid {})", self.user, self.uid, self.gid)
    }
}

/// True when running as root (the start-up warns if no `--user` is given then).
pub fn running_as_root() -> bool {
    Uid::effective().is_root()
}

/// The threads of this process (from /proc; 1 if unreadable).
pub fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(1, |d| d.count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_users_and_groups_and_root_are_refused() {
        let e = Account::lookup("no-such-user-tern-test", None).unwrap_err();
        assert_eq!(e, "no such user: no-such-user-tern-test");
        let e = Account::lookup("nobody", Some("no-such-group-tern-test")).unwrap_err();
        assert_eq!(e, "no such group: no-such-group-tern-test");
        let e = Account::lookup("root", None).unwrap_err();
        assert!(e.contains("is root"), "{e}");
    }

    #[test]
    fn nobody_is_found_with_its_primary_group_or_the_named_one() {
        let nobody = Account::lookup("nobody", None).unwrap();
        assert_eq!(
            nobody.uid,
            User::from_name("nobody").unwrap().unwrap().uid.as_raw()
        );
        let root_group = Account::lookup("nobody", Some("root")).unwrap();
        assert_eq!(root_group.gid, 0);
        assert!(nobody.to_string().starts_with("nobody (uid "));
    }

    #[test]
    fn give_chowns_a_folder_and_its_files_but_not_through_links() {
        if !running_as_root() {
            eprintln!("skipped: needs root to chown");
            return;
        }
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("db"), "x").unwrap();
        let outside = tmp.path().join("outside");
        std::fs::write(&outside, "y").unwrap();
        std::os::unix::fs::symlink(&outside, data.join("link")).unwrap();
        let nobody = Account::lookup("nobody", None).unwrap();
        nobody.give(&[&data, &tmp.path().join("missing")]).unwrap();
        let uid = |p: &Path| std::fs::symlink_metadata(p).unwrap().uid();
        assert_eq!(uid(&data), nobody.uid);
        assert_eq!(uid(&data.join("db")), nobody.uid);
        assert_eq!(uid(&outside), 0, "a link's target is not given away");
    }

    #[test]
    fn this_test_process_has_threads() {
        // The test harness runs tests on threads of their own, so there is more than one.
        let other =
            std::thread::spawn(|| std::thread::sleep(std::time::Duration::from_millis(200)));
        assert!(thread_count() >= 2);
        other.join().unwrap();
    }
}
