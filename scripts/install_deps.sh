#!/usr/bin/env bash
# Installs modtrain's build and test dependencies from Debian's packages. Idempotent:
# apt-get skips what is already installed. The CUDA toolkit is expected under /usr/local/cuda.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libopenblas-openmp-dev libopenblas0-openmp   # f64 GEMM, f32 without oneDNN (OpenMP build)
  libdnnl-dev                                  # oneDNN: f32 GEMM (core/cpu/blas.h)
  libblis-openmp-dev                           # another BLAS candidate, for benchmarks/blas/blas_sgemm
  catch2                                       # Catch2 v2 test framework
  clang libclang-rt-14-dev                     # libFuzzer + sanitizers (scripts/fuzz.sh, MOD_FUZZ)
  libprotobuf-dev protobuf-compiler            # config schema and checkpoint metadata
  libboost-program-options-dev                 # command line
  nlohmann-json3-dev                           # JSON: eval --json, tokenizer.json, JSON Lines input
  libpcre2-dev                                 # tokenizer.json pre-tokenizer regexes (PCRE2)
  zlib1g-dev                                   # gzip input (modtrain prep)
  libopenmpi-dev openmpi-bin                   # CPU communicator
  bible-kjv                                    # default corpus
  gnuplot-nox                                  # isoFLOP plots (modtrain grid collect)
  slurmctld slurmd slurm-client munge          # Slurm + munge, for scripts/slurm_test_cluster.sh
  libpmix-dev                                  # libpmix.so, dlopened by srun --mpi=pmix
  iproute2 procps                              # ip netns, tc, sysctl: the multihost tests
)

# Python packages for two tests, from PyPI; optional: without them the test is skipped, saying so.
#   safetensors, numpy: an exported safetensors file checked from Python (checkpoint_export_python)
#   tokenizers: our tokenizer.json encoder against Hugging Face's (hf_tokenizer_parity)
python_test_packages() {
  python3 -c "import safetensors.numpy, numpy" 2>/dev/null ||
    python3 -m pip install --quiet --disable-pip-version-check --timeout 20 --retries 1 \
      safetensors numpy 2>/dev/null || true
  python3 -c "import safetensors.numpy, numpy" 2>/dev/null ||
    echo "install_deps: warning: no safetensors/numpy for python3; unit:checkpoint_export_python will skip"
  python3 -c "import tokenizers" 2>/dev/null ||
    python3 -m pip install --quiet --disable-pip-version-check --timeout 20 --retries 1 \
      tokenizers 2>/dev/null || true
  python3 -c "import tokenizers" 2>/dev/null ||
    echo "install_deps: warning: no tokenizers for python3; unit:hf_tokenizer_parity will skip"
}

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#packages[@]} packages present"
else
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
  echo "install_deps: installed ${missing[*]}"
fi
python_test_packages
