#!/usr/bin/env bash
# Run hmgstore's GPU checks and benchmarks on a GPU machine (a cloud VM) (no registry there).
#   bash benchmarks/run_gpu.sh STAGE...     stages: env gpu-tests gpu-tests-split multigpu-tests tests tests-all tests-fixed probe probe-kernel tune bench bench-quick
#                                          reach reach-quick compress compress-quick compress-split locality fuse
#                                          example-loss nccl-net compress-100 (2 x H200) producer-tests ipc-shm gpu-share train-sms-sweep train-final train-int8 train-proc train-proc-128 train-proc-sms train-proc-mps
#                                          sample sample-papers hotness gather-host split split-tests train pyg
#                                          topology-tests probe-topology probe-rows-small remote-train soak dma-misses step-pages strong-mps producer-mps-papers producer-priority sampler-stream; peer-rows scale scale-papers papers-a papers-b two-machines (2+ GPUs)
#                                          multi (2+ GPUs: the multigpu tests of tests/test_sharded.py, test_distributed.py,
#                                          test_examples.py, test_bench.py, and the CPU tests of those) peer multi-pyg
# Logs and results go under $OUT (or ./bench-out). Wheels that the GPU image lacks
# (torch_sparse/scatter, dgl, ogb) are taken from .whl/ when present (see README).
set -u
OUT=${OUT:-bench-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || { cat "$OUT/install.log"; exit 1; }
status=0
# A user-level MPS daemon for the stages that run a producer process beside the trainer (no GPU setting changed)
mps_start() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  nvidia-cuda-mps-control -d || { echo "MPS daemon did not start"; return 1; }
}
mps_stop() { echo quit | nvidia-cuda-mps-control; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY; }
# bench train on the papers-shaped graph (GRAPH overrides it) with 20% of the features as int8 rows, topology and
# labels on the GPU: the cached configuration the producer stages compare
papers_cached="--graph ${GRAPH:-papers:111M:1.6B} --cache 0.2 --compress int8 --topology-cache 1.0 --labels-on-gpu --batches 60 --no-progress"
for stage in "$@"; do
  echo "=== $stage $(date -u +%FT%TZ)"
  case $stage in
    env) rc=0; nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv
         python3 -c 'import torch, cupy; print("torch", torch.__version__, "cupy", cupy.__version__, "gpus", torch.cuda.device_count())' ;;
    gpu-tests) timeout 420 python3 -m pytest -q -rfE -p no:cacheprovider -m "gpu and not multigpu" tests >"$OUT/gpu-tests.log" 2>&1; rc=$?
         grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu-tests.log" | tail -30 ;;
    # The same suite spread over every GPU of the machine, one pytest per GPU (SHARDS=3: three, dealt over the
    # GPUs; on one H200 three side by side take 2 min instead of 5), test files dealt out in turn
    gpu-tests-split) gpus=$(nvidia-smi -L | wc -l); n=${SHARDS:-$gpus}; files=(tests/test_*.py); pids=""
         for ((g = 0; g < n; g++)); do
           mine=(); for ((i = g; i < ${#files[@]}; i += n)); do mine+=("${files[$i]}"); done
           CUDA_VISIBLE_DEVICES=$((g % gpus)) timeout 420 python3 -m pytest -q -rfE -p no:cacheprovider -m "gpu and not multigpu" \
             "${mine[@]}" >"$OUT/gpu-tests-$g.log" 2>&1 & pids="$pids $!"
         done
         rc=0; for pid in $pids; do wait $pid || rc=1; done
         for ((g = 0; g < n; g++)); do grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu-tests-$g.log" | tail -15; done ;;
    multigpu-tests) timeout ${LIMIT:-400} python3 -m pytest -q -rfE -p no:cacheprovider -m multigpu tests \
         >"$OUT/gpu-tests-multigpu.log" 2>&1; rc=$?; grep -E "passed|failed|FAILED|ERROR" "$OUT/gpu-tests-multigpu.log" | tail -15 ;;
    probe-split) timeout 400 python3 benchmarks/probes/probe_split.py --gb 2 8 40 --row-bytes 512 128 >"$OUT/probe_split.log" 2>&1; rc=$?; tail -3 "$OUT/probe_split.log" ;;
    probe-sorted) timeout 200 python3 benchmarks/probes/probe_sorted.py --gb 2 --row-bytes 128 512 --profile "$OUT/profile" >"$OUT/probe_sorted.json" \
                    2>"$OUT/probe_sorted.log"; rc=$?; cat "$OUT/probe_sorted.json"; tail -3 "$OUT/probe_sorted.log" ;;
    probe-fork) timeout 200 python3 benchmarks/probes/probe_fork.py >"$OUT/probe_fork.json" 2>"$OUT/probe_fork.log"; rc=$?
                cat "$OUT/probe_fork.log" ;;
    probe-split-loop-cuda) timeout 300 python3 benchmarks/probes/probe_split_loop.py --backing cuda \
                        >"$OUT/probe_split_loop_cuda.json" 2>"$OUT/probe_split_loop_cuda.log"; rc=$?
                        tail -8 "$OUT/probe_split_loop_cuda.log" ;;
    probe-split-loop) timeout 300 python3 benchmarks/probes/probe_split_loop.py >"$OUT/probe_split_loop.json" \
                        2>"$OUT/probe_split_loop.log"; rc=$?; tail -8 "$OUT/probe_split_loop.log" ;;
    probe-split-loop-128) timeout 300 python3 benchmarks/probes/probe_split_loop.py --row-bytes 128 \
                        >"$OUT/probe_split_loop_128.json" 2>"$OUT/probe_split_loop_128.log"; rc=$?
                        tail -8 "$OUT/probe_split_loop_128.log" ;;
    split-tests) timeout 300 python3 -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_split.py >"$OUT/split-tests.log" 2>&1
         rc=$?; grep -E "passed|failed|FAILED|ERROR|Error" "$OUT/split-tests.log" | tail -30 ;;
    split) timeout 560 python3 -m hmgstore.bench gather --row-bytes 128 512 --variants hmg_owned hmg_split cpu_pinned \
             --sweep-gb 8 40 --reps 10 --slow-reps 5 --out "$OUT/split" 2>"$OUT/split.log"; rc=$?; grep -A12 "^Split" "$OUT/split.log"
           timeout 300 python3 -m hmgstore.bench gather --row-bytes 128 512 --variants hmg_split --sweep-gb 40 \
             --split-threads 4 --slow-reps 5 --out "$OUT/split-4" 2>"$OUT/split-4.log"; grep -A12 "^Split" "$OUT/split-4.log" ;;
    sample) timeout 300 python3 -m hmgstore.bench sample --out "$OUT/sample" 2>"$OUT/sample.log"; rc=$?; tail -3 "$OUT/sample.log" ;;
    train) timeout 300 python3 -m hmgstore.bench train --out "$OUT/train" 2>"$OUT/train.log"; rc=$?; tail -4 "$OUT/train.log"
           timeout 150 python3 -m hmgstore.bench train --configs cache+pipe host+pipe --max-sms 32 --out "$OUT/train-sm32" \
             2>"$OUT/train-sm32.log"; tail -4 "$OUT/train-sm32.log" ;;
    hotness) timeout 420 python3 benchmarks/research hotness --out "$OUT/hotness" 2>"$OUT/hotness.log"; rc=$?
             tail -12 "$OUT/hotness.log" ;;
    gather-host) timeout 560 python3 -m hmgstore.bench gather --row-bytes 128 256 512 1024 4096 --reps 10 --slow-reps 3 \
                   --out "$OUT/gather" 2>"$OUT/gather.log"; rc=$?; tail -2 "$OUT/gather.log" ;;
    sample-papers) timeout 420 python3 -m hmgstore.bench sample --graphs 111M:1.6B --variants hmg_gpu hmg_host hmg_cache \
                     --batches 10 --out "$OUT/sample-papers" 2>"$OUT/sample-papers.log"; rc=$?; tail -3 "$OUT/sample-papers.log" ;;
    tests) python3 -m pytest -q -m gpu tests/test_tensor.py tests/test_memory.py >"$OUT/tests.log" 2>&1; rc=$?; tail -25 "$OUT/tests.log" ;;
    tests-all) python3 -m pytest -q tests >"$OUT/tests-all.log" 2>&1; rc=$?; tail -40 "$OUT/tests-all.log" ;;
    probe) python3 benchmarks/probes/probe_host_pages.py --out "$OUT/probe" 2>&1; rc=$? ;;
    probe-kernel) python3 benchmarks/probes/probe_kernel.py --out "$OUT/probe-kernel" 2>&1; rc=$? ;;
    tune) python3 benchmarks/probes/tune_gather.py --out "$OUT/tune" 2>&1; rc=$? ;;
    bench) python3 -m hmgstore.bench gather --out "$OUT/gather" 2>"$OUT/gather.log"; rc=$? ;;
    bench-quick) python3 -m hmgstore.bench gather --sweep-gb --row-bytes 128 512 4096 --out "$OUT/gather" 2>"$OUT/gather.log"; rc=$? ;;
    pyg) mkdir -p "$OUT/pyg"; rc=0
         # stock PyG (x on the CPU, PyG's CPU sampler); hmgstore (features and topology from pinned host memory,
         # GPU sampler); hmgstore with 2 GB of hot features; x and topology whole on the GPU (the ceiling)
         for mode in cpu:pyg hmgstore:hmgstore hmgstore-2GB:hmgstore gpu:hmgstore; do
           features=${mode%%:*}; sampler=${mode##*:}; extra=""; [ "$features" = hmgstore-2GB ] && extra="--gpu-budget 2GB"
           timeout 300 python3 examples/pyg_graphsage.py --dataset synthetic --num-nodes 2000000 --feat-dim 1024 --epochs 2 \
             --max-batches 15 --no-progress --features "${features%%-*}" --sampler "$sampler" $extra \
             --json "$OUT/pyg/pyg_${features}_${sampler}.json" 2>&1 | tail -1 || rc=1
         done ;;
    pyg-pipe) mkdir -p "$OUT/pyg"; rc=0  # the example as make run runs it on a GPU: sampler + pipeline
         for budget in none 2GB; do
           extra=""; [ "$budget" = 2GB ] && extra="--gpu-budget 2GB --topology-budget 64MB"
           timeout 120 python3 examples/pyg_graphsage.py --dataset synthetic --num-nodes 2000000 --feat-dim 1024 \
             --epochs 2 --max-batches 40 --no-progress $extra --json "$OUT/pyg/pyg_pipeline_$budget.json" 2>&1 | tail -1 || rc=1
         done ;;
    multi) nvidia-smi topo -m; df -h /dev/shm
           timeout ${LIMIT:-300} python3 -m pytest -q -s -rs -rfE tests/test_sharded.py tests/test_distributed.py tests/test_bench.py \
             tests/test_examples.py::test_two_cpu_processes tests/test_examples.py::test_says_how_to_start_it_without_torchrun \
             tests/test_examples.py::test_every_gpu_of_the_node \
             >"$OUT/multi.log" 2>&1; rc=$?; grep -v '^ *"' "$OUT/multi.log" | tail -40 ;;
    peer) timeout ${LIMIT:-300} python3 -m hmgstore.bench peer --out "$OUT/peer" 2>"$OUT/peer.log"; rc=$?; tail -5 "$OUT/peer.log" ;;
    multi-pyg) mkdir -p "$OUT/pyg"
           torchrun --standalone --nproc-per-node "$(nvidia-smi -L | wc -l)" examples/multi_gpu_pyg.py --num-nodes 2000000 \
             --feat-dim 512 --gpu-budget 512MB --replicate 128MB --epochs 1 --max-batches 30 --no-progress \
             --json "$OUT/pyg/multi_gpu_pyg.json" >"$OUT/multi-pyg.log" 2>&1; rc=$?; tail -30 "$OUT/multi-pyg.log" ;;
    reach) timeout 560 python3 benchmarks/research reach --no-progress --out "$OUT/reach" 2>"$OUT/reach.log"; rc=$?
           tail -40 "$OUT/reach.log" ;;
    reach-quick) timeout 200 python3 benchmarks/research reach --table-gb 4 --pages 16 256 1024 2048 --no-progress \
                   --out "$OUT/reach" 2>"$OUT/reach.log"; rc=$?; tail -30 "$OUT/reach.log" ;;
    compress) timeout 560 python3 benchmarks/probes/probe_compress.py >"$OUT/probe_compress.json" 2>"$OUT/probe_compress.log"
              rc=$?; cat "$OUT/probe_compress.log" ;;
    compress-quick) timeout 200 python3 benchmarks/probes/probe_compress.py --gb 2 --row-bytes 128 512 --reps 5 \
                      >"$OUT/probe_compress.json" 2>"$OUT/probe_compress.log"; rc=$?; cat "$OUT/probe_compress.log" ;;
    compress-split) timeout 560 python3 benchmarks/probes/probe_compress.py --gb 40 --formats int8 bfloat16 --split \
                      --rows-sweep 125000 250000 1000000 2000000 4000000 \
                      >"$OUT/probe_compress_split.json" 2>"$OUT/probe_compress_split.log"; rc=$?
                    cat "$OUT/probe_compress_split.log" ;;
    locality) timeout 560 python3 benchmarks/probes/probe_locality.py >"$OUT/probe_locality.json" 2>"$OUT/probe_locality.log"
              rc=$?; cat "$OUT/probe_locality.log" ;;
    fuse) timeout 560 python3 benchmarks/probes/probe_fuse.py >"$OUT/probe_fuse.json" 2>"$OUT/probe_fuse.log"; rc=$?
          cat "$OUT/probe_fuse.log" ;;
    producer-tests) timeout 400 python3 -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_producer.py tests/test_pipeline.py \
                      >"$OUT/producer-tests.log" 2>&1; rc=$?; tail -15 "$OUT/producer-tests.log" ;;
    ipc-shm) timeout 120 python3 benchmarks/probes/probe_ipc_shm.py 2>&1; rc=$? ;;
    gpu-share) rc=0; command -v nvidia-cuda-mps-control || echo "no nvidia-cuda-mps-control on PATH"  # what can bound a share
               python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "green contexts:",
                 hasattr(torch.cuda, "green_contexts"))' ;;
    train-proc) timeout 560 python3 -m hmgstore.bench train --configs all_gpu+pipe all_gpu+proc cache+pipe cache+proc \
                  --no-progress --out "$OUT/train-proc" 2>"$OUT/train-proc.log"; rc=$?; tail -14 "$OUT/train-proc.log" ;;
    train-proc-128) timeout 560 python3 -m hmgstore.bench train --feat-dim 128 --configs all_gpu+pipe all_gpu+proc cache+pipe \
                      cache+proc --no-progress --out "$OUT/train-proc-128" 2>"$OUT/train-proc-128.log"; rc=$?
                    tail -14 "$OUT/train-proc-128.log" ;;
    train-proc-sms) rc=0; for sms in ${SMS:-16 48}; do  # the gathers' SM cap, in the thread and in the producer
                      timeout 280 python3 -m hmgstore.bench train --configs cache+pipe cache+proc --max-sms $sms --no-progress \
                        --out "$OUT/train-proc-sms$sms" 2>"$OUT/train-proc-sms$sms.log" || rc=1; tail -6 "$OUT/train-proc-sms$sms.log"
                    done ;;
    train-sms-sweep) rc=0  # the thread pipeline's gather cap against none, on the 1024-d and the 128-d graphs
                     for spec in ${SWEEP:-1024:8 1024:24 128:16 128:64}; do set -- ${spec/:/ }
                       timeout 200 python3 -m hmgstore.bench train --feat-dim $1 --configs ${CONFIGS:-all_gpu+pipe cache+pipe} --max-sms $2 \
                         --no-progress --out "$OUT/train-sms-$1-$2" 2>"$OUT/train-sms-$1-$2.log" || rc=1
                       grep -E "^\| (all_gpu|cache)" "$OUT/train-sms-$1-$2.log"
                     done ;;
    train-final) rc=0  # the defaults (gathers capped at auto_sms), uncapped beside them, then under MPS at 10%
                 run() { timeout 240 python3 -m hmgstore.bench train --no-progress "$@" 2>"$OUT/last.log" || rc=1
                         grep -E "^\| (all_gpu|cache)|target" "$OUT/last.log"; }
                 echo "-- 1024-d"; run --configs all_gpu+pipe cache+pipe cache+proc --out "$OUT/final-1024"
                 echo "-- 1024-d, uncapped"; run --configs cache+pipe --max-sms none --out "$OUT/final-1024-none"
                 echo "-- 128-d"; run --feat-dim 128 --configs all_gpu+pipe cache+pipe cache+proc --out "$OUT/final-128"
                 export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
                 mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
                 if nvidia-cuda-mps-control -d; then
                   echo "-- MPS, 1024-d"; run --configs all_gpu+pipe cache+proc --sm-percent 10 --out "$OUT/final-mps-1024"
                   echo "-- MPS, 128-d"; run --feat-dim 128 --configs all_gpu+pipe cache+proc --sm-percent 10 --out "$OUT/final-mps-128"
                   echo quit | nvidia-cuda-mps-control
                 else echo "MPS daemon did not start"; rc=1; fi
                 unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
                 find "$OUT" -name 'train.png' -delete; find "$OUT" -name 'train.md' -delete; rm -f "$OUT/last.log" ;;
    train-int8) rc=0  # the 1024-d graph's cache stored as int8 rows (4x fewer host bytes): thread, producer, MPS
                run() { timeout 270 python3 -m hmgstore.bench train --no-progress --compress int8 "$@" 2>"$OUT/last.log" || rc=1
                        grep -E "^\| (all_gpu|cache)|target" "$OUT/last.log"; }
                echo "-- 1024-d, int8"; run --configs all_gpu+pipe cache+pipe cache+proc --out "$OUT/int8-1024"
                export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
                mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
                if nvidia-cuda-mps-control -d; then
                  echo "-- MPS, 1024-d, int8"; run --configs all_gpu+pipe cache+proc --sm-percent 10 --out "$OUT/int8-mps-1024"
                  echo quit | nvidia-cuda-mps-control
                else echo "MPS daemon did not start"; rc=1; fi
                unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
                find "$OUT" -name 'train.png' -delete; find "$OUT" -name 'train.md' -delete; rm -f "$OUT/last.log" ;;
    remote-train) timeout 300 python3 benchmarks/research remote --what train --device cpu --no-progress \
                    --out "$OUT/remote-train" 2>"$OUT/remote-train.log"; rc=$?; tail -8 "$OUT/remote-train.log"
                  rm -f "$OUT/remote-train/remote.png" ;;
    train-graphs) rc=0  # the sampler's CUDA-graph replays in the pipeline thread against eager launches
                  run() { timeout 200 python3 -m hmgstore.bench train --no-progress "$@" 2>"$OUT/last.log" || rc=1
                          grep -E "^\| (all_gpu|cache)|target" "$OUT/last.log"; }
                  for g in on off; do
                    echo "-- 1024-d, graphs $g"; run --configs all_gpu+pipe cache+pipe --sampler-graphs $g --out "$OUT/graphs-$g-1024"
                    echo "-- 128-d, graphs $g"; run --feat-dim 128 --configs all_gpu+pipe cache+pipe --sampler-graphs $g --out "$OUT/graphs-$g-128"
                  done
                  find "$OUT" -name 'train.png' -delete; find "$OUT" -name 'train.md' -delete; rm -f "$OUT/last.log" ;;
    train-proc-mps) rc=0  # a user-level MPS daemon for this run only (no GPU setting changes); stopped at the end
                    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
                    mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
                    if nvidia-cuda-mps-control -d; then
                      for pct in ${MPS_PCTS:-100 30}; do
                        timeout 280 python3 -m hmgstore.bench train --feat-dim ${FEAT:-1024} --configs ${MPS_CONFIGS:-all_gpu+pipe cache+pipe cache+proc} --sm-percent $pct ${EXTRA:-} \
                          --no-progress --out "$OUT/train-proc-mps$pct" 2>"$OUT/train-proc-mps$pct.log" || rc=1
                        tail -8 "$OUT/train-proc-mps$pct.log"
                      done
                      echo quit | nvidia-cuda-mps-control; cp -r $CUDA_MPS_LOG_DIRECTORY "$OUT/mps-log"
                    else echo "MPS daemon did not start"; rc=1; fi
                    unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY ;;
    nccl-net) mkdir -p /tmp/nccl  # one machine per GPU over NCCL, made to take the network path (no P2P, no shared memory)
              NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_DEBUG=INFO NCCL_DEBUG_FILE=/tmp/nccl/%h.%p.log timeout 300 \
                python3 -m pytest -q -rfE -p no:cacheprovider -m multigpu tests/test_cluster.py >"$OUT/nccl-net.log" 2>&1; rc=$?
              cat /tmp/nccl/*.log | grep -oE "via (NET|P2P|SHM)[^ ]*|Using network [A-Za-z]+" | sort | uniq -c >>"$OUT/nccl-net.log"
              tail -8 "$OUT/nccl-net.log" ;;
    compress-100) timeout ${TIMEOUT:-300} python3 benchmarks/probes/probe_compress.py --gb 100 --row-bytes 512 128 --formats int8 --reps 5 \
                    >"$OUT/probe_compress_100.json" 2>"$OUT/probe_compress_100.log"; rc=$?; tail -30 "$OUT/probe_compress_100.log" ;;
    example-loss) rc=0  # make run's example on a GPU, its loss read every step (as before) and every 25 steps
                  timeout 200 python3 -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_examples.py >"$OUT/example-tests.log" 2>&1 || rc=1
                  tail -2 "$OUT/example-tests.log"
                  for every in 1 25; do
                    timeout 200 python3 examples/pyg_graphsage.py --dataset synthetic --num-nodes 2000000 --feat-dim 1024 \
                      --epochs 2 --max-batches 60 --no-progress --loss-every $every --json "$OUT/pyg-loss-every-$every.json" 2>&1 | tail -1 || rc=1
                  done ;;
    tests-fixed) python3 -m pytest -q tests/test_dgl_compat.py tests/test_pyg_graph_store.py tests/test_pyg_feature_store.py \
                   tests/test_pyg_loaders.py 2>&1 | tail -5; rc=${PIPESTATUS[0]} ;;
    topology-tests) timeout 400 python3 -m pytest -q -rfE -p no:cacheprovider -m "gpu and not multigpu" tests/test_distributed.py \
                      tests/test_graph_sampler.py tests/test_pyg_sampler.py tests/test_table.py >"$OUT/topology-tests.log" 2>&1; rc=$?
                    grep -E "passed|failed|FAILED|ERROR" "$OUT/topology-tests.log" | tail -20 ;;
    probe-topology) timeout 500 python3 benchmarks/probes/probe_topology_chunks.py >"$OUT/probe_topology.json" 2>"$OUT/probe_topology.log"
                    rc=$?; tail -8 "$OUT/probe_topology.log" ;;
    probe-rows-small) timeout 400 python3 benchmarks/probes/probe_rows_small.py --table-gib 2 >"$OUT/probe_rows_small.json" \
                        2>"$OUT/probe_rows_small.log"; rc=$?; tail -6 "$OUT/probe_rows_small.log" ;;
    peer-rows) timeout 560 python3 benchmarks/probes/probe_peer_rows.py --out "$OUT/peer-rows" >"$OUT/peer-rows.json" \
                 2>"$OUT/peer-rows.log"; rc=$?; grep "ROWS=" "$OUT/peer-rows.log"; tail -3 "$OUT/peer-rows.log" ;;
    scale) timeout ${LIMIT:-500} python3 -m hmgstore.bench scale --gpus ${GPUS:-1 $(nvidia-smi -L | wc -l)} --num-nodes 2M \
             --epochs 2 --max-batches ${BATCHES:-100} ${EXTRA:-} --out "$OUT/scale" >"$OUT/scale.log" 2>&1; rc=$?
           tail -12 "$OUT/scale.log" ;;
    # Two machines simulated on one host of 2 or 4 GPUs (half the GPUs each, HMGSTORE_NODE_ID apart: separate
    # node-shared memory, NCCL between them) against one machine of every GPU, same graph, global batch and seed
    # (NODES nodes, 128-d)
    two-machines) rc=0; n=${NODES:-500000}; parts=/tmp/hmg-parts; rm -rf $parts; g=$(nvidia-smi -L | wc -l); h=$((g / 2))
         for m in 1 2; do
           python3 -m hmgstore.cli.partition $parts/m$m --parts $m --by hash --synthetic $n --feat-dim 128 --no-progress \
             >"$OUT/partition-$m.log" 2>&1 || { rc=1; tail -5 "$OUT/partition-$m.log"; }
         done
         opts="--epochs ${EPOCHS:-3} --batch-size 4096 --no-progress"
         timeout ${LIMIT:-200} torchrun --standalone --nproc-per-node $g examples/multi_node_pyg.py $parts/m1 $opts \
           --json "$OUT/one-machine.json" >"$OUT/one-machine.log" 2>&1 || rc=1; tail -2 "$OUT/one-machine.log"
         pids=""
         for node in 0 1; do
           HMGSTORE_NODE_ID=node$node timeout ${LIMIT:-200} torchrun --nnodes 2 --node-rank $node --nproc-per-node $h \
             --master-addr 127.0.0.1 --master-port 29517 examples/multi_node_pyg.py $parts/m2 $opts \
             --json "$OUT/two-machines.json" >"$OUT/two-machines-$node.log" 2>&1 & pids="$pids $!"
         done
         for pid in $pids; do wait $pid || rc=1; done; tail -2 "$OUT/two-machines-0.log"; tail -2 "$OUT/two-machines-1.log"
         rm -rf $parts ;;
    # The papers100M-shaped graph on 1 and GPUS GPUs: setting a (float32 rows sharded over the GPUs' memory),
    # setting b (20% of the float32 bytes as int8 rows over the GPUs, the rest int8 in node-shared host memory);
    # DIAG=1 adds setting a with --pipeline off (sampling, gathers and the step timed apart)
    papers-a) timeout ${LIMIT:-580} python3 -m hmgstore.bench scale --gpus ${GPUS:-1 4} --graph papers:111M:1.6B \
                --gpu-budget 60GB --replicate 0 --epochs 2 --max-batches ${BATCHES:-200} ${EXTRA:-} --no-progress \
                --out "$OUT/papers-a${TAG:-}" >"$OUT/papers-a${TAG:-}.log" 2>&1; rc=$?; grep -E "^\|" "$OUT/papers-a${TAG:-}.log" | tail -6 ;;
    papers-b) g=${GPUS:-4}; b=$(python3 -c "print(f'{57.0 * 0.2 / $g:.2f}GB')")
              timeout ${LIMIT:-300} torchrun --standalone --nproc-per-node $g examples/multi_gpu_pyg.py --graph papers:111M:1.6B \
                --gpu-budget $b --replicate 0 --compress int8 --epochs 2 --max-batches ${BATCHES:-200} ${EXTRA:-} --no-progress \
                --json "$OUT/papers-b-gpus$g.json" >"$OUT/papers-b-gpus$g.log" 2>&1; rc=$?; tail -${g} "$OUT/papers-b-gpus$g.log" ;;
    scale-papers) df -h /dev/shm; free -g | head -2
             timeout 580 python3 -m hmgstore.bench scale --gpus 1 "$(nvidia-smi -L | wc -l)" --graph papers:111M:1.6B \
               --gpu-budget 60GB --epochs 2 --max-batches 60 --out "$OUT/scale-papers" >"$OUT/scale-papers.log" 2>&1; rc=$?
             tail -12 "$OUT/scale-papers.log" ;;
    step-tests) timeout 300 python3 -m pytest -q -rfE -p no:cacheprovider -m gpu tests/test_train_step.py \
                  >"$OUT/step-tests.log" 2>&1; rc=$?; tail -5 "$OUT/step-tests.log" ;;
    accuracy-step) timeout 400 python3 benchmarks/accuracy.py step >"$OUT/accuracy-step.json" 2>"$OUT/accuracy-step.log"
                   rc=$?; tail -7 "$OUT/accuracy-step.log" ;;
    # The strong step (layers trimmed per hop, TF32) with its ceilings (step alone, loader alone), papers-shaped graph,
    # 20% cache in int8 rows, the pipeline's gathers capped at auto_sms and uncapped. FANOUT, CAPS, CONFIGS, BATCHES,
    # EXTRA (more flags) and LIMIT (seconds) may be set; PROFILE=1 adds --profile (it slows the cached loader).
    strong-papers) f=${FANOUT:-15,10,5}; tag=strong-papers-${f//,/-}
                   timeout ${LIMIT:-580} python3 -m hmgstore.bench train --graph papers:111M:1.6B --fanout "$f" \
                     --configs ${CONFIGS:-all_gpu+pipe cache+pipe} --cache 0.2 --compress int8 --batches ${BATCHES:-30} \
                     --max-sms ${CAPS:-auto none} ${EXTRA:-} ${PROFILE+--profile} --no-progress --out "$OUT/$tag" 2>"$OUT/$tag.log"; rc=$?
                   grep -E "^\||target|step:" "$OUT/$tag.log" | tail -12 ;;
    strong-2m) tag=strong-2m-${COMPRESS:-int8}
               timeout 580 python3 -m hmgstore.bench train --configs ${CONFIGS:-all_gpu+pipe cache+pipe} --cache 0.2 \
                 --compress ${COMPRESS:-int8} --batches ${BATCHES:-30} --max-sms ${CAPS:-auto none} ${EXTRA:-} ${PROFILE+--profile} \
                 --no-progress --out "$OUT/$tag" 2>"$OUT/$tag.log"; rc=$?
               grep -E "^\||target|step:" "$OUT/$tag.log" | tail -12 ;;
    # The producer process under a user-level MPS daemon, beside the strong step (the loader's Python off
    # the training thread's GIL, the two processes' kernels side by side instead of taking turns), GRAPH: 2m or papers
    strong-mps) tag=strong-mps-${GRAPH:-2m}; g=""; [ "${GRAPH:-2m}" = papers ] && g="--graph papers:111M:1.6B"
                export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
                mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
                if nvidia-cuda-mps-control -d; then
                  for pct in ${MPS_PCTS:-30}; do
                    timeout ${LIMIT:-280} python3 -m hmgstore.bench train $g --configs ${CONFIGS:-all_gpu+pipe cache+proc} \
                      --cache 0.2 --compress int8 --batches ${BATCHES:-40} --max-sms none --sm-percent $pct ${EXTRA:-} \
                      --no-progress --out "$OUT/$tag-$pct" 2>"$OUT/$tag-$pct.log"; rc=$?
                    grep -E "^\||target|host GB" "$OUT/$tag-$pct.log" | tail -8
                  done
                  echo quit | nvidia-cuda-mps-control
                else echo "MPS daemon did not start"; rc=1; fi
                unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY ;;
    # The cached papers-shaped loader in a producer process against the pipeline thread, the strong step, all under
    # one user-level MPS daemon (stopped at the end): producer with gathers capped at 12 SMs, thread, producer uncapped
    producer-mps-papers) if mps_start; then
                  rc=0; common=$papers_cached
                  for v in "proc100-cap12 cache+proc --sm-percent 100 --max-sms 12" "thread-cap12 cache+pipe --max-sms 12" \
                           "proc100-uncapped cache+proc --sm-percent 100 --max-sms none"; do
                    set -- $v; name=$1; shift
                    timeout 200 python3 -m hmgstore.bench train $common --configs "$@" --out "$OUT/mps-$name" 2>"$OUT/mps-$name.log" || rc=1
                    grep -E "batches/s  epoch" "$OUT/mps-$name.log" | tail -1
                  done
                  mps_stop
                else rc=1; fi ;;
    # MPS client priorities (CUDA_MPS_CLIENT_PRIORITY can only lower a client): RUNS of producer-first (the
    # trainer at 1), trainer-first (the producer at 1), neither; ~140 s each on the papers-shaped graph (one H200)
    producer-priority) if mps_start; then
                  rc=0; common="$papers_cached --max-sms 12 --configs cache+proc --sm-percent 100"
                  for name in ${RUNS:-producer-first neither}; do
                    case $name in producer-first) t=1 p=0 ;; trainer-first) t=0 p=1 ;; *) t=0 p=0 ;; esac
                    CUDA_MPS_CLIENT_PRIORITY=$t timeout 280 python3 -m hmgstore.bench train $common --mps-priority $p \
                      --out "$OUT/priority-$name" 2>"$OUT/priority-$name.log" || rc=1
                    grep -E "batches/s  epoch" "$OUT/priority-$name.log" | tail -1
                  done
                  mps_stop
                else rc=1; fi ;;
    # The sampler's batches on a stream of their own against the loader's stream (bench train --sampler-stream on
    # off: one graph build), papers-shaped graph, the thread then the producer, under MPS; ~450 s
    sampler-stream) if mps_start; then
                  timeout 560 python3 -m hmgstore.bench train $papers_cached --max-sms 12 --sm-percent 100 \
                    --configs ${CONFIGS:-cache+pipe cache+proc} --sampler-stream ${STREAMS:-on off} ${EXTRA:-} \
                    --out "$OUT/sampler-stream" 2>"$OUT/sampler-stream.log"; rc=$?
                  grep -E "batches/s  epoch" "$OUT/sampler-stream.log" | tail -4
                  mps_stop
                else rc=1; fi ;;
    # The soak: examples/pyg_graphsage.py's pipelined training, 30 epochs of the 2M-node graph (table and
    # topology 25% in GPU memory), then hmgstore.Producer for 10; host RSS, GPU memory, fds and /dev/shm per epoch
    soak) timeout 590 python3 benchmarks/soak.py ${SOAK_ARGS:-} --out "$OUT/soak-gpu" >"$OUT/soak.log" 2>&1; rc=$?
          grep -E "^\||^#|Exact" "$OUT/soak.log" | tail -40 ;;
    # The strong step's slowdown beside a capped zero-copy gather of 200k rows, by the host pages they lie
    # in (128-5000), against the same gather from GPU memory (benchmarks/probes/probe_step_pages.py)
    step-pages) timeout 300 python3 benchmarks/probes/probe_step_pages.py ${EXTRA:-} >"$OUT/probe_step_pages.json" \
                  2>"$OUT/probe_step_pages.log"; rc=$?; tail -25 "$OUT/probe_step_pages.log" ;;
    # A batch's missed rows read by the CPU into pinned staging and copied by the copy engine, against
    # the zero-copy kernel, alone and beside a GPU-bound step (benchmarks/probes/probe_dma_misses.py)
    dma-misses) timeout 400 python3 benchmarks/probes/probe_dma_misses.py ${EXTRA:-} >"$OUT/probe_dma_misses.json" \
                  2>"$OUT/probe_dma_misses.log"; rc=$?; tail -30 "$OUT/probe_dma_misses.log" ;;
    *) echo "unknown stage $stage"; rc=2 ;;
  esac
  [ "$rc" = 0 ] || { status=1; echo "=== $stage failed (rc $rc)"; }
done
exit $status
