//! The unprivileged account a server started as root drops to (`--user`, `--group`).

use std::fmt;
use std::path::Path;

use std::ffi::CString;

use nix::dir::Dir;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{fstatat, Mode, SFlag};
use nix::unistd::{Gid, Group, Uid, User};

/// What [`Account::give`] hands over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Give {
    /// A folder tern writes in, and the files in it, all named with one of these prefixes.
    Folder {
        path: std::path::PathBuf,
        made_by_tern: Vec<String>,
    },
    /// A single file tern made (a ticket-key file).
    File(std::path::PathBuf),
}

/// The id of the group `name` (from the system's group database, as `getent group` reads it).
pub fn group_id(name: &str) -> Result<u32, String> {
    Ok(Group::from_name(name)
        .map_err(|e| format!("cannot look up group {name}: {e}"))?
        .ok_or_else(|| format!("no such group: {name}"))?
        .gid
        .as_raw())
}

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
            Some(name) => Gid::from_raw(group_id(name)?),
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

    /// Gives the account what tern made as root, so that it can go on writing it. Only root
    /// can; as anyone else this does nothing (the files are already theirs). Everything is
    /// done through descriptors opened without following links, so a path swapped for a
    /// symbolic link in the meantime gives nothing away.
    pub fn give(&self, items: &[Give]) -> Result<(), String> {
        if !Uid::effective().is_root() {
            return Ok(());
        }
        for item in items {
            match item {
                Give::Folder { path, made_by_tern } => self.give_folder(path, made_by_tern)?,
                Give::File(path) => self.give_file(path)?,
            }
        }
        Ok(())
    }

    /// The folder and the plain files in it, after checking that everything in it is
    /// tern's (names starting with one of `made_by_tern`): a mistaken `--data /etc` must
    /// not give /etc away.
    fn give_folder(&self, path: &Path, made_by_tern: &[String]) -> Result<(), String> {
        let flags = OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_RDONLY | OFlag::O_CLOEXEC;
        let mut dir = match Dir::open(path, flags, Mode::empty()) {
            Ok(dir) => dir,
            Err(nix::Error::ENOENT) => return Ok(()),
            Err(e) => return Err(format!("cannot open {}: {e}", path.display())),
        };
        let mut names = Vec::new();
        for entry in dir.iter() {
            let entry = entry.map_err(|e| format!("cannot list {}: {e}", path.display()))?;
            let name = entry.file_name().to_owned();
            let text = name.to_string_lossy();
            if text == "." || text == ".." {
                continue;
            }
            if !made_by_tern.iter().any(|p| text.starts_with(p.as_str())) {
                return Err(format!(
                    "--user: {} holds {text:?}, which tern did not make: give tern a folder of its own",
                    path.display()
                ));
            }
            names.push(name);
        }
        for name in &names {
            let st = fstatat(&dir, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW)
                .map_err(|e| format!("cannot inspect {}/{name:?}: {e}", path.display()))?;
            let plain = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFREG
                && st.st_nlink == 1;
            if !plain {
                return Err(format!(
                    "--user: {}/{} is not a plain file (a link or a folder): remove it",
                    path.display(),
                    name.to_string_lossy()
                ));
            }
            nix::unistd::fchownat(
                &dir,
                name.as_c_str(),
                Some(Uid::from_raw(self.uid)),
                Some(Gid::from_raw(self.gid)),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            )
            .map_err(|e| self.cannot_give(path, e))?;
        }
        nix::unistd::fchown(
            &dir,
            Some(Uid::from_raw(self.uid)),
            Some(Gid::from_raw(self.gid)),
        )
        .map_err(|e| self.cannot_give(path, e))
    }

    /// One plain file (not a link, not hard-linked elsewhere).
    fn give_file(&self, path: &Path) -> Result<(), String> {
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC;
        let fd = match nix::fcntl::open(path, flags, Mode::empty()) {
            Ok(fd) => fd,
            Err(nix::Error::ENOENT) => return Ok(()),
            Err(e) => return Err(format!("cannot open {}: {e}", path.display())),
        };
        let st = nix::sys::stat::fstat(&fd).map_err(|e| self.cannot_give(path, e))?;
        if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG
            || st.st_nlink != 1
        {
            return Err(format!("--user: {} is not a plain file", path.display()));
        }
        nix::unistd::fchown(
            &fd,
            Some(Uid::from_raw(self.uid)),
            Some(Gid::from_raw(self.gid)),
        )
        .map_err(|e| self.cannot_give(path, e))
    }

    fn cannot_give(&self, path: &Path, e: nix::Error) -> String {
        format!("cannot give {} to {}: {e}", path.display(), self.user)
    }

    /// Becomes the account for good: supplementary groups, then group, then user (after
    /// setuid there is no right left to change groups). Checks that root cannot be regained.
    pub fn become_it(&self) -> Result<(), String> {
        let (uid, gid) = (Uid::from_raw(self.uid), Gid::from_raw(self.gid));
        let fail = |what: &str, e: nix::Error| format!("cannot drop privileges ({what}): {e}");
        // The user's own supplementary groups too (e.g. `ssl-cert` to re-read keys on reload).
        let name =
            CString::new(self.user.as_str()).map_err(|_| "a user name with NUL".to_string())?;
        nix::unistd::initgroups(&name, gid).map_err(|e| fail("initgroups", e))?;
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
        assert_eq!(group_id("root"), Ok(0));
        assert_eq!(
            group_id("no-such-group-tern-test").unwrap_err(),
            "no such group: no-such-group-tern-test"
        );
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
    fn give_hands_over_tern_s_folder_but_refuses_foreign_files_and_links() {
        if !running_as_root() {
            eprintln!("skipped: needs root to chown");
            return;
        }
        use std::os::unix::fs::MetadataExt;
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("db"), "x").unwrap();
        std::fs::write(data.join("db-wal"), "x").unwrap();
        let nobody = Account::lookup("nobody", None).unwrap();
        let folder = |path: &Path| Give::Folder {
            path: path.to_path_buf(),
            made_by_tern: vec!["db".into()],
        };
        let uid = |p: &Path| std::fs::symlink_metadata(p).unwrap().uid();
        nobody
            .give(&[folder(&data), folder(&tmp.path().join("missing"))])
            .unwrap();
        assert_eq!(uid(&data), nobody.uid);
        assert_eq!(uid(&data.join("db-wal")), nobody.uid);

        // A file tern did not make: nothing is given, the folder stays root's.
        let other = tmp.path().join("other");
        std::fs::create_dir(&other).unwrap();
        std::fs::write(other.join("passwd"), "root:x:0:0").unwrap();
        let e = nobody.give(&[folder(&other)]).unwrap_err();
        assert!(e.contains("which tern did not make"), "{e}");
        assert_eq!(uid(&other), 0);
        assert_eq!(uid(&other.join("passwd")), 0);

        // A link named like tern's file, to a file outside: refused, the target stays root's.
        let linked = tmp.path().join("linked");
        std::fs::create_dir(&linked).unwrap();
        let outside = tmp.path().join("outside");
        std::fs::write(&outside, "y").unwrap();
        std::os::unix::fs::symlink(&outside, linked.join("db")).unwrap();
        assert!(nobody.give(&[folder(&linked)]).is_err());
        assert_eq!(uid(&outside), 0);
        // The folder itself given as a link: not followed.
        let link_to_other = tmp.path().join("link-to-other");
        std::os::unix::fs::symlink(&other, &link_to_other).unwrap();
        assert!(nobody.give(&[folder(&link_to_other)]).is_err());
        assert!(nobody.give(&[Give::File(linked.join("db"))]).is_err());
        assert_eq!(uid(&outside), 0);
        // A plain file.
        nobody.give(&[Give::File(outside.clone())]).unwrap();
        assert_eq!(uid(&outside), nobody.uid);
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
