// Force-included (`-include`) into every mlx-c translation unit by build.rs.
#pragma once

// 1. GCC 12 (Debian 12) ships no <format>; mlx-c only uses `std::format` with plain `{}`
//    placeholders in mlx/c/private/io.h, so a minimal substitute is enough there.
#include <version>
#if !defined(__cpp_lib_format)
#include <sstream>
#include <string>
#include <string_view>
namespace std {
namespace hunch_detail {
inline void format_rest(std::ostringstream& out, std::string_view fmt) { out << fmt; }
template <class T, class... Rest>
void format_rest(std::ostringstream& out, std::string_view fmt, const T& first,
                 const Rest&... rest) {
  auto at = fmt.find("{}");
  if (at == std::string_view::npos) {
    out << fmt;
    return;
  }
  out << fmt.substr(0, at) << first;
  format_rest(out, fmt.substr(at + 2), rest...);
}
}  // namespace hunch_detail
template <class... Args>
std::string format(std::string_view fmt, const Args&... args) {
  std::ostringstream out;
  hunch_detail::format_rest(out, fmt, args...);
  return out.str();
}
}  // namespace std
#endif

// 2. mlx-c declares float16_t/bfloat16_t (and the accessors that use them) only on aarch64,
//    but mlx-rs calls those accessors on every platform. Elsewhere, use MLX's own half types,
//    which have the same 2-byte layout.
#if !defined(__aarch64__)
#include "mlx/types/half_types.h"
typedef mlx::core::float16_t float16_t;
typedef mlx::core::bfloat16_t bfloat16_t;
#ifndef HAS_FLOAT16
#define HAS_FLOAT16
#endif
#ifndef HAS_BFLOAT16
#define HAS_BFLOAT16
#endif
#endif
