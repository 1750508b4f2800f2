//! stdout is a command's output, stderr its diagnostics: `sluice check`
//! piped into a file holds only its report, and `sluice serve` logs on
//! stderr only (as kubectl, nginx and every Unix tool do).

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn check_writes_its_report_on_stdout_and_nothing_else() {
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/examples");
    let state = tempfile::tempdir().expect("temp dir");
    let output = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["check", "-f", examples, "--state-dir"])
        .arg(state.path())
        .env("RUST_LOG", "trace")
        .output()
        .expect("run sluice check");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{stdout}");
    assert!(
        stdout.contains("HTTPRoute default/autocomplete"),
        "{stdout}"
    );
    for level in [" TRACE ", " DEBUG ", " INFO ", " WARN ", " ERROR "] {
        assert!(!stdout.contains(level), "a log line on stdout: {stdout}");
    }
}

#[test]
fn serve_logs_on_stderr_and_keeps_stdout_empty() {
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/canary.yaml");
    let state = tempfile::tempdir().expect("temp dir");
    let admin = format!(
        "127.0.0.1:{}",
        sluice::ports::free_loopback_port().expect("a port")
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["serve", "-f", examples, "--admin", &admin, "--state-dir"])
        .arg(state.path())
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run sluice serve");
    // Ready once the admin listener answers (a guard against a hang, not a
    // timing assertion).
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(&admin).is_err() {
        assert!(Instant::now() < deadline, "sluice serve never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Wait for the startup logs, then stop it.
    std::thread::sleep(Duration::from_millis(300));
    let _ = child.kill();
    let _ = child.wait();
    let (mut stdout, mut stderr) = (String::new(), String::new());
    child
        .stdout
        .take()
        .expect("stdout")
        .read_to_string(&mut stdout)
        .expect("read stdout");
    child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut stderr)
        .expect("read stderr");
    assert!(stdout.is_empty(), "serve wrote on stdout: {stdout}");
    assert!(stderr.contains("admin listener started"), "{stderr}");
}
