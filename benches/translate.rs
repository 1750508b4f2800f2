//! Translate (manifests already parsed into a snapshot -> route table and
//! status) for 1,000 and 10,000 generated HTTPRoutes: what every reload
//! costs.
//!
//! `cargo bench --bench translate`

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use sluice::translate::{TranslateOptions, translate};

#[path = "support/routes.rs"]
mod routes;

fn translate_routes(c: &mut Criterion) {
    let layout = routes::Layout::default();
    let options = TranslateOptions {
        default_bind: layout.listen.ip(),
    };
    let mut group = c.benchmark_group("translate");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(10));
    for n in [1_000usize, 10_000] {
        let text = routes::infrastructure(&layout) + &routes::routes(n, false);
        let snapshot = routes::snapshot(&text);
        group.bench_with_input(BenchmarkId::from_parameter(n), &n, |b, _| {
            b.iter(|| black_box(translate(&snapshot, &options)))
        });
    }
    group.finish();
}

criterion_group!(benches, translate_routes);
criterion_main!(benches);
