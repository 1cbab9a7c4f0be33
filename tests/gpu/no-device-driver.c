/* A stand-in for the NVIDIA driver's libcuda.so.1 on a machine that has no NVIDIA device, for
 * tests/gpu/imitation.sh only (never packed, never on the GPU machine).
 *
 * The real driver library on such a machine loads and answers every call that needs a device
 * with CUDA_ERROR_NO_DEVICE ("no CUDA-capable device is detected"). A container on this CPU
 * machine has no driver at all, and MLX's CUDA libmlx.so names libcuda.so.1 as a dependency, so
 * without this nothing linked against it would even start. It exports what libmlx imports from
 * the driver plus the entry points CUDA's runtime (linked into libmlx statically) looks up
 * through cuGetProcAddress; all of them answer CUDA_ERROR_NO_DEVICE, except the version and
 * error-string queries, which answer as a CUDA 13.0 driver would.
 *
 *   cc -shared -fPIC -o libcuda.so.1 -Wl,-soname,libcuda.so.1 tests/gpu/no-device-driver.c
 */
#include <stddef.h>
#include <string.h>

typedef int CUresult;
enum { CUDA_SUCCESS = 0, CUDA_ERROR_INVALID_VALUE = 1, CUDA_ERROR_NO_DEVICE = 100 };

static CUresult no_device(void) { return CUDA_ERROR_NO_DEVICE; }

CUresult cuDriverGetVersion(int *version) {
  if (version == NULL) return CUDA_ERROR_INVALID_VALUE;
  *version = 13000;
  return CUDA_SUCCESS;
}

CUresult cuGetErrorName(CUresult error, const char **name) {
  if (name == NULL) return CUDA_ERROR_INVALID_VALUE;
  *name = error == CUDA_ERROR_NO_DEVICE ? "CUDA_ERROR_NO_DEVICE"
          : error == CUDA_SUCCESS      ? "CUDA_SUCCESS"
                                       : "CUDA_ERROR_UNKNOWN";
  return CUDA_SUCCESS;
}

CUresult cuGetErrorString(CUresult error, const char **text) {
  if (text == NULL) return CUDA_ERROR_INVALID_VALUE;
  *text = error == CUDA_ERROR_NO_DEVICE ? "no CUDA-capable device is detected"
          : error == CUDA_SUCCESS      ? "no error"
                                       : "unknown error";
  return CUDA_SUCCESS;
}

CUresult cuInit(unsigned flags) { (void)flags; return CUDA_ERROR_NO_DEVICE; }
CUresult cuDeviceGetCount(int *count) {
  if (count != NULL) *count = 0;
  return CUDA_ERROR_NO_DEVICE;
}

/* CUDA's runtime finds every other entry point through this. */
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version, unsigned long long flags,
                             int *status) {
  (void)version; (void)flags;
  if (symbol == NULL || pfn == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (strcmp(symbol, "cuDriverGetVersion") == 0) *pfn = (void *)cuDriverGetVersion;
  else if (strcmp(symbol, "cuGetErrorName") == 0) *pfn = (void *)cuGetErrorName;
  else if (strcmp(symbol, "cuGetErrorString") == 0) *pfn = (void *)cuGetErrorString;
  else if (strcmp(symbol, "cuGetProcAddress") == 0) *pfn = (void *)cuGetProcAddress_v2;
  else if (strcmp(symbol, "cuDeviceGetCount") == 0) *pfn = (void *)cuDeviceGetCount;
  else *pfn = (void *)no_device;
  if (status != NULL) *status = 0; /* CU_GET_PROC_ADDRESS_SUCCESS */
  return CUDA_SUCCESS;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}

/* What libmlx.so 0.32.2 imports from the driver directly (readelf --dyn-syms). */
#define NO_DEVICE(name) \
  CUresult name(void) { return CUDA_ERROR_NO_DEVICE; }
NO_DEVICE(cuGraphKernelNodeSetAttribute)
NO_DEVICE(cuFuncSetAttribute)
NO_DEVICE(cuModuleUnload)
NO_DEVICE(cuGraphCreate)
NO_DEVICE(cuGraphAddKernelNode_v2)
NO_DEVICE(cuLaunchKernelEx)
NO_DEVICE(cuModuleGetFunction)
NO_DEVICE(cuOccupancyMaxPotentialBlockSize)
NO_DEVICE(cuModuleLoadDataEx)
NO_DEVICE(cuGraphGetNodes)
NO_DEVICE(cuTensorMapEncodeTiled)
NO_DEVICE(cuDeviceGet)
NO_DEVICE(cuDeviceGetName)
NO_DEVICE(cuDeviceGetAttribute)
NO_DEVICE(cuDeviceTotalMem_v2)
NO_DEVICE(cuCtxGetCurrent)
