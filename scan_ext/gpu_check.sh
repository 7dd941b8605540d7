#!/usr/bin/env bash
# The GPU check, one prepared script for a machine with an NVIDIA GPU, nvcc and a CUDA build of
# torch (no install: it uses that machine's torch). From the repository root:
#     bash scan_ext/gpu_check.sh            # about 5 minutes on one H200; a log in $OUT or /tmp
# 1. builds the CUDA scan kernel and runs the CUDA tests (the 11 that skip on a CPU-only machine);
# 2. trains the same tiny Mamba on the CPU and on the GPU: their loss curves must agree;
# 3. times the paper's protocol (d = 64) on the GPU for a few thousand steps, Mamba on AR and
#    attention on ATR, and the same models' steps on the CPU, as steps per second.
set -uo pipefail
out=${OUT:-/tmp/gpu_check}
mkdir -p "$out" && exec > >(tee "$out/gpu_check.log") 2>&1
export PYTHONUNBUFFERED=1 MECH_SCAN_CACHE=${MECH_SCAN_CACHE:-/tmp/mech_scan_cache}
status=0
step() { echo; echo "== $*"; }

step "machine"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
nvcc --version | tail -n 2
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda,
            'device', torch.cuda.get_device_name() if torch.cuda.is_available() else None)"

step "1. the CUDA kernel: build, then the CUDA tests"
python3 -c "import torch, scan_ext; scan_ext.kernel(torch.device('cuda'), required=True);
print('extension built; cuda kernel:', scan_ext.load().has_cuda())" || status=1
python3 -m pytest -q -rs -p no:cacheprovider tests/test_scan.py -k cuda || status=1

step "2. the same tiny run on the CPU and on the GPU"
tiny=(--arch mamba --task ar --d-model 32 --num-kv 64 --n-train 2048 --steps 300 --eval-every 50
      --n-eval 64 --seed 7)
for dev in cpu cuda; do
    python3 mech.py "${tiny[@]}" --device $dev --out "/tmp/gpu_check_runs/tiny_$dev" --force \
        > /dev/null || status=1
done
python3 - <<'EOF' || status=1
import json
curve = {d: json.load(open(f"/tmp/gpu_check_runs/tiny_{d}/metrics.json"))["curve"]
         for d in ("cpu", "cuda")}
worst = max(abs(a["train_loss"] - b["train_loss"]) / abs(a["train_loss"])
            for a, b in zip(curve["cpu"], curve["cuda"]))
print("train loss, cpu vs cuda:", [(p["train_loss"], q["train_loss"])
                                   for p, q in zip(curve["cpu"], curve["cuda"])])
print(f"largest relative difference {worst:.2e} (float32 on two devices: expect < 1e-2)")
assert worst < 1e-2, "the GPU run departs from the CPU run"
EOF

step "3. the paper's protocol, timed (steps per second; the CPU with all its threads)"
for run in "ar mamba 1e-2" "atr attention 1e-3"; do
    set -- $run
    for dev in cuda cpu; do
        steps=$([ $dev = cuda ] && echo 3000 || echo 300)
        python3 mech.py --preset paper --d-model 64 --task $1 --arch $2 --lr $3 --steps $steps \
            --device $dev --out "/tmp/gpu_check_runs/paper_${1}_${2}_$dev" --force \
            > /dev/null || status=1
        python3 -c "import json; m = json.load(open('/tmp/gpu_check_runs/paper_${1}_${2}_$dev/metrics.json'))
print(f\"$1 $2 on $dev: {m['steps_per_s']:.1f} steps/s over {m['steps']} steps (accuracy {m['accuracy']:.3f}, \"
      f\"{m['wall_time_s']:.0f} s with its evaluations)\")" || status=1
    done
done

step "done: $([ $status = 0 ] && echo 'every check passed' || echo 'A CHECK FAILED (see above)')"
exit $status
