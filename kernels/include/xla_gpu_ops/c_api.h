// The C ABI of libxla_gpu_ops.so: plain launchers (eager PyTorch through ctypes), the config
// struct shared by launchers and the legacy custom-call opaque, and the workspace sizing that
// every front end asks for when it builds a call. Nothing here depends on a framework.
//
// Symbol naming (derived in Python from the op table, xla_gpu_ops/_registry.py):
//   xla_gpu_<op>_launch        plain C launcher, returns XgoStatus
//   xla_gpu_<op>_cuda_ffi      typed XLA FFI handler, platform CUDA
//   xla_gpu_<op>_host_ffi      typed XLA FFI handler, platform Host (XLA:CPU)
//   xla_gpu_<op>_cuda_legacy   legacy status-returning custom call (api_version 2), platform CUDA
#ifndef XLA_GPU_OPS_C_API_H_
#define XLA_GPU_OPS_C_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define XGO_EXPORT __attribute__((visibility("default")))

typedef enum {
  XGO_OK = 0,
  XGO_INVALID_ARGUMENT = 1,  // bad shape, dtype, attribute or config; nothing was launched
  XGO_CUDA_ERROR = 2,        // a CUDA call or launch failed
} XgoStatus;

typedef enum {
  XGO_F32 = 0,
  XGO_F16 = 1,
  XGO_BF16 = 2,
} XgoDtype;

// Message of the last non-OK status returned on this thread ("" if none).
XGO_EXPORT const char* xla_gpu_ops_last_error(void);
// ABI version of this header; Python refuses a library whose version differs.
#define XGO_ABI_VERSION 1
XGO_EXPORT int32_t xla_gpu_ops_abi_version(void);

// ---------------------------------------------------------------- simple_add
// out[i] = a[i] + b[i] for i < num_elements (any num_elements >= 0; 0 launches nothing).
#define XGO_SIMPLE_ADD_MAGIC 0x41475800u /* "\0XGA" */
typedef struct {
  uint32_t magic;    // XGO_SIMPLE_ADD_MAGIC
  uint32_t version;  // 1
  int32_t dtype;     // XgoDtype
  int32_t reserved;  // 0
  int64_t num_elements;
} XgoSimpleAddConfig;

XGO_EXPORT int32_t xla_gpu_simple_add_launch(const XgoSimpleAddConfig* config, const void* a,
                                             const void* b, void* out, void* cuda_stream);

// ---------------------------------------------------------------- paged_attention
// Semantics: torch_xla ragged_paged_attention (see README / docs/DESIGN.md).
//   query        [num_tokens, num_q_heads, head_dim]                      dtype
//   kv_cache     [num_pages, page_size, 2 * num_kv_heads, head_dim]       dtype (K even, V odd)
//   context_lens int32 [max_num_seqs]
//   block_tables int32 [max_num_seqs, pages_per_seq]
//   query_start_loc int32 [max_num_seqs + 1]
//   num_seqs     int32 [1]
//   out          [num_tokens, num_q_heads, head_dim]                      dtype
//   workspace    float32 [xla_gpu_paged_attention_workspace_elems(config)]
// sliding_window == 0 and soft_cap == 0 mean "disabled"; negative values are invalid.
// Metadata values live on the device and are not read by the host: the kernel guards them
// (see docs/DESIGN.md, "Bad metadata").
#define XGO_PAGED_ATTENTION_MAGIC 0x41505800u /* "\0XPA" */
typedef struct {
  uint32_t magic;    // XGO_PAGED_ATTENTION_MAGIC
  uint32_t version;  // 1
  int32_t dtype;     // XgoDtype of query, kv_cache and out
  int32_t reserved;  // 0
  int64_t num_tokens;
  int64_t num_q_heads;
  int64_t num_kv_heads;
  int64_t head_dim;
  int64_t num_pages;
  int64_t page_size;
  int64_t max_num_seqs;
  int64_t pages_per_seq;
  int64_t sliding_window;  // 0: no window
  float scale;
  float soft_cap;  // 0: no cap
} XgoPagedAttentionConfig;

// Number of float32 elements of scratch space a call with these static shapes needs (>= 1).
// Depends on static shapes only, so every front end can size the extra output at trace time.
// Returns -1 (and sets the last error) if the config is invalid.
XGO_EXPORT int64_t xla_gpu_paged_attention_workspace_elems(const XgoPagedAttentionConfig* config);

XGO_EXPORT int32_t xla_gpu_paged_attention_launch(
    const XgoPagedAttentionConfig* config, const void* query, const void* kv_cache,
    const int32_t* context_lens, const int32_t* block_tables, const int32_t* query_start_loc,
    const int32_t* num_seqs, void* out, float* workspace, int64_t workspace_elems,
    void* cuda_stream);

// sizeof() of the config structs, so Python can check its ctypes mirror.
XGO_EXPORT int64_t xla_gpu_ops_config_size(const char* op_name);

#ifdef __cplusplus
}  // extern "C"
#endif

#endif  // XLA_GPU_OPS_C_API_H_
