#!/usr/bin/env bash
# Quantize one variant (and run its quality gate), then pack the checkpoint for the build jobs.
#
# usage: CONFIG=lpx.yaml VARIANT=fp8 [OUT=ci-out] scripts/ci/quantize.sh
#   writes $OUT/quantize-$VARIANT.tgz: the checkpoint and eval artifacts, relative to LPX_HOME
#   (restore with: tar -xzf quantize-$VARIANT.tgz -C "$(lpx path)").
# Run it in the same container as build.sh: the quantize key includes the torch/transformers/
# ModelOpt versions, and a different set would make the build job quantize again.
set -euo pipefail
: "${CONFIG:?set CONFIG to the lpx.yaml}" "${VARIANT:?set VARIANT to a variant name}"
OUT="${OUT:-ci-out}"
mkdir -p "$OUT"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# build.archs narrowed to the archs this variant can run (the matrix excludes the others).
python3 -c 'import sys; from pathlib import Path; from pipeline.inspection.matrix import write_cell_config as w; w(Path(sys.argv[1]), sys.argv[2], None, Path(sys.argv[3]))' \
  "$CONFIG" "$VARIANT" "$work/lpx.yaml"

lpx quantize -c "$work/lpx.yaml" --variant "$VARIANT"
lpx eval -c "$work/lpx.yaml" --variant "$VARIANT"  # fails here if the variant misses quality_gate

home="$(lpx path)"
ckpt="$(lpx artifacts path --stage quantize --variant "$VARIANT")"
ckpt_rel="${ckpt#"$home"/}"
evals_rel="$(dirname "${ckpt_rel/checkpoints/evals}")"  # same model/variant slot under evals/
tar -czf "$OUT/quantize-$VARIANT.tgz" -C "$home" "$ckpt_rel" "$evals_rel"
echo "$OUT/quantize-$VARIANT.tgz"
