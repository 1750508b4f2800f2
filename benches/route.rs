//! Request matching and weighted choice, the two pure steps every request
//! takes: `RouteTable::lookup` against tables of 10, 1,000 and 10,000
//! generated HTTPRoutes (mixed Exact, PathPrefix, header and
//! RegularExpression matches), and `WeightedPicker::pick`.
//!
//! `cargo bench --bench route`

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use sluice::route::WeightedPicker;
use sluice::translate::{TranslateOptions, translate};

#[path = "support/routes.rs"]
mod routes;

fn lookup(c: &mut Criterion) {
    let layout = routes::Layout::default();
    let options = TranslateOptions {
        default_bind: layout.listen.ip(),
    };
    for (label, one_host) in [("ten-routes-per-host", false), ("one-host", true)] {
        let mut group = c.benchmark_group(format!("lookup/{label}"));
        for n in [10usize, 1_000, 10_000] {
            let text = routes::infrastructure(&layout) + &routes::routes(n, one_host);
            let table = translate(&routes::snapshot(&text), &options).table;
            // Requests for 64 routes spread over the table.
            let requests: Vec<_> = (0..64)
                .map(|k| routes::request_for((k * (n / 64 + 1)) % n, one_host))
                .collect();
            let mut k = 0usize;
            group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
                b.iter(|| {
                    k = (k + 1) % requests.len();
                    let (host, method, path, headers) = &requests[k];
                    let found = table.lookup(layout.listen, host, method, path, None, headers);
                    assert!(
                        matches!(found, sluice::route::Lookup::Matched(_)),
                        "request {k} must match"
                    );
                    black_box(found);
                });
            });
        }
        group.finish();
    }
}

fn weighted(c: &mut Criterion) {
    let mut group = c.benchmark_group("weighted_pick");
    for (label, weights) in [
        ("995-5", vec![995u64, 5]),
        ("90-10", vec![90, 10]),
        ("8-backends", vec![1, 2, 3, 4, 5, 6, 7, 1_000]),
    ] {
        let picker = WeightedPicker::new(&weights);
        group.bench_function(label, |b| b.iter(|| black_box(picker.pick())));
    }
    group.finish();
}

criterion_group!(benches, lookup, weighted);
criterion_main!(benches);
