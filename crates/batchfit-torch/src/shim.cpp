// batchfit's C++ shim over libtorch: what tch 0.24 does not bind.
//
// * CUDA caching-allocator statistics, cache release, peak reset and free/total memory, through the
//   device-agnostic at::accelerator API (<ATen/DeviceAccelerator.h>), so no CUDA headers are needed and
//   this file compiles and links against every libtorch build, with or without a GPU present.
// * Autocast with a dtype for the CUDA device type (tch's `autocast` takes none).
//
// Compiled by build.rs with the `cc` crate; the Rust side is src/gpu/allocator.rs.
//
// Conventions, for every function:
// * returns a status code: 0 ok, 1 no CUDA device, 2 no such device index, 3 libtorch raised;
// * on a non-zero status `*err` receives a malloc'd NUL-terminated message (when `err` is not null),
//   which the caller frees with batchfit_shim_free; on success `*err` is left untouched;
// * no C++ exception ever crosses the C boundary.

#include <ATen/Context.h>
#include <ATen/DeviceAccelerator.h>
#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>

namespace {

constexpr int kOk = 0;
constexpr int kNoCuda = 1;
constexpr int kNoSuchDevice = 2;
constexpr int kTorchError = 3;

// Autocast dtype codes shared with the Rust side.
constexpr int32_t kDtypeOther = 0;
constexpr int32_t kDtypeBf16 = 1;
constexpr int32_t kDtypeFp16 = 2;

int fail(char** err, int code, const std::string& msg) {
  if (err != nullptr) {
    char* s = static_cast<char*>(std::malloc(msg.size() + 1));
    if (s != nullptr) {
      std::memcpy(s, msg.data(), msg.size());
      s[msg.size()] = '\0';
    }
    *err = s;
  }
  return code;
}

// Runs `f` (which returns a status) with every exception turned into kTorchError and a message.
// c10::Error's what() carries a C++ backtrace; its first part is the useful message.
template <typename F>
int guarded(char** err, F&& f) {
  try {
    return f();
  } catch (const c10::Error& e) {
    return fail(err, kTorchError, e.what_without_backtrace());
  } catch (const std::exception& e) {
    return fail(err, kTorchError, e.what());
  } catch (...) {
    return fail(err, kTorchError, "unknown C++ exception in libtorch");
  }
}

// Checks that libtorch's accelerator is CUDA and has at least one device; returns the device count.
int require_cuda(char** err, int64_t* count) {
  const auto acc = at::accelerator::getAccelerator(false);
  if (!acc.has_value()) {
    return fail(err, kNoCuda,
                "libtorch has no accelerator at all (libtorch_cuda is not loaded: is this a CPU-only "
                "libtorch, or was libtorch_cuda dropped at link time?)");
  }
  if (*acc != c10::DeviceType::CUDA) {
    return fail(err, kNoCuda,
                "libtorch's accelerator is " + c10::DeviceTypeName(*acc) + ", not CUDA");
  }
  const int64_t n = static_cast<int64_t>(at::accelerator::deviceCount());
  if (n <= 0) {
    return fail(err, kNoCuda,
                "libtorch is built with CUDA but sees 0 CUDA devices (no GPU, no NVIDIA driver, or "
                "CUDA_VISIBLE_DEVICES hides them)");
  }
  *count = n;
  return kOk;
}

// require_cuda, plus: `device_index` names one of the devices; then initialises CUDA in libtorch
// (creates the caching allocator), as torch.cuda's own memory functions do before asking it anything.
int require_device(char** err, int64_t device_index) {
  int64_t count = 0;
  if (int rc = require_cuda(err, &count); rc != kOk) {
    return rc;
  }
  if (device_index < 0 || device_index >= count) {
    return fail(err, kNoSuchDevice,
                "CUDA device " + std::to_string(device_index) + " does not exist: libtorch sees " +
                    std::to_string(count) + " CUDA device(s)");
  }
  at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
  return kOk;
}

}  // namespace

extern "C" {

struct batchfit_accel_stats_t {
  int64_t allocated_bytes;
  int64_t peak_allocated_bytes;
  int64_t reserved_bytes;
  int64_t peak_reserved_bytes;
  int64_t alloc_retries;
  int64_t ooms;
};

void batchfit_shim_free(char* s) { std::free(s); }

// What libtorch's accelerator is: `*device_type` gets the c10::DeviceType code (-1: none; CUDA is 1),
// its lower-case name is copied into `name` (NUL-terminated, truncated to `name_cap`), and
// `*device_count` the number of its devices (0 without one).
int batchfit_accel_available(int32_t* device_type, char* name, size_t name_cap,
                             int64_t* device_count, char** err) {
  return guarded(err, [&] {
    const auto acc = at::accelerator::getAccelerator(false);
    *device_type = acc.has_value() ? static_cast<int32_t>(*acc) : -1;
    const std::string n = acc.has_value() ? c10::DeviceTypeName(*acc, true) : std::string();
    if (name != nullptr && name_cap > 0) {
      const size_t len = n.size() < name_cap - 1 ? n.size() : name_cap - 1;
      std::memcpy(name, n.data(), len);
      name[len] = '\0';
    }
    *device_count = acc.has_value() ? static_cast<int64_t>(at::accelerator::deviceCount()) : 0;
    return kOk;
  });
}

int batchfit_accel_stats(int64_t device_index, batchfit_accel_stats_t* out, char** err) {
  return guarded(err, [&] {
    if (int rc = require_device(err, device_index); rc != kOk) {
      return rc;
    }
    const auto s = at::accelerator::getDeviceStats(static_cast<c10::DeviceIndex>(device_index));
    constexpr auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    out->allocated_bytes = s.allocated_bytes[agg].current;
    out->peak_allocated_bytes = s.allocated_bytes[agg].peak;
    out->reserved_bytes = s.reserved_bytes[agg].current;
    out->peak_reserved_bytes = s.reserved_bytes[agg].peak;
    out->alloc_retries = s.num_alloc_retries;
    out->ooms = s.num_ooms;
    return kOk;
  });
}

// Releases the caching allocator's unused cached blocks on every CUDA device.
int batchfit_accel_empty_cache(char** err) {
  return guarded(err, [&] {
    if (int rc = require_device(err, 0); rc != kOk) {
      return rc;
    }
    at::accelerator::emptyCache();
    return kOk;
  });
}

int batchfit_accel_reset_peak(int64_t device_index, char** err) {
  return guarded(err, [&] {
    if (int rc = require_device(err, device_index); rc != kOk) {
      return rc;
    }
    at::accelerator::resetPeakStats(static_cast<c10::DeviceIndex>(device_index));
    return kOk;
  });
}

// Free and total device memory as the driver reports them (cudaMemGetInfo).
int batchfit_accel_mem_info(int64_t device_index, uint64_t* free_bytes, uint64_t* total_bytes,
                            char** err) {
  return guarded(err, [&] {
    if (int rc = require_device(err, device_index); rc != kOk) {
      return rc;
    }
    const auto ft = at::accelerator::getMemoryInfo(static_cast<c10::DeviceIndex>(device_index));
    *free_bytes = static_cast<uint64_t>(ft.first);
    *total_bytes = static_cast<uint64_t>(ft.second);
    return kOk;
  });
}

// Autocast for the CUDA device type, on the calling thread (libtorch keeps it thread-local).
// `dtype`: 1 bf16, 2 fp16, 0 leave the dtype as it is.
int batchfit_autocast_set(int32_t enabled, int32_t dtype, char** err) {
  return guarded(err, [&] {
    switch (dtype) {
      case kDtypeOther:
        break;
      case kDtypeBf16:
        at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
        break;
      case kDtypeFp16:
        at::autocast::set_autocast_dtype(at::kCUDA, at::kHalf);
        break;
      default:
        return fail(err, kTorchError,
                    "unknown autocast dtype code " + std::to_string(dtype) + " (1 bf16, 2 fp16)");
    }
    at::autocast::set_autocast_enabled(at::kCUDA, enabled != 0);
    return kOk;
  });
}

// `*dtype`: 1 bf16, 2 fp16, 0 anything else (its c10::ScalarType code in `*scalar_type`).
int batchfit_autocast_get(int32_t* enabled, int32_t* dtype, int32_t* scalar_type, char** err) {
  return guarded(err, [&] {
    *enabled = at::autocast::is_autocast_enabled(at::kCUDA) ? 1 : 0;
    const auto t = at::autocast::get_autocast_dtype(at::kCUDA);
    *scalar_type = static_cast<int32_t>(t);
    *dtype = t == at::kBFloat16 ? kDtypeBf16 : t == at::kHalf ? kDtypeFp16 : kDtypeOther;
    return kOk;
  });
}

// Drops autocast's cache of lower-precision weight copies (PyTorch does this when the outermost
// autocast region exits).
int batchfit_autocast_clear_cache(char** err) {
  return guarded(err, [&] {
    at::autocast::clear_cache();
    return kOk;
  });
}

// Autocast nesting depth, as torch.autocast maintains it: `*depth` gets the new depth.
int batchfit_autocast_nesting(int32_t increment, int32_t* depth, char** err) {
  return guarded(err, [&] {
    *depth = increment != 0 ? at::autocast::increment_nesting() : at::autocast::decrement_nesting();
    return kOk;
  });
}

}  // extern "C"
