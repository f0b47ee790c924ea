#!/usr/bin/env bash
# gpu-check.sh — on a GPU machine (PyTorch 2.x with CUDA, see scripts/gpu-env.sh): build ration with
# -DRATION_CUDA=ON against python3's libtorch and run the GPU checks. Stages, in the order given:
#   info     the machine, compiler, torch and CUDA versions
#   headers  pack torch's, CUDA's and NCCL's headers into $OUT (compile-checking the CUDA build elsewhere)
#   build    configure build-cuda/ and build the CLI, tests and GPU bench (errors listed, -k 0)
#   test     the GPU tests (gtest filter Cuda*) and the command line on train.device = "cuda"
#   plan     bench_plan_scaling on this machine's CPU (planner time vs depth on a quiet host; planning is
#            single-threaded and device-independent)
#   bench    bench_peer --device cuda: ration vs PyTorch training steps on the GPU (the default gpt and cnn,
#            and a larger gpt), peaks from each side's caching allocator
# Logs and results land in $OUT (default ./gpu-out).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
source scripts/gpu-env.sh
B=build-cuda
JOBS=$(nproc)
torch_dir() { python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))'; }
cuda_home() { python3 -c 'from torch.utils.cpp_extension import CUDA_HOME;print(CUDA_HOME)'; }

stage_info() {
  echo "== info"; date -u; nproc; free -g | head -2; nvidia-smi -L; nvidia-smi --query-gpu=driver_version,memory.total --format=csv
  g++ --version | head -1; cmake --version | head -1; echo "ninja $(ninja --version)"; which nvcc && nvcc --version | tail -2
  python3 -c 'import torch;print("torch", torch.__version__, "cuda", torch.version.cuda, "cxx11abi", torch._C._GLIBCXX_USE_CXX11_ABI, "gpu", torch.cuda.get_device_name(0))'
  echo "CUDA_HOME $(cuda_home)"; local td; td=$(torch_dir)
  ls -d "$td"/include/gloo 2>&1 | head -1; ls "$td"/lib | head -40
  grep -rho 'cxx_std_[0-9]*\|CXX_STANDARD [0-9]*' "$td"/share/cmake | sort | uniq -c
  cat /etc/os-release | head -2
}

stage_headers() {
  echo "== headers"
  local td ch nccl; td=$(torch_dir); ch=$(cuda_home)
  nccl=$(python3 -c 'import nvidia.nccl,os;print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null || true)
  mkdir -p /tmp/hdr/cuda /tmp/hdr/nccl
  cp -a "$td"/include /tmp/hdr/torch
  (cd "$ch"/include && tar --exclude=cccl --exclude=thrust --exclude=cub --exclude=cuda/std -cf - .) | (cd /tmp/hdr/cuda && tar -xf -)
  [ -n "$nccl" ] && cp -a "$nccl"/include/. /tmp/hdr/nccl/
  du -sh /tmp/hdr/*
  (cd /tmp/hdr && tar -cf - torch cuda nccl | xz -T"$JOBS" -6 | split -b 15M - "$OUT"/hdr.tar.xz.)
  ls -la "$OUT"
}

stage_build() {
  echo "== build"
  local t0=$SECONDS
  cmake -S . -B "$B" -G Ninja -DRATION_CUDA=ON -DCMAKE_PREFIX_PATH="$RATION_TORCH_PREFIX;$RATION_DEB_PREFIX" \
        -DCUDAToolkit_ROOT="$(cuda_home)" -DCMAKE_CUDA_COMPILER="$(cuda_home)/bin/nvcc" \
        -DCMAKE_CUDA_ARCHITECTURES=90 -DTORCH_CUDA_ARCH_LIST=9.0 > "$OUT"/configure.log 2>&1
  local rc=$?
  tail -30 "$OUT"/configure.log
  if [ $rc -ne 0 ]; then echo "configure failed"; tail -60 "$B"/CMakeFiles/CMakeError.log 2>/dev/null; return 1; fi
  timeout "${RATION_BUILD_TIMEOUT:-420}" cmake --build "$B" -j "$JOBS" --target ration_cli ration_tests bench_peer bench_plan_scaling -- -k 0 \
    > "$OUT"/build.log 2>&1
  rc=$?
  echo "build rc $rc in $((SECONDS - t0)) s"
  grep -E 'error|FAILED:|undefined reference' "$OUT"/build.log | head -150
  return $rc
}

stage_test() {
  echo "== test"
  local r="$B"/ration
  "$B"/ration_tests --gtest_filter='Cuda*' 2>&1 | tee "$OUT"/gtest_cuda.log | tail -40
  "$r" gradcheck configs/gpt.toml --set train.device=cuda 2>&1 | tail -6
  "$r" gradcheck configs/lstm_lm.toml --set train.device=cuda 2>&1 | tail -2
  "$r" gradcheck configs/gpt.toml --set train.device=cuda --offload --offload-prefetch 3 2>&1 | grep -i "offload\|bitwise\|worst\|error" | head -8
  "$r" train configs/gpt.toml --set train.device=cuda --steps 20 --set train.checkpoint_dir= --json > "$OUT"/train_gpt.json 2>&1
  echo "train gpt rc $?"; tail -c 1500 "$OUT"/train_gpt.json
}

stage_plan() {
  echo "== plan"
  "$B"/bench/bench_plan_scaling --set train.batch_size=4 --reps "${RATION_PLAN_REPS:-7}" \
    --out "$OUT"/plan_scaling.json 2>&1 | tail -24
}

stage_bench() {
  echo "== bench"
  export RATION_PEER_PYTHON="$(command -v python3)"
  "$B"/bench/bench_peer --device cuda --families gpt,lstm_lm --reps "${RATION_BENCH_REPS:-2}" --steps 20 --warmup 5 \
    --json "$OUT"/gpu_peer.json 2>&1 | grep -v '^\[rep\|^  *wall' | tail -20
  "$B"/bench/bench_peer --device cuda --families gpt --reps "${RATION_BENCH_REPS:-2}" --steps 20 --warmup 5 \
    --set model.n_layer=12 --set model.n_embd=768 --set model.n_head=12 --set train.batch_size=32 \
    --json "$OUT"/gpu_peer_gpt768.json 2>&1 | grep -v '^\[rep\|^  *wall' | tail -12
}

for s in "$@"; do "stage_$s" || { echo "stage $s failed"; [ "$s" = build ] && exit 1; }; done
