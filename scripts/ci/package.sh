#!/usr/bin/env bash
# Write the Triton model repository of every matrix cell from the restored artifacts, and pack them.
#
# usage: CONFIG=lpx.yaml [IN=ci-in] [OUT=ci-out] [PUBLISH_CMD='cmd'] scripts/ci/package.sh
#   IN holds the quantize-*.tgz and engine-*.tgz of the other jobs. Writes $OUT/lpx-repos.tgz:
#   the repository artifacts plus every manifest.json (checkpoints, evals, engines), relative to LPX_HOME,
#   and lpx-repos.tgz.sha256 (deploy.repository.sha256 for pods that fetch it; `lpx serve --repo` serves it unpacked).
#   PUBLISH HOOK: nothing is uploaded unless PUBLISH_CMD is set; it then runs as `$PUBLISH_CMD <tarball>`.
set -euo pipefail
shopt -s nullglob  # the torch target has no engine-*.tgz
: "${CONFIG:?set CONFIG}"
IN="${IN:-ci-in}" OUT="${OUT:-ci-out}"
mkdir -p "$OUT"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

home="$(lpx path)"
mkdir -p "$home"
for t in "$IN"/quantize-*.tgz "$IN"/engine-*.tgz; do
  tar -xzf "$t" -C "$home"
done

lpx matrix -c "$CONFIG" --format json \
  | python3 -c 'import json, sys; [print(c["variant"], c["arch"]) for c in json.load(sys.stdin)["include"]]' \
  > "$work/cells"
while read -r variant arch; do
  python3 -c 'import sys; from pathlib import Path; from pipeline.inspection.matrix import write_cell_config as w; w(Path(sys.argv[1]), sys.argv[2], sys.argv[3], Path(sys.argv[4]))' \
    "$CONFIG" "$variant" "$arch" "$work/$variant-$arch.yaml"
  lpx repo -c "$work/$variant-$arch.yaml" --variant "$variant"
done < "$work/cells"

(cd "$home" && find artifacts/repos -mindepth 1 -maxdepth 1 && find artifacts -name manifest.json -not -path 'artifacts/repos/*') \
  > "$work/files"
tarball="$OUT/lpx-repos.tgz"
tar -czf "$tarball" -C "$home" -T "$work/files"
# the checksum lpx.yaml's deploy.repository.sha256 wants when pods fetch this tarball
(cd "$OUT" && sha256sum lpx-repos.tgz > lpx-repos.tgz.sha256)
echo "$tarball"
cat "$tarball.sha256"

if [[ -n "${PUBLISH_CMD:-}" ]]; then  # --- publish hook: off by default, never a network call of ours ---
  bash -c "$PUBLISH_CMD \"\$1\"" publish "$tarball"
fi
