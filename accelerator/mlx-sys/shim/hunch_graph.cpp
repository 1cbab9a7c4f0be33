// How many operations an MLX graph would run: the distinct primitives reachable from some
// outputs that are not evaluated yet. Hunch's benchmarks use it to report the MLX operations a
// forward pass builds (docs/benchmarks.md); it is not on any hot path.
#include <cstdint>
#include <unordered_set>
#include <vector>

#include "mlx/c/private/array.h"

extern "C" size_t hunch_mlx_graph_operations(const mlx_array* outputs, size_t count) {
  try {
    std::unordered_set<const void*> primitives;
    std::unordered_set<std::uintptr_t> seen;
    std::vector<mlx::core::array> stack;
    for (size_t i = 0; i < count; ++i) {
      stack.push_back(mlx_array_get_(outputs[i]));
    }
    while (!stack.empty()) {
      mlx::core::array a = std::move(stack.back());
      stack.pop_back();
      if (!seen.insert(a.id()).second || !a.has_primitive()) {
        continue;
      }
      primitives.insert(static_cast<const void*>(&a.primitive()));
      for (const auto& input : a.inputs()) {
        stack.push_back(input);
      }
    }
    return primitives.size();
  } catch (...) {
    return 0;
  }
}
