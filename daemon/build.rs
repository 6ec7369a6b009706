//! Sets `RIGD_GIT_REV` for `rigd --version`: the commit the binary was built from (`git describe`
//! style: short hash), or "no git revision" outside a checkout (a source tarball).

use std::path::Path;
use std::process::Command;

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| ".".into());
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(&dir)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|s| !s.is_empty())
    };
    let rev = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "no git revision".into());
    println!("cargo:rustc-env=RIGD_GIT_REV={rev}");
    // A new commit or checkout changes HEAD or the branch it names: build again then only.
    // (Only paths that exist: cargo reruns the script at every build for one that does not.)
    if let Some(git_dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        let git_dir = Path::new(&git_dir);
        // `--git-path`: in a linked worktree the branch and packed-refs live in the common
        // directory, not in the worktree's own (whose HEAD names the branch and never changes).
        let path = |p: &str| git(&["rev-parse", "--git-path", p]).map(|p| Path::new(&dir).join(p));
        let head = git(&["symbolic-ref", "-q", "HEAD"]).and_then(|h| path(&h));
        let watched = [Some(git_dir.join("HEAD")), head, path("packed-refs")];
        for path in watched.into_iter().flatten().filter(|p| p.exists()) {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
