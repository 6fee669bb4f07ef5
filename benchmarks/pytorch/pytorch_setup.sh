# Sourced by compare_pytorch.sh and compare_sampling.sh (BUILD_DIR set): PyTorch's best set-up on
# this CPU. Exports ATEN_CPU_CAPABILITY and sets pytorch_env, a command prefix for PyTorch's
# process alone.
#
# PyTorch's vector kernels: its AVX-512 ones where the CPU has them (Debian's build otherwise
# stays on AVX2, measured 4-5% slower a step).
if [[ -z "${ATEN_CPU_CAPABILITY:-}" ]] && grep -qw avx512f /proc/cpuinfo; then
  export ATEN_CPU_CAPABILITY=avx512
fi
echo "PyTorch vector kernels: ATEN_CPU_CAPABILITY=${ATEN_CPU_CAPABILITY:-default}"

# PyPI's wheels run f32 GEMMs in MKL, which takes its AVX2 path on AMD CPUs (a Zen 5 host: 197-216
# GFLOP/s at 1024^3-2048^3, 474-500 on its AVX-512 path). A shim answering MKL's CPU check
# (mkl_serv_intel_cpu_true), preloaded into PyTorch's process alone, is its best set-up there;
# MKL_AMD_SHIM=0 measures the wheel as shipped.
pytorch_env=(env)
if [[ "${MKL_AMD_SHIM:-1}" != 0 ]] && grep -qm1 AuthenticAMD /proc/cpuinfo; then
  shim=$BUILD_DIR/mkl_intel_cpu_shim.so
  [[ -f "$shim" ]] || echo 'int mkl_serv_intel_cpu_true(void) { return 1; }' |
    cc -shared -fPIC -O2 -x c -o "$shim" - ||
    { echo "pytorch_setup: could not build $shim (a C compiler is needed)" >&2; exit 1; }
  pytorch_env=(env "LD_PRELOAD=$(realpath "$shim")${LD_PRELOAD:+:$LD_PRELOAD}")
  echo "PyTorch's MKL: its AVX-512 path on this AMD CPU through $shim (MKL_AMD_SHIM=0: as shipped)"
fi
