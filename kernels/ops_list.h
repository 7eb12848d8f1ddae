/* ops_list.h: every op of the backend table, its prototype written once.
 *
 * Each entry is OP(name, class, cpu, cuda, (parameters), (arguments)); the
 * includer defines OP, includes this file, and it is undefined again at the
 * end (so the file has no include guard: it is a table, read several times).
 * From it come:
 *   - backend.h: the BackendOps entry   void (*name)(Backend *be, parameters)
 *   - ops.h:     the dispatch           op_<name>(Backend *be, parameters)
 *   - cpu_ops.h: the fp32 reference     cpu_<name>(parameters)   (cpu column)
 *   - cuda_ops.h: the CUDA launcher     cuda_op_<name>(parameters, tail) (cuda column)
 *   - the backends' table entries (backend_cpu.c, backend_cuda.cu) are declared
 *     from it before they are defined, and profile.c wraps every entry;
 * so a backend function whose signature drifts from its entry, or an entry
 * that a backend does not fill, is a compile error.
 *
 * Columns:
 *   class  its row of --profile's table (ProfClass without PROF_).
 *   cpu    REF: void cpu_<name>(parameters). COUNT: the same returning int,
 *          the count of non-ignored rows. OWN: declared by hand in cpu_ops.h.
 *   cuda   the launcher's trailing arguments after the parameters: STREAM
 *          (cudaStream_t stream), SCRATCH (void *scratch, cudaStream_t stream:
 *          at least the op's cuda_<op>_scratch_bytes bytes), STATUS
 *          (CudaOpStatus *status, cudaStream_t stream). STEP (const StepVars
 *          *step, cudaStream_t stream) and STEP_SCRATCH (const StepVars *step,
 *          void *scratch, cudaStream_t stream): the ops that read the
 *          backend's StepVars while they are set (backend.h; step NULL:
 *          their arguments). OWN: declared by hand (the GEMM family,
 *          cuda_gemm.h).
 *   (arguments) the parameters' names in order, for the forwarding calls.
 *
 * The contract of every op (shapes, accumulation, masks, precision) is the
 * comment beside its entry; ops.h states the conventions they share.
 */
#ifndef OP
#error "define OP(name, class, cpu, cuda, params, args) before including ops_list.h"
#endif

/* ---- Memory ------------------------------------------------------------- */
OP(zero, ELEMENTWISE, REF, STREAM, (float *x, size_t n_elems), (x, n_elems))
/* dst = src (memmove semantics: the ranges may overlap) */
OP(copy, ELEMENTWISE, REF, SCRATCH, (float *dst, const float *src, size_t n_elems), (dst, src, n_elems))
/* ids: dst = src (memmove semantics) */
OP(copy_ids, ELEMENTWISE, REF, SCRATCH, (int32_t *dst, const int32_t *src, size_t n_elems), (dst, src, n_elems))

/* ---- GEMM ---------------------------------------------------------------
 * C = alpha * op(A) @ op(B) + beta * C, op(X) = X or X^T.
 * op(A): (M, K), op(B): (K, N), C: (M, N); A stored (M,K) or (K,M) when
 * trans_a, B stored (K,N) or (N,K) when trans_b. beta = 0 overwrites C. */
OP(gemm, GEMM, REF, OWN,
   (bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A, const float *B, float beta,
    float *C),
   (trans_a, trans_b, M, N, K, alpha, A, B, beta, C))

/* ---- Linear (GEMM + bias) ----------------------------------------------
 * y = x W^T + b. b may be NULL. In bf16 mode b enters as bf16(b), like W
 * (backend.h's precision rule), in every linear_fwd form. */
OP(linear_fwd, GEMM, REF, OWN,
   (float *y,        // (N, out)
    const float *x,  // (N, in)
    const float *W,  // (out, in)
    const float *b,  // (out) or NULL
    int N, int in, int out),
   (y, x, W, b, N, in, out))
/* dx += dy W (dx_mode GRAD_ADD) or dx = dy W (GRAD_WRITE: a GEMM with
 * beta = 0, dx's old contents never read); dW += dy^T x ; db +=
 * sum_rows(dy). dx, dW or db may be NULL to skip that gradient. In bf16
 * mode the GEMMs read bf16(dy), and db is the fp32 sum of those same bf16
 * values (backend.h's precision rule; what cuBLASLt's BGRADB epilogue on
 * the dW GEMM sums), in every linear_bwd form. */
OP(linear_bwd, GEMM, REF, OWN,
   (float *dx,        // (N, in) or NULL
    GradMode dx_mode,
    float *dW,        // (out, in) or NULL
    float *db,        // (out) or NULL
    const float *dy,  // (N, out)
    const float *x,   // (N, in)
    const float *W,   // (out, in)
    int N, int in, int out),
   (dx, dx_mode, dW, db, dy, x, W, N, in, out))

/* The linear layer on an input kept as bf16 bits x16 (to_bf16's rounding):
 * the copy of a GEMM operand that backward keeps for that GEMM alone
 * (model.c's Kept). The weights, bias, modes and NULLs are linear_fwd's and
 * linear_bwd's. In bf16 mode those round x to bf16 before multiplying, so
 * these give their results bit for bit on an fp32 x whose rounding is x16,
 * without rounding it again; in fp32 mode they multiply the widened x16
 * (exact) in fp32. */
OP(linear_fwd_x16, GEMM, OWN, OWN,
   (float *y,            // (N, out)
    const uint16_t *x16, // (N, in) bf16 bits
    const float *W,      // (out, in)
    const float *b,      // (out) or NULL
    int N, int in, int out),
   (y, x16, W, b, N, in, out))
OP(linear_bwd_x16, GEMM, OWN, OWN,
   (float *dx,           // (N, in) or NULL
    GradMode dx_mode,
    float *dW,           // (out, in) or NULL
    float *db,           // (out) or NULL
    const float *dy,     // (N, out)
    const uint16_t *x16, // (N, in) bf16 bits
    const float *W,      // (out, in)
    int N, int in, int out),
   (dx, dx_mode, dW, db, dy, x16, W, N, in, out))

/* linear_bwd_x16 through a ReLU: dy masked where the ReLU's output relu16
 * (bf16 bits, as the FFN keeps it) is not positive, which is act_bwd_x16's
 * ReLU gradient written into a temporary, then linear_bwd_x16 on that
 * temporary, bit for bit (db from the masked fp32 values); dy itself is
 * only read. One pass over dy where the two ops take three (the FFN's
 * hidden gradient, the step's widest backward tensor): on a GPU in bf16
 * the bias gradient's pass masks dy as it stores the GEMMs' bf16 copy. */
OP(linear_bwd_relu_x16, GEMM, OWN, OWN,
   (float *dx,              // (N, in) or NULL
    GradMode dx_mode,
    float *dW,              // (out, in) or NULL
    float *db,              // (out) or NULL
    const float *dy,        // (N, out) before the ReLU's gradient
    const uint16_t *relu16, // (N, out) bf16 bits: the ReLU's output
    const uint16_t *x16,    // (N, in) bf16 bits
    const float *W,         // (out, in)
    int N, int in, int out),
   (dx, dx_mode, dW, db, dy, relu16, x16, W, N, in, out))

/* The linear layer with its output rounded to bf16 as it is stored, ReLU
 * first when relu: y16 = bf16(act(x W^T + b)), x given as fp32 (x) or as
 * bf16 bits (x16), exactly one of them. tmp is (N, out) fp32 room the op
 * may use (the caller's free scratch; CUDA writes there only when
 * cuBLASLt cannot store bf16 with this epilogue), or NULL where the caller
 * has none that large (the logits): the op then finds its own, CUDA in
 * row chunks of its scratch (scratch_linear_fwd16). On the CPU, bit for bit
 * linear_fwd (or _x16) into fp32, then act_fwd16 (relu) or to_bf16; CUDA
 * asks cuBLASLt for the whole in one GEMM, whose fp32 sums may be ordered
 * differently from the fp32-output GEMM's. */
OP(linear_fwd16, GEMM, OWN, OWN,
   (uint16_t *y16,        // (N, out) bf16 bits
    float *tmp,           // (N, out)
    const float *x,       // (N, in) or NULL
    const uint16_t *x16,  // (N, in) bf16 bits, or NULL
    const float *W,       // (out, in)
    const float *b,       // (out) or NULL
    bool relu, int N, int in, int out),
   (y16, tmp, x, x16, W, b, relu, N, in, out))

/* linear_bwd without a bias, dy given as bf16 bits (dy16): the gradient
 * of the bf16 logits (xent_vp_grad_inplace16) into the output layer. dx
 * and dW are linear_bwd's on the widened dy: in bf16 mode linear_bwd
 * rounds dy to exactly these bits before multiplying, so these are its
 * bits; in fp32 mode the widened values are multiplied as they are. */
OP(linear_bwd_dy16, GEMM, OWN, OWN,
   (float *dx,             // (N, in) or NULL
    GradMode dx_mode,
    float *dW,             // (out, in) or NULL
    const uint16_t *dy16,  // (N, out) bf16 bits
    const float *x,        // (N, in)
    const float *W,        // (out, in)
    int N, int in, int out),
   (dx, dx_mode, dW, dy16, x, W, N, in, out))

/* The linear backward with bf16 gradients at either end (bf16 mode's
 * contract, backend.h): dy given as fp32 (dy) or as bf16 bits (dy16),
 * exactly one; relu16 (or NULL) masks dy first by a ReLU's gradient
 * (relu16 > 0 ? dy : 0, act_bwd_x16's); x as fp32 (x) or bf16 bits (x16),
 * at most one (needed for dW); dx into fp32 dx (dx_mode as linear_bwd) or
 * written as its bf16 rounding into dx16 (GRAD_WRITE only: the gradient a
 * ReLU or dropout passes on to the next linear backward, never stored in
 * fp32), at most one; W, dW, db and NULLs as linear_bwd (db the sum of the
 * masked dy as the GEMMs read it). On the CPU bit for bit linear_bwd
 * (_x16) on the widened, masked dy into an fp32 dx, then to_bf16; CUDA
 * stores dx16 from the GEMM (its fp32 sums ordered as cuBLASLt chooses)
 * and takes db from BGRADB where it can. */
OP(linear_bwd16, GEMM, OWN, OWN,
   (float *dx,              // (N, in) or NULL
    uint16_t *dx16,         // (N, in) bf16 bits, or NULL
    GradMode dx_mode,
    float *dW,              // (out, in) or NULL
    float *db,              // (out) or NULL
    const float *dy,        // (N, out) or NULL
    const uint16_t *dy16,   // (N, out) bf16 bits, or NULL
    const uint16_t *relu16, // (N, out) bf16 bits: a ReLU's output, or NULL
    const float *x,         // (N, in) or NULL
    const uint16_t *x16,    // (N, in) bf16 bits, or NULL
    const float *W,         // (out, in)
    int N, int in, int out),
   (dx, dx16, dx_mode, dW, db, dy, dy16, relu16, x, x16, W, N, in, out))

/* The FFN's ReLU with its bit-mask (bf16 mode's fc1, kept for fc2's
 * backward, linear_bwd16_drelu): y16 = linear_fwd16's with relu, bit for
 * bit on the CPU (the same one-GEMM route and band on CUDA), and mask bit j
 * of row n (byte n * relu_mask_row_bytes(out) + j / 8, bit j % 8) set where
 * the fp32 pre-activation x W^T + b is positive, the ReLU's own test (it
 * differs from y16 > 0 only where a positive value below bf16's least
 * subnormal rounds to 0). A row's padding bits are unspecified. On CUDA
 * the GEMM's RELU_AUX_BIAS epilogue writes the mask where cuBLASLt plans
 * it (its aux leading dimension, in bits, a multiple of 128: hence the
 * row bytes); else the fp32 product, then one pass rounding and masking. */
OP(linear_relu_fwd16, GEMM, OWN, OWN,
   (uint16_t *y16,        // (N, out) bf16 bits
    float *tmp,           // (N, out) fp32 room, or NULL (linear_fwd16's)
    uint8_t *mask,        // (N, relu_mask_row_bytes(out)) bits
    const float *x,       // (N, in) or NULL
    const uint16_t *x16,  // (N, in) bf16 bits, or NULL
    const float *W,       // (out, in)
    const float *b,       // (out) or NULL
    int N, int in, int out),
   (y16, tmp, mask, x, x16, W, b, N, in, out))

/* The backward of a layer whose input x16 is a ReLU's output kept with
 * its mask (linear_relu_fwd16's), through that ReLU: dh16 (written) =
 * bf16(dy W) where the mask is set, +0 elsewhere: the ReLU's input
 * gradient, the dy of the layer before it; db_h += the column sums of the
 * widened dh16: that layer's bias gradient (linear_bwd16's db reading dh16
 * as its dy, the same bf16 contract); dW and db (or NULL) as
 * linear_bwd16's from dy (fp32) or dy16 (bf16 bits), exactly one. On the
 * CPU bit for bit linear_bwd16 writing dx16, the mask, then bias_bwd's
 * sums; CUDA asks cuBLASLt for dh16 and db_h in the dx GEMM's DRELU_BGRAD
 * epilogue (db_h summed from the masked fp32 products before their
 * rounding: within the GEMM's band), else stores dh16 from a plain GEMM
 * and masks it by x16 > 0 (the mask's bits but for the subnormal case
 * above) in the pass that sums db_h. */
OP(linear_bwd16_drelu, GEMM, OWN, OWN,
   (uint16_t *dh16,        // (N, in) bf16 bits, written
    float *dW,             // (out, in) or NULL
    float *db,             // (out) or NULL
    float *db_h,           // (in) accumulated
    const float *dy,       // (N, out) or NULL
    const uint16_t *dy16,  // (N, out) bf16 bits, or NULL
    const uint8_t *mask,   // (N, relu_mask_row_bytes(in)) bits: linear_relu_fwd16's
    const uint16_t *x16,   // (N, in) bf16 bits: the ReLU's output
    const float *W,        // (out, in)
    int N, int in, int out),
   (dh16, dW, db, db_h, dy, dy16, mask, x16, W, N, in, out))

/* y[n, :] += b */
OP(bias_add, ELEMENTWISE, REF, STREAM,
   (float *y,        // (N, C)
    const float *b,  // (C)
    int N, int C),
   (y, b, N, C))
/* db += sum over rows of dy; in bf16 mode of bf16(dy): the bias gradient
 * of a linear layer whose GEMMs read bf16(dy), as linear_bwd's db */
OP(bias_bwd, ELEMENTWISE, REF, SCRATCH,
   (float *db,        // (C)
    const float *dy,  // (N, C)
    int N, int C),
   (db, dy, N, C))

/* ---- Embedding -----------------------------------------------------------
 * out[n] = scale * table[ids[n] - vocab_start] when the id falls in this
 * shard's rows [vocab_start, vocab_start + V_local), else zeros (so a
 * vocab-parallel shard contributes only its own rows; with one shard pass
 * vocab_start = 0, V_local = V). Ids outside [0, V) of the full vocabulary
 * are a caller bug and must be rejected before calling. */
OP(embedding_fwd, EMBEDDING, REF, STREAM,
   (float *out,          // (N, C)
    const int32_t *ids,  // (N)
    const float *table,  // (V_local, C)
    float scale, int N, int C, int vocab_start, int V_local),
   (out, ids, table, scale, N, C, vocab_start, V_local))
/* dtable[ids[n] - vocab_start] += scale * dout[n] (scatter-add, own rows
 * only; deterministic: rows are visited in order). */
OP(embedding_bwd, EMBEDDING, REF, SCRATCH,
   (float *dtable,       // (V_local, C)
    const float *dout,   // (N, C)
    const int32_t *ids,  // (N)
    float scale, int N, int C, int vocab_start, int V_local),
   (dtable, dout, ids, scale, N, C, vocab_start, V_local))

/* Sinusoidal positions (Vaswani et al., interleaved):
 * pe[t, 2i] = sin(t / 10000^(2i/C)), pe[t, 2i+1] = cos(t / 10000^(2i/C)).
 * x[b, t, :] += pe[t, :]. C must be even. Positions are constant: no backward. */
OP(add_positions, EMBEDDING, REF, STREAM,
   (float *x,  // (B, T, C)
    int B, int T, int C),
   (x, B, T, C))

/* ---- LayerNorm -----------------------------------------------------------
 * y = (x - mean) * rstd * gamma + beta, per row; mean and rstd saved. */
OP(layernorm_fwd, LAYERNORM, REF, STREAM,
   (float *y,            // (N, C)
    float *mean,         // (N)
    float *rstd,         // (N)
    const float *x,      // (N, C)
    const float *gamma,  // (C)
    const float *beta,   // (C)
    int N, int C, float eps),
   (y, mean, rstd, x, gamma, beta, N, C, eps))
OP(layernorm_bwd, LAYERNORM, REF, SCRATCH,
   (float *dx,           // (N, C)  accumulated
    float *dgamma,       // (C)     accumulated
    float *dbeta,        // (C)     accumulated
    const float *dy,     // (N, C)
    const float *x,      // (N, C)
    const float *mean,   // (N)
    const float *rstd,   // (N)
    const float *gamma,  // (C)
    int N, int C),
   (dx, dgamma, dbeta, dy, x, mean, rstd, gamma, N, C))

/* ---- Activations (GELU is the exact erf form, as torch's default) -------
 * Element by element: y may alias x, dx may alias dy or x. For ReLU,
 * act'(x) is 1 where x > 0, so the output y = act(x) gives the same
 * gradient as x (the model keeps only y). */
OP(act_fwd, ELEMENTWISE, REF, STREAM, (float *y, const float *x, size_t n_elems, Activation act),
   (y, x, n_elems, act))
/* y16 = act(x) rounded to bf16 (to_bf16's rounding): act_fwd then to_bf16
 * bit for bit, in one pass (the FFN activation kept in bf16). */
OP(act_fwd16, ELEMENTWISE, REF, STREAM, (uint16_t *y16, const float *x, size_t n_elems, Activation act),
   (y16, x, n_elems, act))
/* dx += dy * act'(x) (GRAD_ADD), or dx = dy * act'(x) (GRAD_WRITE); written,
 * dx may be dy itself (each element is read before it is written). */
OP(act_bwd, ELEMENTWISE, REF, STREAM,
   (float *dx, GradMode mode, const float *dy, const float *x, size_t n_elems, Activation act),
   (dx, mode, dy, x, n_elems, act))
/* act_bwd with x given as bf16 bits (the FFN's kept activation output,
 * which for ReLU gives the same gradient): act_bwd on the widened x16, bit
 * for bit, without an fp32 copy of it. */
OP(act_bwd_x16, ELEMENTWISE, REF, STREAM,
   (float *dx, GradMode mode, const float *dy, const uint16_t *x16, size_t n_elems, Activation act),
   (dx, mode, dy, x16, n_elems, act))

/* ---- Element-wise --------------------------------------------------------- */
/* out = a + b (out may alias a or b) */
OP(add, ELEMENTWISE, REF, STREAM, (float *out, const float *a, const float *b, size_t n_elems), (out, a, b, n_elems))
/* y += x */
OP(accumulate, ELEMENTWISE, REF, STREAM, (float *y, const float *x, size_t n_elems), (y, x, n_elems))
/* x *= s */
OP(scale, ELEMENTWISE, REF, STREAM, (float *x, float s, size_t n_elems), (x, s, n_elems))
/* acc[0] += sum of x (summed in double, fixed order); acc is a device scalar. */
OP(sum_acc, LOSS, REF, SCRATCH, (float *acc, const float *x, size_t n_elems), (acc, x, n_elems))
/* acc[0] += sum of squares of x (summed in double, fixed order). */
OP(sumsq_acc, OPTIMIZER, REF, SCRATCH, (float *acc, const float *x, size_t n_elems), (acc, x, n_elems))
/* Global-norm clipping on the device, as torch.nn.utils.clip_grad_norm_:
 * norm = sqrt(sum of sumsq[0..n_parts)); norm_coef[0] = norm,
 * norm_coef[1] = min(1, max_norm / (norm + 1e-6)) (1 when max_norm <= 0). */
OP(clip_coef, OPTIMIZER, REF, STREAM, (float *norm_coef, const float *sumsq, int n_parts, float max_norm),
   (norm_coef, sumsq, n_parts, max_norm))
/* x *= s[0], s a device scalar. */
OP(scale_by, OPTIMIZER, REF, STREAM, (float *x, const float *s, size_t n_elems), (x, s, n_elems))

/* For each segment s of the table (OpSeg, backend.h; made by op_segs_create,
 * ops.h) in table order: acc[s.acc] += sum of squares of x[s.x_at ..
 * s.x_at + s.n), each segment summed in double and added as op_sumsq_acc
 * adds it (so the CPU matches one op_sumsq_acc per segment bit for bit).
 * acc: device floats. One launch however many segments. */
OP(sumsq_segs, OPTIMIZER, OWN, STREAM, (float *acc, const float *x, const OpSegTable *segs), (acc, x, segs))

/* dst = src rounded to bfloat16 (nearest, ties to even; NaN stays NaN),
 * kept as raw bits: the staging of bf16 collectives. */
OP(to_bf16, CONVERT, REF, STREAM, (uint16_t *dst, const float *src, size_t n_elems), (dst, src, n_elems))
/* dst = src widened to fp32 (exact). */
OP(from_bf16, CONVERT, REF, STREAM, (float *dst, const uint16_t *src, size_t n_elems), (dst, src, n_elems))
/* x = x rounded to bfloat16, kept in fp32 (to_bf16 then from_bf16, in
 * place): the values a bf16-kept tensor would hold, for a model keeping
 * them in fp32 (model_set_keep_bf16 off in bf16 mode). */
OP(round_bf16, CONVERT, REF, STREAM, (float *x, size_t n_elems), (x, n_elems))

/* ---- Masked softmax ------------------------------------------------------
 * Rows are (b, h, i) over Tk keys: P = softmax(scale * S) where key j is
 * masked out when j >= k_len[b], or (causal) when j > i. Masked entries get
 * probability 0. A row with no valid key (k_len[b] == 0) becomes all zeros. */
OP(softmax_fwd, ATTENTION, REF, STREAM,
   (float *P,              // (B, H, Tq, Tk)
    const float *S,        // (B, H, Tq, Tk)
    const int32_t *k_len,  // (B)
    int B, int H, int Tq, int Tk, float scale, bool causal),
   (P, S, k_len, B, H, Tq, Tk, scale, causal))
/* dS += scale * P * (dP - sum_j(dP * P)) */
OP(softmax_bwd, ATTENTION, REF, STREAM,
   (float *dS,        // (B, H, Tq, Tk)
    const float *dP,  // (B, H, Tq, Tk)
    const float *P,   // (B, H, Tq, Tk)
    int B, int H, int Tq, int Tk, float scale),
   (dS, dP, P, B, H, Tq, Tk, scale))

/* ---- Scaled dot-product attention, per head --------------------------------
 * q, k, v hold H heads of width D side by side: head h of token t is
 * q[t, h*D : (h+1)*D]. out = softmax(q k^T / sqrt(D), masks) v.
 * P (the probabilities) is saved for backward. out may be NULL: P alone
 * (selective recomputation rebuilding P in backward), the same bits. */
OP(attention_fwd, ATTENTION, REF, STREAM,
   (float *out,            // (B, Tq, H*D)
    float *P,              // (B, H, Tq, Tk)
    const float *q,        // (B, Tq, H*D)
    const float *k,        // (B, Tk, H*D)
    const float *v,        // (B, Tk, H*D)
    const int32_t *k_len,  // (B)
    int B, int H, int Tq, int Tk, int D, bool causal),
   (out, P, q, k, v, k_len, B, H, Tq, Tk, D, causal))
/* dq, dk, dv accumulated (mode GRAD_ADD), or all three written (GRAD_WRITE:
 * their old contents never read; the rows of padding keys, j >= k_len[b],
 * become zeros in dk and dv, as does all of dq when Tk == 0 and all of dk
 * and dv when Tq == 0). scratch holds B*H*Tq*Tk floats. */
OP(attention_bwd, ATTENTION, REF, STREAM,
   (float *dq,          // (B, Tq, H*D)
    float *dk,          // (B, Tk, H*D)
    float *dv,          // (B, Tk, H*D)
    GradMode mode,
    const float *dout,  // (B, Tq, H*D)
    const float *P,     // (B, H, Tq, Tk)
    const float *q,     // (B, Tq, H*D)
    const float *k,     // (B, Tk, H*D)
    const float *v,     // (B, Tk, H*D)
    float *scratch,     // (B, H, Tq, Tk)
    int B, int H, int Tq, int Tk, int D),
   (dq, dk, dv, mode, dout, P, q, k, v, scratch, B, H, Tq, Tk, D))
/* The same two ops with q, k and v given as bf16 bits (bf16 mode keeps
 * them so): attention_fwd and attention_bwd on the widened values, bit for
 * bit (every product and sum still in fp32; only the loads narrow). The
 * forward's output goes to out in fp32 or to out16 as its bf16 rounding
 * (the attention output bf16 mode keeps), at most one of them (neither:
 * P alone).
 * The backward's gradients go to dq, dk, dv in fp32 or, in GRAD_WRITE
 * mode, to dq16, dk16, dv16 as their bf16 rounding (to_bf16's bits, bit
 * for bit the fp32 form's values rounded): one set or the other, the bf16
 * one chosen when any of its pointers is given (then dq, dk, dv are NULL).
 * That set is bf16 mode's q, k, v gradient (backend.h's precision rule):
 * the dy of the q, k, v projections' linear backward, whose GEMMs round an
 * fp32 dy to exactly these bits. attention_drop_bwd and attention_flash_bwd
 * take the same pair of sets. */
OP(attention_fwd_x16, ATTENTION, OWN, STREAM,
   (float *out,             // (B, Tq, H*D), or NULL
    uint16_t *out16,        // (B, Tq, H*D) bf16 bits, or NULL: out rounded as it is stored (to_bf16's bits)
    float *P,               // (B, H, Tq, Tk)
    const uint16_t *q16,    // (B, Tq, H*D)
    const uint16_t *k16,    // (B, Tk, H*D)
    const uint16_t *v16,    // (B, Tk, H*D)
    const int32_t *k_len,   // (B)
    int B, int H, int Tq, int Tk, int D, bool causal),
   (out, out16, P, q16, k16, v16, k_len, B, H, Tq, Tk, D, causal))
OP(attention_bwd_x16, ATTENTION, OWN, STREAM,
   (float *dq,              // (B, Tq, H*D) or NULL
    float *dk,              // (B, Tk, H*D) or NULL
    float *dv,              // (B, Tk, H*D) or NULL
    uint16_t *dq16,         // (B, Tq, H*D) bf16 bits, or NULL
    uint16_t *dk16,         // (B, Tk, H*D) bf16 bits, or NULL
    uint16_t *dv16,         // (B, Tk, H*D) bf16 bits, or NULL
    GradMode mode,
    const float *dout,      // (B, Tq, H*D)
    const float *P,         // (B, H, Tq, Tk)
    const uint16_t *q16,    // (B, Tq, H*D)
    const uint16_t *k16,    // (B, Tk, H*D)
    const uint16_t *v16,    // (B, Tk, H*D)
    float *scratch,         // (B, H, Tq, Tk)
    int B, int H, int Tq, int Tk, int D),
   (dq, dk, dv, dq16, dk16, dv16, mode, dout, P, q16, k16, v16, scratch, B, H, Tq, Tk, D))

/* ---- Attention with dropout on the probabilities --------------------------
 * fairseq's attention dropout: attention_fwd with out = Dropout(P) v. The
 * mask is dropout_fwd_win's over P seen as B rows of H*Tq*Tk (heads, query,
 * key): row b starts at element first + b*ld of it (a tp rank's heads inside
 * the (B, H_all, Tq, Tk) tensor of every head: ld = H_all*Tq*Tk, first = the
 * rank's first head * Tq*Tk). P keeps the probabilities before the dropout
 * (what backward needs, bit for bit attention_fwd's); Pd, (B, H, Tq, Tk)
 * room, receives the dropped ones. q, k, v are fp32 (q, k, v) or bf16 bits
 * (q16, k16, v16, as the _x16 op), exactly one set; out and out16 as
 * attention_fwd_x16 (neither: P alone). p == 0: attention_fwd /
 * attention_fwd_x16 bit for bit (Pd not touched). On CUDA p > 0 takes the
 * general path (the fused one-block kernels hold no mask). */
OP(attention_drop_fwd, ATTENTION, OWN, STEP,
   (float *out,             // (B, Tq, H*D), or NULL
    uint16_t *out16,        // (B, Tq, H*D) bf16 bits, or NULL
    float *P,               // (B, H, Tq, Tk)
    float *Pd,              // (B, H, Tq, Tk) room
    const float *q,         // (B, Tq, H*D) or NULL
    const float *k,         // (B, Tk, H*D) or NULL
    const float *v,         // (B, Tk, H*D) or NULL
    const uint16_t *q16,    // (B, Tq, H*D) or NULL
    const uint16_t *k16,    // (B, Tk, H*D) or NULL
    const uint16_t *v16,    // (B, Tk, H*D) or NULL
    const int32_t *k_len,   // (B)
    int B, int H, int Tq, int Tk, int D, bool causal, uint64_t first, uint64_t ld, float p, uint64_t seed,
    uint64_t stream_id),
   (out, out16, P, Pd, q, k, v, q16, k16, v16, k_len, B, H, Tq, Tk, D, causal, first, ld, p, seed, stream_id))
/* Its backward from the undropped P and the same mask: Pd rebuilt in
 * scratch, dv (+)= Pd^T dout; dP = mask * (dout v^T) / (1-p) (dropout_bwd),
 * dS = scale * P * (dP - rowsum(dP * P)), dq (+)= dS k, dk (+)= dS^T q;
 * modes, zeros and scratch (B, H, Tq, Tk) as attention_bwd; dq16, dk16,
 * dv16 as attention_bwd_x16's. p == 0: attention_bwd / attention_bwd_x16
 * bit for bit. */
OP(attention_drop_bwd, ATTENTION, OWN, STEP,
   (float *dq,              // (B, Tq, H*D) or NULL
    float *dk,              // (B, Tk, H*D) or NULL
    float *dv,              // (B, Tk, H*D) or NULL
    uint16_t *dq16,         // (B, Tq, H*D) bf16 bits, or NULL
    uint16_t *dk16,         // (B, Tk, H*D) bf16 bits, or NULL
    uint16_t *dv16,         // (B, Tk, H*D) bf16 bits, or NULL
    GradMode mode,
    const float *dout,      // (B, Tq, H*D)
    const float *P,         // (B, H, Tq, Tk)
    const float *q,         // (B, Tq, H*D) or NULL
    const float *k,         // (B, Tk, H*D) or NULL
    const float *v,         // (B, Tk, H*D) or NULL
    const uint16_t *q16,    // (B, Tq, H*D) or NULL
    const uint16_t *k16,    // (B, Tk, H*D) or NULL
    const uint16_t *v16,    // (B, Tk, H*D) or NULL
    float *scratch,         // (B, H, Tq, Tk)
    int B, int H, int Tq, int Tk, int D, uint64_t first, uint64_t ld, float p, uint64_t seed, uint64_t stream_id),
   (dq, dk, dv, dq16, dk16, dv16, mode, dout, P, q, k, v, q16, k16, v16, scratch, B, H, Tq, Tk, D, first, ld, p, seed,
    stream_id))

/* ---- Attention without the probabilities (flash-style) ---------------------
 * The forward keeps per row the log-sum-exp of its scaled scores instead of
 * P, and the backward rebuilds P from it tile by tile; no (B, H, Tq, Tk)
 * tensor is ever stored. q, k, v are bf16 bits (bf16 mode keeps them so),
 * laid out as attention_fwd's; D a multiple of 16, at most 128 (a head's
 * width on tensor cores). Precision (the CPU reference computes exactly this;
 * a GPU sums in another order, on tensor cores):
 *   s_ij = q_i . k_j (products of bf16 values, exact; fp32 sums),
 *   z_ij = scale * s_ij with scale = 1/sqrt(D), for the n_i valid keys
 *   (attention_fwd's masks), m_i = max_j z_ij,
 *   lse_i = m_i + log(sum_j exp(z_ij - m_i)),  p_ij = exp(z_ij - lse_i),
 *   out_i = bf16(sum_j bf16(p_ij) v_j);
 * a row without a valid key has lse -INFINITY, p 0 and out 0. */
OP(attention_flash_fwd, ATTENTION, OWN, STREAM,
   (uint16_t *out16,        // (B, Tq, H*D) bf16 bits
    float *lse,             // (B, H, Tq)
    const uint16_t *q16,    // (B, Tq, H*D)
    const uint16_t *k16,    // (B, Tk, H*D)
    const uint16_t *v16,    // (B, Tk, H*D)
    const int32_t *k_len,   // (B)
    int B, int H, int Tq, int Tk, int D, bool causal),
   (out16, lse, q16, k16, v16, k_len, B, H, Tq, Tk, D, causal))
/* Its backward, from the forward's lse: p_ij rebuilt as above (0 where
 * masked), g_i = bf16(dout_i), dp_ij = g_i . v_j, delta_i = sum_j p_ij dp_ij
 * (stored in scratch), ds_ij = scale * p_ij * (dp_ij - delta_i);
 *   dv_j (+)= sum_i bf16(p_ij) g_i,  dq_i (+)= sum_j bf16(ds_ij) k_j,
 *   dk_j (+)= sum_i bf16(ds_ij) q_i,
 * accumulated (GRAD_ADD) or written (GRAD_WRITE; padding keys' dk and dv
 * rows zeros, as attention_bwd's), or written as their bf16 rounding into
 * dq16, dk16, dv16 (attention_bwd_x16's pair of sets). Deterministic: no
 * atomics. */
OP(attention_flash_bwd, ATTENTION, OWN, STREAM,
   (float *dq,              // (B, Tq, H*D) or NULL
    float *dk,              // (B, Tk, H*D) or NULL
    float *dv,              // (B, Tk, H*D) or NULL
    uint16_t *dq16,         // (B, Tq, H*D) bf16 bits, or NULL
    uint16_t *dk16,         // (B, Tk, H*D) bf16 bits, or NULL
    uint16_t *dv16,         // (B, Tk, H*D) bf16 bits, or NULL
    GradMode mode,
    const float *dout,      // (B, Tq, H*D)
    const float *lse,       // (B, H, Tq): the forward's
    const uint16_t *q16,    // (B, Tq, H*D)
    const uint16_t *k16,    // (B, Tk, H*D)
    const uint16_t *v16,    // (B, Tk, H*D)
    const int32_t *k_len,   // (B)
    float *scratch,         // (B, H, Tq): delta
    int B, int H, int Tq, int Tk, int D, bool causal),
   (dq, dk, dv, dq16, dk16, dv16, mode, dout, lse, q16, k16, v16, k_len, scratch, B, H, Tq, Tk, D, causal))

/* ---- Dropout with a counter-based RNG --------------------------------------
 * Philox4x32-10 keyed by `seed`; element i uses counter
 * (i/4 lo, i/4 hi, stream_id lo, stream_id hi), word i%4. The mask is a pure
 * function of (seed, stream_id, i): backward recomputes it, resume
 * reproduces it. Kept elements are scaled by 1/(1-p). p == 0 copies. out may
 * alias x. The _at forms take a window of a larger mask: out[i] is element
 * first + i of it (first a multiple of 4), so the windows of a tensor split
 * by rows together draw the mask of the whole (sequence parallelism);
 * ops.h's op_dropout_fwd / op_dropout_bwd are the whole tensor (first = 0). */
OP(dropout_fwd_at, ELEMENTWISE, REF, STEP,
   (float *out, const float *x, size_t n_elems, uint64_t first, float p, uint64_t seed, uint64_t stream_id),
   (out, x, n_elems, first, p, seed, stream_id))
/* dx += mask * dy / (1-p) (GRAD_ADD), or dx = mask * dy / (1-p)
 * (GRAD_WRITE: dropped elements become 0; p == 0 copies). dx16 instead
 * (exactly one of the two; GRAD_WRITE only; it aliases nothing): those
 * written values stored as their bf16 rounding (to_bf16's bits), the
 * dy of a linear layer's backward in bf16 mode (backend.h's contract:
 * the FFN's fc2, whose GEMMs round it so anyway), so no fp32 copy is
 * written and converted again. */
OP(dropout_bwd_at, ELEMENTWISE, REF, STEP,
   (float *dx,      // (n_elems) or NULL
    uint16_t *dx16, // (n_elems) bf16 bits written, or NULL
    GradMode mode, const float *dy, size_t n_elems, uint64_t first, float p, uint64_t seed, uint64_t stream_id),
   (dx, dx16, mode, dy, n_elems, first, p, seed, stream_id))

/* The same on a window of rows: element (r, c) of the (rows, cols) operand
 * is element first + r*ld + c of the mask (any first; ld >= cols when
 * rows > 1, so no element of the mask is drawn twice): the block of a tp
 * rank's columns inside a larger row-major tensor of rows ld long, so the
 * ranks' blocks together draw the unsharded tensor's mask (the FFN's hidden
 * activations and the attention probabilities, whose columns are split over
 * tp). out and x (dx and dy) are (rows, cols), contiguous; out may alias x,
 * dx may alias dy. dropout_fwd_at(first, n) is the window of one row. */
OP(dropout_fwd_win, ELEMENTWISE, REF, STEP,
   (float *out, const float *x, size_t rows, size_t cols, uint64_t ld, uint64_t first, float p, uint64_t seed,
    uint64_t stream_id),
   (out, x, rows, cols, ld, first, p, seed, stream_id))
OP(dropout_bwd_win, ELEMENTWISE, REF, STEP,
   (float *dx, GradMode mode, const float *dy, size_t rows, size_t cols, uint64_t ld, uint64_t first, float p,
    uint64_t seed, uint64_t stream_id),
   (dx, mode, dy, rows, cols, ld, first, p, seed, stream_id))

/* ---- Residual + dropout + LayerNorm, fused --------------------------------
 * The boundary of two pre-LN sub-blocks in one op each way, on the rows of
 * a window of the whole (N, C) mask that starts at element `first` (a
 * multiple of 4; 0 without sequence parallelism), as dropout_fwd_at.
 * Forward: res_out = res_in + Dropout(branch + bias) (bias may be NULL),
 * then y, mean, rstd = LayerNorm(res_out) as layernorm_fwd: equal to
 * bias_add, dropout_fwd_at, add, layernorm_fwd in turn, bit for bit (the
 * CPU reference is that sequence; CUDA shares its LayerNorm rows with
 * layernorm.cu). res_out may alias res_in; y aliases nothing; branch is only
 * read. The LayerNorm output goes to y in fp32 or, y NULL, to y16 as its
 * bf16 rounding (to_bf16's, bit for bit; the model's bf16-kept LayerNorm
 * outputs): exactly one of the two is given. */
OP(residual_ln_fwd, LAYERNORM, OWN, STEP,
   (float *res_out,       // (N, C)
    float *y,             // (N, C) or NULL
    uint16_t *y16,        // (N, C) or NULL
    float *mean,          // (N)
    float *rstd,          // (N)
    const float *res_in,  // (N, C)
    const float *branch,  // (N, C)
    const float *bias,    // (C) or NULL
    const float *gamma,   // (C)
    const float *beta,    // (C)
    int N, int C, float eps, uint64_t first, float p, uint64_t seed, uint64_t stream_id),
   (res_out, y, y16, mean, rstd, res_in, branch, bias, gamma, beta, N, C, eps, first, p, seed, stream_id))
/* Backward: d_res += the LayerNorm's input gradient from dy (x, mean, rstd
 * as saved; dgamma, dbeta accumulated), as layernorm_bwd; then d_branch =
 * the dropout's input gradient of the new d_res and d_bias += its column
 * sums (d_bias NULL: skipped), as bias_bwd (in bf16 mode the sums of
 * d_branch's bf16 rounding). d_branch is WRITTEN, not
 * accumulated (it equals dropout_bwd_at into zeros): the one pass needs no
 * zeroing before it. d_branch aliases neither dy nor d_res. d_branch16
 * instead (exactly one of the two): d_branch stored as its bf16 rounding
 * (bf16 mode's contract, backend.h: the dy of the ROW layer's linear
 * backward, whose GEMMs round it so anyway), d_bias the sums of those bf16
 * values; the same bits as d_branch then to_bf16. */
OP(residual_ln_bwd, LAYERNORM, OWN, STEP_SCRATCH,
   (float *d_res,         // (N, C) accumulated
    float *d_branch,      // (N, C) written, or NULL
    uint16_t *d_branch16, // (N, C) bf16 bits written, or NULL
    float *dgamma,        // (C) accumulated
    float *dbeta,         // (C) accumulated
    float *d_bias,        // (C) accumulated, or NULL
    const float *dy,      // (N, C)
    const float *x,       // (N, C) the LayerNorm's input (res_out of the forward)
    const float *mean,    // (N)
    const float *rstd,    // (N)
    const float *gamma,   // (C)
    int N, int C, uint64_t first, float p, uint64_t seed, uint64_t stream_id),
   (d_res, d_branch, d_branch16, dgamma, dbeta, d_bias, dy, x, mean, rstd, gamma, N, C, first, p, seed, stream_id))

/* ---- Label-smoothed cross-entropy ------------------------------------------
 * For row n with target y = targets[n] (rows with y == ignore_id are skipped,
 * loss 0): loss_n = (1-eps) * (-log p_y) + (eps/V) * sum_v (-log p_v),
 * p = softmax(logits[n]), as torch's cross_entropy(label_smoothing=eps).
 * Writes per-row losses and the row's log-sum-exp (saved for backward).
 * (The count of non-ignored rows is the caller's: it knows the targets; the
 * CPU reference returns it.) A target outside [0, V) is refused: the CPU
 * dies at the row, CUDA records it in its status (cuda_ops.h). */
OP(xent_fwd, LOSS, COUNT, STATUS,
   (float *losses,           // (N)
    float *lse,              // (N)
    const float *logits,     // (N, V)
    const int32_t *targets,  // (N)
    int N, int V, float eps, int32_t ignore_id),
   (losses, lse, logits, targets, N, V, eps, ignore_id))
/* dlogits += dloss * (softmax(logits[n]) - (1-eps) onehot(y) - eps/V),
 * zero for ignored rows. dloss is one scale for all rows (e.g. 1/n_tokens). */
OP(xent_bwd, LOSS, REF, STREAM,
   (float *dlogits,          // (N, V)
    const float *logits,     // (N, V)
    const float *lse,        // (N)
    const int32_t *targets,  // (N)
    float dloss, int N, int V, float eps, int32_t ignore_id),
   (dlogits, logits, lse, targets, dloss, N, V, eps, ignore_id))

/* ---- Vocab-parallel label-smoothed cross-entropy -----------------------------
 * The logits of a row are split over tp ranks by vocabulary: this rank holds
 * columns [vocab_start, vocab_start + V_local) of the V real ones, of which
 * the first V_valid are real (the rest pad the vocabulary to a multiple of
 * tp and are ignored). The full row is never gathered:
 *   1. op_xent_vp_max: the shard's row max; the caller reduces it (MAX).
 *   2. op_xent_vp_sums: with the global max, per row the shard's
 *      {sum exp(x - max), sum x, x_target (0 if the target is elsewhere)};
 *      the caller reduces them (SUM).
 *   3. op_xent_vp_loss: losses and lse from the reduced statistics (every
 *      rank computes the same values).
 *   4. op_xent_vp_bwd: the shard's gradient.
 * With one shard this is op_xent_fwd / op_xent_bwd. Rows whose target is
 * ignore_id give loss 0 and no gradient. */
OP(xent_vp_max, LOSS, REF, STREAM,
   (float *row_max,       // (N)
    const float *logits,  // (N, V_local)
    int N, int V_local, int V_valid),
   (row_max, logits, N, V_local, V_valid))
OP(xent_vp_sums, LOSS, REF, STREAM,
   (float *stats,            // (N, 3)
    const float *logits,     // (N, V_local)
    const float *row_max,    // (N) global
    const int32_t *targets,  // (N)
    int N, int V_local, int V_valid, int vocab_start, int32_t ignore_id),
   (stats, logits, row_max, targets, N, V_local, V_valid, vocab_start, ignore_id))
/* V is the real vocabulary size. A target outside [0, V) is refused as
 * op_xent_fwd refuses it. */
OP(xent_vp_loss, LOSS, COUNT, STATUS,
   (float *losses,           // (N)
    float *lse,              // (N)
    const float *row_max,    // (N) global
    const float *stats,      // (N, 3) reduced
    const int32_t *targets,  // (N)
    int N, int V, float eps, int32_t ignore_id),
   (losses, lse, row_max, stats, targets, N, V, eps, ignore_id))
/* dlogits += dloss * (exp(x - lse) - (1-eps) [v == y] - eps/V), valid columns only. */
OP(xent_vp_bwd, LOSS, REF, STREAM,
   (float *dlogits,          // (N, V_local)
    const float *logits,     // (N, V_local)
    const float *lse,        // (N)
    const int32_t *targets,  // (N)
    float dloss, int N, int V_local, int V_valid, int vocab_start, int V, float eps, int32_t ignore_id),
   (dlogits, logits, lse, targets, dloss, N, V_local, V_valid, vocab_start, V, eps, ignore_id))
/* The same gradient written over the logits, which the loss no longer
 * needs: no (N, V_local) gradient buffer, no pass to zero one. Padding
 * columns and ignored rows become 0. The one backward op that overwrites
 * rather than accumulates: each element equals op_xent_vp_bwd's into zeros. */
OP(xent_vp_grad_inplace, LOSS, REF, STEP,
   (float *logits,           // (N, V_local) in: logits; out: gradient
    const float *lse,        // (N)
    const int32_t *targets,  // (N)
    float dloss, int N, int V_local, int V_valid, int vocab_start, int V, float eps, int32_t ignore_id),
   (logits, lse, targets, dloss, N, V_local, V_valid, vocab_start, V, eps, ignore_id))

/* The same three on logits kept as bf16 bits (the output layer's
 * linear_fwd16): each gives the fp32 op's results on the widened logits,
 * bit for bit (the arithmetic is the fp32 op's; widening is exact). The
 * in-place gradient is then rounded to bf16 as it is stored over them:
 * the dy16 of linear_bwd_dy16. */
OP(xent_vp_max16, LOSS, REF, STREAM,
   (float *row_max,            // (N)
    const uint16_t *logits16,  // (N, V_local) bf16 bits
    int N, int V_local, int V_valid),
   (row_max, logits16, N, V_local, V_valid))
OP(xent_vp_sums16, LOSS, REF, STREAM,
   (float *stats,              // (N, 3)
    const uint16_t *logits16,  // (N, V_local) bf16 bits
    const float *row_max,      // (N) global
    const int32_t *targets,    // (N)
    int N, int V_local, int V_valid, int vocab_start, int32_t ignore_id),
   (stats, logits16, row_max, targets, N, V_local, V_valid, vocab_start, ignore_id))
OP(xent_vp_grad_inplace16, LOSS, REF, STEP,
   (uint16_t *logits16,      // (N, V_local) in: logits; out: gradient, bf16 bits
    const float *lse,        // (N)
    const int32_t *targets,  // (N)
    float dloss, int N, int V_local, int V_valid, int vocab_start, int V, float eps, int32_t ignore_id),
   (logits16, lse, targets, dloss, N, V_local, V_valid, vocab_start, V, eps, ignore_id))

/* ---- AdamW (decoupled weight decay, as torch.optim.AdamW) ------------------
 * p -= lr*wd*p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
 * p -= lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps). step t >= 1. */
OP(adamw, OPTIMIZER, REF, STREAM,
   (float *p, const float *g, float *m, float *v, size_t n_elems, float lr, float beta1, float beta2, float eps,
    float wd, int t),
   (p, g, m, v, n_elems, lr, beta1, beta2, eps, wd, t))
/* adamw over every segment s of the table in one launch: p[s.x_at..],
 * g[s.g_at..], m and v [s.s_at..], s.n elements, weight decay wd where
 * s.decay (else 0). Equal to one op_adamw per segment bit for bit. */
OP(adamw_segs, OPTIMIZER, OWN, STREAM,
   (float *p, const float *g, float *m, float *v, const OpSegTable *segs, float lr, float beta1, float beta2,
    float eps, float wd, int t),
   (p, g, m, v, segs, lr, beta1, beta2, eps, wd, t))

#undef OP
