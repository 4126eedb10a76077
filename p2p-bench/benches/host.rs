//! Host-side costs that sit on every call's path, measured with criterion (no GPU needed):
//! the collective planner, and encoding and decoding a handle and a message in the `wire`
//! formats, and the correctness checker's input building and comparison. Run: `cargo bench -p p2p-bench --bench host --features bench`. The GPU-side enqueue cost of a call
//! (planner plus launch) is measured by `p2p-bench coll` ("host cost of issuing one call").

// criterion_group! makes an undocumented `pub fn benches`.
#![allow(missing_docs)]

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use p2p_collective::plan::{Planner, Tuning};
use p2p_collective::{Access, Call, DataType, Forced, Op};
use p2p_mem::wire::{self, HandleKind};

fn planner(c: &mut Criterion) {
    let tuning = Tuning::for_device(132, 2);
    let planner = |world| Planner {
        world,
        forced: Forced::AUTO,
        tuning,
    };
    let mut g = c.benchmark_group("plan");
    for (name, count) in [("8B", 2usize), ("1MiB", 1 << 18), ("1GiB", 1 << 28)] {
        g.bench_function(format!("all_reduce f32 {name} 8 ranks"), |b| {
            let call = Call::new(Op::AllReduce, DataType::F32, count);
            b.iter(|| planner(8).plan(black_box(&call), Access::NONE))
        });
    }
    g.bench_function("every op, 64 KiB, 4 ranks", |b| {
        b.iter(|| {
            for op in Op::ALL {
                let call = Call::new(op, DataType::BF16, black_box(1 << 15));
                black_box(planner(4).plan(&call, Access::NONE));
            }
        })
    });
    g.finish();
}

fn wire_formats(c: &mut Criterion) {
    let uuid = [7u8; 16];
    let payload = vec![3u8; HandleKind::IpcMem.payload_len()];
    let handle = wire::encode(HandleKind::IpcMem, &uuid, 4242, &payload);
    let mut g = c.benchmark_group("wire");
    g.bench_function("encode IPC handle", |b| {
        b.iter(|| {
            wire::encode(
                HandleKind::IpcMem,
                black_box(&uuid),
                4242,
                black_box(&payload),
            )
        })
    });
    g.bench_function("decode IPC handle", |b| {
        b.iter(|| wire::decode(black_box(&handle), HandleKind::IpcMem).map(|e| e.exporter_pid))
    });
    let body = vec![9u8; 200];
    let message = wire::encode_message(0x0C01, &body);
    g.bench_function("encode 200 B message", |b| {
        b.iter(|| wire::encode_message(0x0C01, black_box(&body)))
    });
    g.bench_function("decode 200 B message", |b| {
        b.iter(|| wire::decode_message(black_box(&message), 4096).map(|(k, p)| (k, p.len())))
    });
    g.finish();
}

fn checking(c: &mut Criterion) {
    use p2p_collective::verify::{build, compare};
    let n = 4 << 20;
    let mut g = c.benchmark_group("verify");
    g.sample_size(10);
    g.bench_function("build 4 Mi f32", |b| {
        b.iter(|| build(DataType::F32, black_box(n), |j| (j % 31) as i64))
    });
    let data = build(DataType::F32, n, |j| (j % 31) as i64);
    g.bench_function("compare 4 Mi f32", |b| {
        b.iter(|| compare(DataType::F32, black_box(&data), |j| Some((j % 31) as i64)).0)
    });
    g.finish();
}

criterion_group!(benches, planner, wire_formats, checking);
criterion_main!(benches);
