#include "errors.hpp"

#include <exception>

#include "kvcore/error.hpp"

namespace kvcore::py {

namespace nb = nanobind;

namespace {

constexpr int kCodes = 5;
PyObject* g_error = nullptr;
PyObject* g_by_code[kCodes] = {};  // indexed by ErrorCode

PyObject* new_type(nb::module_& m, const char* name, const char* doc, PyObject* bases, const char* code) {
  const std::string full = std::string("kvcore.") + name;
  PyObject* t = PyErr_NewExceptionWithDoc(full.c_str(), doc, bases, nullptr);
  if (!t) throw nb::python_error();
  if (code && PyObject_SetAttrString(t, "code", nb::str(code).ptr()) != 0) throw nb::python_error();
  m.attr(name) = nb::borrow(t);
  return t;  // the module holds a reference; this one is kept for the translator
}

PyObject* subtype(nb::module_& m, const char* name, PyObject* builtin, const char* doc, const char* code) {
  nb::object bases = nb::steal(PyTuple_Pack(2, g_error, builtin));
  return new_type(m, name, doc, bases.ptr(), code);
}

}  // namespace

void bind_errors(nb::module_& m) {
  g_error = new_type(m, "Error",
                     "Base class of every kvcore failure. The message names the bad argument and its value; the "
                     "call changed nothing. Subclasses also derive from the matching built-in exception.",
                     PyExc_Exception, nullptr);
  g_by_code[int(ErrorCode::InvalidArgument)] =
      subtype(m, "InvalidArgumentError", PyExc_ValueError, "A bad argument (also a ValueError).", "InvalidArgument");
  g_by_code[int(ErrorCode::OutOfMemory)] = subtype(
      m, "OutOfMemoryError", PyExc_MemoryError, "A pool or device allocation ran out (also a MemoryError).",
      "OutOfMemory");
  g_by_code[int(ErrorCode::NotSupported)] =
      subtype(m, "NotSupportedError", PyExc_NotImplementedError,
              "A valid request this build or format does not support (also a NotImplementedError).", "NotSupported");
  g_by_code[int(ErrorCode::Corrupt)] = subtype(
      m, "CorruptError", PyExc_RuntimeError, "State that failed a consistency check (also a RuntimeError).", "Corrupt");
  g_by_code[int(ErrorCode::DeviceError)] = subtype(m, "DeviceError", PyExc_RuntimeError,
                                                   "A CUDA runtime failure (also a RuntimeError).", "DeviceError");
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      const int c = static_cast<int>(e.code());
      PyErr_SetString(c >= 0 && c < kCodes ? g_by_code[c] : g_error, e.what());
    }
  });
}

}  // namespace kvcore::py
