//! A mutation fuzzer for model loading and signature parsing: the committed models with bytes
//! flipped, truncated, spliced and inserted, and plain random bytes. Every input must load or be
//! refused with an error; none may panic or crash the process.
//!
//! `cargo test --test fuzz_models` runs 300 cases from a fixed seed (the same every run, so CI is
//! deterministic). Run it for longer with other seeds:
//!
//! ```sh
//! BATCHINFER_FUZZ_ITERS=20000 BATCHINFER_FUZZ_SEED=$RANDOM cargo test --release --test fuzz_models -- --nocapture
//! ```

use std::sync::Arc;

use batchinfer::model::{Model, ModelSource, SessionOptions};
use batchinfer::tensor::input::InputBinding;
use datafusion::arrow::datatypes::DataType;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn mutate(rng: &mut Rng, corpus: &[Vec<u8>]) -> Vec<u8> {
    let mut bytes = corpus[rng.below(corpus.len())].clone();
    match rng.below(6) {
        0 => {
            for _ in 0..1 + rng.below(8) {
                let i = rng.below(bytes.len());
                bytes[i] ^= 1 << rng.below(8);
            }
        }
        1 => bytes.truncate(rng.below(bytes.len())),
        2 => {
            let other = &corpus[rng.below(corpus.len())];
            let (cut, from) = (rng.below(bytes.len()), rng.below(other.len()));
            bytes.truncate(cut);
            bytes.extend_from_slice(&other[from..]);
        }
        3 => {
            let at = rng.below(bytes.len());
            let junk: Vec<u8> = (0..1 + rng.below(32)).map(|_| rng.next() as u8).collect();
            bytes.splice(at..at, junk);
        }
        4 => {
            // Overwrite a varint-sized run: lengths and tags in the protobuf.
            let at = rng.below(bytes.len());
            for b in bytes.iter_mut().skip(at).take(1 + rng.below(4)) {
                *b = rng.next() as u8;
            }
        }
        _ => bytes = (0..rng.below(2048)).map(|_| rng.next() as u8).collect(),
    }
    bytes
}

#[test]
fn mutated_models_load_or_fail_cleanly() {
    let corpus: Vec<Vec<u8>> = std::fs::read_dir("data/models")
        .unwrap()
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    let iterations = env_number("BATCHINFER_FUZZ_ITERS", 300);
    let mut rng = Rng(env_number("BATCHINFER_FUZZ_SEED", 0x5eed_2026).max(1));
    let options = SessionOptions {
        max_sessions: 1,
        intra_threads: 1,
        optimization: Default::default(),
        varying_shapes: false,
        device: Default::default(),
    };
    let (mut loaded, mut refused) = (0, 0);
    for _ in 0..iterations {
        let bytes: Arc<[u8]> = mutate(&mut rng, &corpus).into();
        match Model::from_bytes(
            "fuzzed",
            ModelSource::parse("fuzzed.onnx").unwrap(),
            bytes,
            Vec::new(),
            options,
        ) {
            Ok(model) => {
                loaded += 1;
                // The signature must be usable for planning whatever it holds.
                let _ = InputBinding::plan(
                    &model.signature,
                    &[DataType::Float32, DataType::Float32, DataType::Float32],
                );
                let _ = InputBinding::plan(&model.signature, &[DataType::Utf8]);
                let _ = model.signature.describe_inputs();
            }
            Err(e) => {
                refused += 1;
                let message = e.to_string();
                assert!(
                    message.starts_with("model 'fuzzed' could not be loaded from fuzzed.onnx"),
                    "{message}"
                );
            }
        }
    }
    println!("{iterations} mutated models: {loaded} loaded, {refused} refused with an error");
    assert_eq!(loaded + refused, iterations);
}
