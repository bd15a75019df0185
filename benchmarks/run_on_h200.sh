#!/usr/bin/env bash
# What to run on the H200 (device tool), each mode one call of under 10 minutes; results land in $OUT
# (copy them to benchmark_results/ afterwards and re-render README with nanovllm.tools.render_results).
#   bash benchmarks/run_on_h200.sh checks    # GPU tests: engine vs CPU, logprobs, AWQ, architectures (MoE kernels),
#                                             speculative decoding ($CHECKS_TIMEOUT, CHECKS_AWQ=0 without AWQ,
#                                             $CHECKS_FILES instead of the default files)
#   bash benchmarks/run_on_h200.sh kernels   # kernel grid at real sizes (store/prefill/decode x dtypes x KV kinds;
#                                             KERNELS_K="decode" picks tests by name)
#   bash benchmarks/run_on_h200.sh quick     # decode attention on bench-like lengths, bench.py bf16
#   bash benchmarks/run_on_h200.sh tune      # decode launch settings per KV dtype and launch size ($TUNE_KV)
#                                             -> attention/tuned/
#   bash benchmarks/run_on_h200.sh attention # decode attention microbenchmarks (64 x 8k, 256 x 100..2,048,
#                                             bench.py's decode steps by split factor, in CUDA graphs)
#   bash benchmarks/run_on_h200.sh store     # store kernel: a bench prefill step (runs of prompt tokens or not), a decode step
#   bash benchmarks/run_on_h200.sh bench     # bench.py bf16/int8/fp8 (median of 3; $BENCH_KV picks)
#   bash benchmarks/run_on_h200.sh workloads # bench.py --workload short/prefix (+ no cascade)/random/long (+ int8; $WORKLOADS picks),
#                                              median of 3, GPU idle fraction (~8 min on the H200)
#   bash benchmarks/run_on_h200.sh waves     # admission every step against waves ($WAVES: fractions of the seats that
#                                             must be free) on the short workload, 1,024 and 256 seats, median of 3
#                                             (~6 min)
#   bash benchmarks/run_on_h200.sh profile   # decode step profile of bench.py's workload per KV dtype ($PROFILE_KV)
#   bash benchmarks/run_on_h200.sh awq       # AWQ kernel tests, fastest method per shape -> quant/tuned/
#   bash benchmarks/run_on_h200.sh awq-sweep # GEMV settings per shape ($SWEEP_MODELS) + methods -> quant/tuned/
#   bash benchmarks/run_on_h200.sh awq-e2e   # AWQ vs bf16 end to end (both models), decode profile
#   bash benchmarks/run_on_h200.sh regress   # regression_test.sh ($CASES, default all), bench_sharegpt.py
#   bash benchmarks/run_on_h200.sh prefill   # prefill attention on the long/short workloads' steps, per launch setting
#   bash benchmarks/run_on_h200.sh archs     # decode settings at head_dim 64 (-> attention/tuned/), then bench.py on
#                                             dummy Llama-3.1-8B vs Qwen3-8B, Llama-3.2-1B int8 vs bf16 (median of 3,
#                                             ~6 min)
#   bash benchmarks/run_on_h200.sh moe       # dummy Qwen3-30B-A3B: batch-1 TPOT (bench_one.py), bench.py beside Qwen3-8B
#   bash benchmarks/run_on_h200.sh moe-kernels # fused MoE launch settings ($MOE_SETTINGS) and how many pairs skip
#                                             the sort, timed in CUDA graphs; batch-1 decode profile
#   bash benchmarks/run_on_h200.sh runbatch  # run_batch's loop against LLM.generate on the short workload
#   bash benchmarks/run_on_h200.sh interrupt # Ctrl-C 3 s into a long generate returns promptly, the engine answers as before
#   bash benchmarks/run_on_h200.sh codemodel # train the ~76M code model on the stdlib (4 min), then n-gram speculation
#                                             on code-edit prompts at batch 1/8/64/256 (benchmarks/bench_spec.py) and
#                                             the quality table (benchmarks/quality_table.py)
# Several modes run in turn: `bash benchmarks/run_on_h200.sh checks bench`. Any H100/H200 card works; results
# name the card, and tuned files are written per GPU model.
set -o pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD" PYTHONUNBUFFERED=1
# The device tool returns at most 8 files: results are written to a work folder and packed into
# $OUT/results.tgz after every mode, so a call cut off by its time limit still returns the finished modes.
ARCHIVE_DIR=${OUT:-/tmp/nanovllm-gpu}
OUT=$(mktemp -d)
export NANOVLLM_RESULTS="$OUT"   # the scripts' default records (results/...) land in the archive
mkdir -p "$ARCHIVE_DIR"
pack() { tar czf "$ARCHIVE_DIR/results.tgz" -C "$OUT" .; }   # after every run: a call cut off keeps what finished
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader
for mode in "${@:-checks}"; do
case "$mode" in
  checks)
    # engine-level tests first, the AWQ kernels' (the longest) last: a run cut off by its limit has checked the rest
    # (CHECKS_AWQ=0 leaves them out, for a short call when the AWQ code has not changed since they passed)
    # (CHECKS_FILES picks test files, e.g. to split the checks over two calls; the log ends with each test's time)
    timeout ${CHECKS_TIMEOUT:-480} python -m pytest -v -p no:cacheprovider --durations=0 ${CHECKS_FILES:-tests/test_gpu.py \
      tests/test_architectures.py tests/kernels/test_triton_moe.py tests/test_speculative.py \
      $([ "${CHECKS_AWQ:-1}" = 0 ] || echo tests/awq)} 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "PASSED|FAILED|ERROR|passed|failed" | tail -15
    ;;
  kernels)
    timeout 280 python -m pytest -q -p no:cacheprovider -n 6 tests/kernels ${KERNELS_K:+-k "$KERNELS_K"} 2>&1 | tee "$OUT/kernel_tests.log" | tail -5
    ;;
  quick)
    timeout 60 python benchmarks/bench_decode_attention.py --batch 256 --context 2048 --context-min 100 \
      2>&1 | tail -3
    timeout 85 python bench.py --out "$OUT/bench-auto.json" 2>&1 | tail -1
    ;;
  tune)     # bench.py's decode steps timed in CUDA graphs per setting and split factor (~2 min for 3 dtypes)
    timeout 300 python benchmarks/bench_decode_steps.py --kv-cache-dtype ${TUNE_KV:-auto int8 fp8} \
      --splits 1 2 8 --settings 128/4/2 64/2/3 64/4/2 64/2/2 128/2/3 128/2/2 --long 64x8192 \
      --out "$OUT/decode-steps.json" --write \
      2>&1 | grep -v '"step"' | cut -c1-400
    cp nanovllm/attention/tuned/*.json "$OUT/"
    ;;
  bench)
    for kv in ${BENCH_KV:-auto int8 fp8}; do
      timeout 100 python bench.py --kv-cache-dtype "$kv" --repeat 3 --out "$OUT/bench-$kv.json" 2>&1 | tail -1
      pack
    done
    ;;
  workloads)
    # $WORKLOADS picks some, e.g. WORKLOADS="short;prefix --no-enable-cascade-attention"
    IFS=';' read -ra specs <<< "${WORKLOADS:-short;prefix;prefix --no-enable-cascade-attention;random;random --kv-cache-dtype int8;long;long --kv-cache-dtype int8}"
    for spec in "${specs[@]}"; do
      name=$(echo "$spec" | tr ' ' '_' | tr -d '-')
      timeout 200 python bench.py --workload $spec --repeat 3 --profile --out "$OUT/bench-$name.json" 2>&1 | tail -1 \
        | cut -c1-300
      pack
    done
    ;;
  waves)   # issue 37: admission in every step (0) against bounded waves, the same engine defaults otherwise
    # (random and prefix hold at most 512 requests: every one is admitted at once under the default 1,024 seats)
    for seats in 1024 256; do
      for wave in ${WAVES:-0 0.125 0.25 0.5}; do
        timeout 150 python bench.py --workload short --max-num-seqs $seats --admission-wave $wave --repeat 3 \
          --out "$OUT/bench-short-seats$seats-wave$wave.json" 2>&1 | tail -1 | cut -c1-300
        pack
      done
    done
    ;;
  attention)
    timeout 35 python benchmarks/bench_decode_attention.py --batch 64 --context 8192 2>&1 | tail -3
    timeout 40 python benchmarks/bench_decode_attention.py --batch 256 --context 2048 --context-min 100 \
      2>&1 | tail -3
    timeout 90 python benchmarks/bench_decode_steps.py 2>&1 | grep -v '"step"' | cut -c1-300
    ;;
  store)
    timeout 60 python benchmarks/bench_store.py 2>&1 | tail -7 | cut -c1-160
    ;;
  awq)      # ~3 min: AWQ kernel tests at real sizes, the fastest method per shape and token count -> quant/tuned/
    timeout 150 python -m pytest -q -p no:cacheprovider tests/awq 2>&1 | tee "$OUT/awq_tests.log" | tail -3
    timeout 150 python benchmarks/bench_gemm.py --models 8B 0.6B --tokens 1 2 4 8 16 64 128 256 1024 \
      --out "$OUT/awq_gemm.json" --write | cut -c1-400
    cp nanovllm/quant/tuned/*.json "$OUT/" 2>/dev/null
    ;;
  awq-sweep)  # ~15 s per shape and token count swept (1-2 tokens: the GEMV's), ~90 s the rest; -> quant/tuned/
    timeout 250 python benchmarks/bench_gemm.py --models ${SWEEP_MODELS:-8B 0.6B} --tokens 1 2 --sweep-gemv \
      --out "$OUT/awq_gemm-sweep.json" | cut -c1-400
    timeout 150 python benchmarks/bench_gemm.py --models 8B 0.6B --tokens 4 8 16 64 128 256 1024 \
      --out "$OUT/awq_gemm-rest.json" | cut -c1-400
    python benchmarks/bench_gemm.py --from "$OUT/awq_gemm-sweep.json" "$OUT/awq_gemm-rest.json" \
      --out "$OUT/awq_gemm.json" --write | tail -c 300
    cp nanovllm/quant/tuned/*.json "$OUT/" 2>/dev/null
    ;;
  awq-e2e)  # ~5 min: both models' TPOT at batch 1 and batch-256 throughput (follows quant/tuned/), profile
    timeout 290 python benchmarks/bench_awq_vs_bf16.py --models Qwen3-0.6B Qwen3-8B 2>&1 | tail -4
    timeout 120 python -m nanovllm.tools.decode_profile --bench-workload \
      --out "$OUT/decode-bench-workload.json" 2>&1 | tail -3
    ;;
  profile)  # decode steps of the bench workload per KV cache dtype ($PROFILE_KV): where each step's time goes
    for kv in ${PROFILE_KV:-auto int8 fp8}; do
      timeout 120 python -m nanovllm.tools.decode_profile --bench-workload --kv-cache-dtype "$kv" \
        --out "$OUT/decode-bench-workload-$kv.json" 2>&1 | tail -2
    done
    ;;
  regress)  # A-D took ~150 s on the H200, E (CPU gloo there: one GPU) ~60 s, bench_sharegpt ~40 s per config
    NANOVLLM_REGRESSION_OUT="$OUT/regression" timeout 370 bash regression_test.sh $CASES 2>&1 | tee "$OUT/regression.log"
    timeout 200 python bench_sharegpt.py --num-prompts 100 --out "$OUT/sharegpt.json" 2>&1 | tail -6
    ;;
  prefill)
    timeout 150 python benchmarks/bench_prefill_attention.py --settings default 128/64/8/3 128/128/8/3 64/64/4/3 \
      --out "$OUT/prefill-attention.json" 2>&1 | grep -v '"gpu"' | cut -c1-200
    ;;
  archs)
    # head_dim 64 (Llama-3.2-1B) gets its own decode launch settings first (-> attention/tuned/, by_head_dim)
    timeout 200 python benchmarks/bench_decode_steps.py --model Llama-3.2-1B --kv-cache-dtype auto int8 \
      --splits 1 2 8 --settings 64/2/3 128/2/3 128/4/2 256/4/2 256/8/2 256/4/3 --long 64x8192 \
      --out "$OUT/decode-steps-head-dim-64.json" --write 2>&1 | grep -v '"step"' | cut -c1-400
    cp nanovllm/attention/tuned/*.json "$OUT/"
    # and the prefill kernel's tiles at head_dim 64 (prefill_settings: 64 keys; a quantized cache takes 128 only
    # at head_dim 128, as measured there)
    timeout 60 python benchmarks/bench_prefill_attention.py --model Llama-3.2-1B --kv-cache-dtype auto int8 \
      --steps "12k+4.4k fresh" "64 x 250" --settings default 64/128/4/2 64/128/4/3 \
      --out "$OUT/prefill-attention-head-dim-64.json" 2>&1 | cut -c1-200
    pack
    # the 1B pair first (a minute): a call cut off by its limit still has one of the two comparisons
    for spec in "Llama-3.2-1B" "Llama-3.2-1B --kv-cache-dtype int8" "Qwen3-8B" "Llama-3.1-8B"; do
      name=$(echo "$spec" | tr ' ' '_' | tr -d '-')
      timeout 150 python bench.py --model $spec --repeat 3 --profile --out "$OUT/bench-$name.json" 2>&1 | tail -1 \
        | cut -c1-300
      pack
    done
    ;;
  moe-kernels)   # fused MoE launch settings at Qwen3-30B-A3B's sizes ($MOE_SETTINGS), batch-1 decode profile
    # decode (1-2 tokens): down_sum=... fuses the down GEMM and the top_k sum, down=... runs them apart
    timeout 200 python benchmarks/bench_moe.py --tokens 1 2 4 8 64 256 --settings default per_pair=32 per_pair=64 \
      ${MOE_SETTINGS:-down=64/64/4/3 down_sum=8/256/4/3 down_sum=16/128/4/4 down_sum=32/256/4/3 \
      down_sum=16/256/8/3 down_sum=16/256/2/4 gate_up=16/64/4/3,down=32/64/4/3 \
      gate_up=32/128/4/3,down=64/128/4/3 gate_up=32/128/4/4,down=64/128/4/4 gate_up=64/128/4/3,down=64/128/4/3 \
      gate_up=32/256/4/3,down=64/256/4/2 gate_up=16/128/2/4,down=32/128/2/4 gate_up=32/64/2/5,down=64/64/2/5 \
      gate_up=64/64/4/4,down=128/64/4/4 gate_up=16/256/4/3,down=32/256/4/3} \
      --out "$OUT/moe-kernels.json" 2>&1 | grep -E '^\{"best"|error' | cut -c1-3000
    pack
    timeout 150 python -m nanovllm.tools.decode_profile --model nanovllm/configs/Qwen3-30B-A3B --num-seqs 1 \
      --prompt-len 128 --steps 50 --top 16 --out "$OUT/decode-qwen3-30b-a3b-batch1.json" 2>&1 | tail -1 | cut -c1-1500
    ;;
  moe)
    timeout 200 python benchmarks/bench_one.py --model Qwen3-30B-A3B --weights bf16 --num-seqs 0 \
      --out "$OUT/tpot-qwen3-30b-a3b.json" 2>&1 | tail -1
    pack
    timeout 250 python bench.py --model Qwen3-30B-A3B --out "$OUT/bench-qwen3-30b-a3b.json" 2>&1 | tail -1 | cut -c1-300
    pack
    # issue 40 compares it with dummy Qwen3-8B measured in the same call
    timeout 130 python bench.py --model Qwen3-8B --out "$OUT/bench-qwen3-8b.json" 2>&1 | tail -1 | cut -c1-300
    ;;
  runbatch)
    timeout 200 python benchmarks/bench_run_batch.py --out "$OUT/run-batch-short.json" 2>&1 | tail -1
    ;;
  interrupt)   # issue 44: SIGINT 3 s into the short workload, then the same greedy tokens as before it
    timeout 120 python benchmarks/check_interrupt.py --out "$OUT/interrupt.json" 2>&1 | grep -v rejected | tail -3
    ;;
  codemodel)   # the weights stay on the machine: measured in the same call (training $CODE_MINUTES, default 4)
    timeout 330 python -m nanovllm.demo.train_code --minutes ${CODE_MINUTES:-4} --out /tmp/code-qwen3 2>&1 | tail -2
    cp /tmp/code-qwen3/training.json /tmp/code-qwen3/training.png "$OUT/" 2>/dev/null
    pack     # each step packed: a call cut off by its limit keeps what finished
    timeout 150 python benchmarks/bench_spec.py --model /tmp/code-qwen3 --out "$OUT/spec-code-edit.json" 2>&1 \
      | grep -v INFO | cut -c1-300
    pack
    timeout 120 python benchmarks/quality_table.py --model /tmp/code-qwen3 --out "$OUT/quality-code-model.json" 2>&1 \
      | grep -v INFO | cut -c1-300
    ;;
  *) echo "usage: $0 MODE... (checks kernels quick tune attention store bench workloads profile awq awq-sweep awq-e2e"\
       "regress prefill archs moe moe-kernels runbatch interrupt codemodel waves)"; exit 2 ;;
esac
pack
done
