// cases/generator.cpp built a second time without AVX-512, its namespace
// renamed mlagate_portable (tests/cases/CMakeLists.txt), so that
// Generator.NormalsAtIsNormalAtBitForBit checks the build without AVX-512
// (its square roots a lane at a time, its vectors in halves) gives the same
// bits where the build itself takes the AVX-512 path.
#include "cases/generator.cpp"
