//! Puts the commit tern is built from into `tern --version` (`TERN_COMMIT`): the hash given
//! in the environment variable of that name (a build from a source tarball), else `git`'s,
//! else "unknown commit".

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
}

fn main() {
    println!("cargo:rerun-if-env-changed=TERN_COMMIT");
    let commit = match std::env::var("TERN_COMMIT") {
        Ok(given) if !given.is_empty() => format!("commit {given}"),
        _ => match git(&["rev-parse", "--short=12", "HEAD"]) {
            Some(hash) => {
                // Built again when HEAD moves: HEAD itself, the branch it names, packed refs.
                if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
                    println!("cargo:rerun-if-changed={dir}/HEAD");
                }
                if let Some(common) =
                    git(&["rev-parse", "--path-format=absolute", "--git-common-dir"])
                {
                    println!("cargo:rerun-if-changed={common}/packed-refs");
                    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
                        println!("cargo:rerun-if-changed={common}/{branch}");
                    }
                }
                format!("commit {hash}")
            }
            None => "unknown commit".into(),
        },
    };
    println!("cargo:rustc-env=TERN_COMMIT={commit}");
}
