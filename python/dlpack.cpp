// DLPack export and import for the Python module (dlpack.h): the "dltensor"
// capsule protocol of the DLPack specification over the DLPack structs the
// plugin ABI already declares.
#include "python/dlpack.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backends/plugin/abi.h"
#include "cases/encoding.h"

namespace mlagate::py {
namespace {

// DLDevice, DLDataType and DLTensor are the plugin ABI's (mlagate/plugin.h,
// the DLPack definitions), with its dtype mapping (backends/plugin/abi.h); the
// capsule protocol adds the managed tensor.
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

using plugin::dl_dtype;
using plugin::dl_dtype_str;

bool from_dl_dtype(DLDataType d, DType& out) {
  if (d.lanes != 1) return false;
  for (DType t : {DType::kF64, DType::kF32, DType::kF16, DType::kBF16, DType::kI32, DType::kI64, DType::kU8}) {
    const DLDataType x = dl_dtype(t);
    if (x.code == d.code && x.bits == d.bits) {
      out = t;
      return true;
    }
  }
  return false;
}

struct Exported {
  DLManagedTensor managed{};
  Shape shape;
  std::vector<std::int64_t> strides;  // elements; empty: compact
  std::shared_ptr<const void> owner;
};

void delete_exported(DLManagedTensor* m) { delete static_cast<Exported*>(m->manager_ctx); }

void capsule_destructor(PyObject* capsule) {
  // Unconsumed ("dltensor" still): ours to free. A consumer renames it and owns it.
  // This may run while an exception is being raised: keep it as it is.
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    if (m && m->deleter) m->deleter(m);
  }
  PyErr_Restore(type, value, traceback);
}

// float64 -> float32 rounded to odd: the nearest float32 toward zero with its
// last bit set when inexact, so that a further round to nearest even (to
// bfloat16 or float16, 8+ bits shorter) equals rounding the double directly.
float f64_to_f32_odd(double d) {
  float f = static_cast<float>(d);
  if (!std::isfinite(f) || static_cast<double>(f) == d) return f;
  std::uint32_t b = std::bit_cast<std::uint32_t>(f);
  if (std::fabs(static_cast<double>(f)) > std::fabs(d)) b -= 1;  // rounded away from zero: one step back
  return std::bit_cast<float>(b | 1u);
}

const char* typestr(DType t) {
  switch (t) {
    case DType::kF64: return "<f8";
    case DType::kF32: return "<f4";
    case DType::kF16: return "<f2";
    case DType::kBF16: return "<u2";
    case DType::kI32: return "<i4";
    case DType::kI64: return "<i8";
    case DType::kU8: return "|u1";
  }
  return "|V1";
}

}  // namespace

PyTensor PyTensor::owning(Tensor t) {
  auto held = std::make_shared<Tensor>(std::move(t));
  return PyTensor{held->view(), held, false};
}

PyTensor PyTensor::copy_of(const TensorView& v) {
  Tensor t = Tensor::for_overwrite(v.dtype, v.shape);
  if (v.nbytes()) v.pack_into(t.bytes());  // a strided view's elements, packed
  return owning(std::move(t));
}

pyb::capsule to_dlpack(const PyTensor& t) {
  auto* e = new Exported;
  e->shape = t.view.shape;
  e->owner = t.owner;
  DLTensor& d = e->managed.dl_tensor;
  d.data = t.view.data;
  d.device = {kDLCPU, 0};
  d.ndim = static_cast<std::int32_t>(e->shape.size());
  d.dtype = dl_dtype(t.view.dtype);
  d.shape = e->shape.data();
  // A strided view (layout strided, a backend that declares strided_views)
  // goes out with its strides: torch.from_dlpack and numpy.from_dlpack keep them.
  e->strides = t.view.strides;
  d.strides = e->strides.empty() ? nullptr : e->strides.data();
  d.byte_offset = 0;
  e->managed.manager_ctx = e;
  e->managed.deleter = delete_exported;
  PyObject* cap = PyCapsule_New(&e->managed, "dltensor", capsule_destructor);
  if (!cap) {
    delete e;
    throw pyb::error_already_set();
  }
  return pyb::reinterpret_steal<pyb::capsule>(cap);
}

pyb::dict array_interface(const PyTensor& t) {
  pyb::dict d;
  pyb::tuple shape(t.view.shape.size());
  for (std::size_t i = 0; i < t.view.shape.size(); ++i) shape[i] = pyb::int_(t.view.shape[i]);
  d["shape"] = shape;
  d["typestr"] = typestr(t.view.dtype);
  if (!t.view.strides.empty()) {  // in bytes, as numpy counts them
    pyb::tuple st(t.view.strides.size());
    for (std::size_t i = 0; i < t.view.strides.size(); ++i)
      st[i] = pyb::int_(t.view.strides[i] * static_cast<std::int64_t>(dtype_size(t.view.dtype)));
    d["strides"] = st;
  }
  // Inputs read-only (a kernel must not write into what the next one reads), outputs writable.
  d["data"] = pyb::make_tuple(reinterpret_cast<std::uintptr_t>(t.view.data), !t.output);
  d["version"] = 3;
  return d;
}

Tensor tensor_from_python(const pyb::handle& obj, DType dtype, const Shape& shape, const std::string& what) {
  if (!pyb::hasattr(obj, "__dlpack__"))
    throw pyb::type_error(what + ": expected a tensor (a torch.Tensor or numpy array: anything with __dlpack__), got " +
                          std::string(pyb::str(pyb::type::handle_of(obj).attr("__name__"))));
  pyb::object cap = obj.attr("__dlpack__")();
  if (!PyCapsule_IsValid(cap.ptr(), "dltensor"))
    throw pyb::type_error(what + ": __dlpack__ did not return a DLPack capsule");
  auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(cap.ptr(), "dltensor"));
  // From here the capsule is consumed: we call its deleter, whatever happens.
  PyCapsule_SetName(cap.ptr(), "used_dltensor");
  struct Release {
    DLManagedTensor* m;
    ~Release() {
      if (m->deleter) m->deleter(m);
    }
  } release{m};
  const DLTensor& d = m->dl_tensor;
  if (d.device.device_type != kDLCPU)
    throw pyb::value_error(what + ": on " + plugin::dl_device_str(d.device) + ", not the host (move it with .cpu())");
  DType given{};
  if (!from_dl_dtype(d.dtype, given))
    throw pyb::type_error(what + ": dtype " + dl_dtype_str(d.dtype) + " (expected " + std::string(dtype_name(dtype)) + ")");
  const Shape got(d.shape, d.shape + d.ndim);
  if (got != shape)
    throw pyb::value_error(what + ": shape " + shape_str(got) + ", expected " + shape_str(shape));
  const bool widening_ok = (given == DType::kF32 || given == DType::kF64) &&
                           (dtype == DType::kBF16 || dtype == DType::kF16 || dtype == DType::kF32);
  if (given != dtype && !widening_ok)
    throw pyb::type_error(what + ": dtype " + std::string(dtype_name(given)) + ", expected " +
                          std::string(dtype_name(dtype)) + " (float32 and float64 are rounded to it; others are not)");

  // A compact copy in the given dtype, strides honoured.
  Tensor src = Tensor::for_overwrite(given, shape);
  const std::size_t es = dtype_size(given);
  const auto* base = static_cast<const std::byte*>(d.data) + d.byte_offset;
  bool compact = d.strides == nullptr;
  if (!compact) {
    compact = true;
    std::int64_t expect = 1;
    for (int i = d.ndim - 1; i >= 0; --i) {
      if (d.shape[i] != 1 && d.strides[i] != expect) compact = false;
      expect *= d.shape[i];
    }
  }
  const std::int64_t n = shape_numel(shape);
  if (compact) {
    if (n) std::memcpy(src.bytes(), base, static_cast<std::size_t>(n) * es);
  } else {
    std::vector<std::int64_t> idx(static_cast<std::size_t>(d.ndim), 0);
    for (std::int64_t flat = 0; flat < n; ++flat) {
      std::int64_t off = 0;
      for (int i = 0; i < d.ndim; ++i) off += idx[i] * d.strides[i];
      std::memcpy(src.bytes() + flat * es, base + off * static_cast<std::int64_t>(es), es);
      for (int i = d.ndim - 1; i >= 0; --i) {
        if (++idx[i] < d.shape[i]) break;
        idx[i] = 0;
      }
    }
  }
  if (given == dtype) return src;
  Tensor out = Tensor::for_overwrite(dtype, shape);
  if (dtype == DType::kF32) {  // from float64: round to nearest even
    const double* in = src.data<double>();
    float* o = out.data<float>();
    for (std::int64_t i = 0; i < n; ++i) o[i] = static_cast<float>(in[i]);
  } else if (given == DType::kF32) {
    f32_run_to_16bit(src.data<float>(), n, dtype == DType::kBF16, out.data<std::uint16_t>());
  } else {  // float64 to 16 bits: once, through float32 rounded to odd
    std::vector<float> mid(static_cast<std::size_t>(n));
    const double* in = src.data<double>();
    for (std::int64_t i = 0; i < n; ++i) mid[static_cast<std::size_t>(i)] = f64_to_f32_odd(in[i]);
    f32_run_to_16bit(mid.data(), n, dtype == DType::kBF16, out.data<std::uint16_t>());
  }
  return out;
}

}  // namespace mlagate::py
