//! `sluice explain` as a user runs it: the binary on the repository's
//! examples, its output and exit codes.

use std::process::Command;

fn explain(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("explain")
        .args(args)
        // No rollout state of the user's: spec shares.
        .env("XDG_STATE_HOME", "/nonexistent-sluice-state")
        .output()
        .expect("sluice runs");
    (
        out.status.code().expect("exited"),
        String::from_utf8(out.stdout).expect("UTF-8"),
        String::from_utf8(out.stderr).expect("UTF-8"),
    )
}

/// The seeds' confusion in one command: the header rule is written below
/// the plain rule in examples/header-canary.yaml and still wins, by header
/// count.
#[test]
fn the_header_rule_written_below_wins_by_header_count() {
    let (code, out, err) = explain(&[
        "-f",
        "examples/",
        "GET",
        "http://search.example.com:8080/",
        "-H",
        "x-canary: always",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    for line in [
        "listener: gateway/default/demo/listener/http",
        "=> 1. HTTPRoute default/search rule 1 [PathPrefix /, header x-canary=\"always\"] host search.example.com: matches: WINS",
        "   2. HTTPRoute default/search rule 0 [PathPrefix /] host search.example.com: matches, but loses to the winner by header count",
        "winner: HTTPRoute default/search rule 1",
        "  backend default/search-canary:80: weight 1, spec 100%, resolved, 1 ready endpoint(s)",
    ] {
        assert!(out.lines().any(|l| l == line), "missing {line:?} in\n{out}");
    }
    // Untagged: the plain rule wins; the header rule ranked first fails.
    let (code, out, _) = explain(&["-f", "examples/", "GET", "http://search.example.com:8080/"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("1. HTTPRoute default/search rule 1 [PathPrefix /, header x-canary=\"always\"] host search.example.com: ranks before the winner by header count, but fails header x-canary"),
        "{out}"
    );
    assert!(
        out.contains("winner: HTTPRoute default/search rule 0"),
        "{out}"
    );
}

#[test]
fn shares_are_printed_as_check_prints_them() {
    let (code, out, _) = explain(&[
        "-f",
        "examples/",
        "GET",
        "http://autocomplete.example.com:8080/suggest?q=sl",
    ]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("spec 99.5%"), "{out}");
    assert!(out.contains("spec 0.5%"), "{out}");
}

#[test]
fn exit_codes_say_matched_404_or_unreadable() {
    let (code, out, _) = explain(&["-f", "examples/", "GET", "http://nobody.example.com:8080/"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("outcome: 404"), "{out}");
    let (code, out, _) = explain(&["-f", "examples/", "GET", "http://search.example.com/"]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("listener ports: 8080"), "{out}");
    let (code, _, err) = explain(&["-f", "no/such/dir", "GET", "http://x/"]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = explain(&["-f", "examples/", "GET", "http://x/", "-H", "no colon"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("Name: value"), "{err}");
}

/// `--crds` as for `check`: a CRD that caps weights at 100 refuses the
/// 995/5 autocomplete route, so the request that route took gets 404.
#[test]
fn crds_refuse_objects_before_explaining() {
    // The HTTPRoute CRD check_cli.rs uses too (run from the crate root).
    let crd = "tests/fixtures/httproute-weights-at-most-100.crd.yaml";
    let url = "http://autocomplete.example.com:8080/suggest?q=sl";
    let (code, out, _) = explain(&["-f", "examples/", "GET", url]);
    assert_eq!(code, 0, "{out}");
    let (code, out, err) = explain(&["-f", "examples/", "--crds", crd, "GET", url]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("outcome: 404"), "{out}");
}
