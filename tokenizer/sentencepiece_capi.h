/* The C ABI of libtandem_spm.so: Debian's libsentencepiece behind plain C types, so that it can
 * be loaded with dlmopen(LM_ID_NEWLM) into a link namespace of its own
 * (sentencepiece_library.h). libsentencepiece exports the protobuf-lite it bundles; in the
 * namespace of a process that also has the system libprotobuf (anything with gRPC) the two
 * interpose and crash. Across the namespace boundary only C types travel: no C++ object, no
 * exception, and memory the library allocates (error strings, decoded text) is released with
 * tandem_spm_free (the namespace has its own malloc).
 *
 * Thread safety: a loaded model may be used from several threads at once (SentencePiece's
 * const methods); load/unload are not concurrent with other calls on the same model.
 * Errors: functions that can fail return 0 on success, else -1 with *error set to a
 * NUL-terminated message (release with tandem_spm_free). */
#ifndef TANDEM_TOKENIZER_SENTENCEPIECE_CAPI_H_
#define TANDEM_TOKENIZER_SENTENCEPIECE_CAPI_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped on any change of the functions below; the loader refuses another version. */
#define TANDEM_SPM_ABI_VERSION 1

/* tandem_spm_piece_type bits. */
#define TANDEM_SPM_PIECE_CONTROL 1u /* <s>, </s>: invisible to SentencePiece's decoder */
#define TANDEM_SPM_PIECE_BYTE 2u    /* <0xAB>: one byte of a byte-fallback run */
#define TANDEM_SPM_PIECE_UNKNOWN 4u /* <unk> */

typedef struct tandem_spm_model tandem_spm_model;

uint32_t tandem_spm_abi_version(void);

/* Loads a SentencePiece .model file; NULL and *error on failure. */
tandem_spm_model* tandem_spm_load(const char* path, char** error);
void tandem_spm_unload(tandem_spm_model* model);

int32_t tandem_spm_piece_size(const tandem_spm_model* model);
int32_t tandem_spm_bos_id(const tandem_spm_model* model); /* -1: none */
int32_t tandem_spm_unk_id(const tandem_spm_model* model);
/* The piece of `id` (*len bytes, not NUL-terminated; valid while the model is loaded), NULL
 * for an id outside [0, piece_size). */
const char* tandem_spm_id_to_piece(const tandem_spm_model* model, int32_t id, size_t* len);
uint32_t tandem_spm_piece_type(const tandem_spm_model* model, int32_t id);

/* Encodes `len` bytes of UTF-8 into ids[0 .. capacity); *count is the number of ids, which may
 * exceed `capacity` (then only the first `capacity` were written: call again with more room). */
int tandem_spm_encode(const tandem_spm_model* model, const char* text, size_t len, int32_t* ids,
                      size_t capacity, size_t* count, char** error);

/* SentencePiece's own decoding of `count` ids: *text (NUL-terminated, *len bytes) is released
 * with tandem_spm_free. */
int tandem_spm_decode(const tandem_spm_model* model, const int32_t* ids, size_t count, char** text,
                      size_t* len, char** error);

void tandem_spm_free(void* p);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TANDEM_TOKENIZER_SENTENCEPIECE_CAPI_H_ */
