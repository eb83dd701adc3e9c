#!/usr/bin/env bash
# Build one variant's engine for one GPU arch, on a runner with that GPU.
#
# usage: CONFIG=lpx.yaml VARIANT=fp8 ARCH=sm90 [GPUS=1] [IN=ci-in] [OUT=ci-out] scripts/ci/build.sh
#   IN holds quantize-$VARIANT.tgz (from quantize.sh); writes $OUT/engine-$VARIANT-$ARCH.tgz
#   (relative to LPX_HOME). Refuses to run when the GPU here is not $ARCH or there are fewer than $GPUS.
set -euo pipefail
: "${CONFIG:?set CONFIG}" "${VARIANT:?set VARIANT}" "${ARCH:?set ARCH, e.g. sm90}"
IN="${IN:-ci-in}" OUT="${OUT:-ci-out}" GPUS="${GPUS:-1}"
mkdir -p "$OUT"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

caps="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader)"  # e.g. "9.0", one line per GPU
count=0
while read -r cap; do
  count=$((count + 1))
  if [[ "sm${cap/./}" != "sm${ARCH//[!0-9]/}" ]]; then
    echo "error: GPU $((count - 1)) is sm${cap/./}, this job builds for $ARCH - fix the runner label mapping" >&2
    exit 2
  fi
done <<< "$caps"
if (( count < GPUS )); then
  echo "error: $count GPU(s) here, the cell needs $GPUS (tp_size x pp_size) - use a bigger runner" >&2
  exit 2
fi

home="$(lpx path)"
mkdir -p "$home"
tar -xzf "$IN/quantize-$VARIANT.tgz" -C "$home"

python3 -c 'import sys; from pathlib import Path; from pipeline.inspection.matrix import write_cell_config as w; w(Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4]))' \
  "$CONFIG" "$VARIANT" "$ARCH" "$work/lpx.yaml"
lpx build -c "$work/lpx.yaml" --variant "$VARIANT"

engine="$(lpx artifacts path --stage build --variant "$VARIANT" --arch "$ARCH")"
tar -czf "$OUT/engine-$VARIANT-$ARCH.tgz" -C "$home" "${engine#"$home"/}"
echo "$OUT/engine-$VARIANT-$ARCH.tgz"
