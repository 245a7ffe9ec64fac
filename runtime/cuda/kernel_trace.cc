#include "runtime/cuda/kernel_trace.h"

#include <cupti.h>
#include <cxxabi.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

namespace tandem::runtime::cuda {
namespace {

using KindFn = CUptiResult (*)(CUpti_ActivityKind);
using RegisterFn = CUptiResult (*)(CUpti_BuffersCallbackRequestFunc,
                                   CUpti_BuffersCallbackCompleteFunc);
using FlushFn = CUptiResult (*)(uint32_t);
using NextFn = CUptiResult (*)(uint8_t*, size_t, CUpti_Activity**);
using TimestampFn = CUptiResult (*)(uint64_t*);
using CallbackNameFn = CUptiResult (*)(CUpti_CallbackDomain, uint32_t, const char**);

constexpr size_t kBufferBytes = size_t{8} << 20;

std::string Demangle(const char* name) {
  if (name == nullptr) return "?";
  int status = 0;
  char* plain = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  if (status != 0 || plain == nullptr) return name;
  std::string out(plain);
  std::free(plain);
  return out;
}

}  // namespace

struct KernelTrace::Impl {
  KindFn enable = nullptr;
  KindFn disable = nullptr;
  RegisterFn register_callbacks = nullptr;
  FlushFn flush = nullptr;
  NextFn next = nullptr;
  TimestampFn timestamp = nullptr;
  CallbackNameFn callback_name = nullptr;  // runtime calls' names (optional)
  bool host_events = false;                // memcpy + runtime-call records too
  absl::Mutex mu;
  std::vector<KernelRecord> records ABSL_GUARDED_BY(mu);
};

namespace {

// The active trace, for CUPTI's callbacks (they carry no user pointer): set by Start, cleared by
// the destructor.
std::atomic<KernelTrace::Impl*> active_trace{nullptr};

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = *buffer == nullptr ? 0 : kBufferBytes;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  KernelTrace::Impl* trace = active_trace.load();
  if (trace != nullptr) {
    std::vector<KernelRecord> got;
    CUpti_Activity* record = nullptr;
    while (trace->next(buffer, valid, &record) == CUPTI_SUCCESS) {
      if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        const char* what = m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_HTOD   ? "memcpy HtoD"
                           : m->copyKind == CUPTI_ACTIVITY_MEMCPY_KIND_DTOH ? "memcpy DtoH"
                                                                            : "memcpy";
        got.push_back({what, m->start, m->end, 0, 0, KernelRecord::Kind::kMemcpy});
        continue;
      }
      if (record->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
        const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(record);
        const char* name = nullptr;
        if (trace->callback_name == nullptr ||
            trace->callback_name(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name) != CUPTI_SUCCESS ||
            name == nullptr) {
          name = "?";
        }
        got.push_back({name, a->start, a->end, 0, 0, KernelRecord::Kind::kApi, a->returnValue});
        continue;
      }
      if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL &&
          record->kind != CUPTI_ACTIVITY_KIND_KERNEL) {
        continue;
      }
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      got.push_back({Demangle(k->name), k->start, k->end, static_cast<uint32_t>(k->gridX),
                     static_cast<uint32_t>(k->blockX)});
    }
    absl::MutexLock lock(&trace->mu);
    trace->records.insert(trace->records.end(), got.begin(), got.end());
  }
  std::free(buffer);
}

template <typename Fn>
Fn Symbol(void* lib, const char* name) {
  return reinterpret_cast<Fn>(dlsym(lib, name));
}

}  // namespace

KernelTrace::KernelTrace(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

absl::StatusOr<std::unique_ptr<KernelTrace>> KernelTrace::Start(bool host_events) {
  // Never closed: CUPTI keeps threads and hooks in the process.
  void* lib = dlopen("libcupti.so.13", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) lib = dlopen("libcupti.so", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return absl::UnavailableError(absl::StrCat("libcupti: ", dlerror()));
  auto impl = std::make_unique<Impl>();
  impl->enable = Symbol<KindFn>(lib, "cuptiActivityEnable");
  impl->disable = Symbol<KindFn>(lib, "cuptiActivityDisable");
  impl->register_callbacks = Symbol<RegisterFn>(lib, "cuptiActivityRegisterCallbacks");
  impl->flush = Symbol<FlushFn>(lib, "cuptiActivityFlushAll");
  impl->next = Symbol<NextFn>(lib, "cuptiActivityGetNextRecord");
  impl->timestamp = Symbol<TimestampFn>(lib, "cuptiGetTimestamp");
  impl->callback_name = Symbol<CallbackNameFn>(lib, "cuptiGetCallbackName");
  impl->host_events = host_events;
  if (!impl->enable || !impl->disable || !impl->register_callbacks || !impl->flush || !impl->next ||
      !impl->timestamp) {
    return absl::UnavailableError("libcupti lacks the activity API");
  }
  Impl* expected = nullptr;
  if (!active_trace.compare_exchange_strong(expected, impl.get())) {
    return absl::FailedPreconditionError("a kernel trace is already active in this process");
  }
  CUptiResult r = impl->register_callbacks(BufferRequested, BufferCompleted);
  if (r == CUPTI_SUCCESS) r = impl->enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  if (r == CUPTI_SUCCESS && host_events) r = impl->enable(CUPTI_ACTIVITY_KIND_MEMCPY);
  if (r == CUPTI_SUCCESS && host_events) r = impl->enable(CUPTI_ACTIVITY_KIND_RUNTIME);
  if (r != CUPTI_SUCCESS) {
    active_trace.store(nullptr);
    return absl::UnavailableError(absl::StrCat("CUPTI activity tracing refused: error ", r));
  }
  return std::unique_ptr<KernelTrace>(new KernelTrace(std::move(impl)));
}

KernelTrace::~KernelTrace() {
  impl_->disable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  if (impl_->host_events) {
    impl_->disable(CUPTI_ACTIVITY_KIND_MEMCPY);
    impl_->disable(CUPTI_ACTIVITY_KIND_RUNTIME);
  }
  impl_->flush(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  active_trace.store(nullptr);
}

uint64_t KernelTrace::Now() const {
  uint64_t t = 0;
  impl_->timestamp(&t);
  return t;
}

absl::StatusOr<std::vector<KernelRecord>> KernelTrace::Collect() {
  if (const CUptiResult r = impl_->flush(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED); r != CUPTI_SUCCESS) {
    return absl::InternalError(absl::StrCat("cuptiActivityFlushAll: error ", r));
  }
  std::vector<KernelRecord> out;
  {
    absl::MutexLock lock(&impl_->mu);
    out.swap(impl_->records);
  }
  std::sort(out.begin(), out.end(),
            [](const KernelRecord& a, const KernelRecord& b) { return a.start_ns < b.start_ns; });
  return out;
}

}  // namespace tandem::runtime::cuda
