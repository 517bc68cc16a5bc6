#!/usr/bin/env bash
# Download here the Python 3.12 x86-64 wheels that the lent GPU machine lacks, into
# devicekit/wheels/ (git-ignored; about 18 MB), for devicekit/gpu_sweep.py to install there:
# Flower 1.41.0, Hydra, OmegaConf, Hydra's joblib launcher, antlr4 4.9.3 (built here as a wheel:
# it is published as source only) and their dependencies, at constraints.txt's versions, less
# the packages the machine already holds. Ray is left out (too large to carry): in-process runs
# only. Needs pip and the package index.
#     devicekit/fetch_wheels.sh [DEST]
set -euo pipefail
kit=$(cd "$(dirname "$0")" && pwd)
dest=${1:-$kit/wheels}
py=${PYTHON:-python3}
mkdir -p "$dest"
# left out: what the machine already holds (/work/.library/device/KINDS.md, "Python packages
# already there"), and what an in-process run never imports: uv (17 MB, Flower's app installer)
# and uvicorn's optional servers (Flower's SuperLink API)
skip='^(numpy|grpcio|protobuf|pyyaml|requests|rich|click|packaging|pathspec|typer|httpx|anyio|
h11|httpcore|idna|certifi|urllib3|charset_normalizer|joblib|markdown_it_py|mdurl|pygments|
typing_extensions|shellingham|sniffio|pillow|filelock|fsspec|psutil|setuptools|cloudpickle|
markupsafe|annotated_doc|uv|uvloop|httptools|watchfiles|websockets|python_dotenv)-'
skip=${skip//$'\n'/}
"$py" -m pip wheel -q --no-deps --no-build-isolation -w "$dest" antlr4-python3-runtime==4.9.3
"$py" -m pip download -q -d "$dest" --find-links "$dest" -c "$kit/../constraints.txt" \
    --python-version 3.12 --implementation cp --only-binary=:all: \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    flwr==1.41.0 hydra-core hydra-joblib-launcher omegaconf antlr4-python3-runtime==4.9.3
for wheel in "$dest"/*.whl; do
    name=$(basename "$wheel" | tr '[:upper:]' '[:lower:]')
    if [[ $name =~ $skip ]]; then rm "$wheel"; fi
done
echo "$(ls "$dest"/*.whl | wc -l) wheels, $(du -sh "$dest" | cut -f1) in $dest"
