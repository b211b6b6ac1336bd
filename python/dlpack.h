// Tensors across the Python boundary: PyTensor is a host tensor the module
// hands to Python (a case's inputs, a backend call's arguments), exported
// zero-copy through DLPack (`__dlpack__`, read by torch.from_dlpack and
// numpy.from_dlpack) and numpy's `__array_interface__`; tensor_from_python
// reads any DLPack producer (torch, numpy, cupy moved to the host) back into an
// owned Tensor of the expected dtype and shape, or throws a Python TypeError or
// ValueError that says what was wrong.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "cases/tensor.h"

namespace mlagate::py {

namespace pyb = pybind11;

struct PyTensor {
  TensorView view;
  // Keeps the bytes alive while Python (or a consumer of an exported capsule)
  // holds them: an owned Tensor, or nothing for a call's arguments, which are
  // valid for the call only (as any kernel argument).
  std::shared_ptr<const void> owner;
  bool output = false;  // an output the callee writes (documentation, repr)

  static PyTensor owning(Tensor t);  // takes the tensor
  static PyTensor copy_of(const TensorView& v) ;
  static PyTensor borrowed(const TensorView& v, bool output) { return PyTensor{v, nullptr, output}; }
};

// The DLPack capsule ("dltensor") of a tensor on the host (kDLCPU).
pyb::capsule to_dlpack(const PyTensor& t);
// numpy's __array_interface__ (bfloat16 as its 16-bit pattern, '<u2': numpy has no bfloat16).
pyb::dict array_interface(const PyTensor& t);

// An object (anything with __dlpack__, e.g. a torch.Tensor on the CPU or a
// numpy array) as an owned contiguous Tensor of `shape`, in `dtype`: the same
// dtype is copied bit for bit; float32 and float64 are rounded to a 16-bit
// float dtype (round to nearest even), float64 to float32; anything else, or
// another shape, throws TypeError / ValueError naming `what`.
Tensor tensor_from_python(const pyb::handle& obj, DType dtype, const Shape& shape, const std::string& what);

}  // namespace mlagate::py
