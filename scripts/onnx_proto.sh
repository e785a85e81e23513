#!/usr/bin/env bash
# Regenerates src/onnx/proto.rs (ONNX's protobuf messages as prost types) from
# src/onnx/onnx-ml.proto, with prost-build and protox (a protobuf compiler in Rust, so no
# protoc is needed), in a throwaway crate: neither is a dependency of batchinfer.
#
#   scripts/onnx_proto.sh
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/src"
cat > "$work/Cargo.toml" <<'TOML'
[package]
name = "onnx-proto"
version = "0.1.0"
edition = "2021"
[dependencies]
protox = "0.9"
prost-build = "0.14.6"
TOML
cat > "$work/src/main.rs" <<'RUST'
fn main() {
    let dir = std::env::args().nth(1).unwrap();
    let fds = protox::compile(["onnx-ml.proto"], [&dir]).unwrap();
    prost_build::Config::new().out_dir(&dir).compile_fds(fds).unwrap();
}
RUST
(cd "$work" && CARGO_TARGET_DIR="$work/target" cargo run -q -- "$root/src/onnx")
mv "$root/src/onnx/onnx.rs" "$root/src/onnx/proto.rs"
cd "$root" && cargo fmt
echo "wrote src/onnx/proto.rs"
