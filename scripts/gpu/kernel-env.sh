# Source from the repo root on a fresh GPU machine after setting $out: makes $out, installs the
# carried wheels (.carry/gptq: msgspec and llguidance for the machine's Python), puts the repo on
# PYTHONPATH and writes the GPU's name and clocks to $out/gpu.txt. For the kernel and engine
# benches (pdl.sh, fp8-mma-rows.sh), which need no model files.
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --target /root/site .carry/gptq/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:/root/site
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader > "$out/gpu.txt"
