// Host vectors handed to Python as numpy arrays that own them (no copy).
#pragma once
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <initializer_list>
#include <vector>

namespace kvcore::py {

template <class T>
nanobind::object numpy_from(std::vector<T>&& v, std::initializer_list<size_t> shape) {
  namespace nb = nanobind;
  auto* heap = new std::vector<T>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  nb::ndarray<nb::numpy, T> a(heap->data(), shape.size(), shape.begin(), owner);
  return a.cast();
}

}  // namespace kvcore::py
