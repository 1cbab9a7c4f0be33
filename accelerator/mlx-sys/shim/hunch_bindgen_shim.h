/* Force-included into bindgen's parse on non-aarch64 targets so the generated API matches
 * aarch64's: float16_t becomes bindgen's 2-byte `__BindgenFloat16`, bfloat16_t a `u16`. */
#pragma once
#if !defined(__aarch64__)
typedef __fp16 float16_t;
typedef unsigned short bfloat16_t;
#define HAS_FLOAT16
#define HAS_BFLOAT16
#endif
