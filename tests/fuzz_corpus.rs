//! Replays the fuzz targets' seed corpora (`fuzz/seeds/<target>/`), plus
//! every manifest the project ships (examples, golden inputs), through the
//! same entry points the fuzzer drives, so regressions are caught in CI
//! without the fuzzer. Run the fuzzer itself with `cargo fuzz run <target>
//! fuzz/seeds/<target>` from `fuzz/` (see docs/hardening.md).

use std::path::Path;

fn files(dir: &str) -> Vec<std::path::PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
    let mut out: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    out.sort();
    out
}

#[test]
fn manifest_seeds_never_panic() {
    let mut inputs = files("fuzz/seeds/manifests_then_translate");
    inputs.extend(files("examples"));
    inputs.extend(
        files("tests/translate")
            .into_iter()
            .filter(|p| p.to_string_lossy().ends_with(".in.yaml")),
    );
    assert!(inputs.len() > 10, "seed corpus went missing");
    for input in inputs {
        let data = std::fs::read(&input).unwrap();
        sluice::fuzzing::manifests_then_translate(&data);
        // Truncations of a valid file are the likeliest malformed inputs.
        for cut in [data.len() / 3, data.len() / 2, data.len() * 2 / 3] {
            sluice::fuzzing::manifests_then_translate(&data[..cut]);
        }
    }
}

#[test]
fn request_seeds_never_panic() {
    let inputs = files("fuzz/seeds/match_request");
    assert!(inputs.len() >= 4, "seed corpus went missing");
    for input in inputs {
        sluice::fuzzing::match_request(&std::fs::read(&input).unwrap());
    }
}

#[test]
fn http1_seeds_frame_alike_in_sluice_and_hyper() {
    use sluice::fuzzing::{Seen, h1_framing, h1_requests, hyper_requests};
    let inputs = files("fuzz/seeds/h1_framing");
    assert!(inputs.len() >= 10, "seed corpus went missing");
    for input in &inputs {
        let data = std::fs::read(input).unwrap();
        // Every prefix: heads and bodies cut anywhere.
        for cut in 0..=data.len() {
            h1_framing(&data[..cut]);
        }
    }
    // The well-formed seeds are served whole, and alike, by both parsers
    // (the differential alone would pass a parser that refused everything).
    for (name, requests) in [
        ("keep-alive.txt", 2),
        ("content-length.txt", 2),
        ("chunked.txt", 2),
        ("forms.txt", 3),
        ("upgrade.txt", 1),
    ] {
        let data = std::fs::read(format!(
            "{}/fuzz/seeds/h1_framing/{name}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap();
        let ours = h1_requests(&data);
        let served = ours
            .iter()
            .filter(|s| matches!(s, Seen::Request { .. }))
            .count();
        assert_eq!(served, requests, "{name}: {ours:?}");
        let theirs = hyper_requests(&data);
        assert_eq!(ours[..requests], theirs[..requests], "{name}");
    }
    // And the smuggling seeds are refused by sluice's parser before the
    // request behind them.
    for name in ["cl-and-te.txt", "te-list.txt", "hosts-bare-lf.txt"] {
        let data = std::fs::read(format!(
            "{}/fuzz/seeds/h1_framing/{name}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap();
        assert_eq!(h1_requests(&data), [Seen::Refused], "{name}");
    }
}

#[test]
fn http1_response_seeds_frame_alike_in_sluice_and_hyper() {
    use sluice::fuzzing::{SeenResponse, h1_response, h1_response_hyper, h1_response_ours};
    let inputs = files("fuzz/seeds/h1_response");
    assert!(inputs.len() >= 10, "seed corpus went missing");
    for input in &inputs {
        let data = std::fs::read(input).unwrap();
        // Every prefix: heads and bodies cut anywhere.
        for cut in 0..=data.len() {
            h1_response(&data[..cut]);
        }
    }
    let seed = |name: &str| {
        std::fs::read(format!(
            "{}/fuzz/seeds/h1_response/{name}",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap()
    };
    // The well-formed seeds are read whole, and alike, by both (the
    // differential alone would pass a parser that refused everything).
    for (name, status, body) in [
        ("length.txt", 200, 5),
        ("chunked.txt", 200, 5),
        ("until-close.txt", 200, 13),
        ("interim.txt", 201, 2),
        ("no-body.txt", 304, 0),
        ("http10.txt", 200, 3),
        ("te-gzip.txt", 200, 8),
        ("no-content.txt", 204, 0),
    ] {
        let data = seed(name);
        let want = SeenResponse::Response { status, body };
        assert_eq!(h1_response_ours(&data, false), want, "{name}");
        assert_eq!(h1_response_hyper(&data, false), want, "{name}");
    }
    // A HEAD's answer has no body, whatever its length says.
    assert_eq!(
        h1_response_ours(&seed("length.txt"), true),
        SeenResponse::Response {
            status: 200,
            body: 0
        }
    );
    // What could be framed two ways is refused (the client gets 502).
    for name in [
        "cl-and-te.txt",
        "cl-differ.txt",
        "bad-chunk.txt",
        "bare-lf.txt",
        "switching.txt",
    ] {
        let ours = h1_response_ours(&seed(name), false);
        assert!(
            matches!(
                ours,
                SeenResponse::Refused | SeenResponse::BodyFailed { .. }
            ),
            "{name}: {ours:?}"
        );
    }
}
