// Row-major Eigen views over buffers whose rows are `stride` elements apart:
// the form every reference kernel computes in, over double (the fp64
// reference) and float (the baseline emulation).
#pragma once

#include <Eigen/Core>

namespace mlagate::detail {

template <class T>
using RowMat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class T>
using RowsMap = Eigen::Map<RowMat<T>, 0, Eigen::OuterStride<>>;
template <class T>
using ConstRowsMap = Eigen::Map<const RowMat<T>, 0, Eigen::OuterStride<>>;

// A row-major block of rows x cols starting at p whose rows are `stride` apart.
template <class T>
RowsMap<T> mat(T* p, Eigen::Index rows, Eigen::Index cols, Eigen::Index stride) {
  return RowsMap<T>(p, rows, cols, Eigen::OuterStride<>(stride));
}
template <class T>
ConstRowsMap<T> cmat(const T* p, Eigen::Index rows, Eigen::Index cols, Eigen::Index stride) {
  return ConstRowsMap<T>(p, rows, cols, Eigen::OuterStride<>(stride));
}

}  // namespace mlagate::detail
