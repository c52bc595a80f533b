# Sourced by the sweeps (gemm_tune.sh, decode_sweep.sh from the repository root, with $sections
# set; ab_bench.sh from anywhere): the environment the binaries need on the GPU machines (NVLS off,
# PyTorch's NCCL first on the library path, eager module loading), and the section and --shape
# helpers.

# Multicast (NVLS) must stay off on shared machines; NCCL 2.28.9 ships in PyTorch's packages there.
export NCCL_NVLS_ENABLE=0 NVSHMEM_DISABLE_NVLS=1 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 CUDA_MODULE_LOADING=EAGER
if nccl_lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null); then
  export LD_LIBRARY_PATH="$nccl_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib; do [ -d "$d" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$d"; done

# want SECTION: true when SECTION (or "all") was asked for.
want() { [[ " $sections " == *" all "* || " $sections " == *" $1 "* ]]; }
failed=0
entries=()
# add ENTRY: one more --shape entry for the next bench invocation.
add() { entries+=(--shape "$1"); }
