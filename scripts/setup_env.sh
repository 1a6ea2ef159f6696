#!/usr/bin/env bash
# Creates a virtual environment (Python 3.11 if present) and installs the package with its test extras.
#
#   bash scripts/setup_env.sh          .venv:     the registry's TensorFlow (CPU or CUDA build) + tf-keras
#   bash scripts/setup_env.sh --tpu    .venv-tpu: the TPU TensorFlow a Cloud TPU runs (docs/tpu.md); .venv stays
#
# Idempotent: a second run only checks that everything is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
EXTRAS="test,notebook,text,jax"
# .venv-tpu is the TPUStrategy path: no JAX there (a JAX TPU VM runs no TPU TensorFlow; its tests run in .venv).
TPU_EXTRAS="test,notebook,text"
# The reference the augmentation tests compare with (official/vision/ops/augment.py), without its dependency tree
# (it pins its own TensorFlow): --no-deps, in both environments.
TFM_REFERENCE="tf-models-official==2.20.0"

# The TPU TensorFlow, and why these pins (docs/tpu.md, "Which TensorFlow"):
# - tensorflow-tpu 2.19.1 is the last TPU build that works: the registry's 2.20.0 asks only
#   `libtpu~=0.0.14`, which resolves to a libtpu that aborts `import tensorflow` (0.0.40 .. 0.0.52,
#   measured), and keras-team/keras pins 2.19.1 in requirements-tensorflow-tpu.txt as "the last version
#   of the TensorFlow that supports TPUs".
# - libtpu 0.0.10 is the one tensorflow-tpu 2.19.1 itself pins (`libtpu==0.0.10` in its metadata), and the
#   registry holds it; 2.16-2.18 pinned `libtpu==2.x.y` builds that only Google's TF libtpu index holds.
# - tf-keras 2.19.0 is the tf-keras of that minor. It requires the `tensorflow` distribution, which would
#   put a second TensorFlow into the same `tensorflow/` folder, so it goes in with --no-deps.
TPU_TENSORFLOW="tensorflow-tpu==2.19.1"
TPU_LIBTPU="libtpu==0.0.10"
LIBTPU_INDEX="https://storage.googleapis.com/libtpu-tf-releases/index.html"

if [ "${1:-}" != "--tpu" ]; then
  if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
  fi
  # Reinstall only when setup.cfg changed since the last install (the stamp holds its hash): every
  # `pip install -e` rebuilds the package and prints setuptools' editable-install notice.
  STAMP=".venv/.installed-$(sha256sum setup.cfg | cut -c1-16)"
  if [ ! -f "$STAMP" ] || ! .venv/bin/python -c "import tpu_pipeline" 2>/dev/null; then
    .venv/bin/python -m pip install --quiet --upgrade pip
    .venv/bin/python -m pip install --quiet -e ".[$EXTRAS]"
    .venv/bin/python -m pip install --quiet --no-deps "$TFM_REFERENCE"
    rm -f .venv/.installed-*
    touch "$STAMP"
  fi
  exit 0
fi

# --tpu: .venv-tpu with exactly one TensorFlow distribution, the TPU build.
VENV=.venv-tpu
STAMP="$VENV/.installed-$(cat setup.cfg scripts/setup_env.sh scripts/deps.py | sha256sum | cut -c1-16)"
if [ -f "$STAMP" ] && "$VENV/bin/python" -c "import tpu_pipeline" 2>/dev/null; then
  exit 0
fi

# A tpu-vm-tf-* image carries its own TPU TensorFlow (paired with its libtpu.so): keep it, never put
# the registry's over it. TPU_LOAD_LIBRARY=0: the check must not start libtpu (on a machine with no
# TPU, libtpu retries the metadata server for minutes). A TPU build registers the TPU compile kernel.
IMAGE_TF="$(TPU_LOAD_LIBRARY=0 TF_CPP_MIN_LOG_LEVEL=3 "$PYTHON" - <<'EOF' 2>/dev/null || true
import importlib.metadata as md
names = [d.metadata["Name"] for d in md.distributions()
         if (d.metadata["Name"] or "").lower().replace("_", "-") in ("tensorflow", "tensorflow-tpu", "tensorflow-cpu")]
if names:
    import tensorflow as tf
    from tensorflow.python.framework import kernels
    if kernels.get_registered_kernels_for_op("_TPUCompileMlir").kernel:
        print(f"{names[0]} {tf.__version__} at {tf.__path__[0]}")
EOF
)"

rm -rf "$VENV"
if [ -n "$IMAGE_TF" ]; then
  echo "setup_env --tpu: found a TPU TensorFlow in $PYTHON ($IMAGE_TF): keeping it; installing the rest around it"
  "$PYTHON" -m venv --system-site-packages "$VENV"
  TF_MINOR="$(echo "$IMAGE_TF" | awk '{print $2}' | cut -d. -f1,2)"
  KEEP_TF="$(echo "$IMAGE_TF" | awk '{print $1 "==" $2}')"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
else
  "$PYTHON" -m venv "$VENV"
  "$VENV/bin/python" -m pip install --quiet --upgrade pip
  FIND_LINKS=()
  if [ -e /dev/accel0 ] || compgen -G "/dev/vfio/[0-9]*" >/dev/null; then
    # On a TPU VM, Google's TF libtpu index is where the TPU TensorFlow's own instructions point;
    # libtpu 0.0.10 is also on the registry, which is where CI (no other index reachable) takes it.
    if curl -s --max-time 10 -o /dev/null "$LIBTPU_INDEX"; then
      FIND_LINKS=(--find-links "$LIBTPU_INDEX")
    fi
  fi
  "$VENV/bin/python" -m pip install --quiet "${FIND_LINKS[@]}" "$TPU_TENSORFLOW" "$TPU_LIBTPU"
  if [ ${#FIND_LINKS[@]} -gt 0 ]; then
    echo "setup_env --tpu: $TPU_TENSORFLOW with $TPU_LIBTPU (its own pin), from Google's TF libtpu index or the registry"
  else
    echo "setup_env --tpu: $TPU_TENSORFLOW with $TPU_LIBTPU (its own pin) from the registry (no TPU here, so Google's TF libtpu index was not asked)"
  fi
  TF_MINOR="2.19"
  KEEP_TF="$TPU_TENSORFLOW"
fi
# tf-keras of the same minor, without its `tensorflow` requirement; then everything else setup.cfg lists,
# resolved together with the TensorFlow kept (so its own pins, e.g. protobuf<6, hold).
"$VENV/bin/python" -m pip install --quiet --no-deps "tf-keras~=$TF_MINOR.0"
# shellcheck disable=SC2046
"$VENV/bin/python" -m pip install --quiet "$KEEP_TF" $("$VENV/bin/python" scripts/deps.py --extras "$TPU_EXTRAS")
"$VENV/bin/python" -m pip install --quiet --no-deps -e . "$TFM_REFERENCE"

# Exactly one TensorFlow distribution: two (tensorflow + tensorflow-tpu) write one tensorflow/ folder.
"$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
import sys
family = ("tensorflow", "tensorflow-tpu", "tensorflow-cpu", "tf-nightly", "tensorflow-intel")
found = sorted({f"{d.metadata['Name']} {d.version}" for d in md.distributions()
                if (d.metadata["Name"] or "").lower().replace("_", "-") in family})
if len(found) != 1:
    sys.exit(f"setup_env --tpu: expected exactly one TensorFlow distribution in .venv-tpu, found {found or 'none'}")
keras = md.version("tf-keras")
try:
    libtpu = md.version("libtpu")
except md.PackageNotFoundError:
    libtpu = "none as a package (the image's libtpu.so)"
print(f"setup_env --tpu: .venv-tpu holds {found[0]}, tf-keras {keras}, libtpu {libtpu}; no other TensorFlow")
EOF
# Any script in .venv-tpu, not only one that imports tpu_pipeline before TensorFlow: on a machine with no
# TPU device, TensorFlow starts without libtpu (which would retry the GCE metadata server for minutes).
# A .pth line runs at interpreter start-up; a TPU VM (a device file present) is left as it is.
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# It names itself as tensorflow_install does (TPU_PIPELINE_LIBTPU_HELD_BACK), so the package decides again.
echo "import os, glob; os.environ.update(TPU_LOAD_LIBRARY='0', TPU_PIPELINE_LIBTPU_HELD_BACK='this machine has no TPU device (/dev/accel*, /dev/vfio/N)') if 'TPU_LOAD_LIBRARY' not in os.environ and not (glob.glob('/dev/accel*') or [p for p in glob.glob('/dev/vfio/*') if os.path.basename(p).isdigit()]) else None" \
  > "$SITE/tpu_pipeline_no_tpu_no_libtpu.pth"
rm -f "$VENV"/.installed-*
touch "$STAMP"
