//! `sluice demo --keep-running` as a user starts it: the real binary, its
//! stdout read line by line, the dashboard address it prints, and Ctrl-C
//! (SIGINT) to stop it. Shared by the demo's test and the browser test.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// A running `sluice demo --keep-running`.
pub struct LiveDemo {
    child: Child,
    lines: mpsc::Receiver<String>,
    reader: Option<std::thread::JoinHandle<()>>,
    /// A guard against a hang, not a timing assertion.
    deadline: Instant,
    /// Everything printed so far.
    pub printed: String,
    /// The admin listener's address, from the printed dashboard URL.
    pub admin: String,
}

impl LiveDemo {
    /// Start the demo and read up to the end of its "what to try" lines.
    pub fn start() -> LiveDemo {
        let mut child = Command::new(env!("CARGO_BIN_EXE_sluice"))
            .args(["demo", "--requests", "1000", "--keep-running"])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("run the sluice binary");
        let stdout = child.stdout.take().expect("stdout");
        let (lines_tx, lines) = mpsc::channel::<String>();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if lines_tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut demo = LiveDemo {
            child,
            lines,
            reader: Some(reader),
            deadline: Instant::now() + Duration::from_secs(300),
            printed: String::new(),
            admin: String::new(),
        };
        let dashboard = loop {
            let line = demo.next_line();
            if let Some(url) = line.trim().strip_prefix("dashboard:") {
                break url.trim().to_string();
            }
        };
        demo.admin = dashboard
            .strip_prefix("http://")
            .and_then(|a| a.strip_suffix('/'))
            .unwrap_or_else(|| panic!("a dashboard URL: {dashboard}"))
            .to_string();
        // The lines after it: what to try.
        while !demo.next_line().trim_start().starts_with("status:") {}
        demo
    }

    /// The next printed line.
    pub fn next_line(&mut self) -> String {
        let left = self.deadline.saturating_duration_since(Instant::now());
        let line = self
            .lines
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("the demo stopped printing:\n{}", self.printed));
        self.printed.push_str(&line);
        self.printed.push('\n');
        line
    }

    /// Read until one whole cycle was printed: a promotion completed,
    /// then a rollback.
    pub fn wait_for_a_cycle(&mut self) {
        let mut promoted = false;
        loop {
            let line = self.next_line();
            if line.trim_start().starts_with("Complete after") {
                promoted = true;
            }
            if line.trim_start().starts_with("RolledBack after") {
                assert!(promoted, "the promotion comes first:\n{}", self.printed);
                return;
            }
            assert!(
                !line.contains("going on"),
                "a rollout did not end:\n{}",
                self.printed
            );
        }
    }

    /// GET `path` from the admin listener: the whole answer, head and body.
    pub fn get(&self, path: &str) -> String {
        let admin = &self.admin;
        let mut conn = std::net::TcpStream::connect(admin).expect("connect to the admin listener");
        write!(
            conn,
            "GET {path} HTTP/1.1\r\nHost: {admin}\r\nConnection: close\r\n\r\n"
        )
        .expect("send");
        let mut answer = String::new();
        conn.read_to_string(&mut answer).expect("read");
        answer
    }

    /// Ctrl-C: SIGINT, then wait for the exit; returns its status with
    /// everything printed.
    pub fn interrupt(mut self) -> (ExitStatus, String) {
        rustix::process::kill_process(
            rustix::process::Pid::from_child(&self.child),
            rustix::process::Signal::INT,
        )
        .expect("SIGINT sent");
        let code = loop {
            if let Some(code) = self.child.try_wait().expect("wait") {
                break code;
            }
            assert!(
                Instant::now() < self.deadline,
                "Ctrl-C did not stop the demo"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        if let Some(reader) = self.reader.take() {
            reader.join().expect("reader");
        }
        while let Ok(line) = self.lines.try_recv() {
            self.printed.push_str(&line);
            self.printed.push('\n');
        }
        (code, std::mem::take(&mut self.printed))
    }
}

impl Drop for LiveDemo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
