// Phase stamps and the L2 KV prefetch of the tensor-core paged decode kernel (measurement and an
// opt-in candidate, both compile-time: PagedDecodeTcKernel's kMode, see DecodeMode below, so the
// default instantiation's SASS is unchanged).
//
// Stamps (PagedAttentionPlanInput::phase_stamps): thread 0 of every CTA writes, per phase, the
// %globaltimer (ns, comparable across SMs) and clock64 (SM cycles, for durations inside the CTA).
// Layout: kDecodeStampWords uint64 per CTA, CTA index blockIdx.x + gridDim.x * (blockIdx.y +
// gridDim.y * blockIdx.z); words [0, kDecodePhases) globaltimer, [kDecodePhases, 2 kDecodePhases)
// clock64 (0: the phase was not reached), then kDecodeStampTicket (0 no ticket taken, 1 lost,
// 2 won: the merger), kDecodeStampSm (%smid), kDecodeStampTiles (the CTA's KV tiles),
// kDecodeStampSplits (num_splits), kDecodeStampKeys (the split's keys). The caller zeroes it.
#ifndef TANDEM_KERNELS_ATTENTION_CUDA_DECODE_PHASE_STAMPS_H_
#define TANDEM_KERNELS_ATTENTION_CUDA_DECODE_PHASE_STAMPS_H_

namespace tandem::kernels::cuda {

enum DecodePhase : int {
  kDecodePhaseEntry = 0,      // kernel entry
  kDecodePhaseBounds = 1,     // query_start_loc / seq_lens and the first block-table entries
                              // landed (the stamp stores them, so it waits for the loads)
  kDecodePhaseWait = 2,       // griddepcontrol.wait returned (PDL: the predecessor finished)
  kDecodePhaseQ = 3,          // q's A fragments landed (stored likewise)
  kDecodePhaseFirstTile = 4,  // tile 0 landed (first cp.async wait + barrier of the loop)
  kDecodePhaseLastTile = 5,   // the last tile's P.V done (ring drained, barrier passed)
  kDecodePhaseStored = 6,     // the rows / partials stored (thread 0's stores issued)
  kDecodePhaseTicket = 7,     // merge ticket taken (in-kernel merge only; kDecodeStampTicket)
  kDecodePhaseMergeDone = 8,  // the merger's MergeGroupSplits returned
  kDecodePhases = 9,
};
inline constexpr int kDecodeStampTicket = 2 * kDecodePhases,
                     kDecodeStampSm = kDecodeStampTicket + 1,
                     kDecodeStampTiles = kDecodeStampSm + 1,
                     kDecodeStampSplits = kDecodeStampTiles + 1,
                     kDecodeStampKeys = kDecodeStampSplits + 1,
                     kDecodeStampValue = kDecodeStampKeys + 1,  // sink for the landed values
    kDecodeStampWords = 24;
inline constexpr const char* kDecodePhaseNames[kDecodePhases] = {
    "entry",     "bounds+table", "pdl wait", "q landed",  "tile 0 landed",
    "last tile", "stored",       "ticket",   "merge done"};

namespace internal {

// PagedDecodeTcKernel's compile-time mode bits (0: the default kernel).
enum DecodeMode : int {
  kDecodeModeStamps = 1,      // write p.phase_stamps
  kDecodeModePrefetchKv = 2,  // before griddepcontrol.wait, prefetch the split's older K/V rows
  kDecodeModeEarlyTable = 4,  // before griddepcontrol.wait, load the first tiles' block-table
                              // entries of the CTA's actual split (not the planned length's)
};

#ifdef __CUDACC__
__device__ __forceinline__ unsigned long long* DecodeStampWord(unsigned long long* stamps, int w) {
  const long long cta =
      blockIdx.x + gridDim.x * (blockIdx.y + static_cast<long long>(gridDim.y) * blockIdx.z);
  return stamps + cta * kDecodeStampWords + w;
}

// One thread: %globaltimer and clock64 of `phase`; `landed` (a loaded value) is stored first, so
// the stamp is taken only after that load returned. At entry, also the SM id.
inline __device__ __noinline__ void WriteDecodeStamp(unsigned long long* stamps, int phase,
                                                     unsigned long long landed) {
  *DecodeStampWord(stamps, kDecodeStampValue) = landed;
  unsigned long long gt;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(gt)::"memory");
  const long long ck = clock64();
  *DecodeStampWord(stamps, phase) = gt;
  *DecodeStampWord(stamps, kDecodePhases + phase) = static_cast<unsigned long long>(ck);
  if (phase == kDecodePhaseEntry) {
    unsigned int sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    *DecodeStampWord(stamps, kDecodeStampSm) = sm;
  }
}

// L2 prefetch of one 128-byte line (no value changes; a hint the memory system may drop).
__device__ __forceinline__ void PrefetchL2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}
#endif  // __CUDACC__

}  // namespace internal
}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_ATTENTION_CUDA_DECODE_PHASE_STAMPS_H_
