#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: runs the linear model and the MiniLM embedding job on CUDA and on
# the CPU, compares the outputs, and prints rows/s for each: end to end, and over the time spent
# inside ONNX Runtime's calls (batchinfer's --timing, summed over sessions; on the GPU there is one
# session per model, so this is ONNX Runtime alone on the same batches), and for ONNX Runtime alone
# from Python where onnxruntime-gpu is installed. Without network, carry what it needs first:
# scripts/gpu-carry.sh, then scripts/gpu-unpack.sh there.
#
#   scripts/gpu-check.sh                 # 2,000,000 scored rows, 20,000 embedded sentences
#   ROWS=10000000 TEXTS=2000 scripts/gpu-check.sh
#
# Needs: a release build (built here if missing), the NVIDIA driver, the CUDA 13 libraries
# (system, or NVIDIA's PyPI wheels in a Python environment; see `batchinfer --help`, --device), and
# either network access to PyPI for onnxruntime-gpu==1.31.1 or ORT_DYLIB_PATH pointing at its
# libonnxruntime.so.1.31.1 (with libonnxruntime_providers_cuda.so beside it).
#
# Tolerances (float32 on both sides, but CUDA kernels sum in other orders, and ONNX Runtime's CUDA
# provider may use TF32 tensor cores for MatMul/Gemm, whose inputs keep 10 mantissa bits):
#   linear scores:  |gpu - cpu| <= 1e-3 * max(1, |cpu|)       (TF32 rounding of the inputs: ~5e-4)
#   embeddings:     max |gpu - cpu| per component <= 1e-2 and cosine(gpu, cpu) >= 0.999
set -euo pipefail
cd "$(dirname "$0")/.."

ROWS=${ROWS:-2000000}
TEXTS=${TEXTS:-20000}
DEVICE=${DEVICE:-cuda:0}
bin=target/release/batchinfer
[ -x "$bin" ] || cargo build --release
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

features="f0, f1, f2, f3, f4, f5, f6, f7, f8, f9"
gen="SELECT value AS id, $(for j in 0 1 2 3 4 5 6 7 8 9; do printf 'CAST(((value * %d + 7) %% 1000) AS FLOAT) / 1000.0 AS f%d, ' $((j * 7919 + 13)) $j; done | sed 's/, $//') FROM range($ROWS)"
"$bin" query -e "COPY ($gen) TO '$work/features.parquet' STORED AS PARQUET" >/dev/null

models=$work/models
mkdir -p "$models"
cp data/models/linear.onnx "$models/"
ln -s "$(bash scripts/fetch_minilm.sh)" "$models/minilm"
"$bin" query -e "COPY (SELECT id, body FROM 'data/sample/sentences.parquet' WHERE id < $TEXTS) TO '$work/texts.parquet' STORED AS PARQUET" >/dev/null

timed() { # label device sql rows -> wall rows/s, and rows/s inside ONNX Runtime (from --timing)
  local label=$1 device=$2 sql=$3 rows=$4
  local start end log
  log=$work/timing.log
  start=$(date +%s.%N)
  "$bin" --timing --device "$device" --models "$models" query -e "$sql" >/dev/null 2>"$log" || {
    cat "$log" >&2
    return 1
  }
  end=$(date +%s.%N)
  grep -v "^batchinfer: fetching" "$log" | grep "^batchinfer:" >&2 || true
  python3 - "$label" "$start" "$end" "$rows" "$log" <<'PY'
import re, sys
label, start, end, rows, log = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
wall = end - start
inside = re.search(r"([0-9.]+) s inside the model", open(log).read())
model = f"{rows / float(inside.group(1)):14.0f} rows/s of ONNX Runtime time" if inside else ""
print(f"{label:<40} {wall:8.2f} s {rows / wall:14.0f} rows/s {model}")
PY
}

echo "== $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo 'nvidia-smi not found')"
for device in cpu "$DEVICE"; do
  timed "linear, $ROWS rows, $device" "$device" \
    "COPY (SELECT id, predict('linear', $features) AS p FROM '$work/features.parquet') TO '$work/linear-$device.parquet' STORED AS PARQUET" "$ROWS"
  timed "minilm embed, $TEXTS texts, $device" "$device" \
    "COPY (SELECT id, embed('minilm', body) AS v FROM '$work/texts.parquet') TO '$work/embed-$device.parquet' STORED AS PARQUET" "$TEXTS"
done

python3 - "$work" "$DEVICE" <<'EOF'
import sys
import numpy as np
import pyarrow.parquet as pq

work, device = sys.argv[1], sys.argv[2]

def table(name):
    t = pq.read_table(f"{work}/{name}").sort_by("id")
    return t

cpu, gpu = table("linear-cpu.parquet"), table(f"linear-{device}.parquet")
a = cpu.column("p").to_numpy().astype(np.float64)
b = gpu.column("p").to_numpy().astype(np.float64)
worst = np.max(np.abs(a - b) / np.maximum(1.0, np.abs(a)))
print(f"linear: {len(a)} rows, worst |gpu-cpu|/max(1,|cpu|) = {worst:.2e} (limit 1e-3)")
ok = worst <= 1e-3

cpu, gpu = table("embed-cpu.parquet"), table(f"embed-{device}.parquet")
a = np.stack(cpu.column("v").to_numpy(zero_copy_only=False))
b = np.stack(gpu.column("v").to_numpy(zero_copy_only=False))
diff = np.max(np.abs(a - b))
cos = np.min(np.sum(a * b, axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)))
print(f"embed: {len(a)} vectors, max |gpu-cpu| = {diff:.2e} (limit 1e-2), min cosine = {cos:.6f} (limit 0.999)")
ok = ok and diff <= 1e-2 and cos >= 0.999
sys.exit(0 if ok else 1)
EOF

# ONNX Runtime alone on the GPU: the same linear model on tensors already in GPU-visible memory.
if python3 -c "import onnxruntime as o; assert 'CUDAExecutionProvider' in o.get_available_providers()" 2>/dev/null; then
  python3 - "$ROWS" <<'EOF'
import sys, time
import numpy as np
import onnxruntime as ort
rows = int(sys.argv[1])
s = ort.InferenceSession("data/models/linear.onnx", providers=["CUDAExecutionProvider"])
x = np.random.default_rng(1).random((rows, 10), dtype=np.float32)
name = s.get_inputs()[0].name
s.run(None, {name: x[:65536]})
start = time.perf_counter()
for i in range(0, rows, 65536):
    s.run(None, {name: x[i:i + 65536]})
sec = time.perf_counter() - start
print(f"{'ONNX Runtime alone (Python), linear, GPU':<40} {sec:8.2f} s {rows / sec:14.0f} rows/s")
EOF
else
  echo "ONNX Runtime alone on the GPU: skipped (Python onnxruntime-gpu with CUDA not installed)"
fi
