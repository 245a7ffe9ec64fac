// Phase stamps of the TMA latent kernels (issue 33, measurement only): with
// MlaPlanInput::phase_stamps set, thread 0 (phase 1: the TMA-issuing thread) of every CTA of
// kSerial / kHandOff (mla_decode_tma.cu) and kRows16 (mla_decode_rows16.cu) writes, per phase, the
// %globaltimer (ns, comparable across SMs) and clock64 (SM cycles, for durations inside the CTA).
// Layout: kMlaStampWords uint64 per CTA, CTA index blockIdx.x + gridDim.x * (blockIdx.y +
// gridDim.y * blockIdx.z); words [0, kMlaPhases) globaltimer, [kMlaPhases, 2 kMlaPhases) clock64
// (0: the phase was not reached), then kMlaStampTicket (0 no ticket taken, 1 lost, 2 won: the
// merger), kMlaStampSm (%smid), kMlaStampTiles (the CTA's tiles), then the merger's clock64
// after MergeGroupSplits staged the LSEs and after its weights (kMlaStampMergeLse / Weights).
// The caller zeroes the buffer.
#ifndef TANDEM_KERNELS_MLA_MLA_PHASE_STAMPS_H_
#define TANDEM_KERNELS_MLA_MLA_PHASE_STAMPS_H_

namespace tandem::kernels::cuda {

enum MlaPhase : int {
  kMlaPhaseEntry = 0,      // kernel entry
  kMlaPhaseSetup = 1,      // barriers, tensor-map prefetch, plan / block-table reads, the first
                           // stages' TMA issued (the issuing thread)
  kMlaPhaseQ = 2,          // Q staged (kSerial: landed in shared memory; kRows16: staged in
                           // stage 2's buffer, its fragments read, tile 2 issued)
  kMlaPhaseFirstTile = 3,  // every chunk of tile 0 landed (its full barriers' wait returned)
  kMlaPhaseLastMath = 4,   // the last tile's P V done (thread 0's)
  kMlaPhaseStored = 5,     // the rows / partials stored (thread 0's stores issued)
  kMlaPhaseTicket = 6,     // merge ticket taken (split groups only; kMlaStampTicket: won / lost)
  kMlaPhaseMergeDone = 7,  // the merger's last store (CTA barrier after MergeGroupSplits)
  kMlaPhases = 8,
};
inline constexpr int kMlaStampTicket = 2 * kMlaPhases, kMlaStampSm = kMlaStampTicket + 1,
                     kMlaStampTiles = kMlaStampSm + 1, kMlaStampMergeLse = kMlaStampTiles + 1,
                     kMlaStampMergeWeights = kMlaStampMergeLse + 1, kMlaStampWords = 21;
inline constexpr const char* kMlaPhaseNames[kMlaPhases] = {
    "entry",          "setup+issue", "Q staged", "tile 0 landed",
    "last tile math", "stored",      "ticket",   "merge done"};

}  // namespace tandem::kernels::cuda

#endif  // TANDEM_KERNELS_MLA_MLA_PHASE_STAMPS_H_
