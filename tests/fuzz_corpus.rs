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
