# Sourced by scripts/bootstrap.sh and scripts/config_matrix.sh: the one
# ccache setting both builds use, so that the configure matrix's folders hit
# the objects of the main build. Sets `launcher` (CMake's compiler-launcher
# options; empty without ccache) and exports CCACHE_*: relative paths under
# the repository (CCACHE_BASEDIR, so folders at the same depth under build/
# share objects), the compiler's own dependency file instead of a second
# preprocessor run (CCACHE_DEPEND), no working directory in the hash.
launcher=()
if command -v ccache > /dev/null; then
  export CCACHE_BASEDIR="$PWD" CCACHE_DEPEND=1 CCACHE_NOHASHDIR=1
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache)
fi
