#!/usr/bin/env bash
# What to run on the H200 (device tool), each mode one call of under 10 minutes; results land in $OUT
# (copy them to benchmark_results/ afterwards and re-render README with nanovllm.tools.render_results).
#   bash tests/gpu/run_on_h200.sh checks    # GPU tests: kernels at real sizes, engine vs CPU, logprobs, AWQ
#   bash tests/gpu/run_on_h200.sh quick     # decode attention on bench-like lengths, bench.py bf16
#   bash tests/gpu/run_on_h200.sh tune      # decode launch settings per KV dtype -> nanovllm/attention/tuned/ (copy back)
#   bash tests/gpu/run_on_h200.sh bench     # AWQ GEMM, bench.py bf16/int8/fp8, decode attention
#   bash tests/gpu/run_on_h200.sh awq       # AWQ vs bf16 (TPOT, batch 256), decode profile of the bench workload
#   bash tests/gpu/run_on_h200.sh regress   # regression_test.sh, bench_sharegpt.py
set -o pipefail
cd "$(dirname "$0")/../.."
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/nanovllm-gpu}
mkdir -p "$OUT"
case "${1:-checks}" in
  checks)
    timeout 250 python -m pytest -q -p no:cacheprovider tests/test_gpu.py tests/awq/test_awq.py \
      2>&1 | tee "$OUT/gpu_tests.log" | tail -15
    timeout 200 python -m pytest -q -p no:cacheprovider -n 6 tests/kernels 2>&1 | tee "$OUT/kernel_tests.log" | tail -5
    ;;
  quick)
    timeout 60 python tests/kv_quant/bench_decode_attention.py --batch 256 --context 2048 --context-min 100 \
      2>&1 | tail -3
    cp benchmark_results/kv_int8_cache/decode-attention-b256-c2048-min100.json "$OUT/" 2>/dev/null
    timeout 85 python bench.py --out "$OUT/bench-auto.json" 2>&1 | tail -1
    ;;
  tune)     # bench.py's decode batches: up to 256 sequences of 100 to 2,048 tokens
    timeout 170 python tests/kv_quant/bench_decode_attention.py --batch 256 --context 2048 --context-min 100 \
      --sweep --write
    cp nanovllm/attention/tuned/*.json "$OUT/"
    ;;
  bench)
    timeout 90 python tests/awq/bench_gemm.py --tokens 1 16 64 256 1024 --out "$OUT/awq_gemm.json" --write | tail -1
    cp nanovllm/quant/tuned/*.json "$OUT/" 2>/dev/null     # the AWQ runs below follow the measured winners
    for kv in auto int8 fp8; do
      timeout 85 python bench.py --kv-cache-dtype "$kv" --repeat 3 --out "$OUT/bench-$kv.json" 2>&1 | tail -1
    done
    timeout 35 python tests/kv_quant/bench_decode_attention.py --batch 64 --context 8192 2>&1 | tail -3
    timeout 40 python tests/kv_quant/bench_decode_attention.py --batch 256 --context 2048 --context-min 100 \
      2>&1 | tail -3
    cp benchmark_results/kv_int8_cache/decode-attention-*.json "$OUT/" 2>/dev/null
    ;;
  awq)      # ~4.5 min: both models, TPOT at batch 1 and batch-256 throughput
    timeout 290 python tests/awq/bench_awq_vs_bf16.py --models Qwen3-0.6B Qwen3-8B 2>&1 | tail -4
    cp benchmark_results/quantization_int_4/awq_vs_bf16.json benchmark_results/quantization_int_4/report.md "$OUT/"
    timeout 120 python -m nanovllm.tools.decode_profile --bench-workload \
      --out "$OUT/decode-bench-workload.json" 2>&1 | tail -3
    ;;
  regress)  # A-D took ~150 s on the H200, E (CPU gloo there: one GPU) ~60 s, bench_sharegpt ~40 s per config
    NANOVLLM_REGRESSION_OUT="$OUT/regression" timeout 330 bash regression_test.sh 2>&1 | tee "$OUT/regression.log"
    timeout 240 python bench_sharegpt.py --num-prompts 100 --out "$OUT/sharegpt.json" 2>&1 | tail -6
    ;;
  *) echo "usage: $0 checks|quick|tune|bench|awq|regress"; exit 2 ;;
esac
