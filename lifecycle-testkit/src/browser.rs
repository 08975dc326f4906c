//! Headless Chromium (Debian's `chromium`) on a page the agent serves: the DOM after layout, and
//! a screenshot, as a person would see the page. Each call runs one browser in a profile
//! directory of its own and waits for it to end.

use std::{path::Path, process::Command};

/// Where the tiers install it (`packages::PAGES` in xtask).
pub const CHROMIUM: &str = "/usr/bin/chromium";

/// Runs headless Chromium on `url` with `what` (`--dump-dom`, or `--screenshot=<file>`), in a
/// profile directory of its own under `dir`; its stdout.
pub fn chromium(dir: &Path, url: &str, what: &str) -> String {
    let output = Command::new(CHROMIUM)
        .args([
            "--headless",
            // Root in a test: Chromium's own sandbox refuses to run as root.
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            // This machine's network is closed: no background fetches to fail at.
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--window-size=1000,700",
            "--virtual-time-budget=2000",
        ])
        .arg(format!("--user-data-dir={}", dir.join("profile").display()))
        .arg(what)
        .arg(url)
        .output()
        .expect("run chromium");
    assert!(output.status.success(), "chromium {what} {url}: {output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A screenshot of `url` (a PNG of some size, checked), kept at `LIFECYCLE_EXPLAIN_SCREENSHOT`
/// when that names a file (how `docs/explain.png` is made).
pub fn screenshot(dir: &Path, url: &str) -> Vec<u8> {
    let shot = dir.join("page.png");
    chromium(dir, url, &format!("--screenshot={}", shot.display()));
    let png = std::fs::read(&shot).expect("screenshot written");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "a PNG");
    assert!(png.len() > 20_000, "a page with text and a drawing, not a blank one ({} bytes)", png.len());
    if let Some(keep) = std::env::var_os("LIFECYCLE_EXPLAIN_SCREENSHOT") {
        std::fs::copy(&shot, keep).expect("keep the screenshot");
    }
    png
}
