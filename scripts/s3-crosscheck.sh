#!/usr/bin/env bash
# Runs batchinfer's S3 paths against a second S3-compatible server, moto's (from PyPI, in a
# virtualenv of its own under the cache), on a loopback port: models and Parquet read from S3,
# scores written back and re-read, a multipart COPY, an S3 warehouse, and the error messages. The
# tests use s3s; this checks that nothing depends on one server's behaviour.
#
#   scripts/s3-crosscheck.sh             # needs python3 with venv, and PyPI the first time
#
# To run the same checks on another server (MinIO, Ceph, R2 ...): buckets data, models (holding
# churn.onnx, a copy of data/models/linear.onnx) and out; AWS_ENDPOINT_URL, keys and
# AWS_ALLOW_HTTP set; SERVER=external.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=target/release/batchinfer
[ -x "$bin" ] || cargo build --release
cache="${BATCHINFER_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/batchinfer}"
features="f0, f1, f2, f3, f4, f5, f6, f7, f8, f9"
BATCHINFER_WAREHOUSE=$(mktemp -d)
export BATCHINFER_WAREHOUSE
trap 'rm -rf "$BATCHINFER_WAREHOUSE"' EXIT

if [ "${SERVER:-moto}" = moto ]; then
  venv="$cache/moto-venv"
  if [ ! -x "$venv/bin/moto_server" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q "moto[server]==5.2.5" boto3
  fi
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  "$venv/bin/moto_server" -p "$port" >/dev/null 2>&1 &
  server=$!
  trap 'kill $server 2>/dev/null; rm -rf "$BATCHINFER_WAREHOUSE"' EXIT
  export AWS_ACCESS_KEY_ID=test AWS_SECRET_ACCESS_KEY=test AWS_REGION=us-east-1
  export AWS_ENDPOINT_URL="http://127.0.0.1:$port" AWS_ALLOW_HTTP=true
  for _ in $(seq 50); do curl -s "$AWS_ENDPOINT_URL" >/dev/null && break; sleep 0.2; done
  "$venv/bin/python" - <<'EOF'
import os
import boto3
s3 = boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])
for bucket in ["data", "models", "out"]:
    s3.create_bucket(Bucket=bucket)
EOF
fi
run() { "$bin" --format csv "$@"; }
put() { # local file, s3 url: through batchinfer itself (COPY), so no other client is needed
  run query -e "COPY (SELECT * FROM '$1') TO '$2' STORED AS PARQUET" >/dev/null
}
put data/sample/features.parquet s3://data/customers/part-0.parquet
put data/sample/features.parquet s3://data/customers/part-1.parquet
put data/sample/features.parquet s3://data/customers/part-2.parquet
if [ "${SERVER:-moto}" = moto ]; then
  "$cache/moto-venv/bin/python" -c "
import os, boto3
boto3.client('s3', endpoint_url=os.environ['AWS_ENDPOINT_URL']).upload_file('data/models/linear.onnx', 'models', 'churn.onnx')"
fi

fail() { echo "FAILED: $*" >&2; exit 1; }
echo "== score S3 -> S3 with a model from S3"
run query -e "CREATE OR REPLACE MODEL churn FROM 's3://models/churn.onnx'; COPY (SELECT id, predict('churn', $features) AS p FROM 's3://data/customers/') TO 's3://out/scores/' STORED AS PARQUET" >/dev/null
got=$(run query -e "SELECT count(*) AS n, round(sum(p), 2) AS s FROM 's3://out/scores/'" | tail -1)
want=$(run --models data/models query -e "SELECT 3 * count(*) AS n, round(3 * sum(predict('linear', $features)), 2) AS s FROM 'data/sample/features.parquet'" | tail -1)
[ "$got" = "$want" ] || fail "S3 scores $got, local $want"
echo "   $got (rows, sum) as 3x the local file"

echo "== multipart COPY of 2,000,000 generated rows"
gen=$(for j in 0 1 2 3 4 5 6 7 8 9; do printf 'CAST(random() AS FLOAT) AS f%d, ' $j; done | sed 's/, $//')
run --models data/models query -e "COPY (SELECT id, $features, predict('linear', $features) AS score FROM (SELECT value AS id, $gen FROM range(2000000))) TO 's3://out/big/' STORED AS PARQUET" >/dev/null
n=$(run query -e "SELECT count(DISTINCT id) AS n FROM 's3://out/big/'" | tail -1)
[ "$n" = 2000000 ] || fail "re-read $n rows"
echo "   2000000 rows re-read"

echo "== warehouse in S3"
run --warehouse s3://out/wh/ --models data/models query -e "CREATE OR REPLACE TABLE t AS SELECT id, predict('linear', $features) AS p FROM 's3://data/customers/'" >/dev/null
n=$(run --warehouse s3://out/wh/ query -e "SELECT count(*) AS n FROM t" | tail -1)
[ "$n" = 30000 ] || fail "warehouse table has $n rows"
echo "   CREATE TABLE in s3://out/wh/: 30000 rows from another process"

echo "== errors"
err=$("$bin" query -e "SELECT * FROM 's3://no-such-bucket-here/x.parquet'" 2>&1 >/dev/null || true)
echo "$err" | grep -q "does not exist" || fail "missing bucket: $err"
echo "   $err"
err=$("$bin" query -e "SELECT * FROM 's3://data/missing.parquet'" 2>&1 >/dev/null || true)
echo "$err" | grep -q "no object" || fail "missing object: $err"
echo "   $err"
echo "all checks passed against $AWS_ENDPOINT_URL"
